"""``[train]`` fields every step loop shares (text and generator trainers): length, seed, cadence, threads.

One definition so that a recipe's ``train.log_every`` or ``train.max_wall_minutes`` means the same in
each trainer and is checked the same way (``ckpt_every`` a multiple of ``log_every``); a trainer's own
``[train]`` table subclasses it with its batch and precision fields.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from cosmos_robot.config import StrictModel

__all__ = ["LoopConfig"]


class LoopConfig(StrictModel):
    """Length, seeding, logging / checkpoint cadence, device and the wall-clock cap of a step loop."""

    steps: int = Field(default=1000, ge=1)  # optimizer steps (RL-style trainers: iterations)
    seed: int = 0
    log_every: int = Field(default=50, ge=1)
    ckpt_every: int = Field(default=500, ge=1)  # a multiple of log_every
    keep_checkpoints: int = Field(default=2, ge=1)
    device: str = "cpu"
    num_threads: int | None = Field(default=2, ge=1)
    deterministic: bool = True
    max_wall_minutes: float | None = Field(default=None, gt=0)  # stop, evaluate and export after this long
    progress: bool = True

    @model_validator(mode="after")
    def _cadence(self) -> LoopConfig:
        if self.ckpt_every % self.log_every:
            raise ValueError(
                f"train.ckpt_every ({self.ckpt_every}) must be a multiple of train.log_every ({self.log_every})"
            )
        return self
