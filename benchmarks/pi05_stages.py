"""Where a served pi0.5 chunk's time goes on the host: batch assembly, LeRobot's preprocessor, the
device transfer and resize, the graphed model, the postprocessor (issue 19: the server's model call at
batch 8 was 2.3x the model's own time).

    python benchmarks/pi05_stages.py --folder /tmp/sw_pi05/pi05 --device cuda --batches 1 8
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.pi05.policy import Pi05Policy


def obs(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.uniform(-1, 1, 8),
        "prompt": "pick up the black bowl between the plate and the ramekin and put it on the plate",
    }


def timed(fn: Any, iters: int, sync: bool) -> tuple[float, Any]:
    out = fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = fn()
        if sync:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times)), out


def stage_row(policy: Pi05Policy, b: int, iters: int, sync: bool) -> dict[str, float]:
    """Median ms of each stage of serving ``b`` observations (the stages run on the same inputs)."""
    batch_obs = [obs(i) for i in range(b)]
    row: dict[str, float] = {}
    with torch.inference_mode():
        row["io.batch"], _ = timed(lambda: policy.io.batch(batch_obs), iters, sync)
        row["preprocessor"], _ = timed(lambda: policy.preprocessor(policy.io.batch(batch_obs)), iters, sync)
        row["preprocessor"] -= row["io.batch"]
        row["prepare (all)"], inputs = timed(lambda: policy.prepare(batch_obs), iters, sync)
        noise = policy.serving_noise(b).float()
        row["serving_noise"], _ = timed(lambda: policy.serving_noise(b), iters, sync)
        row["generate"], acts = timed(lambda: policy.generate(inputs, noise), iters, sync)
        row["unnormalize"], _ = timed(lambda: policy.unnormalize(acts), iters, sync)
        row["infer_batch"], _ = timed(lambda: policy.infer_batch(batch_obs), iters, sync)
    return {k: round(v, 2) for k, v in row.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    attention = "math" if args.compile else "auto"
    policy = Pi05Policy.from_pretrained(args.folder, device=args.device, compile=args.compile, attention=attention)
    rows = {}
    for b in args.batches:
        rows[f"b{b}"] = stage_row(policy, b, args.iters, args.device.startswith("cuda"))
        print(b, rows[f"b{b}"], flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
