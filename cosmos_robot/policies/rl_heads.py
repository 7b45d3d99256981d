"""Pieces every VLA family's RL hooks share (``pi05.rl``, ``groot.rl``).

- ``FlowSpec``: the sizes the shared flow samplers read from ``model.config`` (chain rows and
  width, flow steps, Flow-SDE noise level);
- ``value_head``: the critic on pooled observation features, built the same way every time (a
  fixed seed, the last layer zero so the first values are 0), so runs are reproducible;
- ``openpi_flow_time``: openpi's training distribution of flow times, Beta(1.5, 1) scaled to
  [0.001, 1], drawn by inverse CDF from a given generator (NFT / DPO / SFT noise levels);
- ``masked_mean``: the critic's pooling of a token sequence over its valid tokens;
- ``VLARLModel``: the ``RLModel`` methods those families answer alike (openpi's flow times, and a
  Flow-Noise request refused: none of them has a learned noise head).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from cosmos_robot.policies.interfaces import RLModel

__all__ = ["VLA_NOISE_LEVEL", "FlowSpec", "VLARLModel", "masked_mean", "openpi_flow_time", "value_head"]

VLA_NOISE_LEVEL = 0.5  # Flow-SDE a of the VLA families when the recipe gives none (RLinf / flow-GRPO default)


class FlowSpec(BaseModel):
    """The sampler-facing sizes: chain rows (``chunk_size``) and width (``action_dim``, the padded width)."""

    model_config = ConfigDict(frozen=True)

    chunk_size: int
    action_dim: int
    num_flow_steps: int
    noise_level: float = 0.5


def value_head(width: int, seed: int = 0) -> nn.Sequential:
    """``Linear -> SiLU -> Linear(1)``, initialised from ``seed`` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        last = nn.Linear(width, 1)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        return nn.Sequential(nn.Linear(width, width), nn.SiLU(), last)


def openpi_flow_time(n: int, generator: torch.Generator | None = None, device: Any = None) -> torch.Tensor:
    gen_device = generator.device if generator is not None else device
    u = torch.rand((n,), generator=generator, device=gen_device).to(device)
    return u.pow(1.0 / 1.5) * 0.999 + 0.001


def masked_mean(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B, L, W)`` features averaged over the positions ``mask`` ``(B, L)`` keeps (a row keeping none: 0)."""
    m = mask.to(features.dtype)[..., None]
    return (features * m).sum(1) / m.sum(1).clamp_min(1.0)


class VLARLModel(RLModel):
    """A VLA family's ``RLModel``: openpi's flow-time draw, and no learned noise head (Flow-Noise refused)."""

    family: ClassVar[str]  # named in errors

    def noise_std(self, features: Any) -> torch.Tensor:
        raise ValueError(f"{self.family} has no learned noise head: use rollout.sample_mode = 'flow_sde' (or 'ode')")

    def sample_time(self, n: int, generator: torch.Generator | None = None, device: Any = None) -> torch.Tensor:
        return openpi_flow_time(n, generator, device)
