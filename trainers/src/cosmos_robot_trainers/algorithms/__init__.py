"""Pure, registered-by-name RL building blocks: advantage estimators and losses (STYLE.md item 8).

Every function is a pure torch function (no trainer state) documented with its formula and the section of
``shared/research/rl_vla_anchors.md`` it follows. Importing this package registers them:

- advantage: ``gae``, ``grpo``, ``dr_grpo``, ``nft_optimality`` (plus helpers ``filter_groups`` and
  ``normalize_advantages``);
- loss: ``ppo``, ``gspo``, ``value``, ``kl``, ``entropy``, ``nft``, ``flow_dpo``;
- reward: ``env``, ``progress_safety``, ``distance_to_gt`` (per-step reward providers, ``rewards.py``).

``get("loss", "ppo")`` resolves a name; unknown names raise ``UnknownAlgorithmError`` with a suggestion.
"""

from cosmos_robot_trainers.algorithms import rewards  # noqa: F401  (registers the reward providers)
from cosmos_robot_trainers.algorithms.advantages import (
    dr_grpo,
    filter_groups,
    gae,
    grpo,
    nft_optimality,
    normalize_advantages,
)
from cosmos_robot_trainers.algorithms.losses import (
    entropy_bonus,
    flow_dpo_loss,
    gspo_policy_loss,
    kl_penalty,
    masked_mean,
    nft_loss,
    ppo_policy_loss,
    value_loss,
)
from cosmos_robot_trainers.algorithms.registry import UnknownAlgorithmError, get, names, register

__all__ = [
    "UnknownAlgorithmError",
    "dr_grpo",
    "entropy_bonus",
    "filter_groups",
    "flow_dpo_loss",
    "gae",
    "get",
    "grpo",
    "gspo_policy_loss",
    "kl_penalty",
    "masked_mean",
    "names",
    "nft_loss",
    "nft_optimality",
    "normalize_advantages",
    "ppo_policy_loss",
    "register",
    "value_loss",
]
