"""Step time of Cosmos3 generator post-training: one DiffusionNFT update, one Flow-DPO update, one sample.

What each row times (median of ``--iters`` after ``--warmup``), on random weights at the tiny size or at
Cosmos3-Nano's (hidden 4096, 36 layers, the Wan2.2 48-channel VAE; ``cosmos3_latency.build_nano_pipeline``):

- ``nft_update``: ``--batch`` samples' forward process, the trained transformer's velocity (with grad) and
  the old policy's (no grad), the ``nft`` loss, backward, AdamW; the old policy is the same module in
  eval mode here (its cost is one more forward, as in training);
- ``dpo_update``: ``--batch`` pairs: winner and loser velocities with grad, the reference's without, the
  ``flow_dpo`` loss, backward, AdamW;
- ``sample``: one image (or clip) through ``Cosmos3Generator.sample`` (``--steps`` ODE steps, no guidance).

``--lora-rank R`` trains LoRA adapters of rank R on the trainer's default targets (what a recipe's
``[lora] rank`` does) instead of every weight; without it the rows are full fine-tuning.

    python benchmarks/generator_step.py --size tiny                                          # this CPU
    python benchmarks/generator_step.py --size nano --device cuda --dtype bfloat16 --height 256 --width 256
    python benchmarks/generator_step.py --size nano --device cuda --dtype bfloat16 --height 256 --width 256 \
        --lora-rank 32
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _timed(fn: Any, device: str, iters: int, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"p50_ms": round(float(np.percentile(times, 50)), 1), "max_ms": round(float(max(times)), 1)}


def build(args: argparse.Namespace) -> Any:
    from cosmos_robot.generation.cosmos3 import Cosmos3Generator

    if args.size == "nano":
        from cosmos3_latency import build_nano_pipeline

        return Cosmos3Generator(build_nano_pipeline(args.device, getattr(torch, args.dtype)))
    from cosmos_robot.generation.tiny import build_tiny_generator

    folder = build_tiny_generator(Path(tempfile.mkdtemp()) / "tiny", vae_steps=0)
    return Cosmos3Generator.from_pretrained(folder, args.device)


def main(argv: list[str] | None = None) -> int:
    from cosmos_robot.generation.cosmos3 import GenShape
    from cosmos_robot_trainers.algorithms import flow_dpo_loss, nft_loss
    from cosmos_robot_trainers.generator.flow import noised

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "nano"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--frames", type=int, default=1)
    ap.add_argument("--height", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lora-rank", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    gen = build(args)
    shape = GenShape(args.frames, args.height, args.width)
    tr = gen.transformer
    if args.lora_rank > 0:
        from cosmos_robot_trainers.generator.config import LoraConfig
        from cosmos_robot_trainers.generator.run import _apply_lora

        spec = LoraConfig()
        tr.requires_grad_(False)
        _apply_lora(tr, args.lora_rank, args.lora_rank, spec.targets)
        if args.dtype != "float32":
            tr.to(getattr(torch, args.dtype))
    tr.train()
    opt = torch.optim.AdamW([p for p in tr.parameters() if p.requires_grad], lr=1e-6)
    ids = [gen.prompt_ids(f"a red circle number {i}", shape)[0] for i in range(args.batch)]
    lat = torch.randn(args.batch, *gen.latent_shape(shape), device=gen.device)
    sig = torch.full((args.batch,), 0.5)

    def nft_step() -> None:
        x_t, target = noised(lat, torch.randn_like(lat), sig)
        v = gen.velocities(x_t, sig, ids, shape)
        with torch.no_grad():
            v_old = gen.velocities(x_t, sig, ids, shape)
        loss, _ = nft_loss(v, v_old, target, torch.full((args.batch,), 0.7, device=v.device))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def dpo_step() -> None:
        eps = torch.randn_like(lat)
        xw, tw = noised(lat, eps, sig)
        xl, tl = noised(lat.flip(0), eps, sig)
        vw, vl = gen.velocities(xw, sig, ids, shape), gen.velocities(xl, sig, ids, shape)
        with torch.no_grad():
            rw, rl = gen.velocities(xw, sig, ids, shape), gen.velocities(xl, sig, ids, shape)
        loss, _ = flow_dpo_loss(vw, rw, tw, vl, rl, tl)
        opt.zero_grad()
        loss.backward()
        opt.step()

    rows = {
        "nft_update": _timed(nft_step, args.device, args.iters, args.warmup),
        "dpo_update": _timed(dpo_step, args.device, args.iters, args.warmup),
        "sample": _timed(
            lambda: gen.sample("a red circle", shape, 0, args.steps), args.device, args.iters, args.warmup
        ),
    }
    report = {
        "model": f"{args.size} random ({sum(p.numel() for p in tr.parameters()) / 1e6:.1f} M transformer parameters)",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "shape": {"frames": args.frames, "height": args.height, "width": args.width},
        "latents": list(gen.latent_shape(shape)),
        "batch": args.batch,
        "trained": f"LoRA rank {args.lora_rank}" if args.lora_rank else "all weights",
        "trained_parameters_M": round(sum(p.numel() for p in tr.parameters() if p.requires_grad) / 1e6, 2),
        "sample_steps": args.steps,
        "rows": rows,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
