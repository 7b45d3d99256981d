"""Training-run folders as the trainers write them (``save_checkpoint``, ``config.resolved.json``), built
directly from a model's state dict so exporter tests do not need a whole training run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from cosmos_robot_trainers.common.checkpoint import save_checkpoint
from cosmos_robot_trainers.common.rundir import CHECKPOINTS, CONFIG_FILE


def perturbed(state: Mapping[str, torch.Tensor], seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    """A copy of ``state`` with every float tensor moved (what some training would do)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        k: (v + scale * torch.randn(v.shape, generator=gen).to(v.dtype)) if v.is_floating_point() else v.clone()
        for k, v in state.items()
    }


def write_run(
    root: Path,
    config: dict[str, Any],
    checkpoints: Mapping[int, Mapping[str, torch.Tensor]],
    extra_state: dict[str, Any] | None = None,
) -> Path:
    """``root/config.resolved.json`` + ``root/checkpoints/step_XXXXXX`` for each (step, model state)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    for step, state in checkpoints.items():
        save_checkpoint(root / CHECKPOINTS, step, dict(state), {"optimizer": {}, **(extra_state or {})})
    return root
