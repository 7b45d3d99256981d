"""Pieces every trainer shares: checkpoints with exact resume, RNG snapshots, a resumable sampler,
JSONL + TensorBoard metrics, the progress bar and the learning-curve plot.

Why shared: the SFT trainer and the RL trainers (joint PPO, GRPO, ...) must resume the same way and
log the same way, so "killed and resumed equals uninterrupted" is tested once, here, per piece.
"""

from cosmos_robot_trainers.common.checkpoint import (
    Checkpoint,
    checkpoint_dirs,
    latest_checkpoint,
    load_checkpoint,
    load_sharded_into,
    save_checkpoint,
    save_sharded_checkpoint,
)
from cosmos_robot_trainers.common.metrics import MetricsLogger, NullMetricsLogger, read_metrics
from cosmos_robot_trainers.common.progress import TrainProgress
from cosmos_robot_trainers.common.rng import capture_rng_state, configure_torch, restore_rng_state, seed_everything
from cosmos_robot_trainers.common.sampler import EpochBatchSampler

__all__ = [
    "Checkpoint",
    "EpochBatchSampler",
    "MetricsLogger",
    "NullMetricsLogger",
    "TrainProgress",
    "capture_rng_state",
    "checkpoint_dirs",
    "configure_torch",
    "latest_checkpoint",
    "load_checkpoint",
    "load_sharded_into",
    "read_metrics",
    "restore_rng_state",
    "save_checkpoint",
    "save_sharded_checkpoint",
    "seed_everything",
]
