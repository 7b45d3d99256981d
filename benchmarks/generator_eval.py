"""Held-out mean reward of generator folders on many prompts, with 95% intervals and paired gains.

Each folder (a diffusers Cosmos3 pipeline: a run's ``final/`` or ``checkpoints/cosmos3_t2i_shapes``)
generates one sample for each of ``--prompts`` held-out shapes captions (never trained on), with the
same noise per prompt for every folder (``--seed``); the reward scores them. Reported per folder: the
mean and its normal-approximation 95% interval; against the first folder (the start), the paired mean
difference and its interval (the same prompt and noise on both sides).

    python benchmarks/generator_eval.py checkpoints/cosmos3_t2i_shapes runs/nft_cosmos3_t2i_shapes_seed0/final \\
        --prompts 200 --seed 0 --reward brightness
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch


def _ci(x: np.ndarray) -> list[float]:
    half = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x))
    return [round(float(x.mean()) - half, 4), round(float(x.mean()) + half, 4)]


def main(argv: list[str] | None = None) -> int:
    from cosmos_robot.generation.cosmos3 import Cosmos3Generator, GenShape
    from cosmos_robot.generation.rewards import get_reward
    from cosmos_robot_trainers.generator.config import PromptsConfig
    from cosmos_robot_trainers.generator.prompts import heldout_prompts
    from cosmos_robot_trainers.generator.run import to_uint8

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="noise seed base (a new one: a fresh-seed confirmation)")
    ap.add_argument("--reward", default="brightness")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    reward = get_reward(args.reward)
    prompts = heldout_prompts(PromptsConfig(), args.prompts)
    shape = GenShape(1, 64, 64)
    scores = {}
    for folder in args.folders:
        gen = Cosmos3Generator.from_pretrained(folder)
        gen.transformer.eval()
        lat = torch.stack([gen.sample(p, shape, args.seed * 100_003 + i, args.steps) for i, p in enumerate(prompts)])
        with torch.no_grad():
            scores[str(folder)] = np.asarray(reward(to_uint8(gen.decode(lat)), prompts), np.float64)
    start = scores[str(args.folders[0])]
    report = {"prompts": len(prompts), "seed": args.seed, "reward": args.reward, "folders": {}}
    for name, s in scores.items():
        diff = s - start
        report["folders"][name] = {
            "mean": round(float(s.mean()), 4),
            "ci95": _ci(s),
            "gain_vs_first": round(float(diff.mean()), 4),
            "gain_ci95": _ci(diff) if name != str(args.folders[0]) else [0.0, 0.0],
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
