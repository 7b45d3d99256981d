"""``[output]`` of every trainer's recipe: where a run writes and what it writes besides checkpoints."""

from __future__ import annotations

from cosmos_robot.config import StrictModel

__all__ = ["OutputConfig"]


class OutputConfig(StrictModel):
    """Where the run writes: config, metrics, TensorBoard, checkpoints, final policy, learning curve."""

    dir: str  # output folder (relative paths are relative to the working directory)
    tensorboard: bool = True  # TensorBoard events under <dir>/tensorboard
    plot: bool = True  # <dir>/learning_curve.png after each evaluation and at the end
