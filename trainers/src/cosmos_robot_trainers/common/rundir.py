"""The output folder of a run: fresh, resumed or refused (every trainer: SFT, PPO, GRPO, NFT, DPO).

Why refuse: resuming a folder with a recipe that differs in a training-relevant field (learning
rate, data, model size, steps...) would silently splice two different runs into one loss curve.
The saved ``config.resolved.json`` is compared with the new recipe; differences in the trainer's
runtime fields (logging cadence, output and eval options) are allowed, anything else is an error
naming each field, and ``--overwrite`` starts the folder over.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from cosmos_robot_trainers.common.checkpoint import latest_checkpoint

__all__ = ["CHECKPOINTS", "CONFIG_FILE", "RunDirError", "prepare_run_dir", "training_relevant_diff"]

CONFIG_FILE = "config.resolved.json"
CHECKPOINTS = "checkpoints"
# fields renamed since a saved config may have been written: old dotted name -> new (issue 14)
RENAMED_FIELDS = {"model.horizon": "model.chunk_size"}
_OURS = (CONFIG_FILE, CHECKPOINTS, "metrics.jsonl", "tensorboard", "final", "learning_curve.png", "eval")


class RunDirError(ValueError):
    """The output folder cannot be used as asked; the message says why and what to pass."""


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def training_relevant_diff(saved: dict[str, Any], current: dict[str, Any], runtime_fields: Iterable[str]) -> list[str]:
    """``field: saved X, now Y`` for every field that differs and is not a runtime field (or under one).

    A saved field under an old name (``RENAMED_FIELDS``) is compared under its new one."""
    runtime = tuple(runtime_fields)
    a = {RENAMED_FIELDS.get(k, k): v for k, v in _flatten(saved).items()}
    b = _flatten(current)

    def is_runtime(name: str) -> bool:
        return any(name == f or name.startswith(f + ".") for f in runtime)

    return [
        f"{name}: saved {a.get(name)!r}, now {b.get(name)!r}"
        for name in sorted(set(a) | set(b))
        if not is_runtime(name) and a.get(name) != b.get(name)
    ]


def prepare_run_dir(
    config: BaseModel, out_dir: str | Path, runtime_fields: Iterable[str], resume: bool = True, overwrite: bool = False
) -> Path | None:
    """Make ``out_dir`` ready for ``config``; return the checkpoint to resume from (None: start fresh)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"output.dir: {out} is a file; pass a folder")
    saved_path = out / CONFIG_FILE
    has_state = saved_path.exists() or (out / CHECKPOINTS).exists()
    if overwrite and out.exists():
        foreign = [p.name for p in out.iterdir() if p.name not in _OURS]
        if foreign and not saved_path.exists():
            raise RunDirError(
                f"output.dir: {out} holds files that are not a training run ({sorted(foreign)[:5]}); "
                "refusing to delete it even with --overwrite"
            )
        shutil.rmtree(out)
        has_state = False
    ckpt = latest_checkpoint(out / CHECKPOINTS) if has_state else None
    current: dict[str, Any] = config.model_dump(mode="json")
    if has_state:
        if not resume:
            raise RunDirError(
                f"output.dir: {out} already holds a run; rerun without --no-resume to continue it, "
                "or pass --overwrite to start over"
            )
        if saved_path.exists():
            diffs = training_relevant_diff(json.loads(saved_path.read_text()), current, runtime_fields)
            if diffs:
                raise RunDirError(
                    f"output.dir: {out} holds a run with a different recipe; refusing to resume it:\n  "
                    + "\n  ".join(diffs)
                    + "\npass --overwrite to start over, or choose another output.dir"
                )
    out.mkdir(parents=True, exist_ok=True)
    saved_path.write_text(json.dumps(current, indent=2) + "\n")
    return ckpt
