"""pi0.5 action-chunk latency at the released size: LeRobot 0.6.1's ``predict_action_chunk`` vs ours, one run.

Random weights, the released architecture (PaliGemma gemma_2b + SigLIP so400m/14 + gemma_300m
expert, 4.1 B parameters), two 224x224 cameras, a 200-token prompt, chunk 50, 10 flow steps. Both
models hold the same weights (ours is loaded from LeRobot's state dict), and the report includes
their largest action difference on the same inputs and noise.

Measured per batch size (1 and 8), p50/p99 over ``--iters`` calls, CUDA-synchronised:

- ``lerobot``: ``PI05Policy.predict_action_chunk`` on preprocessed inputs (its eager path);
- ``ours_eager``: ``Pi05Model.generate`` (prefix once with a KV cache, fused SDPA attention);
- ``ours_graph``: the same captured as one CUDA graph (``GraphedGenerate``);
- ``ours_infer``: ``Pi05Policy.infer_batch`` from raw observations (LeRobot's processors + the graph);
  ``ours_infer_frozen``: the same after ``gc.freeze`` of the warm heap, as the server runs (every row
  reports the garbage collector's pauses during its timed calls);
- ``server``: our websocket client -> ``PolicyServer`` on loopback -> the policy; batch 8 is 8
  concurrent clients whose requests the server batches.

    python benchmarks/pi05_latency.py --device cuda --dtype bfloat16 --out pi05_latency.json   # H200
    .venv/bin/python benchmarks/pi05_latency.py --size tiny --device cpu --iters 3             # smoke test
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import parity_pi05 as parity
import torch
from timing import measure, server_latency, write_report

from cosmos_robot.policies.pi05.modeling import GemmaSpec, Pi05Architecture, Pi05Model, VisionSpec
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot_server.gc_watch import freeze_heap


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    ref, cfg, stats, tokenizer = build_reference(args)
    report: dict[str, object] = {
        "size": args.size,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "dtype": args.dtype,
        "torch": torch.__version__,
        "flow_steps": args.steps,
        "chunk": cfg.chunk_size,
        "build_s": round(time.perf_counter() - t0, 1),
    }
    cfg.num_inference_steps = args.steps
    native = build_native(args, ref, cfg)
    eager, graphed = build_policies(args, native, cfg, stats, tokenizer)
    report["compile"] = (args.compile_mode or "default") if args.compile else False
    report["trim_prompt"] = args.trim_prompt
    report["attention"] = args.attention
    report["precision"] = args.precision
    fp8 = sum(b.numel() for n, b in native.named_buffers() if n.endswith("weight_q"))  # FP8 weights are buffers
    report["params_million"] = round((sum(p.numel() for p in native.parameters()) + fp8) / 1e6, 1)

    results: dict[str, dict[str, object]] = {}
    for b in args.batches:
        run_batch(b, args, ref, cfg, native, eager, graphed, results)
    report["results"] = results
    return write_report(report, args.out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "full"], default="full")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip-lerobot", action="store_true", help="random native weights only (no LeRobot model)")
    ap.add_argument(
        "--skip-server", action="store_true", help="no served row (its warm-up compiles every batch bucket: minutes)"
    )
    ap.add_argument("--profile", action="store_true", help="also time prefix/step split, SDPA backends, top kernels")
    ap.add_argument("--compile", action="store_true", help="torch.compile prefix and flow step under the graph")
    ap.add_argument(
        "--precision", choices=["bf16", "mixed", "fp8"], default="bf16",
        help="bf16: every weight in bfloat16 (the measured numbers); mixed: LeRobot's float32 vision and norms; "
        "fp8: bf16 with the VLM's and SigLIP's linear layers in FP8 (Hopper GPUs)",
    )  # fmt: skip
    ap.add_argument(
        "--compile-mode", default=None, choices=["default", "max-autotune-no-cudagraphs"],
        help="torch.compile mode for --compile (max-autotune-no-cudagraphs tunes kernels for these shapes)",
    )  # fmt: skip
    ap.add_argument("--attention", choices=["sdpa", "math"], default="sdpa", help="Pi05Model.set_attention")
    ap.add_argument(
        "--trim-prompt",
        type=int,
        default=0,
        metavar="N",
        help="pin the prompt to N tokens before the graph (the policy's trim_prompt; 0: off)",
    )
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def build_reference(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """``(LeRobot's PI05Policy or None with --skip-lerobot, its config, normalisation stats, tokenizer)``."""
    if args.skip_lerobot:
        from cosmos_robot.policies.pi05.tokenizer import make_byte_tokenizer

        return None, parity.make_config(args.size, args.device, args.dtype), parity.make_stats(0), make_byte_tokenizer()
    ref, cfg, stats, tokenizer = parity.make_reference(args.size, args.device, args.dtype, seed=0)
    ref.eval()
    return ref, cfg, stats, tokenizer


def build_native(args: argparse.Namespace, ref: Any, cfg: Any) -> Any:
    """Our ``Pi05Model`` of the same architecture: LeRobot's weights, or random ones with --skip-lerobot."""
    dev = args.device
    if args.size == "tiny":
        arch = Pi05Architecture(
            vlm=GemmaSpec(**parity.TINY),
            expert=GemmaSpec(**parity.TINY),
            vision=VisionSpec(**parity.TINY_VISION),
            chunk_size=cfg.chunk_size,
        )
    else:
        arch = Pi05Architecture(chunk_size=cfg.chunk_size)
    torch_dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    if ref is None:
        with torch.device(dev):
            native = Pi05Model(arch).to(torch_dtype)
        gen = torch.Generator(device=dev).manual_seed(1)
        with torch.no_grad():
            for p in native.parameters():
                p.copy_(torch.randn(p.shape, generator=gen, device=dev) * 0.05)
    else:
        with torch.device("meta"):
            native = Pi05Model(arch)
        from cosmos_robot.policies.pi05.checkpoint import param_dtype

        state = {
            k.removeprefix("model."): v.detach().to(
                dev, param_dtype(k.removeprefix("model."), torch_dtype, args.precision)
            )
            for k, v in ref.state_dict().items()
            if k.startswith("model.") and not k.endswith("lm_head.weight")
        }
        native.load_state_dict(state, strict=True, assign=True)
        del state
    if args.precision == "fp8":
        native.to_fp8()
    native.set_attention(args.attention)
    return native


def build_policies(args: argparse.Namespace, native: Any, cfg: Any, stats: Any, tokenizer: Any) -> tuple[Any, Any]:
    """``(eager policy, CUDA-graphed policy)`` around ``native``; the graphed one is the eager one on a CPU."""
    eager = Pi05Policy.from_model(native, cfg, stats, tokenizer, cuda_graphs=False)
    if not args.device.startswith("cuda"):
        return eager, eager
    graphed = Pi05Policy(
        native,
        cfg,
        eager.preprocessor,
        eager.postprocessor,
        tokenizer,
        cuda_graphs=True,
        compile=(args.compile_mode or True) if args.compile else False,
        trim_prompt=args.trim_prompt,
    )
    return eager, graphed


def profile(native: object, inputs: object, noise: torch.Tensor, steps: int, dev: str) -> dict[str, object]:
    """Where the time goes: prefix vs one flow step, each SDPA backend, and the top CUDA kernels."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    m, x = native, inputs
    out: dict[str, object] = {}
    with torch.inference_mode():
        cache = m.encode_prefix(x.images, x.image_masks, x.tokens, x.token_mask, hidden=False)  # type: ignore[attr-defined]
        t = torch.full((noise.shape[0],), 0.5, device=dev)
        out["prefix"] = measure(
            lambda: m.encode_prefix(x.images, x.image_masks, x.tokens, x.token_mask, hidden=False),  # type: ignore[attr-defined]
            10,
            dev,
        )  # as generate encodes it
        out["one_step"] = measure(lambda: m.velocity(cache, noise, t), 10, dev)  # type: ignore[attr-defined]
        for name, backend in (
            ("math", SDPBackend.MATH),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ):
            try:
                with sdpa_kernel(backend):
                    out[f"generate_{name}"] = measure(
                        lambda: m.generate(x.images, x.image_masks, x.tokens, x.token_mask, noise, steps),
                        5,
                        dev,  # type: ignore[attr-defined]
                    )
            except RuntimeError as exc:
                out[f"generate_{name}"] = str(exc)[:120]
        if dev.startswith("cuda"):
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                m.generate(x.images, x.image_masks, x.tokens, x.token_mask, noise, steps)  # type: ignore[attr-defined]
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60)
            print(table, flush=True)
    return out


def run_batch(
    b: int,
    args: argparse.Namespace,
    ref: object,
    cfg: object,
    native: object,
    eager: object,
    graphed: object,
    results: dict,
) -> None:
    dev = args.device
    t_batch = time.perf_counter()

    def stage(key: str) -> None:
        """Progress on stderr after each measured stage: a run cut by its time slot still says how far it got
        (the batch-8 rows ran past a 7-minute slot twice with nothing printed)."""
        got = row.get(key)
        summary = {k: got[k] for k in ("p50_ms", "p99_ms") if k in got} if isinstance(got, dict) else got
        print(f"[{time.perf_counter() - t_batch:6.1f} s] batch {b}: {key} {summary}", file=sys.stderr, flush=True)

    obs = parity.observations(b, seed=b)
    gen = torch.Generator().manual_seed(b)
    noise = torch.randn((b, cfg.chunk_size, cfg.max_action_dim), generator=gen).to(dev)
    with torch.inference_mode():
        inputs = eager.prepare(obs)
        row: dict[str, object] = {"prompt_tokens_max": int(inputs.token_mask.sum(dim=1).max())}
        if not args.skip_lerobot:
            processed = ref_batch(obs, ref, eager)
            row["lerobot"] = measure(lambda: ref.predict_action_chunk(processed, noise=noise), args.iters, dev)
            stage("lerobot")
            lr_actions = ref.predict_action_chunk(processed, noise=noise).float()
        row["ours_eager"] = measure(
            lambda: native.generate(
                inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, noise, args.steps
            ),
            args.iters,
            dev,
        )
        stage("ours_eager")
        ours = native.generate(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, noise, args.steps)
        tc = time.perf_counter()
        if graphed.graphed is not None:
            g = graphed.graphed
            row["ours_graph"] = measure(
                lambda: g(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, noise),
                args.iters,
                dev,
            )
            row["first_call_s"] = round(time.perf_counter() - tc, 1)  # capture (+ compile) on the first call
            stage("ours_graph")
            graph_out = g(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, noise).float()
            row["graph_vs_eager_max_abs"] = float((graph_out - ours.float()).abs().max())
        row["ours_infer"] = measure(lambda: graphed.infer_batch(obs), args.iters, dev)
        stage("ours_infer")
        if graphed.graphed is not None and args.trim_prompt:
            row["long_prompt_calls"] = graphed.graphed.long_prompt_calls  # prompts over N: served at full length
        # the same with the warm heap frozen, as the server runs it (gc_watch.py): the full
        # collections that the loaded model's ~500k objects make slow are the suspected tail
        freeze_heap()
        row["ours_infer_frozen"] = measure(lambda: graphed.infer_batch(obs), args.iters, dev)
        stage("ours_infer_frozen")
        gc.unfreeze()
        if not args.skip_lerobot:
            d = eager.action_dim
            diff = (lr_actions[..., :d] - ours.float()[..., :d]).abs()
            row["vs_lerobot_max_abs"] = float(diff.max())
            row["vs_lerobot_mean_abs"] = float(diff.mean())
            row["action_scale"] = float(lr_actions[..., :d].abs().mean())
    if args.profile:
        row["profile"] = profile(native, inputs, noise, args.steps, dev)
    if not args.skip_server:
        row["server"] = server_latency(graphed, b, max(5, args.iters // max(1, b // 2)), obs)
        stage("server")
    results[f"batch_{b}"] = row
    print(json.dumps({f"batch_{b}": row}), flush=True)


def ref_batch(obs: list[dict], ref: object, ours: object) -> dict:
    """LeRobot's preprocessed batch for ``obs`` (the same processor pipeline our policy runs)."""
    batch = {
        "observation.images.image": torch.stack([parity._chw(o["observation/image"]) for o in obs]),
        "observation.images.image2": torch.stack([parity._chw(o["observation/wrist_image"]) for o in obs]),
        "observation.state": torch.from_numpy(np.stack([o["observation/state"] for o in obs])),
        "task": [o["prompt"] for o in obs],
    }
    return ours.preprocessor(batch)  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
