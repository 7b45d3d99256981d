"""Tiny flow configs, stats and observations for the flow-policy tests (built here, nothing downloaded)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cosmos_robot.normalize import FeatureStats, compute_stats
from cosmos_robot.policies.flow import FlowConfig, FlowModel

PROMPTS = ["reach the red target", "push the blue cube to the green goal", "put the red cube in the bowl", "open it"]


def tiny_config(**overrides: Any) -> FlowConfig:
    """A few-thousand-parameter model: every test runs in milliseconds."""
    base: dict[str, Any] = dict(
        image_size=16,
        chunk_size=4,
        num_flow_steps=4,
        encoder_channels=8,
        encoder_convs=1,
        num_keypoints=4,
        state_embed_dim=8,
        text_buckets=64,
        text_dim=8,
        trunk_width=32,
        expert_width=32,
        expert_depth=2,
        time_embed_dim=8,
        value_widths=(16,),
        noise_widths=(16,),
    )
    base.update(overrides)
    return FlowConfig(**base)


def scrambled_model(config: FlowConfig, seed: int = 0) -> FlowModel:
    """A model whose zero-initialised layers (FiLM, heads) are randomised, so every input matters."""
    model = FlowModel(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def tiny_stats(config: FlowConfig, seed: int = 0) -> dict[str, FeatureStats]:
    rng = np.random.default_rng(seed)
    return {
        "state": compute_stats(rng.normal(0.3, 2.0, (64, config.state_dim))),
        "actions": compute_stats(rng.normal(-0.1, 0.5, (64, config.action_dim))),
    }


def make_obs(config: FlowConfig, seed: int = 0, prompt: str = PROMPTS[0], size: int = 24) -> dict[str, Any]:
    """An openpi-style wire observation with images of ``size`` (the policy resizes them)."""
    rng = np.random.default_rng(seed)
    obs: dict[str, Any] = {
        f"observation/{cam}": rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for cam in config.cameras
    }
    if config.state_keys == ("state",):
        obs["observation/state"] = rng.normal(size=config.state_dim).astype(np.float64)
    else:  # the tabletop camera-free layout: the 8-D robot state, then object_state
        obs["observation/state"] = rng.normal(size=8).astype(np.float64)
        obs["observation/object_state"] = rng.normal(size=config.state_dim - 8).astype(np.float32)
    obs["prompt"] = prompt
    return obs


def make_batch(config: FlowConfig, batch: int = 6, seed: int = 0) -> dict[str, Any]:
    """A model batch (normalised state and actions, uint8 images, prompts)."""
    gen = torch.Generator().manual_seed(seed)
    s = config.image_size
    return {
        "images": torch.randint(0, 256, (batch, len(config.cameras), 3, s, s), generator=gen, dtype=torch.uint8),
        "state": torch.randn(batch, config.state_dim, generator=gen),
        "prompt": [PROMPTS[i % len(PROMPTS)] for i in range(batch)],
        "actions": torch.randn(batch, config.chunk_size, config.action_dim, generator=gen),
    }
