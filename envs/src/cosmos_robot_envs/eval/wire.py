"""Env observation -> wire observation: the one place that knows the openpi key convention.

Why one small module: every policy server this project talks to (ours, openpi's, RoboLab's clients)
speaks flat openpi keys, while each simulator names its observation its own way. A suite plugs in by
giving a key map (LIBERO: ``agentview_image`` -> ``observation/image`` plus a flip); the evaluator
never looks at keys itself.

A policy that announces an ``input_spec`` refusing extra keys gets only the keys it declares, so
privileged simulator state (``observation/object_state``, which the scripted experts need) never
breaks a learned policy's request validation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cosmos_robot_client.spec import InputSpec

__all__ = [
    "DRIVING_KEYS",
    "LIBERO_KEYS",
    "TABLETOP_KEYS",
    "WireMapping",
    "batch_row",
    "reads_images",
    "spec_from_metadata",
]

# env observation key -> wire key (openpi convention)
TABLETOP_KEYS: dict[str, str] = {
    "image": "observation/image",
    "wrist_image": "observation/wrist_image",
    "state": "observation/state",
    "object_state": "observation/object_state",
    "prompt": "prompt",
}

# the driving suite: the flat rig-frame scene vector (privileged: it holds the agents), AlpaSim's own
# ego_history / route arrays and the optional top-down camera (what an AlpaSim driver hands a policy)
DRIVING_KEYS: dict[str, str] = {
    "state": "observation/state",
    "ego_history": "observation/ego_history",
    "route": "observation/route",
    "image": "observation/image",
}

# LIBERO's env already flips its cameras upright and builds openpi's 8-D state
LIBERO_KEYS: dict[str, str] = {k: v for k, v in TABLETOP_KEYS.items() if k != "object_state"}


def batch_row(obs_batch: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Row ``i`` of a vector-layer observation batch (arrays ``(num_envs, ...)``, text as ``list[str]``)."""
    return {key: value[i] for key, value in obs_batch.items()}


class WireMapping:
    """Rename env keys to wire keys; keep only what ``spec`` accepts when it refuses extra keys."""

    def __init__(self, keys: Mapping[str, str], spec: InputSpec | None = None) -> None:
        self.keys = dict(keys)
        self.spec = spec

    def __call__(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        wire: dict[str, Any] = {}
        for env_key, wire_key in self.keys.items():
            if env_key not in obs:
                continue
            if self.spec is not None and not self.spec.allow_extra and wire_key not in self.spec.fields:
                continue
            value = obs[env_key]
            wire[wire_key] = value if isinstance(value, str) else np.ascontiguousarray(value)
        return wire


def spec_from_metadata(metadata: Mapping[str, Any]) -> InputSpec | None:
    """The ``input_spec`` a server announced (None when it announced none or an unreadable one)."""
    raw = metadata.get("input_spec")
    if not isinstance(raw, Mapping):
        return None
    try:
        return InputSpec.from_dict(raw)
    except ValueError:
        return None


def reads_images(spec: InputSpec | None, keys: Mapping[str, str], image_keys: Sequence[str]) -> bool:
    """Whether a policy with input ``spec`` reads any of the env's cameras ``image_keys`` (env keys,
    mapped to wire keys by ``keys``). Without a spec, or one that accepts extra keys, assume it does."""
    if spec is None or spec.allow_extra:
        return True
    return any(keys.get(k) in spec.fields for k in image_keys)
