"""The per-episode fields of hand-built ``Rollout``s, shared by the RL tests that make them."""

from __future__ import annotations

from typing import Any

import torch


def episode_fields(success: list[float], groups: list[int], lengths: list[int]) -> dict[str, Any]:
    """``ep_*`` fields of a rollout whose episodes all ran ``reach`` and none crashed."""
    n = len(success)
    return {
        "ep_task": ["reach"] * n,
        "ep_group": torch.tensor(groups),
        "ep_success": torch.tensor(success),
        "ep_return": torch.tensor(success),
        "ep_length": torch.tensor(lengths, dtype=torch.long),
        "ep_failed": torch.zeros(n, dtype=torch.bool),
    }
