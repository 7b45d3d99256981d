"""The edge between wire observations and LeRobot policy batches, shared by the LeRobot families.

Why one place: every LeRobot checkpoint (``pi05``, ``groot``) names its inputs the same way
(``observation.images.<cam>``, ``observation.state``, the ``task`` string), while clients speak
openpi's dialect (``observation/<cam>``, ``observation/state``, ``prompt``) or LeRobot's. ``LeRobotIO``
reads the checkpoint's input features and

- lists the accepted names per input (LeRobot's, openpi's, and for LIBERO's ``image``/``image2``
  cameras also ``observation/image`` / ``observation/wrist_image``), announced in server metadata;
- validates a request before any tensor work, naming the missing, doubled or malformed key;
- stacks a batch of observations into LeRobot's batch dict (cameras as (B, 3, H, W) float in
  [0, 1], whatever mix of HxWx3 uint8 and 3xHxW float the clients sent).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cosmos_robot_client.spec import ArraySpec, InputSpec, ObservationError, TextSpec

__all__ = ["IGNORED_KEYS", "STATE_KEY", "TASK_KEY", "LeRobotIO", "feature_type", "image_tensor"]

STATE_KEY, TASK_KEY = "observation.state", "task"
# openpi LIBERO clients name the cameras by role; LeRobot's LIBERO checkpoints call them image/image2
_ROLE_ALIASES = {"image": ("observation/image",), "image2": ("observation/wrist_image",)}
IGNORED_KEYS = frozenset({"observation/object_state", "session_id", "endpoint"})


def feature_type(feature: Any) -> str:
    """A LeRobot ``PolicyFeature``'s type name (``VISUAL``, ``STATE``, ...)."""
    kind = getattr(feature, "type", None)
    return str(getattr(kind, "value", kind))


def image_tensor(value: Any, key: str, index: int) -> torch.Tensor:
    """HxWx3 uint8 / 3xHxW float in [0, 1] -> (3, H, W) float32 in [0, 1]."""
    arr = np.asarray(value)
    if arr.ndim != 3 or 3 not in (arr.shape[0], arr.shape[-1]):
        raise ObservationError(key, f"observation {index}: expected HxWx3 or 3xHxW, got shape {arr.shape}")
    if arr.dtype == np.uint8:
        t = torch.from_numpy(arr.astype(np.float32) / 255.0)
    elif np.issubdtype(arr.dtype, np.floating):
        t = torch.from_numpy(arr.astype(np.float32))
        if t.numel() and (float(t.min()) < -1e-3 or float(t.max()) > 1.0 + 1e-3):
            raise ObservationError(
                key, f"observation {index}: float images must be in [0, 1], got [{t.min():.3g}, {t.max():.3g}]"
            )
    else:
        raise ObservationError(key, f"observation {index}: expected uint8 or float, got {arr.dtype}")
    if arr.shape[-1] == 3 and arr.shape[0] != 3:
        t = t.permute(2, 0, 1)
    return t.contiguous()


class LeRobotIO:
    """Accepted names, validation and batching for a checkpoint's ``input_features``."""

    def __init__(self, input_features: Mapping[str, Any]) -> None:
        self.camera_keys = [k for k, f in input_features.items() if feature_type(f) == "VISUAL"]
        self.state_dim = int(input_features[STATE_KEY].shape[0]) if STATE_KEY in input_features else 0
        self.aliases = self._aliases()
        self.spec = self._build_spec()

    def _aliases(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for key in self.camera_keys:
            short = key.removeprefix("observation.images.")
            out[key] = tuple(dict.fromkeys((key, f"observation/{short}", *_ROLE_ALIASES.get(short, ()))))
        if self.state_dim:
            out[STATE_KEY] = (STATE_KEY, "observation/state")
        out[TASK_KEY] = (TASK_KEY, "prompt")
        return out

    def _build_spec(self) -> InputSpec:
        fields: dict[str, ArraySpec | TextSpec] = {}
        for key, names in self.aliases.items():
            for name in names:
                if key == TASK_KEY:
                    fields[name] = TextSpec(optional=True, description="task instruction")
                elif key == STATE_KEY:
                    fields[name] = ArraySpec((self.state_dim,), "number", optional=True, description="robot state")
                else:
                    fields[name] = ArraySpec(
                        (None, None, None), "number", optional=True, description=f"{key}: HxWx3 uint8 or 3xHxW float"
                    )
        return InputSpec(fields, allow_extra=False, ignored_keys=IGNORED_KEYS)

    @property
    def expected_keys(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.aliases.items()}

    def canonical(self, obs: Mapping[str, Any], index: int) -> dict[str, Any]:
        """One observation under LeRobot's keys; every missing or doubled key is an error naming it."""
        self.spec.validate(obs)
        out: dict[str, Any] = {}
        for key, names in self.aliases.items():
            given = [n for n in names if n in obs]
            if len(given) > 1:
                raise ObservationError(
                    given[1], f"observation {index}: {given[0]!r} and {given[1]!r} are the same input"
                )
            if not given:
                close = difflib.get_close_matches(names[-1], [str(k) for k in obs], n=1)
                hint = f" (got {close[0]!r}?)" if close else ""
                raise ObservationError(names[0], f"observation {index}: missing; send one of {list(names)}{hint}")
            out[key] = obs[given[0]]
        return out

    def batch(self, obs_batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """LeRobot's raw batch: cameras (B, 3, H, W) float in [0, 1], state (B, D) float32, task list."""
        items = [self.canonical(obs, i) for i, obs in enumerate(obs_batch)]
        batch: dict[str, Any] = {TASK_KEY: [str(item[TASK_KEY]) for item in items]}
        for key in self.camera_keys:
            batch[key] = torch.stack([image_tensor(item[key], key, i) for i, item in enumerate(items)])
        if self.state_dim:
            batch[STATE_KEY] = torch.from_numpy(np.stack([np.asarray(it[STATE_KEY], np.float32) for it in items]))
        return batch
