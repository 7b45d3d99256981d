"""Parity of our native pi0.5 (``cosmos_robot.policies.pi05``) with LeRobot 0.6.1's ``PI05Policy``.

Both load the SAME folder, written by LeRobot (``PI05Policy.save_pretrained`` + its processor
pipelines), and answer the same observations from the same initial noise:

- the action chunk after LeRobot's pre/post-processors (``predict_action_chunk`` vs ``infer_batch``);
- one training loss (``PI05Policy.forward`` vs ``Pi05Model.flow_loss``) at a fixed noise and time.

    .venv/bin/python benchmarks/parity_pi05.py --size tiny                   # CPU, seconds
    python benchmarks/parity_pi05.py --size full --device cuda --dtype bfloat16   # H200: the released sizes

``--size full`` builds the released architecture (gemma_2b + gemma_300m + SigLIP so400m) with random
weights through LeRobot's stock config. LeRobot cannot build any other size: for ``--size tiny`` this
script shrinks LeRobot's size table at run time (``get_gemma_config``, the PaliGemma vision config and
the projector it hard-codes to 2048) and then uses LeRobot's own classes unchanged, and writes
``pi05_architecture.json`` so that our loader knows the sizes. Prints a JSON report; exits 1 when
the largest difference exceeds ``--atol``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
from torch import nn

TINY = {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8}
TINY_VISION = {"width": 32, "depth": 1, "num_heads": 2}


@contextlib.contextmanager
def lerobot_tiny_sizes() -> Iterator[None]:
    """Make LeRobot's PI05 build the tiny sizes (restored on exit); LeRobot's code is otherwise untouched."""
    import lerobot.policies.pi05.modeling_pi05 as m

    saved = (m.get_gemma_config, m.CONFIG_MAPPING, m.PaliGemmaWithExpertModel.__init__)
    stock_mapping = m.CONFIG_MAPPING

    class _Mapping:
        def __getitem__(self, key: str):
            factory = stock_mapping[key]
            if key != "paligemma":
                return factory

            def make(*args, **kwargs):
                cfg = factory(*args, **kwargs)
                cfg.vision_config.hidden_size = TINY_VISION["width"]
                cfg.vision_config.num_hidden_layers = TINY_VISION["depth"]
                cfg.vision_config.num_attention_heads = TINY_VISION["num_heads"]
                return cfg

            return make

    stock_init = m.PaliGemmaWithExpertModel.__init__

    def init(self, *args, **kwargs):
        stock_init(self, *args, **kwargs)
        self.paligemma.model.multi_modal_projector.linear = nn.Linear(TINY_VISION["width"], TINY["width"])
        self.paligemma.config.vision_config.projection_dim = TINY["width"]

    m.get_gemma_config = lambda variant: m.GemmaConfig(**TINY)
    m.CONFIG_MAPPING = _Mapping()
    m.PaliGemmaWithExpertModel.__init__ = init
    try:
        yield
    finally:
        m.get_gemma_config, m.CONFIG_MAPPING, m.PaliGemmaWithExpertModel.__init__ = saved


def make_config(size: str, device: str, dtype: str):
    """LeRobot's PI05Config for two 224 px cameras, an 8-D state and 7-D actions."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi05 import PI05Config

    chunk = 10 if size == "tiny" else 50
    return PI05Config(
        device=device,
        dtype=dtype,
        chunk_size=chunk,
        n_action_steps=chunk,
        tokenizer_max_length=48 if size == "tiny" else 200,
        input_features={
            "observation.images.image": PolicyFeature(FeatureType.VISUAL, (3, 224, 224)),
            "observation.images.image2": PolicyFeature(FeatureType.VISUAL, (3, 224, 224)),
            "observation.state": PolicyFeature(FeatureType.STATE, (8,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (7,))},
    )


def make_reference(size: str, device: str, dtype: str, seed: int):
    """LeRobot's PI05Policy with random weights, plus its config, stats and our byte tokenizer."""
    from lerobot.policies.pi05 import PI05Policy

    from cosmos_robot.policies.pi05.tokenizer import make_byte_tokenizer

    cfg = make_config(size, device, dtype)
    torch.manual_seed(seed)
    ctx = lerobot_tiny_sizes() if size == "tiny" else contextlib.nullcontext()
    with ctx:
        policy = PI05Policy(cfg)
    # LeRobot zero-initialises the adaptive-norm projections and the RMSNorm scales; randomise every
    # parameter so that a wrong wiring cannot hide behind zeros.
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    with torch.no_grad():
        for p in policy.parameters():
            p.copy_((torch.randn(p.shape, generator=gen, device=device) * 0.05).to(p.dtype))
    return policy, cfg, make_stats(seed), make_byte_tokenizer()


def make_stats(seed: int) -> dict[str, dict[str, list[float]]]:
    rng = np.random.default_rng(seed)
    return {"observation.state": _quantile_stats(rng, 8), "action": _quantile_stats(rng, 7)}


def build_reference(size: str, folder: Path, device: str, dtype: str, seed: int):
    """``make_reference`` saved as a LeRobot folder (plus ``tokenizer/`` and, tiny, the sizes file)."""
    from cosmos_robot.policies.pi05.modeling import GemmaSpec, Pi05Architecture, VisionSpec
    from cosmos_robot.policies.pi05.policy import build_processors

    policy, cfg, stats, tokenizer = make_reference(size, device, dtype, seed)
    pre, post = build_processors(cfg, stats, tokenizer)
    policy.save_pretrained(folder)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)
    tokenizer.save_pretrained(str(folder / "tokenizer"))
    if size == "tiny":
        arch = Pi05Architecture(
            vlm=GemmaSpec(**TINY),
            expert=GemmaSpec(**TINY),
            vision=VisionSpec(**TINY_VISION),
            chunk_size=cfg.chunk_size,
            max_action_dim=cfg.max_action_dim,
        )
        (folder / "pi05_architecture.json").write_text(json.dumps(arch.to_dict(), indent=2))
    return policy, pre, post


def _quantile_stats(rng: np.random.Generator, dim: int) -> dict[str, list[float]]:
    lo = rng.uniform(-2, -0.5, dim)
    hi = rng.uniform(0.5, 2, dim)
    mean = (lo + hi) / 2
    return {
        "mean": mean.tolist(),
        "std": ((hi - lo) / 4).tolist(),
        "min": (lo * 1.2).tolist(),
        "max": (hi * 1.2).tolist(),
        "q01": lo.tolist(),
        "q99": hi.tolist(),
    }


def observations(batch: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    prompts = ["pick up the black bowl and place it on the plate", "open the top drawer"]
    return [
        {
            "observation/image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
            "observation/state": rng.uniform(-1, 1, 8).astype(np.float32),
            "prompt": prompts[i % len(prompts)],
        }
        for i in range(batch)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "full"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--atol", type=float, default=None, help="default 1e-4 (float32) / 5e-2 (bfloat16)")
    ap.add_argument("--folder", type=Path, default=None, help="where to write the LeRobot folder (default: temp)")
    args = ap.parse_args(argv)
    atol = args.atol if args.atol is not None else (1e-4 if args.dtype == "float32" else 5e-2)

    from cosmos_robot.policies.pi05.policy import Pi05Policy

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp) / "pi05"
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        ref, pre, post = build_reference(args.size, folder, args.device, args.dtype, args.seed)
        built = time.perf_counter() - t0
        ours = Pi05Policy.from_pretrained(folder, device=args.device)
        loaded = time.perf_counter() - t0 - built
        obs = observations(args.batch, args.seed)
        gen = torch.Generator().manual_seed(args.seed + 7)
        noise = torch.randn((args.batch, ref.config.chunk_size, ref.config.max_action_dim), generator=gen)

        # LeRobot: its preprocessor, predict_action_chunk with the given noise, its postprocessor
        ref.eval()
        batch = {
            "observation.images.image": torch.stack([_chw(o["observation/image"]) for o in obs]),
            "observation.images.image2": torch.stack([_chw(o["observation/wrist_image"]) for o in obs]),
            "observation.state": torch.from_numpy(np.stack([o["observation/state"] for o in obs])),
            "task": [o["prompt"] for o in obs],
        }
        with torch.no_grad():
            processed = pre(batch)
            ref_chunk = ref.predict_action_chunk(processed, noise=noise.to(args.device))
            ref_actions = post(ref_chunk).float().cpu().numpy()
        our_actions = np.stack([r["actions"] for r in ours.infer_batch(obs, noise=noise)])

        # one training loss at a fixed (noise, time)
        actions = torch.from_numpy(
            np.random.default_rng(args.seed + 3).uniform(-1, 1, (args.batch, ref.config.chunk_size, 7))
        )
        t = torch.full((args.batch,), 0.37)
        with torch.no_grad():
            images, img_masks = ref._preprocess_images(processed)
            tokens, masks = processed["observation.language.tokens"], processed["observation.language.attention_mask"]
            padded = ref.prepare_action({"action": actions.float().to(args.device)})
            ref_loss = ref.model.forward(
                images, img_masks, tokens, masks, padded, noise.to(args.device), t.to(args.device)
            )
            inputs = ours.prepare(obs)
            our_loss = ours.model.flow_loss(
                inputs.images,
                inputs.image_masks,
                inputs.tokens,
                inputs.token_mask,
                padded,
                noise.to(args.device),
                t.to(args.device),
            )
        report = {
            "size": args.size,
            "device": args.device,
            "dtype": args.dtype,
            "params_million": round(sum(p.numel() for p in ours.model.parameters()) / 1e6, 2),
            "build_s": round(built, 2),
            "load_s": round(loaded, 2),
            "action_max_abs_diff": float(np.abs(ref_actions - our_actions).max()),
            "action_scale": float(np.abs(ref_actions).max()),
            "loss_max_abs_diff": float((ref_loss.float() - our_loss.float()).abs().max()),
            "loss_scale": float(ref_loss.float().abs().max()),
            "atol": atol,
        }
    report["ok"] = report["action_max_abs_diff"] <= atol and report["loss_max_abs_diff"] <= atol * max(
        1.0, report["loss_scale"]
    )
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def _chw(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(img.astype(np.float32) / 255.0).permute(2, 0, 1).contiguous()


if __name__ == "__main__":
    sys.exit(main())
