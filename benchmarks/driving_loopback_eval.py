"""A driving planner evaluated the way AlpaSim would drive it, beside the suite's own evaluation.

Why: a planner meant for AlpaSim (``sft_driving_image``: camera, ego history, route) is trained and
evaluated on the driving suite, but deployed behind ``serve --alpasim-port``, where AlpaSim's driver
builds its observation from poses, routes and PNG frames and turns its answer into poses. This script
runs the same seeds both ways and reports the outcomes side by side, episode by episode:

- ``suite``: ``DrivingEnv`` stepped with ``policy.infer`` on the env's own observation (wire keys
  ``observation/<key>``), one plan per tick;
- ``alpasim``: the loopback AlpaSim runtime (``AlpasimLoopback.in_process``), the checkpoint behind
  our ``EgodriverService`` driver, the env's frames under ``camera_top_down``.

Both use the checkpoint's fixed serving noise, so a difference is what the AlpaSim boundary changes
(float32 poses on the wire, the plan's round trip through poses), not sampling.

    python benchmarks/driving_loopback_eval.py --ckpt runs/sft_driving_image/final --episodes-per-task 20
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_robot.driving import AlpasimLoopback
from cosmos_robot.policies import load_policy_folder
from cosmos_robot_envs.driving import SCENARIOS, DrivingEnv
from cosmos_robot_envs.eval.stats import wilson_interval
from cosmos_robot_server.alpasim import AlpasimDriverConfig, AlpasimDriverServicer


def _wire(policy: Any, obs: dict[str, Any]) -> dict[str, Any]:
    """The env's observation as the policy's wire keys (only the ones its spec names)."""
    return {k: obs[k.removeprefix("observation/")] for k in policy.input_spec.fields if k.startswith("observation/")}


def run_suite(policy: Any, env: DrivingEnv, seed: int, task: str) -> dict[str, Any]:
    obs, info = env.reset(seed=seed, options={"task": task})
    while True:
        plan = np.asarray(policy.infer(_wire(policy, obs))["actions"]).reshape(-1, 2)
        obs, _, terminated, truncated, info = env.step(plan)
        if terminated or truncated:
            return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True, help="a driving planner checkpoint folder")
    p.add_argument("--episodes-per-task", type=int, default=20)
    p.add_argument("--seed", type=int, default=1000, help="first episode seed; seeds run seed, seed+1, ...")
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--image-size", type=int, default=64, help="the camera's height (width 4x), as recorded")
    p.add_argument("--tasks", nargs="*", default=list(SCENARIOS))
    p.add_argument("--out", type=Path, default=None, help="write the per-episode records as JSON here")
    args = p.parse_args()

    policy = load_policy_folder(args.ckpt)
    camera = "observation/image" in policy.input_spec.fields
    config = AlpasimDriverConfig(
        camera_map={"camera_top_down": "image"} if camera else {}, cameras=None if camera else (), route_length=20
    )
    runtime = AlpasimLoopback.in_process(AlpasimDriverServicer(policy, config), camera=camera)
    env = DrivingEnv(
        tasks=args.tasks, obs_mode="camera" if camera else "state", image_size=args.image_size, max_steps=args.max_steps
    )
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for task in args.tasks:
        for k in range(args.episodes_per_task):
            seed = args.seed + k
            suite = run_suite(policy, env, seed, task)
            driven = runtime.run_episode(env, seed=seed, task=task).infos[-1]
            records.append(
                {
                    "task": task,
                    "seed": seed,
                    **{f"suite_{m}": suite[m] for m in ("is_success", "collision", "progress", "tick")},
                    **{f"alpasim_{m}": driven[m] for m in ("is_success", "collision", "progress", "tick")},
                }
            )
    wall = time.perf_counter() - t0
    print(f"{args.ckpt}: {len(records)} seeds, each run twice, {wall / 60:.1f} min")
    print("| task | mode | success [95% CI] | collisions | progress (mean) |")
    print("|---|---|---:|---:|---:|")
    for task in [*args.tasks, "total"]:
        rows = [r for r in records if task in ("total", r["task"])]
        for mode in ("suite", "alpasim"):
            wins = sum(bool(r[f"{mode}_is_success"]) for r in rows)
            lo, hi = wilson_interval(wins, len(rows))
            crashes = sum(bool(r[f"{mode}_collision"]) for r in rows)
            progress = float(np.mean([r[f"{mode}_progress"] for r in rows]))
            ci = f"[{100 * lo:.0f}, {100 * hi:.0f}]"
            print(f"| {task} | {mode} | {wins}/{len(rows)} {ci} | {crashes} | {progress:.3f} |")
    same = sum(r["suite_is_success"] == r["alpasim_is_success"] for r in records)
    ticks = sum(r["suite_tick"] == r["alpasim_tick"] for r in records)
    print(f"same outcome on {same}/{len(records)} seeds, same episode length on {ticks}/{len(records)}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"ckpt": str(args.ckpt), "wall_s": wall, "episodes": records}, indent=1))


if __name__ == "__main__":
    main()
