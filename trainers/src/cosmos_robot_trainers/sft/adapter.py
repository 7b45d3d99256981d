"""What the SFT loop needs from a policy family, and nothing else (``SFTAdapter``).

Why a Protocol: the loop (batch -> flow loss -> update -> EMA -> checkpoint -> eval -> export) is the
same for every flow-matching family; what differs is where the model comes from (a ``[model]`` table or
an ``init`` folder), how demonstrations become batches (our normalisation, or LeRobot's preprocessor
and tokenizer), the loss's masking and the serving policy the weights are exported as. The family
registry names each family's adapter (``Family.sft``); ``run_sft`` asks for it and never compares
family names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_trainers.common.export import EMA
from cosmos_robot_trainers.sft.config import AugmentConfig, FinetuneConfig, SFTConfig

__all__ = ["SFTAdapter", "SFTData", "refuse_finetune"]


class SFTData(Protocol):
    """Training frames held in memory; batches are a pure function of (indices, generator state)."""

    num_episodes: int

    def __len__(self) -> int: ...

    def sample_weights(self, weighting: str) -> np.ndarray | None: ...

    def fingerprint(self) -> dict[str, Any]: ...  # what a resumed run checks against its checkpoint

    def batch(
        self, indices: np.ndarray, augment: AugmentConfig | None, generator: torch.Generator, text_buckets: int
    ) -> dict[str, Any]: ...

    def shard_batch(self, batch: dict[str, Any], lo: int, hi: int) -> dict[str, Any]: ...  # samples lo:hi

    def loss_mass(self, batch: dict[str, Any]) -> float: ...  # what the loss divides by (up to a constant)


@runtime_checkable
class SFTAdapter(Protocol):
    """One family's SFT pieces; ``load_base`` is called first (``init`` is None for a new model)."""

    def load_base(self, config: SFTConfig, init: Path | None) -> None: ...

    def load_data(self, config: SFTConfig) -> SFTData: ...

    def build_model(self, config: SFTConfig, device: torch.device) -> nn.Module: ...

    def flow_loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor: ...

    def sample_time(self, model: nn.Module, n: int, generator: torch.Generator) -> torch.Tensor: ...

    def param_groups(self, model: nn.Module, config: SFTConfig) -> list[dict[str, Any]]: ...  # AdamW's groups

    def servable(self, model: nn.Module, data: SFTData, ema: EMA | None) -> BatchPolicy: ...  # with save_pretrained


def refuse_finetune(config: SFTConfig, family: str) -> None:
    """A family without ``[finetune]`` choices refuses any, naming the field (never silently ignored)."""
    default = FinetuneConfig()
    changed = [
        f"finetune.{k}" for k in type(default).model_fields if getattr(config.finetune, k) != getattr(default, k)
    ]
    if changed:
        raise ValueError(f"{', '.join(changed)}: the {family} family has no such choice (GR00T's SFT has)")
