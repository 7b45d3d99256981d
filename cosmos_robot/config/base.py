"""``StrictModel``: the base of every config; unknown fields are errors that name the field."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ConfigError", "StrictModel", "format_validation_error"]


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field (dotted path) and the problem."""


class StrictModel(BaseModel):
    """Config base: forbid unknown fields, validate defaults and assignments."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_assignment=True)


def _field_names(model: type[BaseModel] | None, path: tuple[Any, ...]) -> list[str]:
    """The field names available at ``path`` inside ``model`` (for "did you mean")."""
    current: Any = model
    for part in path:
        if current is None or not isinstance(current, type) or not issubclass(current, BaseModel):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = field.annotation
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _blame(loc: tuple[Any, ...], overrides: Sequence[str]) -> str | None:
    """The ``--set`` argument(s) behind an error at ``loc``: those that set ``loc`` or a field inside it
    (a table's validator reports at the table) or a table holding it; None when the error is the file's."""
    if not loc:
        return None
    path = tuple(str(p) for p in loc)
    hits = []
    for item in overrides:
        key = tuple(item.partition("=")[0].strip().split("."))
        n = min(len(key), len(path))
        if key[:n] == path[:n]:
            hits.append(item)
    return ", ".join(f"--set {item}" for item in hits) or None


def format_validation_error(
    exc: ValidationError, model: type[BaseModel] | None = None, source: str = "", overrides: Sequence[str] = ()
) -> str:
    """Turn pydantic's error into lines like ``train.lr: Input should be a valid number (got 'abc')``.

    With ``overrides`` (the ``--set KEY=VALUE`` arguments applied to ``source``), a line caused by one
    says so first (``--set train.lr=abc: train.lr: ...``): the user typed that, not the file."""
    lines = []
    blamed = False
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        dotted = ".".join(str(p) for p in loc) or "<root>"
        if err.get("type") == "extra_forbidden":
            names = _field_names(model, loc[:-1])
            hint = difflib.get_close_matches(str(loc[-1]), names, n=1) if names else []
            extra = f"; did you mean {'.'.join([*map(str, loc[:-1]), hint[0]])!r}?" if hint else ""
            known = f" (known: {', '.join(sorted(names))})" if names and not hint else ""
            line = f"{dotted}: unknown field{extra}{known}"
        else:
            got = err.get("input")
            shown = repr(got) if not isinstance(got, dict) else "a table"
            line = f"{dotted}: {err.get('msg')} (got {shown})"
        culprit = _blame(loc, overrides)
        blamed = blamed or culprit is not None
        lines.append(f"{culprit or source}: {line}" if overrides and (culprit or source) else line)
    if blamed:
        return "invalid config:\n  " + "\n  ".join(lines)
    prefix = f"{source}: " if source else ""
    return prefix + "invalid config:\n  " + "\n  ".join(line.removeprefix(prefix) for line in lines)
