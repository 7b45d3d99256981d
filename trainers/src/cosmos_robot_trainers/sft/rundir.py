"""The SFT run folder: ``common.rundir`` with the SFT recipe's runtime fields."""

from __future__ import annotations

from pathlib import Path

from cosmos_robot_trainers.common import rundir as _rundir
from cosmos_robot_trainers.common.rundir import CHECKPOINTS, CONFIG_FILE, RunDirError
from cosmos_robot_trainers.sft.config import RUNTIME_FIELDS, SFTConfig

__all__ = ["CHECKPOINTS", "CONFIG_FILE", "RunDirError", "prepare_run_dir"]


def prepare_run_dir(config: SFTConfig, resume: bool = True, overwrite: bool = False) -> Path | None:
    """Make ``config.output.dir`` ready; return the checkpoint to resume from (None: start fresh)."""
    return _rundir.prepare_run_dir(config, config.output.dir, RUNTIME_FIELDS, resume=resume, overwrite=overwrite)
