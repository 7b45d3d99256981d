"""Tiny random pi0.5 checkpoints in LeRobot's folder format, for tests, smoke runs and debug recipes.

The released model is 3.4 B parameters and its tokenizer is gated; this builds the same
architecture at a size a 2-core CPU runs in milliseconds (about 0.3 M parameters, SigLIP on 56 px,
a 260-token byte tokenizer), with every parameter random so that no wiring hides behind zeros.
The folder is what ``Pi05Policy.save_pretrained`` writes: LeRobot's four files plus ``tokenizer/``
and ``pi05_architecture.json``.

    python -m cosmos_robot.policies.pi05.tiny checkpoints/pi05_tiny     # writes the debug-recipe checkpoint
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.pi05.modeling import GemmaSpec, Pi05Architecture, Pi05Model, VisionSpec
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot.policies.pi05.tokenizer import make_byte_tokenizer

__all__ = ["build_tiny_pi05", "quantile_stats", "tiny_architecture", "tiny_lerobot_config"]


def tiny_architecture(chunk: int = 10, image_size: int = 56) -> Pi05Architecture:
    return Pi05Architecture(
        vlm=GemmaSpec(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=8),
        expert=GemmaSpec(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=8),
        vision=VisionSpec(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=14, image_size=image_size),
        vocab_size=260,
        max_action_dim=16,
        chunk_size=chunk,
    )


def tiny_lerobot_config(
    arch: Pi05Architecture,
    state_dim: int = 8,
    action_dim: int = 7,
    n_action_steps: int = 5,
    num_steps: int = 4,
    cameras: tuple[str, ...] = ("image", "image2"),
    tokenizer_max_length: int = 48,
) -> Any:
    """LeRobot's own ``PI05Config``; by default two cameras (``image``, ``image2``), as its LIBERO
    checkpoints name them (DROID: ``("exterior_image_1_left", "wrist_image_left")``)."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi05 import PI05Config

    size = arch.vision.image_size
    return PI05Config(
        device="cpu",
        dtype="float32",
        chunk_size=arch.chunk_size,
        n_action_steps=n_action_steps,
        max_action_dim=arch.max_action_dim,
        num_inference_steps=num_steps,
        tokenizer_max_length=tokenizer_max_length,
        image_resolution=(size, size),
        input_features={
            **{f"observation.images.{cam}": PolicyFeature(FeatureType.VISUAL, (3, size, size)) for cam in cameras},
            "observation.state": PolicyFeature(FeatureType.STATE, (state_dim,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (action_dim,))},
    )


def quantile_stats(dim: int, seed: int, lo: float | None = None, hi: float | None = None) -> dict[str, list[float]]:
    """LeRobot-style stats (mean/std/min/max/q01/q99); random ranges unless ``lo``/``hi`` are given."""
    rng = np.random.default_rng(seed)
    low = np.full(dim, lo) if lo is not None else rng.uniform(-2, -0.5, dim)
    high = np.full(dim, hi) if hi is not None else rng.uniform(0.5, 2, dim)
    return {
        "mean": ((low + high) / 2).tolist(),
        "std": ((high - low) / 4).tolist(),
        "min": (low * 1.2).tolist(),
        "max": (high * 1.2).tolist(),
        "q01": low.tolist(),
        "q99": high.tolist(),
    }


def build_tiny_pi05(
    seed: int = 0,
    chunk: int = 10,
    n_action_steps: int = 5,
    state_dim: int = 8,
    action_dim: int = 7,
    stats: dict[str, dict[str, list[float]]] | None = None,
    scale: float = 0.05,
    cameras: tuple[str, ...] = ("image", "image2"),
    tokenizer_max_length: int = 48,
) -> Pi05Policy:
    """A random tiny ``Pi05Policy`` with LeRobot's processors (random quantile stats unless given); its
    byte tokenizer's prompts are cut at ``tokenizer_max_length`` bytes (48: every test prompt fills it)."""
    arch = tiny_architecture(chunk)
    model = Pi05Model(arch)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    stats = stats or {
        "observation.state": quantile_stats(state_dim, seed),
        "action": quantile_stats(action_dim, seed + 1),
    }
    config = tiny_lerobot_config(
        arch, state_dim, action_dim, n_action_steps, cameras=cameras, tokenizer_max_length=tokenizer_max_length
    )
    return Pi05Policy.from_model(model, config, stats, make_byte_tokenizer())


def write_tiny(out: str | Path, seed: int = 0) -> Path:
    """The tabletop-sized tiny pi0.5 folder (what ``checkpoints/pi05_tiny`` holds) written to ``out``.

    Tabletop units: state within [-1, 1] per dim after clipping, actions in [-1, 1]."""
    stats = {"observation.state": quantile_stats(8, 0, -1.0, 1.0), "action": quantile_stats(7, 0, -1.0, 1.0)}
    return Path(build_tiny_pi05(seed, stats=stats).save_pretrained(out))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="write a tiny random pi0.5 checkpoint folder (LeRobot format)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"wrote {write_tiny(args.out, args.seed)}")


if __name__ == "__main__":
    main()
