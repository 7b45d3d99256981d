"""Recipes: TOML files in ``recipes/`` (or any path) plus ``--set a.b=c`` overrides.

``load_recipe("debug", ["train.steps=4"], Model)`` finds ``recipes/debug.toml``, applies the
overrides (values parsed as TOML literals, so ``lr=3e-4``, ``tasks=["reach","push"]`` and
``name="x"`` all work; a bare word stays a string), and validates against ``Model``. A wrong
recipe name gets the list of recipes and a "did you mean"; a wrong key names the dotted path, and
an error caused by an override names that ``--set`` argument rather than the recipe file.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, TypeVar

import tomllib
from pydantic import BaseModel, ValidationError

from cosmos_robot.config.base import ConfigError, format_validation_error

__all__ = ["RECIPES_DIR", "apply_overrides", "find_recipe", "load_recipe", "parse_override"]

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
M = TypeVar("M", bound=BaseModel)


def find_recipe(name_or_path: str | Path, recipes_dir: Path = RECIPES_DIR) -> Path:
    """A recipe path from a name (``debug``), a file name (``debug.toml``) or a path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        return path
    candidate = recipes_dir / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    if candidate.exists():
        return candidate
    names = sorted(p.stem for p in recipes_dir.glob("*.toml")) if recipes_dir.exists() else []
    hint = difflib.get_close_matches(path.stem, names, n=1)
    extra = f"; did you mean {hint[0]!r}?" if hint else ""
    raise ConfigError(f"recipe {str(name_or_path)!r} not found{extra} (recipes in {recipes_dir}: {', '.join(names)})")


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` -> (``["train", "lr"]``, ``0.0003``)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part.isidentifier() for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted KEY like train.lr=3e-4")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: a string
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``KEY=VALUE`` applied (tables created as needed)."""
    out = copy.deepcopy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"--set {item!r}: {where} is a value ({child!r}), not a table")
            node = child
        node[path[-1]] = value
    return out


def load_recipe(name_or_path: str | Path, overrides: list[str] | None, model: type[M]) -> M:
    """Find, read, override and validate a recipe."""
    path = find_recipe(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    data = apply_overrides(data, overrides or [])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, source=str(path), overrides=overrides or [])) from exc
