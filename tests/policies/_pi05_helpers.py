"""Tiny pi0.5 policies for tests: the real folder format, sizes small enough for a 2-core CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.pi05.modeling import GemmaSpec, Pi05Architecture, Pi05Model, VisionSpec
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot.policies.pi05.tokenizer import make_byte_tokenizer

STATE_DIM, ACTION_DIM = 8, 7


def tiny_arch(chunk: int = 10, image_size: int = 56) -> Pi05Architecture:
    return Pi05Architecture(
        vlm=GemmaSpec(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=8),
        expert=GemmaSpec(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=8),
        vision=VisionSpec(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=14, image_size=image_size),
        vocab_size=260,
        max_action_dim=16,
        chunk_size=chunk,
    )


def lerobot_config(arch: Pi05Architecture, n_action_steps: int = 5, num_steps: int = 4) -> Any:
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
        tokenizer_max_length=48,
        image_resolution=(size, size),
        input_features={
            "observation.images.image": PolicyFeature(FeatureType.VISUAL, (3, size, size)),
            "observation.images.image2": PolicyFeature(FeatureType.VISUAL, (3, size, size)),
            "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
    )


def quantile_stats(dim: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    lo, hi = rng.uniform(-2, -0.5, dim), rng.uniform(0.5, 2, dim)
    return {"mean": ((lo + hi) / 2).tolist(), "std": ((hi - lo) / 4).tolist(), "min": (lo * 1.2).tolist(),
            "max": (hi * 1.2).tolist(), "q01": lo.tolist(), "q99": hi.tolist()}  # fmt: skip


def randomize_(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Random values everywhere (the stock init zeroes the adaptive norms, hiding wiring mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


def tiny_pi05(seed: int = 0, chunk: int = 10, n_action_steps: int = 5) -> Pi05Policy:
    arch = tiny_arch(chunk)
    model = Pi05Model(arch)
    randomize_(model, seed)
    stats = {"observation.state": quantile_stats(STATE_DIM, seed), "action": quantile_stats(ACTION_DIM, seed + 1)}
    return Pi05Policy.from_model(model, lerobot_config(arch, n_action_steps), stats, make_byte_tokenizer())


def libero_obs(seed: int, size: int = 64, prompt: str = "put the bowl on the plate") -> dict[str, Any]:
    """An observation as openpi's LIBERO client sends it."""
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "observation/state": rng.uniform(-1, 1, STATE_DIM).astype(np.float64),
        "prompt": prompt,
    }
