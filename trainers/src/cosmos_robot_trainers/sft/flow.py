"""SFT of our ``flow`` family: a new ``FlowModel`` from the recipe's ``[model]`` table.

The data are normalised with stats computed from the demonstrations (``sft.data``), and the exported
``FlowPolicy`` carries those stats, so serving feeds the model exactly what training did.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosmos_robot.policies.flow import FlowModel, FlowPolicy
from cosmos_robot.policies.registry import CheckpointError
from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_trainers.common.export import EMA
from cosmos_robot_trainers.sft.adapter import SFTData, refuse_finetune
from cosmos_robot_trainers.sft.config import SFTConfig
from cosmos_robot_trainers.sft.data import TrainData, load_train_data
from cosmos_robot_trainers.sft.optim import default_param_groups

__all__ = ["FlowSFTAdapter"]


class FlowSFTAdapter:
    supports_fsdp = True  # build_model makes a fresh FlowModel: a whole copy can be rebuilt for export
    """``SFTAdapter`` of the flow family (see ``sft.adapter``)."""

    def load_base(self, config: SFTConfig, init: Path | None) -> None:
        refuse_finetune(config, "flow")
        if init is not None:
            raise CheckpointError(
                f"init: {init} is a flow checkpoint; SFT trains a new flow policy from a [model] table "
                "(to continue a flow policy, post-train it with an RL recipe)"
            )

    def load_data(self, config: SFTConfig) -> SFTData:
        return load_train_data(config.data, config.model)

    def build_model(self, config: SFTConfig, device: torch.device) -> nn.Module:
        return FlowModel(config.model).to(device)

    def flow_loss(
        self, model: nn.Module, batch: dict[str, torch.Tensor], noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        loss, _ = _flow(model).flow_loss(batch, noise=noise, time=time)
        return loss

    def param_groups(self, model: nn.Module, config: SFTConfig) -> list[dict[str, Any]]:
        return default_param_groups(model, config.optim)

    def sample_time(self, model: nn.Module, n: int, generator: torch.Generator) -> torch.Tensor:
        return _flow(model).sample_time(n, generator)

    def servable(self, model: nn.Module, data: SFTData, ema: EMA | None) -> BatchPolicy:
        if not isinstance(data, TrainData):
            raise TypeError(f"FlowSFTAdapter.servable: expected flow TrainData, got {type(data).__name__}")
        served = copy.deepcopy(_flow(model))
        if ema is not None:
            ema.copy_to(served)
        return FlowPolicy(served.eval(), data.stats)


def _flow(model: nn.Module) -> FlowModel:
    if not isinstance(model, FlowModel):
        raise TypeError(f"FlowSFTAdapter: expected a FlowModel, got {type(model).__name__}")
    return model
