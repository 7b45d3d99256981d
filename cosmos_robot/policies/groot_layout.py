"""Isaac-GR00T's observation layouts at the edge, for any served policy (``serve --groot-layout``).

GR00T's sim clients (``--use-sim-policy-wrapper``; its LIBERO, RoboCasa and SimplerEnv rollouts)
send one ZMQ request per *vector* of environments, with the batch axis on the wire:

- ``video.<camera>``: uint8 (B, T, H, W, 3); ``state.<group>``: float (B, T, d) per state group;
  ``annotation.human.action.task_description`` (or ``annotation.human.task_description``,
  ``annotation.human.coarse_action``): B strings;
- the reply: ``action.<group>``: float32 (B, chunk_size, d) per action group.

N1.5's flat format is the same without the batch axis (``video.*`` (T, H, W, 3), ``state.*``
(T, d), one instruction; ``action.*`` (chunk_size, d)). N1.6's real-robot clients (its SO100
example) send what ``Gr00tPolicy.check_observation`` reads, nested and batched: ``{"video":
{camera: (B, T, H, W, 3)}, "state": {group: (B, T, d)}, "language": {key: [[str]] * B}}``, and read
``action[group][b][t]`` from ``{group: (B, chunk_size, d)}`` (no ``action.`` prefix).

``Gr00tLayoutPolicy`` splits such a request into B observations in the inner policy's own keys
(``observation/<camera>``, the state groups concatenated in the layout's order as
``observation/state``, ``prompt``), answers them with ONE ``infer_batch`` call, and splits the
chunks' columns back into the action groups, in the layout the request came in. Requests that
already use the inner policy's keys pass through unchanged, so openpi clients keep working on the
same server. The layout's modality config is served at GR00T's ``get_modality_config`` endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy, BatchPolicy, supports_batch
from cosmos_robot_client.spec import InputSpec, ObservationError

__all__ = ["LAYOUTS", "Gr00tLayout", "Gr00tLayoutPolicy"]

LANGUAGE_KEYS = (
    "annotation.human.action.task_description",
    "annotation.human.task_description",
    "annotation.human.coarse_action",
)


@dataclass(frozen=True)
class Gr00tLayout:
    """One embodiment's flat keys: cameras -> wire keys, ordered state and action groups with widths."""

    name: str
    video: tuple[tuple[str, str], ...]  # (GR00T key, inner policy key)
    state: tuple[tuple[str, int], ...]
    action: tuple[tuple[str, int], ...]
    chunk_size: int  # action rows per reply (GR00T's action_horizon; announced in the modality config)
    language: str = LANGUAGE_KEYS[0]  # the instruction's key in the modality config

    def modality_config(self) -> dict[str, Any]:
        """GR00T's ``ModalityConfig`` tables (``delta_indices`` + ``modality_keys``) for this layout."""
        return {
            "video": {"delta_indices": [0], "modality_keys": [k.removeprefix("video.") for k, _ in self.video]},
            "state": {"delta_indices": [0], "modality_keys": [k.removeprefix("state.") for k, _ in self.state]},
            "action": {
                "delta_indices": list(range(self.chunk_size)),
                "modality_keys": [k.removeprefix("action.") for k, _ in self.action],
            },
            "language": {"delta_indices": [0], "modality_keys": [self.language]},
        }


# GR00T's libero_panda embodiment: 256 px agent view + wrist view, eef pose (6 x 1) + 2 finger joints,
# actions eef deltas (6 x 1) + gripper, 16 steps (its LIBERO eval executes the first 8)
LAYOUTS = {
    "libero": Gr00tLayout(
        name="libero",
        video=(("video.image", "observation/image"), ("video.wrist_image", "observation/wrist_image")),
        state=(
            ("state.x", 1),
            ("state.y", 1),
            ("state.z", 1),
            ("state.roll", 1),
            ("state.pitch", 1),
            ("state.yaw", 1),
            ("state.gripper", 2),
        ),
        action=(
            ("action.x", 1),
            ("action.y", 1),
            ("action.z", 1),
            ("action.roll", 1),
            ("action.pitch", 1),
            ("action.yaw", 1),
            ("action.gripper", 1),
        ),
        chunk_size=16,
    ),
    # GR00T N1.6's SO100/SO101 example (gr00t/eval/real_robot/SO100): front + wrist camera, 5 arm
    # joints + gripper in degrees, the same groups as actions, 16 steps
    "so100": Gr00tLayout(
        name="so100",
        video=(("video.front", "observation/image"), ("video.wrist", "observation/wrist_image")),
        state=(("state.single_arm", 5), ("state.gripper", 1)),
        action=(("action.single_arm", 5), ("action.gripper", 1)),
        chunk_size=16,
        language="annotation.human.task_description",
    ),
}


class Gr00tLayoutPolicy(BatchPolicy):
    """``inner`` behind GR00T's flat layout as well as its own keys (see the module docstring)."""

    def __init__(self, inner: BasePolicy, layout: Gr00tLayout) -> None:
        self.inner, self.layout = inner, layout

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            **self.inner.metadata,
            "groot_layout": self.layout.name,
            "modality_config": self.layout.modality_config(),
        }

    @property
    def input_spec(self) -> InputSpec | None:
        return None  # two layouts are accepted; each request is checked here, naming the key

    def reset(self) -> None:
        self.inner.reset()

    def example_observation(self) -> dict[str, Any] | None:
        return self.inner.example_observation()  # the inner policy's own keys are accepted as they are

    def _split(self, obs: Mapping[str, Any], index: int) -> tuple[list[dict[str, Any]], bool]:
        """GR00T flat obs -> inner observations, and whether it carried a batch axis."""
        lay = self.layout
        missing = [k for k, _ in lay.video + lay.state if k not in obs]
        lang_key = next((k for k in LANGUAGE_KEYS if k in obs), None)
        if missing or lang_key is None:
            key = missing[0] if missing else lay.language
            raise ObservationError(key, f"observation {index}: missing for GR00T's {lay.name} layout")
        first = np.asarray(obs[lay.video[0][0]])
        if first.ndim not in (4, 5) or first.shape[-1] != 3:
            raise ObservationError(
                lay.video[0][0], f"observation {index}: expected (B, T, H, W, 3) or (T, H, W, 3), got {first.shape}"
            )
        batched = first.ndim == 5
        b = first.shape[0] if batched else 1
        texts = obs[lang_key]
        texts = [texts] if isinstance(texts, str) else [str(t) for t in np.asarray(texts, dtype=object).reshape(-1)]
        if len(texts) not in (1, b):
            raise ObservationError(lang_key, f"observation {index}: {len(texts)} instructions for a batch of {b}")
        out = []
        for i in range(b):
            item: dict[str, Any] = {}
            for gkey, wire in lay.video:
                v = np.asarray(obs[gkey])
                if v.shape != first.shape:
                    raise ObservationError(gkey, f"observation {index}: shape {v.shape}, expected {first.shape}")
                item[wire] = v[i, -1] if batched else v[-1]
            parts = []
            for gkey, width in lay.state:
                s = np.asarray(obs[gkey], dtype=np.float32)
                row = s[i] if batched else s
                row = row.reshape(-1, width)[-1] if row.size % width == 0 and row.size else None
                if row is None:
                    raise ObservationError(gkey, f"observation {index}: expected width {width}, got shape {s.shape}")
                parts.append(row)
            item["observation/state"] = np.concatenate(parts)
            item["prompt"] = texts[i] if len(texts) == b else texts[0]
            out.append(item)
        return out, batched

    def _flatten(self, obs: Mapping[str, Any], index: int) -> dict[str, Any]:
        """N1.6's nested ``{video, state, language}`` observation -> the flat keys ``_split`` reads."""
        flat: dict[str, Any] = {}
        for group in ("video", "state", "language"):
            part = obs.get(group)
            if not isinstance(part, Mapping):
                raise ObservationError(
                    group, f"observation {index}: GR00T's nested layout needs a map here, got {type(part).__name__}"
                )
            for key, value in part.items():
                flat[str(key) if group == "language" else f"{group}.{key}"] = value
        for gkey, _ in self.layout.video:
            video = flat.get(gkey)
            if video is not None and np.ndim(video) != 5:
                raise ObservationError(
                    gkey, f"observation {index}: the nested layout needs (B, T, H, W, 3), got {np.shape(video)}"
                )
        for key in LANGUAGE_KEYS:
            if key in flat:  # [[str] * T] * B -> the latest instruction of each env
                texts = flat[key]
                if isinstance(texts, str):
                    texts = [texts]
                flat[key] = [
                    t if isinstance(t, str) else str(np.asarray(t, dtype=object).reshape(-1)[-1]) for t in texts
                ]
        return flat

    def _pack(self, chunks: Sequence[np.ndarray], batched: bool, nested: bool = False) -> dict[str, Any]:
        acts = np.stack([np.asarray(c, dtype=np.float32) for c in chunks])  # (B, H, D)
        need = sum(w for _, w in self.layout.action)
        if acts.shape[-1] != need:
            raise ValueError(
                f"the policy answers {acts.shape[-1]}-D actions; the {self.layout.name} layout needs {need}"
            )
        out, col = {}, 0
        for key, width in self.layout.action:
            part = acts[..., col : col + width]
            out[key.removeprefix("action.") if nested else key] = part if batched else part[0]
            col += width
        return out

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        plan: list[tuple[str, int, bool]] = []  # (kind, how many inner observations, batched)
        inner_obs: list[dict[str, Any]] = []
        for i, obs in enumerate(obs_batch):
            if isinstance(obs.get("video"), Mapping):
                items, batched = self._split(self._flatten(obs, i), i)
                plan.append(("nested", len(items), batched))
                inner_obs.extend(items)
            elif any(str(k).startswith("video.") for k in obs):
                items, batched = self._split(obs, i)
                plan.append(("groot", len(items), batched))
                inner_obs.extend(items)
            else:
                plan.append(("plain", 1, False))
                inner_obs.append(dict(obs))
        if supports_batch(self.inner):
            results = self.inner.infer_batch(inner_obs)  # type: ignore[attr-defined]
        else:
            results = [self.inner.infer(o) for o in inner_obs]
        out, pos = [], 0
        for kind, n, batched in plan:
            part = results[pos : pos + n]
            pos += n
            chunks = [r["actions"] for r in part]
            out.append(part[0] if kind == "plain" else self._pack(chunks, batched, nested=kind == "nested"))
        return out
