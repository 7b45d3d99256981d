"""Training checkpoints: ``<root>/step_XXXXXX/`` folders written atomically, newest one resumed.

Layout of one checkpoint folder:

- ``model.safetensors``: the model's ``state_dict`` (safetensors: no code runs when it is read);
- ``trainer_state.pt``: optimizer, scheduler, RNG snapshots, data-sampler position and step, loaded
  with ``torch.load(weights_only=True)``, so only tensors and plain containers are accepted;
- ``trainer_state.json``: the step and a few human-readable facts (what ``ls`` should tell you).

Why write into a hidden temporary folder and rename: a run killed while saving (SIGKILL, OOM, a
pre-empted machine) must never leave a half-written ``step_*`` folder that the next resume would
pick up. ``os.replace`` of a folder is atomic on POSIX, so a ``step_*`` folder is always complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

__all__ = ["Checkpoint", "checkpoint_dirs", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
MODEL_FILE = "model.safetensors"
STATE_FILE = "trainer_state.pt"
INFO_FILE = "trainer_state.json"


@dataclass
class Checkpoint:
    """One loaded checkpoint."""

    path: Path
    step: int
    model: dict[str, torch.Tensor]
    state: dict[str, Any]


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_dirs(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoint folders under ``root`` as ``(step, path)``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / STATE_FILE).exists() and (child / MODEL_FILE).exists():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    dirs = checkpoint_dirs(root)
    return dirs[-1][1] if dirs else None


def save_checkpoint(
    root: str | Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    state: dict[str, Any],
    info: dict[str, Any] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Write ``step_XXXXXX`` atomically; then keep only the ``keep_last`` newest folders (None: all)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".{final.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model_state.items()}
    save_file(tensors, str(tmp / MODEL_FILE), metadata={"step": str(step)})
    torch.save({**state, "step": step}, tmp / STATE_FILE)
    (tmp / INFO_FILE).write_text(json.dumps({"step": step, **(info or {})}, indent=2, default=str) + "\n")
    for name in (MODEL_FILE, STATE_FILE):
        with open(tmp / name, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep_last is not None and keep_last > 0:
        for _, old in checkpoint_dirs(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a folder written by ``save_checkpoint``; a missing file is an error naming it."""
    path = Path(path)
    for name in (MODEL_FILE, STATE_FILE):
        if not (path / name).exists():
            raise FileNotFoundError(f"checkpoint {path} is incomplete: missing {name}")
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"{path / STATE_FILE}: not a trainer state (no 'step')")
    return Checkpoint(path=path, step=int(state["step"]), model=load_file(str(path / MODEL_FILE)), state=state)
