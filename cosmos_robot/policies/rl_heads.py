"""Pieces every VLA family's RL hooks share (``pi05.rl``, ``groot.rl``).

- ``FlowSpec``: the sizes the shared flow samplers read from ``model.config`` (chain rows and
  width, flow steps, Flow-SDE noise level);
- ``value_head``: the critic on pooled observation features, built the same way every time (a
  fixed seed, the last layer zero so the first values are 0), so runs are reproducible;
- ``openpi_flow_time``: openpi's training distribution of flow times, Beta(1.5, 1) scaled to
  [0.001, 1], drawn by inverse CDF from a given generator (NFT / DPO / SFT noise levels).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

__all__ = ["FlowSpec", "openpi_flow_time", "value_head"]


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
