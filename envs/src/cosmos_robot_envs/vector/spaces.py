"""Which parts of an observation are fixed-size arrays and which are text, and spaces as plain data.

Why: arrays (camera images, state vectors) go through shared memory, one preallocated (num_envs, ...)
block per key, so a 224x224 image never gets serialised; text (the ``prompt``) has no fixed size and
travels in the small reply message instead. :class:`ObsLayout` makes that split once, from the
observation space, and validates every observation against it with errors that name the key, the
shape and the dtype.

Spaces are described as plain dicts (:func:`space_to_data` / :func:`space_from_data`) so a worker can
tell the parent its spaces over msgpack, without pickle, and the parent can check that every worker
built the same env.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["ActionLayout", "ArrayField", "ObsLayout", "space_from_data", "space_to_data"]

_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiBinary, spaces.MultiDiscrete)


@dataclass(frozen=True)
class ArrayField:
    """One fixed-size array of a single env's observation (or its action)."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _array_field(space: spaces.Space[Any], where: str) -> ArrayField:
    if not isinstance(space, _ARRAY_SPACES):
        raise TypeError(
            f"{where}: space {type(space).__name__} is not supported by the vector layer; "
            "use Box, Discrete, MultiBinary, MultiDiscrete or Text"
        )
    assert space.dtype is not None and space.shape is not None
    return ArrayField(tuple(space.shape), np.dtype(space.dtype))


@dataclass(frozen=True)
class ObsLayout:
    """The observation split: ``arrays`` go to shared memory, ``texts`` travel as strings.

    A plain (non-Dict) space is one array under the key ``""``; ``is_dict`` says which to return.
    """

    is_dict: bool
    arrays: Mapping[str, ArrayField]
    texts: tuple[str, ...]

    @classmethod
    def from_space(cls, space: spaces.Space[Any]) -> ObsLayout:
        if not isinstance(space, spaces.Dict):
            if isinstance(space, spaces.Text):
                return cls(False, {}, ("",))
            return cls(False, {"": _array_field(space, "observation")}, ())
        arrays: dict[str, ArrayField] = {}
        texts: list[str] = []
        for key, sub in space.spaces.items():
            if not isinstance(key, str):
                raise TypeError(f"observation key {key!r} must be a str")
            if isinstance(sub, spaces.Text):
                texts.append(key)
            elif isinstance(sub, spaces.Dict):
                raise TypeError(
                    f"observation[{key!r}]: nested Dict spaces are not supported; flatten the keys "
                    "(e.g. 'observation/image') in a wrapper"
                )
            else:
                arrays[key] = _array_field(sub, f"observation[{key!r}]")
        return cls(True, arrays, tuple(texts))

    def split(self, obs: Any, env_index: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Check one env's observation against the layout; returns (arrays, texts)."""
        if not self.is_dict:
            if self.texts:
                return {}, {"": _as_text(obs, "observation", env_index)}
            return {"": _as_array(obs, self.arrays[""], "observation", env_index)}, {}
        if not isinstance(obs, Mapping):
            raise TypeError(f"env {env_index}: observation must be a dict, got {type(obs).__name__}")
        expected = set(self.arrays) | set(self.texts)
        if set(obs) != expected:
            missing, extra = sorted(expected - set(obs)), sorted(set(obs) - expected)
            raise KeyError(
                f"env {env_index}: observation keys differ from its space (missing {missing}, extra {extra})"
            )
        arrays = {k: _as_array(obs[k], f, f"observation[{k!r}]", env_index) for k, f in self.arrays.items()}
        texts = {k: _as_text(obs[k], f"observation[{k!r}]", env_index) for k in self.texts}
        return arrays, texts


def _as_array(value: Any, field: ArrayField, where: str, env_index: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != field.shape:
        raise ValueError(f"env {env_index}: {where} has shape {arr.shape}, its space says {field.shape}")
    if not np.can_cast(arr.dtype, field.dtype, casting="same_kind"):
        raise TypeError(f"env {env_index}: {where} has dtype {arr.dtype}, its space says {field.dtype}")
    return arr


def _as_text(value: Any, where: str, env_index: int) -> str:
    if not isinstance(value, str):
        raise TypeError(f"env {env_index}: {where} is a Text space but the env returned {type(value).__name__}")
    return value


@dataclass(frozen=True)
class ActionLayout:
    """The action of one env: a fixed-size array (Box, Discrete, MultiBinary or MultiDiscrete)."""

    field: ArrayField

    @classmethod
    def from_space(cls, space: spaces.Space[Any]) -> ActionLayout:
        return cls(_array_field(space, "action"))

    def check_batch(self, actions: Any, num_envs: int) -> np.ndarray:
        arr = np.asarray(actions)
        want = (num_envs, *self.field.shape)
        if arr.shape != want:
            raise ValueError(f"actions have shape {arr.shape}, expected {want} (num_envs, *action_space.shape)")
        if not np.can_cast(arr.dtype, self.field.dtype, casting="same_kind"):
            raise TypeError(f"actions have dtype {arr.dtype}, the action space says {self.field.dtype}")
        return arr.astype(self.field.dtype, copy=False)


def space_to_data(space: spaces.Space[Any]) -> dict[str, Any]:
    """A msgpack-friendly description of ``space`` (the types :class:`ObsLayout` supports)."""
    if isinstance(space, spaces.Box):
        return {"type": "Box", "low": space.low, "high": space.high, "dtype": space.dtype.str}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": space.dtype.str}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec, "start": space.start, "dtype": space.dtype.str}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Text):
        return {
            "type": "Text",
            "max_length": space.max_length,
            "min_length": space.min_length,
            "charset": "".join(sorted(space.character_set)),
        }
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": [[k, space_to_data(s)] for k, s in space.spaces.items()]}
    raise TypeError(
        f"space {type(space).__name__} cannot be described; use Box, Discrete, MultiBinary, "
        "MultiDiscrete, Text or a Dict of those"
    )


def space_from_data(data: Mapping[str, Any]) -> spaces.Space[Any]:
    """Inverse of :func:`space_to_data`."""
    kind = data.get("type")
    if kind == "Box":
        return spaces.Box(np.asarray(data["low"]), np.asarray(data["high"]), dtype=np.dtype(data["dtype"]))
    if kind == "Discrete":
        return spaces.Discrete(data["n"], start=data["start"], dtype=np.dtype(data["dtype"]).type)
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(
            np.asarray(data["nvec"]), dtype=np.dtype(data["dtype"]).type, start=np.asarray(data["start"])
        )
    if kind == "MultiBinary":
        return spaces.MultiBinary(data["n"])
    if kind == "Text":
        return spaces.Text(data["max_length"], min_length=data["min_length"], charset=data["charset"])
    if kind == "Dict":
        return spaces.Dict({k: space_from_data(s) for k, s in data["spaces"]})
    raise ValueError(f"unknown space description type {kind!r}")
