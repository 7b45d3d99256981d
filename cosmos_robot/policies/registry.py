"""Policy families by name, imported lazily: ``config.json``'s ``type`` -> the family's policy class.

Why lazy: a checkpoint folder names its family, and loading a flow policy must not import
LeRobot's pi05 or diffusers' Cosmos3 (seconds of imports, gigabytes of optional deps). Each entry
is a ``"module:Class"`` string resolved on first use. The folder formats differ per family:

- ours (``flow``): ``config.json`` with ``"type": "flow"``, ``model.safetensors``, ``policy.json``
  (transforms and normalisation stats);
- LeRobot (``pi05``, ``groot``): ``config.json`` with LeRobot's ``"type"``, ``model.safetensors``,
  ``policy_preprocessor.json`` / ``policy_postprocessor.json``;
- diffusers (``cosmos3``): ``model_index.json`` naming the pipeline class.

``detect_family`` tells which one a folder holds; unknown types get a "did you mean".
"""

from __future__ import annotations

import difflib
import importlib
import json
from pathlib import Path
from typing import Any

__all__ = [
    "FAMILIES",
    "CheckpointError",
    "detect_family",
    "load_policy_class",
    "read_json",
    "register_family",
    "require_files",
]

FAMILIES: dict[str, str] = {
    "flow": "cosmos_robot.policies.flow.policy:FlowPolicy",
    "pi05": "cosmos_robot.policies.pi05.policy:Pi05Policy",
    "groot": "cosmos_robot.policies.groot.policy:Gr00tPolicy",
    "cosmos3": "cosmos_robot.policies.cosmos3.policy:Cosmos3Policy",
}


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file, key or tensor."""


def register_family(name: str, target: str) -> None:
    """Add a family (``"module:Class"``); later issues register pi05, groot and cosmos3 here."""
    if ":" not in target:
        raise ValueError(f"register_family({name!r}): target must be 'module:Class', got {target!r}")
    FAMILIES[name] = target


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint JSON file as a dict; a clear ``CheckpointError`` naming the file otherwise."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def require_files(root: Path, names: tuple[str, ...], what: str, note: str = "") -> None:
    """``root`` is a folder holding ``names``; else a ``CheckpointError`` listing what is missing and found."""
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a checkpoint folder (does not exist or is a file)")
    missing = [name for name in names if not (root / name).is_file()]
    if missing:
        found = sorted(p.name for p in root.iterdir())[:12]
        raise CheckpointError(
            f"{root}: missing {', '.join(missing)} (a {what} folder holds {', '.join(names)}{note}; "
            f"found {found or 'nothing'})"
        )


def torch_dtype(value: Any) -> Any:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or a ``torch.dtype``) as a ``torch.dtype``;
    anything else is a ``CheckpointError`` listing the choices."""
    import torch

    if isinstance(value, torch.dtype):
        return value
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if value not in table:
        raise CheckpointError(f"dtype must be one of {sorted(table)}, got {value!r}")
    return table[value]


def detect_family(ckpt_dir: str | Path) -> str:
    """The family name of a checkpoint folder, from ``config.json`` or ``model_index.json``."""
    root = Path(ckpt_dir)
    if not root.exists():
        raise CheckpointError(f"checkpoint folder {root} does not exist")
    if not root.is_dir():
        raise CheckpointError(f"{root} is a file; pass the checkpoint folder that holds config.json")
    if (root / "model_index.json").exists():
        index = read_json(root / "model_index.json")
        cls = str(index.get("_class_name", ""))
        if "cosmos" in cls.lower():
            return "cosmos3"
        raise CheckpointError(f"{root}/model_index.json: diffusers pipeline {cls!r} is not a supported policy family")
    config_path = root / "config.json"
    if not config_path.exists():
        present = sorted(p.name for p in root.iterdir())[:10]
        raise CheckpointError(f"{root}: missing config.json (found {present or 'nothing'})")
    config = read_json(config_path)
    family = config.get("type")
    if not isinstance(family, str) or not family:
        raise CheckpointError(f"{config_path}: missing the 'type' field naming the policy family ({sorted(FAMILIES)})")
    if family not in FAMILIES:
        hint = difflib.get_close_matches(family, list(FAMILIES), n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else f"; known families: {sorted(FAMILIES)}"
        raise CheckpointError(f"{config_path}: unknown policy type {family!r}{extra}")
    return family


def load_policy_class(family: str) -> Any:
    """Import the policy class of ``family``."""
    if family not in FAMILIES:
        hint = difflib.get_close_matches(family, list(FAMILIES), n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else f"; known families: {sorted(FAMILIES)}"
        raise CheckpointError(f"unknown policy type {family!r}{extra}")
    module_name, _, attr = FAMILIES[family].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)
