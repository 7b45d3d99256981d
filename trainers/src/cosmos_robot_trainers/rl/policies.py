"""The RL trainer's view of a checkpoint: the family registry's ``RLAdapter`` for its folder.

Each family implements ``cosmos_robot.policies.interfaces.RLAdapter`` in its own package
(``cosmos_robot/policies/<family>/rl.py``); this module only asks the registry for it, so the trainer
never compares family names and a new family needs no change here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from cosmos_robot.policies.interfaces import RLAdapter, RLModel
from cosmos_robot.policies.registry import family_of

__all__ = ["RLAdapter", "RLModel", "frozen_copy", "load_rl_adapter"]

M = TypeVar("M", bound=nn.Module)


def load_rl_adapter(
    path: str | Path, device: torch.device | str = "cpu", noise_level: float | None = None, freeze_vlm: bool = False
) -> RLAdapter:
    """The RL adapter for a checkpoint folder of any family that supports RL."""
    return family_of(path).rl_adapter(path, device=device, noise_level=noise_level, freeze_vlm=freeze_vlm)


def frozen_copy(model: M) -> M:
    """A deep copy in eval mode with gradients off (reference / NFT old policy)."""
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen
