"""Cosmos3 action-chunk latency: diffusers' ``Cosmos3OmniPipeline`` (the reference path) vs our loop, one run.

Both run the same transformer, VAE and scheduler on the same image, prompt and seed:

- ``stock``: ``pipe(prompt, action=CosmosActionCondition(mode="policy", ...), output_type="latent")``:
  it VAE-encodes all chunk + 1 frames of the conditioning video and has no state row;
- ``ours_stateless``: ``Cosmos3Sampler`` without a state row, the same sequence plan (the report
  checks the actions are identical), encoding only frame 0;
- ``ours_droid``: cosmos-framework's DROID plan (state row, composite view description), what
  ``serve --ckpt`` runs for a DROID checkpoint;
- ``ours_droid_interval``: the same with the Edge guidance interval (960, 1001).

    .venv/bin/python benchmarks/cosmos3_latency.py --tier 480 --iters 3                  # tiny random model, CPU
    python benchmarks/cosmos3_latency.py --size nano --device cuda --dtype bfloat16         # Nano-sized, random
    python benchmarks/cosmos3_latency.py --folder /path/to/Cosmos3-Nano-Policy-DROID --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from timing import write_report


def timed(fn, iters: int, device: str) -> tuple[dict[str, float], object]:
    out = fn()  # warm-up
    times = []
    for _ in range(iters):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"p50_ms": round(float(np.percentile(times, 50)), 1), "max_ms": round(float(max(times)), 1)}, out


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def build_nano_pipeline(device: str, dtype: torch.dtype):
    """Cosmos3-Nano's shapes with random weights, built on ``device``: the transformer at diffusers'
    defaults (hidden 4096, 36 layers, 32/8 heads, head_dim 128, 48 latent channels) with the action
    head, the Wan2.2-TI2V-5B VAE (48 channels, 16x spatial / 4x temporal), UniPC on flow sigmas."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler

    from cosmos_robot.policies.cosmos3.tiny import chat_tokenizer

    torch.manual_seed(0)
    with torch.device(device):
        transformer = Cosmos3OmniTransformer(action_gen=True, action_dim=64).to(dtype)
        vae = AutoencoderKLWan(
            base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
            temperal_downsample=[False, True, True], is_residual=True, patch_size=2, in_channels=12,
            out_channels=12, scale_factor_temporal=4, scale_factor_spatial=16,
            latents_mean=[0.0] * 48, latents_std=[1.0] * 48,
        ).to(dtype)  # fmt: skip
    scheduler = UniPCMultistepScheduler(
        use_flow_sigmas=True, use_karras_sigmas=False, flow_shift=5.0, prediction_type="flow_prediction"
    )
    return Cosmos3OmniPipeline(
        transformer=transformer, text_tokenizer=chat_tokenizer(), vae=vae, scheduler=scheduler,
        enable_safety_checker=False, default_use_system_prompt=False, use_native_flow_schedule=True,
    )  # fmt: skip


@dataclass
class Case:
    """What every row runs: one DROID composite image, prompt and state through ``pipe`` / our sampler."""

    pipe: Any
    sampler: Any  # Cosmos3Sampler over the same pipeline
    image: np.ndarray
    prompt: str
    state: np.ndarray
    settings: Any  # DROID's sampler settings at --tier
    tier: int
    iters: int
    device: str


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pipe = load_pipeline(args)
    case = make_case(pipe, args)
    rows: dict[str, dict[str, float]] = {}
    rows["stock"], ref = time_stock(case)
    rows["ours_stateless"], (ours, info) = time_ours_stateless(case)
    rows["ours_droid"], (_, info_d) = time_ours_droid(case)
    rows["ours_droid_interval"], (_, info_i) = time_ours_droid_interval(case)
    if args.compile:  # after the uncompiled rows: the stock pipeline shares the transformer
        from cosmos_robot.policies.compiling import transformer_blocks

        for block in transformer_blocks(pipe.transformer):
            block.compile()
        rows["ours_droid_compiled"], _ = time_ours_droid(case)
        rows["ours_droid_interval_compiled"], _ = time_ours_droid_interval(case)
    s = case.settings
    report = {
        "model": str(
            args.folder or f"{args.size} random ({_params(pipe.transformer) / 1e9:.3f} B transformer parameters)"
        ),
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "threads": torch.get_num_threads(),
        "tier": args.tier,
        "canvas": list(info["canvas"]),
        "chunk": s.chunk,
        "steps": s.num_steps,
        "guidance": s.guidance,
        "seq_len": {"stateless": info["seq_len"], "droid": info_d["seq_len"]},
        "transformer_calls": {"droid": info_d["transformer_calls"], "droid_interval": info_i["transformer_calls"]},
        "stateless_equals_stock": bool(np.array_equal(ours, ref.float().cpu().numpy())),
        "latency": rows,
    }
    stock_ms = rows["stock"]["p50_ms"]
    report["speedup_vs_stock"] = {k: round(stock_ms / v["p50_ms"], 2) for k, v in rows.items() if k != "stock"}
    return write_report(report, args.out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=None, help="a Cosmos3 pipeline folder (default: random weights)")
    ap.add_argument(
        "--size", choices=["tiny", "nano"], default="tiny",
        help="random weights: tiny (0.3 M) or Cosmos3-Nano's size (transformer 4096 x 36 layers, Wan2.2 VAE)",
    )  # fmt: skip
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--tier", type=int, default=480)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also time our loop with torch.compile'd transformer blocks")
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def load_pipeline(args: argparse.Namespace) -> Any:
    """The folder's pipeline, or random weights at the tiny or Nano size; on ``--device``, no progress bar."""
    from diffusers import Cosmos3OmniPipeline

    from cosmos_robot.policies.cosmos3.tiny import build_tiny_pipeline

    torch_dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    if args.folder is None and args.size == "nano":
        pipe = build_nano_pipeline(args.device, torch_dtype)
    elif args.folder is None:
        pipe = build_tiny_pipeline(seed=0)
    else:
        pipe = Cosmos3OmniPipeline.from_pretrained(
            str(args.folder), enable_safety_checker=False, torch_dtype=torch_dtype
        )
    pipe.to(args.device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def make_case(pipe: Any, args: argparse.Namespace) -> Case:
    from cosmos_robot.policies.cosmos3.conventions import DROID, droid_composite
    from cosmos_robot.policies.cosmos3.sampler import Cosmos3Sampler

    rng = np.random.default_rng(0)
    cams = [rng.integers(0, 256, (360, 640, 3), dtype=np.uint8) for _ in range(3)]
    image = droid_composite(*cams)  # 540 x 640, as cosmos-framework's DROID server composes it
    settings = replace(DROID.settings, resolution_tier=args.tier)
    sampler = Cosmos3Sampler(pipe)
    state = rng.normal(size=8).astype(np.float32)
    prompt = "put the marker in the cup"
    return Case(pipe, sampler, image, prompt, state, settings, args.tier, args.iters, args.device)


def time_stock(case: Case) -> tuple[dict[str, float], Any]:
    """``stock``: diffusers' pipeline in policy mode (encodes every frame of the conditioning video)."""
    from diffusers import CosmosActionCondition

    s = case.settings

    def stock() -> Any:
        return case.pipe(
            prompt=case.prompt,
            action=CosmosActionCondition(
                mode="policy",
                chunk_size=s.chunk,
                domain_name="droid_lerobot",
                resolution_tier=case.tier,
                image=case.image,
                view_point="concat_view",
            ),  # fmt: skip
            fps=s.fps,
            num_inference_steps=s.num_steps,
            guidance_scale=s.guidance,
            generator=torch.Generator().manual_seed(5),
            output_type="latent",
        ).action[0]

    return timed(stock, case.iters, case.device)


def time_ours_stateless(case: Case) -> tuple[dict[str, float], Any]:
    """``ours_stateless``: our sampler on the stock pipeline's sequence plan (no state row)."""
    stateless = replace(case.settings, raw_dim=10, view_description=None, reimpose_clean=False)
    return timed(lambda: case.sampler.sample(case.image, case.prompt, stateless, None, seed=5), case.iters, case.device)


def time_ours_droid(case: Case) -> tuple[dict[str, float], Any]:
    """``ours_droid``: cosmos-framework's DROID plan (state row, composite view description)."""
    s = case.settings
    return timed(lambda: case.sampler.sample(case.image, case.prompt, s, case.state, 5), case.iters, case.device)


def time_ours_droid_interval(case: Case) -> tuple[dict[str, float], Any]:
    """``ours_droid_interval``: the DROID plan with the Edge guidance interval (960, 1001)."""
    interval = replace(case.settings, guidance_interval=(960.0, 1001.0))
    return timed(lambda: case.sampler.sample(case.image, case.prompt, interval, case.state, 5), case.iters, case.device)


if __name__ == "__main__":
    sys.exit(main())
