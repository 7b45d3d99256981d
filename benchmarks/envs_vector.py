"""Vector-layer overhead: our batched envs vs a plain env loop and gymnasium's own vector envs.

What is measured, in env-steps per second (num_envs x batched steps / wall time), on the same env:
  - ``single``: one ``gymnasium.make`` env stepped in a plain Python loop (the ceiling for N=1);
  - ``ours sync`` / ``ours async``: :func:`make_vector_env` in "sync" and "async" mode;
  - ``gym sync`` / ``gym async``: ``gymnasium.vector.SyncVectorEnv`` / ``AsyncVectorEnv(shared_memory=True)``.
The overhead ratio is ``gym async rate / ours async rate`` (time per step, ours over gymnasium's;
target <= 1.1). Episodes end inside the window, so resets are part of the work: gymnasium autoresets
(NEXT_STEP), ours resets the finished envs with ``reset(mask=done)``, as the evaluator does.

Envs: ``cheap`` = Pendulum-v1 (microseconds per step: pure layer overhead), ``image`` =
gym-pusht ``pixels_agent_pos`` (96x96 RGB rendered per step), ``tabletop`` = CosmosRobot/Reach-v0
when the tabletop suite is installed. On a 2-core machine N=4 cannot scale; the ratios still hold.

    .venv/bin/python benchmarks/envs_vector.py [--envs cheap image] [--num-envs 1 2 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym
import numpy as np
from rich.console import Console
from rich.table import Table

from cosmos_robot_envs.vector import EnvFactory, make_vector_env

ENVS: dict[str, tuple[str, dict[str, Any], int]] = {  # name -> (id, kwargs, batched steps per run)
    "cheap": ("Pendulum-v1", {}, 3000),
    "image": ("gym_pusht/PushT-v0", {"obs_type": "pixels_agent_pos"}, 400),
    "tabletop": ("CosmosRobot/Reach-v0", {}, 300),
}


def _actions(space: gym.Space[Any], n: int, count: int) -> list[np.ndarray]:
    space.seed(0)
    return [np.stack([space.sample() for _ in range(n)]) for _ in range(count)]


def bench_single(factory: EnvFactory, steps: int) -> float:
    env = factory()
    acts = _actions(env.action_space, 1, 64)
    env.reset(seed=0)
    start = time.perf_counter()
    for t in range(steps):
        _, _, term, trunc, _ = env.step(acts[t % 64][0])
        if term or trunc:
            env.reset()
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def bench_ours(factory: EnvFactory, n: int, mode: str, steps: int) -> float:
    with make_vector_env(factory, n, mode) as venv:  # type: ignore[arg-type]
        acts = _actions(venv.single_action_space, n, 64)
        venv.reset(seeds=0)
        for t in range(20):  # warm-up
            _, _, term, trunc, _ = venv.step(acts[t % 64])
            if (done := term | trunc).any():
                venv.reset(mask=done)
        start = time.perf_counter()
        for t in range(steps):
            _, _, term, trunc, _ = venv.step(acts[t % 64])
            if (done := term | trunc).any():
                venv.reset(mask=done)
        return n * steps / (time.perf_counter() - start)


def bench_gym(factory: EnvFactory, n: int, mode: str, steps: int) -> float:
    fns: list[Callable[[], gym.Env[Any, Any]]] = [factory] * n
    venv: gym.vector.VectorEnv[Any, Any, Any] = (
        gym.vector.AsyncVectorEnv(fns, shared_memory=True, context="forkserver")
        if mode == "async"
        else gym.vector.SyncVectorEnv(fns)
    )
    try:
        acts = _actions(venv.single_action_space, n, 64)
        venv.reset(seed=0)
        for t in range(20):
            venv.step(acts[t % 64])
        start = time.perf_counter()
        for t in range(steps):
            venv.step(acts[t % 64])
        return n * steps / (time.perf_counter() - start)
    finally:
        venv.close()


def run(env_names: list[str], counts: list[int], repeats: int, scale: float) -> list[dict[str, Any]]:
    rows = []
    for name in env_names:
        env_id, kwargs, steps = ENVS[name]
        steps = max(20, int(steps * scale))
        factory = EnvFactory(env_id, kwargs)
        try:
            factory().close()
        except gym.error.Error as exc:
            print(f"skip {name}: {exc}")
            continue
        single = statistics.median(bench_single(factory, steps) for _ in range(repeats))
        for n in counts:
            row: dict[str, Any] = {"env": name, "env_id": env_id, "num_envs": n, "single": single}
            for label, fn, mode in [
                ("ours sync", bench_ours, "sync"),
                ("gym sync", bench_gym, "sync"),
                ("ours async", bench_ours, "async"),
                ("gym async", bench_gym, "async"),
            ]:
                row[label] = statistics.median(fn(factory, n, mode, steps) for _ in range(repeats))
            row["overhead async (ours/gym time)"] = row["gym async"] / row["ours async"]
            row["overhead sync (ours/gym time)"] = row["gym sync"] / row["ours sync"]
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    return rows


def show(rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"env-steps/s ({platform.machine()}, {os.cpu_count()} cores)")
    cols = ["env", "num_envs", "single", "ours sync", "gym sync", "ours async", "gym async"]
    ratios = ["overhead sync (ours/gym time)", "overhead async (ours/gym time)"]
    for col in cols + ratios:
        table.add_column(col.replace(" (ours/gym time)", " ratio"), justify="right")
    for row in rows:
        table.add_row(
            *[str(row[c]) if isinstance(row[c], (str, int)) else f"{row[c]:,.0f}" for c in cols],
            *[f"{row[r]:.2f}" for r in ratios],
        )
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["cheap", "image"], choices=sorted(ENVS))
    parser.add_argument("--num-envs", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell; the median is reported")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the step counts (0.1 for a smoke run)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    rows = run(args.envs, args.num_envs, args.repeats, args.scale)
    show(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
