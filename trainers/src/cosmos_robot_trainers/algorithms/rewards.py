"""Reward providers: the per-step MDP reward the RL rollouts sum, chosen by name (``reward.provider``).

Why providers instead of reading the env's scalar reward: AlpaGym trains one simulator under several
reward presets (``progress_safety``, ``distance_to_gt``), and the preset is a training choice, not an
env setting; a provider computes it from the step's ``info``, so one env serves every preset and a
new preset is one registered function. Each provider is ``fn(env_reward, info) -> float`` for one
env step; it raises ``KeyError`` naming the info field a suite does not report.

- ``env``: the env's own reward (tabletop and LIBERO: the sparse success reward; driving: the env's
  preset, ``progress_safety`` by default);
- ``progress_safety``, ``distance_to_gt``: AlpaGym's presets on the driving suite, the same terms the
  env computes (``cosmos_robot_envs.driving.env.reward_terms``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cosmos_robot_trainers.algorithms.registry import get, register

__all__ = ["env_reward", "preset_reward", "reward_provider"]


@register("reward", "env")
def env_reward(reward: float, info: Mapping[str, Any]) -> float:
    """The env's own step reward."""
    return float(reward)


def preset_reward(preset: str, info: Mapping[str, Any], weights: Mapping[str, float] | None = None) -> float:
    """The sum of a driving preset's terms for one tick (``reward_terms``), each times its weight in
    ``weights`` (1 for a term not named)."""
    from cosmos_robot_envs.driving.env import reward_terms

    missing = [k for k in ("progress_step", "collision", "offroad", "dist_to_gt", "max_steps") if k not in info]
    if missing:
        raise KeyError(
            f"reward provider {preset!r} reads the driving suite's step info; this env's info lacks {missing} "
            "(use reward.provider = 'env' on other suites)"
        )
    terms = reward_terms(preset, info)
    return float(sum((weights or {}).get(name, 1.0) * value for name, value in terms.items()))


def reward_provider(
    name: str, term_weights: Mapping[str, float] | None = None
) -> Callable[[float, Mapping[str, Any]], float]:
    """The registered provider ``name``; with ``term_weights`` (``reward.term_weights``), the driving
    preset ``name`` with its named terms re-weighted (e.g. ``{"progress": 10}``: progress +10 per route
    instead of +1, collision still -10). The config checked the names."""
    if not term_weights:
        return get("reward", name)
    weights = dict(term_weights)
    return lambda reward, info: preset_reward(name, info, weights)


@register("reward", "progress_safety")
def progress_safety(reward: float, info: Mapping[str, Any]) -> float:
    """AlpaGym's progress_safety: progress +1 per route length, collision -10, off-road -5, -0.01 per metre."""
    return preset_reward("progress_safety", info)


@register("reward", "distance_to_gt")
def distance_to_gt(reward: float, info: Mapping[str, Any]) -> float:
    """AlpaGym's distance_to_gt: minus the metres to the ground-truth trajectory, averaged over the horizon."""
    return preset_reward("distance_to_gt", info)
