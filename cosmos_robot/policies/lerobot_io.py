"""The edge between wire observations and LeRobot policy batches, shared by the LeRobot families.

Why one place: every LeRobot checkpoint (``pi05``, ``groot``) names its inputs the same way
(``observation.images.<cam>``, ``observation.state``, the ``task`` string), while clients speak
openpi's dialect (``observation/<cam>``, ``observation/state``, ``prompt``) or LeRobot's. ``LeRobotIO``
reads the checkpoint's input features and

- lists the accepted names per input (LeRobot's, openpi's, and for LIBERO's ``image``/``image2``
  cameras also ``observation/image`` / ``observation/wrist_image``; for LeRobot's DROID cameras
  ``exterior_1_left``/``exterior_2_left``/``wrist_left`` openpi's DROID names), announced in server metadata;
- for a DROID checkpoint (DROID camera names), also builds the state from openpi's DROID pair
  ``observation/joint_position`` + ``observation/gripper_position`` (``(1,)`` or a 0-D scalar), as
  openpi's ``DroidInputs`` does: ``state = [q, g]``, so openpi/RoboLab DROID clients work unchanged;
- validates a request before any tensor work, naming the missing, doubled or malformed key;
- stacks a batch of observations into LeRobot's batch dict (cameras as (B, 3, H, W) float in
  [0, 1], whatever mix of HxWx3 uint8 and 3xHxW float the clients sent).

``check_processor_states`` reads the processors' ``state_file`` tensors (normalisation stats) before
LeRobot does: a missing or truncated stats file is a ``CheckpointError`` naming that file, where
LeRobot's pipeline loader would end in a bare ``SafetensorError``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.registry import CheckpointError, read_json
from cosmos_robot_client.spec import ArraySpec, InputSpec, ObservationError, TextSpec

__all__ = [
    "IGNORED_KEYS",
    "STATE_KEY",
    "TASK_KEY",
    "LeRobotIO",
    "LeRobotIOPolicy",
    "check_processor_states",
    "feature_type",
    "image_tensor",
]

STATE_KEY, TASK_KEY = "observation.state", "task"
# openpi LIBERO clients name the cameras by role; LeRobot's LIBERO checkpoints call them image/image2, and its
# DROID dataset (droid_1.0.1) exterior_1_left/exterior_2_left/wrist_left where openpi's DROID keys add "image_"
_ROLE_ALIASES = {
    "image": ("observation/image",),
    "image2": ("observation/wrist_image",),
    "exterior_1_left": ("observation/exterior_image_1_left",),
    "exterior_2_left": ("observation/exterior_image_2_left",),
    "wrist_left": ("observation/wrist_image_left",),
}
_DROID_CAMERAS = frozenset(
    {"exterior_1_left", "exterior_2_left", "wrist_left", "exterior_image_1_left", "exterior_image_2_left",
     "wrist_image_left"}
)  # fmt: skip
JOINT_KEY, GRIPPER_KEY = "observation/joint_position", "observation/gripper_position"
IGNORED_KEYS = frozenset({"observation/object_state", "session_id", "endpoint"})


def check_processor_states(root: Path, pipelines: Sequence[str]) -> None:
    """Every ``state_file`` the processor pipelines ``pipelines`` (JSON files in ``root``) name exists
    and is a complete safetensors file of finite float tensors; else a ``CheckpointError`` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    for name in pipelines:
        steps = read_json(root / name).get("steps", [])
        if not isinstance(steps, list):
            raise CheckpointError(f"{root / name}: 'steps' must be a list of processor steps")
        for step in steps:
            state = step.get("state_file") if isinstance(step, dict) else None
            if state is None:
                continue
            path = root / str(state)
            if not isinstance(state, str) or Path(state).name != state or not path.is_file():
                raise CheckpointError(f"{root / name}: its state_file {state!r} is not a file in {root}")
            try:
                tensors = load_file(str(path))
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(f"{path}: not a complete safetensors file ({exc}); truncated copy?") from exc
            for key, t in tensors.items():
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    raise CheckpointError(f"{path}: tensor {key!r} holds NaN or inf (normalisation stats)")


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


def stack_images(values: Sequence[Any], key: str, device: torch.device | str | None = None) -> torch.Tensor:
    """One camera's images of a batch -> (B, 3, H, W) float32 in [0, 1], on ``device`` (default: CPU).

    The served case, HxWx3 uint8 images of one shape, is stacked as uint8 and converted in one
    operation where it will be used: on a GPU the host sends a quarter of the bytes (from pinned
    memory, asynchronously) and does no per-pixel work; the values are those of :func:`image_tensor`
    bit for bit (x / 255 in float32 either way). Anything else goes image by image through
    :func:`image_tensor`, which names the observation and problem of a bad one."""
    arrays = [np.asarray(v) for v in values]
    first = arrays[0] if arrays else None
    fast = first is not None and first.ndim == 3 and first.shape[-1] == 3 and first.shape[0] != 3
    if fast and all(a.dtype == np.uint8 and a.shape == first.shape for a in arrays):  # type: ignore[union-attr]
        raw = torch.from_numpy(np.stack(arrays))
        dev = torch.device(device) if device is not None else raw.device
        if dev.type == "cuda":
            raw = raw.pin_memory().to(dev, non_blocking=True)
        # a divisor on the device: CUDA divides by a CPU scalar as a multiply by its reciprocal (1 ulp off)
        scale = torch.full((), 255.0, dtype=torch.float32, device=raw.device)
        return (raw.permute(0, 3, 1, 2).to(torch.float32) / scale).contiguous()
    out = torch.stack([image_tensor(v, key, i) for i, v in enumerate(arrays)])
    return out if device is None else out.to(device)


class LeRobotIO:
    """Accepted names, validation and batching for a checkpoint's ``input_features``."""

    def __init__(self, input_features: Mapping[str, Any]) -> None:
        self.camera_keys = [k for k, f in input_features.items() if feature_type(f) == "VISUAL"]
        self.state_dim = int(input_features[STATE_KEY].shape[0]) if STATE_KEY in input_features else 0
        shorts = {k.removeprefix("observation.images.") for k in self.camera_keys}
        # openpi's DROID state pair (joint positions + gripper) -> observation.state
        self.state_parts = (JOINT_KEY, GRIPPER_KEY) if self.state_dim >= 2 and shorts & _DROID_CAMERAS else ()
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
                    if self.state_parts:
                        fields[JOINT_KEY] = ArraySpec(
                            (self.state_dim - 1,), "number", optional=True, description="DROID joints: state[:-1]"
                        )
                        fields[GRIPPER_KEY] = ArraySpec(
                            (1,), "number", optional=True, alt_shapes=((),), description="DROID gripper: state[-1]"
                        )
                else:
                    fields[name] = ArraySpec(
                        (None, None, None), "number", optional=True, description=f"{key}: HxWx3 uint8 or 3xHxW float"
                    )
        return InputSpec(fields, allow_extra=False, ignored_keys=IGNORED_KEYS)

    def example(self, image_size: int = 224, prompt: str = "do something") -> dict[str, Any]:
        """A valid observation under LeRobot's own keys: gray HxWx3 uint8 cameras, zero state."""
        obs: dict[str, Any] = {}
        for key, names in self.aliases.items():
            if key == TASK_KEY:
                obs[names[0]] = prompt
            elif key == STATE_KEY:
                obs[names[0]] = np.zeros(self.state_dim, dtype=np.float32)
            else:
                obs[names[0]] = np.full((image_size, image_size, 3), 128, dtype=np.uint8)
        return obs

    @property
    def expected_keys(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.aliases.items()}

    @property
    def state_from(self) -> dict[str, list[str]]:
        """Inputs that may instead be composed from several keys (announced in server metadata)."""
        return {STATE_KEY: list(self.state_parts)} if self.state_parts else {}

    def canonical(self, obs: Mapping[str, Any], index: int) -> dict[str, Any]:
        """One observation under LeRobot's keys; every missing or doubled key is an error naming it."""
        self.spec.validate(obs)
        out: dict[str, Any] = {}
        for key, names in self.aliases.items():
            given = [n for n in names if n in obs]
            if key == STATE_KEY and self.state_parts:
                parts = [n for n in self.state_parts if n in obs]
                if parts and given:
                    raise ObservationError(parts[0], f"observation {index}: {given[0]!r} already gives the state")
                if parts:
                    out[key] = self._droid_state(obs, index)
                    continue
            if len(given) > 1:
                raise ObservationError(
                    given[1], f"observation {index}: {given[0]!r} and {given[1]!r} are the same input"
                )
            if not given:
                close = difflib.get_close_matches(names[-1], [str(k) for k in obs], n=1)
                hint = f" (got {close[0]!r}?)" if close else ""
                alt = f" or the pair {list(self.state_parts)}" if key == STATE_KEY and self.state_parts else ""
                raise ObservationError(names[0], f"observation {index}: missing; send one of {list(names)}{alt}{hint}")
            out[key] = obs[given[0]]
        return out

    def _droid_state(self, obs: Mapping[str, Any], index: int) -> np.ndarray:
        """openpi's ``DroidInputs``: ``[joint_position, gripper_position]`` (a 0-D gripper becomes 1-D)."""
        for name in self.state_parts:
            if name not in obs:
                other = next(n for n in self.state_parts if n != name)
                raise ObservationError(name, f"observation {index}: missing; {other!r} needs it to form the state")
        joints = np.asarray(obs[JOINT_KEY], np.float32)
        gripper = np.asarray(obs[GRIPPER_KEY], np.float32).reshape(-1)
        return np.concatenate([joints, gripper])

    def batch(self, obs_batch: Sequence[Mapping[str, Any]], image_device: Any = None) -> dict[str, Any]:
        """LeRobot's raw batch: cameras (B, 3, H, W) float in [0, 1] (on ``image_device``, default the
        CPU: see :func:`stack_images`), state (B, D) float32, task list."""
        items = [self.canonical(obs, i) for i, obs in enumerate(obs_batch)]
        batch: dict[str, Any] = {TASK_KEY: [str(item[TASK_KEY]) for item in items]}
        for key in self.camera_keys:
            batch[key] = stack_images([item[key] for item in items], key, image_device)
        if self.state_dim:
            batch[STATE_KEY] = torch.from_numpy(np.stack([np.asarray(it[STATE_KEY], np.float32) for it in items]))
        return batch


class LeRobotIOPolicy:
    """Mixin of the LeRobot families' serving policies: the input spec and warm-up example come from ``io``."""

    io: LeRobotIO

    @property
    def input_spec(self) -> InputSpec:
        return self.io.spec

    def example_observation(self) -> dict[str, Any]:
        return self.io.example()
