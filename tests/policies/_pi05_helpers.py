"""Tiny pi0.5 policies for tests (``cosmos_robot.policies.pi05.tiny``) and openpi-style observations."""

from __future__ import annotations

from typing import Any

import numpy as np

from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot.policies.pi05.tiny import build_tiny_pi05

STATE_DIM, ACTION_DIM = 8, 7


def tiny_pi05(seed: int = 0, chunk: int = 10, n_action_steps: int = 5) -> Pi05Policy:
    return build_tiny_pi05(seed=seed, chunk=chunk, n_action_steps=n_action_steps)


def libero_obs(seed: int, size: int = 64, prompt: str = "put the bowl on the plate") -> dict[str, Any]:
    """An observation as openpi's LIBERO client sends it."""
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
        "observation/state": rng.uniform(-1, 1, STATE_DIM).astype(np.float64),
        "prompt": prompt,
    }
