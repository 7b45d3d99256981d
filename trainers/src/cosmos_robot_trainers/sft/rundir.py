"""The output folder of a run: fresh, resumed or refused.

Why refuse: resuming a folder with a recipe that differs in a training-relevant field (learning
rate, data, model size, steps...) would silently splice two different runs into one loss curve.
The saved ``config.resolved.json`` is compared with the new recipe; differences in runtime fields
(logging cadence, output and eval options; ``RUNTIME_FIELDS``) are allowed, anything else is an
error naming each field, and ``--overwrite`` starts the folder over.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from cosmos_robot_trainers.common import latest_checkpoint
from cosmos_robot_trainers.sft.config import SFTConfig, training_relevant_diff

__all__ = ["CONFIG_FILE", "RunDirError", "prepare_run_dir"]

CONFIG_FILE = "config.resolved.json"
CHECKPOINTS = "checkpoints"
_OURS = (CONFIG_FILE, CHECKPOINTS, "metrics.jsonl", "tensorboard", "final", "learning_curve.png", "eval")


class RunDirError(ValueError):
    """The output folder cannot be used as asked; the message says why and what to pass."""


def _config_dict(config: SFTConfig) -> dict[str, Any]:
    data: dict[str, Any] = config.model_dump(mode="json")
    return data


def prepare_run_dir(config: SFTConfig, resume: bool = True, overwrite: bool = False) -> Path | None:
    """Make ``config.output.dir`` ready; return the checkpoint to resume from (None: start fresh)."""
    out = Path(config.output.dir)
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
    if has_state:
        if not resume:
            raise RunDirError(
                f"output.dir: {out} already holds a run; rerun without --no-resume to continue it, "
                "or pass --overwrite to start over"
            )
        if saved_path.exists():
            saved = json.loads(saved_path.read_text())
            diffs = training_relevant_diff(saved, _config_dict(config))
            if diffs:
                raise RunDirError(
                    f"output.dir: {out} holds a run with a different recipe; refusing to resume it:\n  "
                    + "\n  ".join(diffs)
                    + "\npass --overwrite to start over, or choose another output.dir"
                )
    out.mkdir(parents=True, exist_ok=True)
    saved_path.write_text(json.dumps(_config_dict(config), indent=2) + "\n")
    return ckpt
