"""Vector-layer overhead: our batched envs vs a plain env loop and gymnasium's own vector envs.

What is measured, in env-steps per second (num_envs x batched steps / wall time), on the same env:
  - ``single``: one ``gymnasium.make`` env stepped in a plain Python loop (the ceiling for N=1);
  - ``ours sync`` / ``ours async``: :func:`make_vector_env` in "sync" and "async" mode;
  - ``gym sync`` / ``gym async``: ``gymnasium.vector.SyncVectorEnv`` / ``AsyncVectorEnv(shared_memory=True)``.
The overhead ratio is ``gym rate / ours rate`` (our time per step over gymnasium's; target <= 1.1),
taken per round of back-to-back runs and reported as the median over rounds; the parent process's CPU
time per batched step is the layer's own cost, the least noisy number on a shared machine. Episodes
end inside the window, so resets are part of the work: gymnasium autoresets (NEXT_STEP), ours resets
the finished envs with ``reset(mask=done)``, as the evaluator does.

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
    "tabletop-state": ("CosmosRobot/Push-v0", {"obs_mode": "state"}, 2000),
}


def _actions(space: gym.Space[Any], n: int, count: int) -> list[np.ndarray]:
    space.seed(0)
    return [np.stack([space.sample() for _ in range(n)]) for _ in range(count)]


class _Clock:
    """Wall time and this process's CPU time (the layer's own cost in the parent) over a window."""

    def __enter__(self) -> _Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def result(self, env_steps: int, batched_steps: int) -> tuple[float, float]:
        """(env-steps per second, parent CPU microseconds per batched step)."""
        return env_steps / self.wall, 1e6 * self.cpu / batched_steps


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


def bench_ours(factory: EnvFactory, n: int, mode: str, steps: int) -> tuple[float, float]:
    with make_vector_env(factory, n, mode) as venv:  # type: ignore[arg-type]
        acts = _actions(venv.single_action_space, n, 64)
        venv.reset(seeds=0)
        for t in range(steps + 20):  # the first 20 are warm-up
            if t == 20:
                clock = _Clock().__enter__()
            _, _, term, trunc, _ = venv.step(acts[t % 64])
            if (done := term | trunc).any():
                venv.reset(mask=done)
        clock.__exit__()
        return clock.result(n * steps, steps)


def bench_gym(factory: EnvFactory, n: int, mode: str, steps: int) -> tuple[float, float]:
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
        with _Clock() as clock:
            for t in range(steps):
                venv.step(acts[t % 64])
        return clock.result(n * steps, steps)
    finally:
        venv.close()


VARIANTS = [
    ("ours sync", bench_ours, "sync"),
    ("gym sync", bench_gym, "sync"),
    ("ours async", bench_ours, "async"),
    ("gym async", bench_gym, "async"),
]


def run(env_names: list[str], counts: list[int], repeats: int, scale: float) -> list[dict[str, Any]]:
    """Each round runs all variants back to back, so a load spike from elsewhere hits both sides of a
    ratio; ratios are per round, then the median over rounds is reported (rates likewise)."""
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
            rounds = [{label: fn(factory, n, mode, steps) for label, fn, mode in VARIANTS} for _ in range(repeats)]
            row: dict[str, Any] = {"env": name, "env_id": env_id, "num_envs": n, "single": single}
            for label, _, _ in VARIANTS:
                row[label] = statistics.median(r[label][0] for r in rounds)
                row[label + " cpu_us"] = statistics.median(r[label][1] for r in rounds)
            for mode in ("sync", "async"):
                row[f"ratio {mode}"] = statistics.median(r[f"gym {mode}"][0] / r[f"ours {mode}"][0] for r in rounds)
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return rows


def show(rows: list[dict[str, Any]]) -> None:
    title = f"env-steps/s; ratio = our time per step / gymnasium's ({platform.machine()}, {os.cpu_count()} cores)"
    table = Table(title=title)
    cols = ["env", "num_envs", "single", "ours sync", "gym sync", "ours async", "gym async"]
    extra = ["ratio sync", "ratio async", "ours async cpu_us", "gym async cpu_us"]
    for col in cols + extra:
        table.add_column(col.replace(" cpu_us", " parent CPU us/step"), justify="right")
    for row in rows:
        table.add_row(
            *[str(row[c]) if isinstance(row[c], (str, int)) else f"{row[c]:,.0f}" for c in cols],
            f"{row['ratio sync']:.2f}",
            f"{row['ratio async']:.2f}",
            f"{row['ours async cpu_us']:.0f}",
            f"{row['gym async cpu_us']:.0f}",
        )
    Console(width=200).print(table)


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
