"""The transform protocol and its by-name registry (for saving pipelines in checkpoints)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Transform", "register_transform", "run_transforms", "transforms_from_config", "transforms_to_config"]

_REGISTRY: dict[str, type[Any]] = {}


@runtime_checkable
class Transform(Protocol):
    def __call__(self, data: dict[str, Any]) -> dict[str, Any]: ...


def register_transform(cls: type[Any]) -> type[Any]:
    """Class decorator: make a frozen dataclass transform saveable by its class name."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__}: transforms must be (frozen) dataclasses")
    _REGISTRY[cls.__name__] = cls
    return cls


def run_transforms(transforms: Sequence[Transform], data: dict[str, Any]) -> dict[str, Any]:
    for t in transforms:
        data = t(data)
    return data


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def transforms_to_config(transforms: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for t in transforms:
        name = type(t).__name__
        if name not in _REGISTRY:
            raise TypeError(f"transform {name} is not registered; decorate it with @register_transform")
        fields = {f.name: _jsonable(getattr(t, f.name)) for f in dataclasses.fields(t)}
        out.append({"name": name, **fields})
    return out


def transforms_from_config(items: Sequence[dict[str, Any]]) -> list[Any]:
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"transforms[{i}]: expected a table with a 'name', got {item!r}")
        name = item["name"]
        cls = _REGISTRY.get(name)
        if cls is None:
            hint = difflib.get_close_matches(name, list(_REGISTRY), n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else f" (known: {sorted(_REGISTRY)})"
            raise ValueError(f"transforms[{i}]: unknown transform {name!r}{extra}")
        kwargs = {k: v for k, v in item.items() if k != "name"}
        try:
            out.append(cls(**kwargs))
        except TypeError as exc:
            raise ValueError(f"transforms[{i}] ({name}): {exc}") from exc
    return out
