"""Vector transforms: join observation vectors into the one state a model reads.

Why its own transform: a camera-free policy reads the robot state and the simulator's object state as
one normalised vector, while clients send them under separate wire keys (``observation/state``,
``observation/object_state``); saving the join in ``policy.json`` keeps serving identical to training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cosmos_robot.transforms.base import register_transform

__all__ = ["ConcatKeys"]


@register_transform
@dataclass(frozen=True)
class ConcatKeys:
    """Concatenate 1-D vectors ``keys`` (in order) into ``out``, e.g. robot state + object state -> ``state``;
    with ``flatten``, arrays too, each flattened row-major (AlpaSim's (16, 3) ego history).

    A missing key or (without ``flatten``) a value that is not a flat vector is an error naming the key
    and its shape."""

    keys: tuple[str, ...]
    out: str
    flatten: bool = False

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        parts = []
        for key in self.keys:
            if key not in data:
                raise KeyError(f"observation is missing {key!r} (needed for {self.out!r}; got keys {sorted(data)})")
            value = np.asarray(data[key])
            if self.flatten:
                value = value.reshape(-1)
            if value.ndim != 1:
                raise ValueError(f"{key}: expected a flat vector to join into {self.out!r}, got shape {value.shape}")
            parts.append(value.astype(np.float32, copy=False))
        out = {k: v for k, v in data.items() if k not in self.keys}
        out[self.out] = np.concatenate(parts)
        return out
