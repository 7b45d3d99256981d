"""Tabletop suite speed on this machine: state-only steps/s and step+render with both cameras.

Why: every demo, test and RL/SFT run on the 2-core CPU box uses this suite, and its cost is
(almost) all software-GL rendering, so these numbers decide test budgets and rollout sizes.
What is measured, per task, one env in this process (no vectorisation):

  1. ``obs_mode="state"``: env.step with random actions (auto-reset at episode end), no rendering;
  2. ``obs_mode="rgb"`` at each image size: env.step plus both cameras (agent view + wrist);
     "frames/s" counts camera images (2 per step);
  3. env construction and ``reset()`` latency.

    MUJOCO_GL=egl .venv/bin/python benchmarks/envs_render.py [--seconds 2] [--sizes 128,224] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

from cosmos_robot_envs.tabletop import TASK_NAMES, make_env


def _steps_per_s(task: str, seconds: float, **kwargs: Any) -> float:
    env = make_env(task, **kwargs)
    rng = np.random.default_rng(0)
    try:
        env.reset(seed=0)
        for _ in range(10):  # warm-up (first render creates the GL context)
            env.step(rng.uniform(-1, 1, 7))
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, 7))
            steps += 1
            if terminated or truncated:
                env.reset()
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def _latencies(task: str) -> tuple[float, float]:
    start = time.perf_counter()
    env = make_env(task, obs_mode="state")
    built = time.perf_counter() - start
    start = time.perf_counter()
    for seed in range(20):
        env.reset(seed=seed)
    reset = (time.perf_counter() - start) / 20
    env.close()
    return built * 1e3, reset * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measurement time per cell")
    parser.add_argument("--sizes", default="128,224", help="comma-separated square image sizes")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "mujoco_gl": os.environ.get("MUJOCO_GL"),
        "tasks": {},
    }
    header = f"{'task':<12} {'state steps/s':>14}" + "".join(
        f" {f'{s}px steps/s':>13} {f'{s}px frames/s':>14}" for s in sizes
    )
    print(results["machine"], "| MUJOCO_GL =", results["mujoco_gl"])
    print(header + f" {'build ms':>9} {'reset ms':>9}")
    for task in TASK_NAMES:
        row: dict[str, float] = {"state_steps_per_s": _steps_per_s(task, args.seconds, obs_mode="state")}
        line = f"{task:<12} {row['state_steps_per_s']:>14.0f}"
        for size in sizes:
            rate = _steps_per_s(task, args.seconds, obs_mode="rgb", image_size=size)
            row[f"rgb{size}_steps_per_s"] = rate
            line += f" {rate:>13.0f} {2 * rate:>14.0f}"
        row["build_ms"], row["reset_ms"] = _latencies(task)
        print(line + f" {row['build_ms']:>9.1f} {row['reset_ms']:>9.2f}")
        results["tasks"][task] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
