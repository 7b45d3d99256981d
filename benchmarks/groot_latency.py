"""GR00T N1.7 action-chunk latency: where LeRobot's path spends its time, batch 1 and 8, one run.

The folders are built with ``cosmos_robot.policies.groot.tiny`` (``--size released``: GR00T
N1.7-3B's shapes with random weights: a Qwen3-VL-2B backbone cut at layer 16, the 32-layer DiT
action head, 4 flow steps, chunk 40) and loaded the way ``serve --ckpt`` loads them. Rows:

- ``lerobot predict_action_chunk``: LeRobot's own model call on an already-processed batch (the
  reference the issue names);
- ``preprocessor``: LeRobot's own processor pipeline (Qwen3-VL image processing, tokenisation,
  normalisation) on the raw observations, then ours (the same pipeline with the tokenised prompts
  kept, ``cosmos_robot.policies.groot.processing``), with the images on the CPU and, on CUDA, on
  the GPU (LeRobot's VLM encode step's own ``device``, ``-a gpu_images=true``);
- ``ours model``: on the same processed batch, first the previous path (LeRobot's backbone run
  eagerly, the flow loop replayed as a CUDA graph), then ``Gr00tPolicy._predict``: the whole chunk
  (the capturable backbone of ``cosmos_robot.policies.groot.backbone``, the encoders, the loop)
  replayed as one CUDA graph;
- ``ours served``: ``Gr00tPolicy.infer_batch``, what our server runs per batch (preprocessor +
  model + postprocessor); ``bf16`` rows also cast the weights to bfloat16 (``-a dtype=bfloat16``);
- ``ours through the websocket server``: B concurrent openpi-protocol clients on loopback, the
  server batching their requests (``timing.server_latency``).

    python benchmarks/groot_latency.py --size released --device cuda --batch 1 8 --iters 20
    .venv/bin/python benchmarks/groot_latency.py --size tiny --iters 5          # CPU smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import measure, server_latency, write_report


def _obs(seed: int, size: int = 224) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "observation/state": rng.uniform(-1, 1, 8).astype(np.float32),
        "prompt": "pick up the black bowl between the plate and the ramekin and place it on the plate",
    }


def _stepwise(policy: Any, processed: dict[str, Any]) -> Any:
    """The previous served path: LeRobot's backbone eagerly, then the graphed flow loop."""
    inputs = policy.policy._filter_groot_inputs(processed, include_action=False)
    groot = policy.policy._groot_model
    backbone_inputs, action_inputs = groot.prepare_input(inputs)
    return policy._predict_stepwise(backbone_inputs, action_inputs)


def _with_cpu_images(policy: Any, fn: Any) -> Any:
    """Run ``fn`` with LeRobot's VLM encode step on its default CPU path."""
    steps = [s for s in policy.preprocessor.steps if type(s).__name__ == "GrootN17VLMEncodeStep"]
    saved = [s.device for s in steps]
    for s in steps:
        s.device = None
    try:
        return fn()
    finally:
        for s, d in zip(steps, saved, strict=True):
            s.device = d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "released"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--folder", type=Path, default=None, help="build into this folder, or reuse FOLDER/policy")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--compile", action="store_true", help="bf16 rows also torch.compile every layer stack")
    args = ap.parse_args(argv)

    from cosmos_robot.policies.groot.policy import Gr00tPolicy
    from cosmos_robot.policies.groot.tiny import build_tiny_groot

    t0 = time.perf_counter()
    root = args.folder or Path(tempfile.mkdtemp(prefix="groot_bench_"))
    folder = root / "policy" if (root / "policy" / "config.json").is_file() else build_tiny_groot(root, size=args.size)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    served = Gr00tPolicy.from_pretrained(folder, device=args.device, gpu_images=True)
    load_s = time.perf_counter() - t0
    fast = None
    if args.device != "cpu":
        fast = Gr00tPolicy.from_pretrained(
            folder, device=args.device, dtype="bfloat16", compile=args.compile, gpu_images=True
        )
    from lerobot.policies.factory import make_pre_post_processors

    lerobot_pre, _ = make_pre_post_processors(
        served.policy.config,
        pretrained_path=str(folder),
        preprocessor_overrides={"device_processor": {"device": args.device}},
    )
    params = sum(p.numel() for p in served.policy.parameters())
    cuda = args.device.startswith("cuda")
    rows: dict[str, Any] = {}
    for b in args.batch:
        obs = [_obs(i) for i in range(b)]
        batch = served.io.batch(obs)
        with torch.inference_mode():
            processed = served.preprocessor(batch)
            rows[f"b{b}"] = {
                "lerobot predict_action_chunk": measure(
                    lambda p=processed: served.policy.predict_action_chunk(p), args.iters, args.device, warmup=2
                ),
                "LeRobot's preprocessor (images on the CPU, its default)": measure(
                    lambda bt=batch: lerobot_pre(bt), args.iters, args.device, warmup=2
                ),
                "ours preprocessor (prompts kept), images on the CPU": _with_cpu_images(
                    served, lambda bt=batch: measure(lambda: served.preprocessor(bt), args.iters, args.device, warmup=2)
                ),
                "ours model, LeRobot's backbone eager + graphed flow loop": measure(
                    lambda p=processed: _stepwise(served, p), args.iters, args.device, warmup=2
                ),
                "ours model, whole chunk graphed": measure(
                    lambda p=processed: served._predict(p), args.iters, args.device, warmup=2
                ),
            }
            if cuda:
                rows[f"b{b}"]["ours preprocessor (prompts kept), images on the GPU"] = measure(
                    lambda bt=batch: served.preprocessor(bt), args.iters, args.device, warmup=2
                )
            if fast is not None:
                rows[f"b{b}"]["ours model, bf16 weights, whole chunk graphed"] = measure(
                    lambda p=processed: fast._predict(p), args.iters, args.device, warmup=2
                )
        rows[f"b{b}"]["ours served"] = measure(lambda o=obs: served.infer_batch(o), args.iters, args.device, warmup=2)
        if fast is not None:
            rows[f"b{b}"]["ours served, bf16 weights"] = measure(
                lambda o=obs: fast.infer_batch(o), args.iters, args.device, warmup=2
            )
        # b concurrent websocket clients -> our server (warmed like `serve --warmup auto`) -> the policy
        rows[f"b{b}"]["ours through the websocket server" + (", bf16 weights" if fast is not None else "")] = (
            server_latency(fast if fast is not None else served, b, max(5, args.iters), obs)
        )
    # last: LeRobot's own backbone forward leaves transformers' output-recording hooks on its layers,
    # which break the compiled blocks' graphs; the compiled whole-chunk rows above ran before them
    for b in args.batch if fast is not None else ():
        with torch.inference_mode():
            processed = served.preprocessor(served.io.batch([_obs(i) for i in range(b)]))
            rows[f"b{b}"]["ours model, bf16 weights, LeRobot's backbone eager + graphed loop"] = measure(
                lambda p=processed: _stepwise(fast, p), args.iters, args.device, warmup=2
            )
    report = {
        "size": args.size,
        "parameters_b": round(params / 1e9, 3),
        "dtype": str(next(served.policy.parameters()).dtype),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "chunk": int(served.policy.config.chunk_size),
        "build_s": round(build_s, 1),
        "load_s": round(load_s, 1),
        "bf16_rows_compiled": args.compile,
        "latency": rows,
    }
    return write_report(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
