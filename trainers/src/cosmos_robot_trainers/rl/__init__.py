"""Online RL for flow policies on the vectorized simulator: joint PPO, GRPO (+ Dr-GRPO, GSPO),
DiffusionNFT and Flow-DPO behind one driver loop of named phases (``trainer.run_rl``)."""

from cosmos_robot_trainers.rl.config import ALGORITHMS, RLConfig
from cosmos_robot_trainers.rl.rollout import EpisodeSpec, Rollout, RolloutWorker, episode_specs
from cosmos_robot_trainers.rl.trainer import RatioGateError, RLResult, run_rl

__all__ = [
    "ALGORITHMS",
    "EpisodeSpec",
    "RLConfig",
    "RLResult",
    "RatioGateError",
    "Rollout",
    "RolloutWorker",
    "episode_specs",
    "run_rl",
]
