"""Does stochastic RL sampling keep an SFT flow policy's success? ODE vs Flow-SDE vs Flow-Noise.

The RL trainers roll out with a stochastic sampler (one Flow-SDE step, or Flow-Noise on every step)
so that chunks have log-probs; serving uses the deterministic ODE. If the stochastic sampler alone
cost much success, PPO would start from a worse policy than the one being served (notes checklist
item 6). This evaluates the same checkpoint on the same episodes (same seeds) with:

- ``ode (served)``: the serving path, ODE from the checkpoint's fixed seeded noise;
- ``ode (fresh noise)``: ODE from new noise at every call (NFT / DPO rollouts);
- ``flow_sde``: one random denoising step stochastic with sigma_t = a sqrt(t / (1 - t)), a = noise_level;
- ``flow_noise``: every step stochastic with the learned bounded std (untrained head: its midpoint).

    MUJOCO_GL=egl .venv/bin/python benchmarks/rl_sde_vs_ode.py --ckpt checkpoints/flow_tabletop_weak \
        [--episodes-per-task 25] [--num-envs 4] [--noise-level 0.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import torch
from rich.console import Console
from rich.table import Table

from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot_envs.eval import EvalConfig, run_eval
from cosmos_robot_trainers.rl.sampled_policy import SampledFlowPolicy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", default="checkpoints/flow_tabletop_weak")
    parser.add_argument("--episodes-per-task", type=int, default=25)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--noise-level", type=float, default=None)
    parser.add_argument("--num-steps", type=int, default=None, help="denoising steps K (default: the checkpoint's)")
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    base = FlowPolicy.from_pretrained(args.ckpt)
    if args.num_steps is not None:  # serve with K steps too, so every row uses the same discretisation
        base.model.config = base.model.config.model_copy(update={"num_flow_steps": args.num_steps})
        base.config = base.model.config
    rows: list[tuple[str, Any]] = [
        ("ode (served)", base),
        ("ode (fresh noise)", SampledFlowPolicy(base, "ode", seed=1)),
        ("flow_sde", SampledFlowPolicy(base, "flow_sde", seed=1, noise_level=args.noise_level)),
        ("flow_noise", SampledFlowPolicy(base, "flow_noise", seed=1)),
    ]
    results: dict[str, dict[str, Any]] = {}
    for name, policy in rows:
        config = EvalConfig(
            policy=f"{args.ckpt} [{name}]",
            suite="tabletop",
            episodes_per_task=args.episodes_per_task,
            num_envs=args.num_envs,
            replan_steps=5,
            seed=args.seed,
            image_size=args.image_size,
            vector_mode="async",
            video_episodes=0,
        )
        with tempfile.TemporaryDirectory() as out, torch.inference_mode():
            res = run_eval(config, policy, out, overwrite=True)
        results[name] = {
            "total": res["totals"]["success_rate"],
            "tasks": {t: v["success_rate"] for t, v in res["tasks"].items()},
            "episodes": res["totals"]["episodes"],
        }
    tasks = list(next(iter(results.values()))["tasks"])
    steps = args.num_steps or base.config.num_flow_steps
    table = Table(
        title=f"{args.ckpt}: success by sampler, K={steps} ({args.episodes_per_task} episodes/task, seed {args.seed})"
    )
    for col in ["sampler", *tasks, "total", "vs served"]:
        table.add_column(col, justify="right" if col != "sampler" else "left")
    served = results["ode (served)"]["total"]
    for name, r in results.items():
        cells = [f"{100 * r['tasks'][t]:.0f}%" for t in tasks]
        table.add_row(name, *cells, f"{100 * r['total']:.1f}%", f"{100 * (r['total'] - served):+.1f} pts")
    Console().print(table)
    if args.json:
        with open(args.json, "w") as fh:
            meta = {"ckpt": args.ckpt, "noise_level": args.noise_level, "num_steps": args.num_steps}
            json.dump({**meta, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
