"""Sampler gate (issue 16): is the RL rollout sampler's success within 3 points of the served policy's?

Runs ``cosmos_robot_trainers.rl.sampler_gate.sampler_gap``: the same episodes (tasks x layout seeds)
through the rollout worker twice, with the recipe's sampler and with the serving sampler (ODE from the
serving noise, which reproduces ``FlowPolicy.infer_batch`` exactly). Prints a JSON report with both
success rates, their Wilson intervals and the gap, and exits 1 when the gap exceeds ``--max-gap``.

    .venv/bin/python benchmarks/sampler_gate.py --recipe joint_ppo_flow_tabletop_state --episodes-per-task 100
    .venv/bin/python benchmarks/sampler_gate.py --recipe joint_ppo_flow_tabletop --set rollout.start_noise=fresh
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.rl import RLConfig
from cosmos_robot_trainers.rl.policies import load_rl_adapter
from cosmos_robot_trainers.rl.sampler_gate import sampler_gap


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="joint_ppo_flow_tabletop_state", help="an RL recipe (its init and sampler)")
    parser.add_argument("--ckpt", help="override the recipe's init checkpoint")
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="recipe override key=value")
    parser.add_argument("--episodes-per-task", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1000, help="first layout seed (eval-style, held out)")
    parser.add_argument("--max-gap", type=float, default=3.0, help="points the rollout sampler may trail serving")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = list(args.overrides) + ([f"init={json.dumps(args.ckpt)}"] if args.ckpt else [])
    _, config = load_train_recipe(args.recipe, overrides)
    if not isinstance(config, RLConfig):
        parser.error(f"{args.recipe} is not an RL recipe")
    adapter = load_rl_adapter(config.init, "cpu", config.rollout.noise_level)
    if config.rollout.num_flow_steps:
        adapter.set_num_flow_steps(config.rollout.num_flow_steps)
    t0 = time.perf_counter()
    gap = sampler_gap(config, adapter, args.episodes_per_task, args.seed)
    report = {
        "recipe": args.recipe,
        "init": config.init,
        "sample_mode": config.sample_mode,
        "start_noise": config.start_noise,
        "num_flow_steps": config.rollout.num_flow_steps,
        "noise_level": config.rollout.noise_level,
        "wall_s": round(time.perf_counter() - t0, 1),
        **gap.summary(),
    }
    print(json.dumps(report, indent=2))
    ok = gap.gap_points <= args.max_gap
    print(f"gap {gap.gap_points:+.1f} points (limit {args.max_gap}): {'PASS' if ok else 'FAIL'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
