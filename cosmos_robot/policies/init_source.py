"""What a recipe's ``init`` names: a checkpoint folder, or ``tiny:<family>`` (built on first use).

Why ``tiny:<family>``: debug recipes must run as a newcomer types them (``cosmos-robot train
debug_joint_ppo_groot``) without a separate command that writes a tiny model first. The family
registry's ``tiny`` writer builds it once under ``runs/tiny/<family>`` (or ``$COSMOS_ROBOT_TINY_DIR``),
under a file lock (Ray workers resolve ``init`` too); a marker file written last makes an interrupted
build start over instead of loading half a folder.

A folder that does not exist is an error that names the command that makes it: a recipe's output
(``runs/<recipe>/final``) names ``cosmos-robot train <recipe>``; anything else lists the choices.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from cosmos_robot.config.recipes import RECIPES_DIR
from cosmos_robot.manifest import verify_manifest
from cosmos_robot.policies.registry import FAMILIES, CheckpointError, get_family

__all__ = ["TINY_PREFIX", "resolve_init", "tiny_root"]

TINY_PREFIX = "tiny:"
_MARKER = ".tiny.json"


def tiny_root() -> Path:
    """Where ``tiny:<family>`` checkpoints are built (``$COSMOS_ROBOT_TINY_DIR``, default ``runs/tiny``)."""
    return Path(os.environ.get("COSMOS_ROBOT_TINY_DIR", "runs/tiny"))


def resolve_init(init: str, *, field: str = "init", log: Callable[[str], None] = print) -> Path:
    """The checkpoint folder ``init`` names, building a ``tiny:<family>`` one when it is missing."""
    if init.startswith(TINY_PREFIX):
        return _tiny(init[len(TINY_PREFIX) :], field, log)
    path = Path(init)
    if path.exists():
        if path.is_dir():
            verify_manifest(path)  # an exported folder's files must match its manifest.json
        return path
    raise CheckpointError(f"{field}: checkpoint folder {path} does not exist; {_how_to_make(path)}")


def _tiny(name: str, field: str, log: Callable[[str], None]) -> Path:
    try:
        family = get_family(name)
    except CheckpointError as exc:
        raise CheckpointError(f"{field}: {TINY_PREFIX}{name}: {exc}") from None
    root = tiny_root() / family.name
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{family.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # Ray workers and parallel runs may ask at the same time: one builds
        marker = root / _MARKER
        if marker.is_file():
            return root / json.loads(marker.read_text())["folder"]
        if root.exists():
            shutil.rmtree(root)  # an interrupted build
        log(f"{field}: building a tiny random {family.name} checkpoint in {root} (first use; reused afterwards)")
        folder = family.write_tiny(root)
        marker.write_text(json.dumps({"family": family.name, "folder": folder.relative_to(root).as_posix()}))
        return folder


def _how_to_make(path: Path) -> str:
    parts = path.parts
    if len(parts) >= 2 and parts[0] == "runs" and (RECIPES_DIR / f"{parts[1]}.toml").is_file():
        return f"it is made by `cosmos-robot train {parts[1]}` (run that first)"
    tiny = ", ".join(f"{TINY_PREFIX}{n}" for n, f in sorted(FAMILIES.items()) if f.tiny is not None)
    return (
        "pass a checkpoint folder (what `cosmos-robot serve --ckpt` takes, e.g. a run's final/ folder) "
        f"or a tiny random model built on first use ({tiny})"
    )
