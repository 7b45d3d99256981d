"""Declared observation specs, so a bad request fails at the edge with an error naming the key.

A policy declares ``InputSpec({"observation/image": ArraySpec((224, 224, 3), "uint8"), "prompt":
TextSpec()})``; the server checks every request against it before batching and answers a mismatch
with e.g. ``observation/image: expected shape (224, 224, 3), got (224, 224)``. The spec is also
announced to clients in the server metadata (``to_dict``), so they know what to send.

Dtypes are either an exact numpy name (``"uint8"``, ``"float32"``) or a family: ``"floating"``,
``"integer"``, ``"number"`` (LIBERO clients send float64 state where a model computes in float32).
Shapes use ``None`` for a free dimension; ``alt_shapes`` lists other accepted shapes, because real
clients disagree on some fields (DROID clients send the gripper as ``(1,)`` or as a 0-D scalar,
and openpi's ``DroidInputs`` accepts both). A field that accepts ``()`` also takes a plain Python number.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

__all__ = ["ArraySpec", "InputSpec", "ObservationError", "TextSpec"]

_FAMILIES: dict[str, Any] = {
    "floating": np.floating,
    "integer": np.integer,
    "number": np.number,
    "bool": np.bool_,
}


class ObservationError(ValueError):
    """An observation that does not match the policy's input spec; ``key`` names the field."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True)
class ArraySpec:
    """An array field: shape with ``None`` wildcards and a dtype name or family."""

    shape: tuple[int | None, ...]
    dtype: str = "number"
    optional: bool = False
    description: str = ""
    alt_shapes: tuple[tuple[int | None, ...], ...] = ()  # other accepted shapes, e.g. ((),) for a scalar too

    def __post_init__(self) -> None:
        if self.dtype not in _FAMILIES:
            try:
                np.dtype(self.dtype)
            except TypeError as exc:
                raise ValueError(f"ArraySpec.dtype: unknown dtype {self.dtype!r}") from exc

    def dtype_ok(self, dtype: np.dtype) -> bool:
        family = _FAMILIES.get(self.dtype)
        if family is not None:
            return bool(np.issubdtype(dtype, family))
        return bool(dtype == np.dtype(self.dtype))

    @property
    def shapes(self) -> tuple[tuple[int | None, ...], ...]:
        """Every accepted shape, the main one first."""
        return (self.shape, *self.alt_shapes)

    def shape_ok(self, shape: tuple[int, ...]) -> bool:
        return any(
            len(shape) == len(want) and all(w is None or w == g for w, g in zip(want, shape)) for want in self.shapes
        )

    def check(self, key: str, value: Any) -> None:
        if isinstance(value, np.generic):
            value = np.asarray(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and () in self.shapes:
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise ObservationError(
                key, f"expected an array of shape {self.describe_shape()} {self.dtype}, got {type(value).__name__}"
            )
        if not self.shape_ok(value.shape):
            raise ObservationError(key, f"expected shape {self.describe_shape()}, got {_fmt_shape(value.shape)}")
        if not self.dtype_ok(value.dtype):
            raise ObservationError(key, f"expected dtype {self.dtype}, got {value.dtype}")

    def describe_shape(self) -> str:
        return " or ".join(_fmt_shape(s) for s in self.shapes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "array",
            "shape": list(self.shape),
            "dtype": self.dtype,
            "optional": self.optional,
        }
        if self.alt_shapes:
            out["alt_shapes"] = [list(s) for s in self.alt_shapes]
        return out


@dataclass(frozen=True)
class TextSpec:
    """A string field such as ``prompt``."""

    optional: bool = False
    description: str = ""

    def check(self, key: str, value: Any) -> None:
        if not isinstance(value, str):
            raise ObservationError(key, f"expected a string, got {type(value).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "text", "optional": self.optional}


FieldSpec = Union[ArraySpec, TextSpec]


@dataclass(frozen=True)
class InputSpec:
    """The full observation contract of a policy."""

    fields: Mapping[str, FieldSpec]
    allow_extra: bool = False
    ignored_keys: frozenset[str] = field(default_factory=frozenset)
    # alternative key sets (their fields declared optional): an observation holds all keys of exactly one,
    # e.g. cosmos3 DROID takes the three camera views or the canvas a RoboLab client composed from them
    layouts: tuple[tuple[str, ...], ...] = ()

    def validate(self, obs: Any) -> None:
        """Raise ``ObservationError`` naming the first offending key; return silently when valid."""
        if not isinstance(obs, Mapping):
            raise ObservationError("<observation>", f"expected a map of named fields, got {type(obs).__name__}")
        for key, spec in self.fields.items():
            if key not in obs:
                if spec.optional:
                    continue
                raise ObservationError(key, f"missing required key (expected keys: {sorted(self.fields)})")
            spec.check(key, obs[key])
        self._check_layouts(obs)
        if not self.allow_extra:
            for key in obs:
                if key in self.fields or key in self.ignored_keys:
                    continue
                hint = difflib.get_close_matches(str(key), list(self.fields), n=1)
                extra = f"; did you mean {hint[0]!r}?" if hint else f" (expected keys: {sorted(self.fields)})"
                raise ObservationError(str(key), f"unknown key{extra}")

    def _check_layouts(self, obs: Mapping[str, Any]) -> None:
        if not self.layouts:
            return
        choices = " or ".join(str(list(layout)) for layout in self.layouts)
        complete = [layout for layout in self.layouts if all(k in obs for k in layout)]
        if not complete:
            closest = max(self.layouts, key=lambda layout: sum(k in obs for k in layout))  # first of the best
            missing = next(k for k in closest if k not in obs)
            raise ObservationError(missing, f"missing required key (send all keys of one layout: {choices})")
        chosen = set(complete[0])
        for layout in self.layouts:
            for key in layout:
                if key in obs and key not in chosen:
                    raise ObservationError(
                        key, f"mixes two layouts: {sorted(chosen)} is complete; send the keys of one of {choices}"
                    )

    def to_dict(self) -> dict[str, Any]:
        return {key: spec.to_dict() for key, spec in self.fields.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, allow_extra: bool = False) -> InputSpec:
        """Rebuild a spec announced in server metadata (the inverse of ``to_dict``)."""
        fields: dict[str, FieldSpec] = {}
        for key, item in data.items():
            if not isinstance(item, Mapping) or item.get("kind") not in ("array", "text"):
                raise ValueError(f"input_spec[{key!r}]: expected a map with kind 'array' or 'text', got {item!r}")
            if item["kind"] == "text":
                fields[key] = TextSpec(optional=bool(item.get("optional", False)))
            else:
                shape = _parse_shape(item.get("shape", ()))
                alts = tuple(_parse_shape(s) for s in item.get("alt_shapes", ()))
                fields[key] = ArraySpec(
                    shape, str(item.get("dtype", "number")), bool(item.get("optional", False)), alt_shapes=alts
                )
        return cls(fields, allow_extra=allow_extra)

    def example(self, *, free_dim: int = 1, image_size: int = 224, prompt: str = "do something") -> dict[str, Any]:
        """A zero-filled observation that satisfies the spec (client bring-up, warm-up, probes).

        Free dimensions are ``free_dim``, except the height and width of image-like fields
        (``(H, W, 3)`` or ``(3, H, W)``), which are ``image_size``. With layouts, the keys of the
        first layout are used and those of the others left out."""
        first = set(self.layouts[0]) if self.layouts else set()
        others = {k for layout in self.layouts[1:] for k in layout} - first
        obs: dict[str, Any] = {}
        for key, spec in self.fields.items():
            if key in others:
                continue
            if isinstance(spec, TextSpec):
                obs[key] = prompt
                continue
            family = {"floating": "float32", "integer": "int64", "number": "float32", "bool": "bool"}
            dtype = np.dtype(family.get(spec.dtype, spec.dtype))
            shape = list(spec.shape)
            if len(shape) == 3 and (shape[-1] == 3 or shape[0] == 3):
                spatial = (0, 1) if shape[-1] == 3 else (1, 2)
                for i in spatial:
                    shape[i] = image_size if shape[i] is None else shape[i]
            obs[key] = np.zeros(tuple(free_dim if d is None else d for d in shape), dtype=dtype)
        return obs


def _parse_shape(dims: Any) -> tuple[int | None, ...]:
    return tuple(None if d is None else int(d) for d in dims)


def _fmt_shape(shape: tuple[int | None, ...]) -> str:
    inner = ", ".join("*" if d is None else str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"
