"""Training checkpoints: ``<root>/step_XXXXXX/`` folders written atomically, newest one resumed.

Layout of one checkpoint folder:

- ``model.safetensors``: the model's ``state_dict`` (safetensors: no code runs when it is read);
- ``trainer_state.pt``: optimizer, scheduler, RNG snapshots, data-sampler position and step, loaded
  with ``torch.load(weights_only=True)``, so only tensors and plain containers are accepted;
- ``trainer_state.json``: the step and a few human-readable facts (what ``ls`` should tell you).

A *sharded* checkpoint (``save_sharded_checkpoint``; ``train.checkpoint_format = "sharded"``) holds
``sharded/`` instead of ``model.safetensors``: model and optimizer state written by every rank with
``torch.distributed.checkpoint`` (each its own shards, no gathering on one process), read back at any
world size, sharded or not (``load_sharded_into``), and consolidated by the exporter.

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
SHARDED_DIR = "sharded"  # torch.distributed.checkpoint's folder (its ``.metadata`` marks it complete)
STATE_FILE = "trainer_state.pt"
INFO_FILE = "trainer_state.json"


@dataclass
class Checkpoint:
    """One loaded checkpoint."""

    path: Path
    step: int
    model: dict[str, torch.Tensor]  # empty for a sharded checkpoint
    state: dict[str, Any]
    sharded: Path | None = None  # the torch.distributed.checkpoint folder of a sharded checkpoint


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
        if match and child.is_dir() and (child / STATE_FILE).exists() and _has_weights(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def _has_weights(folder: Path) -> bool:
    return (folder / MODEL_FILE).exists() or (folder / SHARDED_DIR / ".metadata").exists()


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
    _publish(tmp, final, step, state, info, keep_last, synced=(MODEL_FILE,))
    return final


def _publish(
    tmp: Path,
    final: Path,
    step: int,
    state: dict[str, Any],
    info: dict[str, Any] | None,
    keep_last: int | None,
    synced: tuple[str, ...] = (),
) -> None:
    """Add the trainer state to the temporary folder, flush it and the ``synced`` files, rename it into
    place (atomic), then keep only the ``keep_last`` newest checkpoint folders."""
    torch.save({**state, "step": step}, tmp / STATE_FILE)
    (tmp / INFO_FILE).write_text(json.dumps({"step": step, **(info or {})}, indent=2, default=str) + "\n")
    for name in (*synced, STATE_FILE):
        with open(tmp / name, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    if keep_last is not None and keep_last > 0:
        for _, old in checkpoint_dirs(final.parent)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a folder written by ``save_checkpoint`` (or the trainer state of a sharded one, whose weights
    ``load_sharded_into`` reads); a missing file is an error naming it."""
    path = Path(path)
    sharded = path / SHARDED_DIR if (path / SHARDED_DIR / ".metadata").exists() else None
    for name in (STATE_FILE,) if sharded else (MODEL_FILE, STATE_FILE):
        if not (path / name).exists():
            raise FileNotFoundError(f"checkpoint {path} is incomplete: missing {name}")
    state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"{path / STATE_FILE}: not a trainer state (no 'step')")
    model = {} if sharded else load_file(str(path / MODEL_FILE))
    return Checkpoint(path=path, step=int(state["step"]), model=model, state=state, sharded=sharded)


def save_sharded_checkpoint(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    info: dict[str, Any] | None,
    keep_last: int | None,
    is_main: bool,
    barrier: Any,
) -> Path:
    """Every rank writes its shards of model and optimizer (``torch.distributed.checkpoint``) into the
    step's temporary folder; rank 0 then adds the trainer state and renames it into place (atomic as
    ``save_checkpoint``). A collective: every rank calls it (``barrier``: the world's barrier)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".{final.name}.tmp"
    if is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    barrier()
    if optimizer.state:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        content = {"model": model_sd, "optim": optim_sd}
    else:  # never stepped (an RL update skipped): get_state_dict would take a zero step; nothing to save
        content = {"model": get_model_state_dict(model)}
    dcp.save(content, checkpoint_id=str(tmp / SHARDED_DIR))
    barrier()
    if is_main:
        _publish(tmp, final, step, state, info, keep_last)
    barrier()
    return final


def load_sharded_into(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A sharded checkpoint's model and optimizer state into ``model`` and ``optimizer``, whatever this
    run's world size and sharding (torch.distributed.checkpoint reshards on load)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    stepped = any(k.startswith("optim.") for k in saved)  # saved before any step: the optimizer stays fresh
    model_sd, optim_sd = get_state_dict(model, optimizer) if stepped else (get_model_state_dict(model), {})
    missing = [k for k in model_sd if f"model.{k}" not in saved]
    if missing:
        raise ValueError(f"{folder}: the sharded checkpoint has no weights for {missing[:5]}")
    # partial: a parameter that never had a gradient (a head the loss does not reach) has no optimizer
    # state in the checkpoint and keeps the fresh one; the model's own keys must all be there
    planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
    content = {"model": model_sd, "optim": optim_sd} if stepped else {"model": model_sd}
    dcp.load(content, checkpoint_id=str(folder), planner=planner)  # in place
    if stepped:
        from cosmos_robot_trainers.common.fsdp import kernels_kept

        with kernels_kept(optimizer):
            set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    else:
        set_model_state_dict(model, model_sd)
