"""The online RL algorithms, one table entry each: how a rollout becomes advantages, and the update.

Why a table: the driver (``trainer.py``) runs the same named phases for every algorithm
(rollout -> reward -> old_logprob -> advantage -> health -> update -> weight_sync); only the
advantage, health and update phases and the extra models an algorithm keeps (a frozen reference,
NFT's old policy) differ. Each entry names those, so the driver never compares algorithm names and a
new algorithm is its loss / advantage in ``cosmos_robot_trainers.algorithms``, its update in
``learner.py`` or ``regression.py`` and one ``OnlineMethod`` here (``rl/config.py``'s ``ALGORITHMS``
holds the facts its config checks use).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cosmos_robot_trainers.rl.advantage import Advantages, dpo_pairs, group_advantages, nft_advantages, ppo_advantages
from cosmos_robot_trainers.rl.config import ALGORITHMS, AlgoConfig, RLConfig
from cosmos_robot_trainers.rl.inputs import UpdateInputs
from cosmos_robot_trainers.rl.learner import policy_gradient_health, update_policy_gradient
from cosmos_robot_trainers.rl.regression import dpo_health, nft_health, update_dpo, update_nft
from cosmos_robot_trainers.rl.rollout import Rollout

__all__ = ["METHODS", "OnlineMethod", "UpdateInputs", "get_method"]


Stats = dict[str, float]


@dataclass(frozen=True)
class OnlineMethod:
    """One online algorithm: ``advantage(rollout, algo, generator) -> (targets, stats)``,
    ``update(inputs, rollout, targets) -> metrics`` and ``health(inputs, rollout, targets) -> metrics``
    (the split-half gradient cosine of its loss; no step); ``reference(config)`` says whether it keeps a
    frozen copy of the starting model, ``old_model`` whether it keeps a slowly moving old policy."""

    name: str
    advantage: Callable[[Rollout, AlgoConfig, torch.Generator], tuple[Any, Stats]]
    update: Callable[[UpdateInputs, Rollout, Any], Stats]
    health: Callable[[UpdateInputs, Rollout, Any], Stats]
    reference: Callable[[RLConfig], bool] = lambda config: config.algo.kl_coef > 0
    old_model: bool = False


def _with_stats(fn: Callable[[Rollout, AlgoConfig], Advantages]) -> Callable[..., tuple[Advantages, Stats]]:
    def advantage(rollout: Rollout, algo: AlgoConfig, generator: torch.Generator) -> tuple[Advantages, Stats]:
        adv = fn(rollout, algo)
        return adv, adv.stats

    return advantage


def _sampler(inp: UpdateInputs) -> dict[str, Any]:
    """How the stored log-probs were sampled, which the learner must recompute them with."""
    return {"sample_mode": inp.sample_mode, "noise_level": inp.noise_level}


def _policy_gradient(*, critic: bool) -> Callable[[UpdateInputs, Rollout, Advantages], Stats]:
    def update(inp: UpdateInputs, rollout: Rollout, adv: Advantages) -> Stats:
        algo = inp.config.algo
        return update_policy_gradient(
            inp.model,
            inp.optimizer,
            rollout,
            adv,
            inp.config,
            inp.generator,
            num_flow_steps=inp.k_steps,
            train_policy=not (critic and inp.iteration < algo.critic_warmup_iters),
            sequence_ratio=not critic and algo.policy_loss == "gspo",
            ref_model=inp.ref_model,
            world=inp.world,
            aux=inp.aux,
            **_sampler(inp),
        )

    return update


def _policy_gradient_health(inp: UpdateInputs, rollout: Rollout, adv: Advantages) -> Stats:
    return policy_gradient_health(inp.model, rollout, adv, inp.config, inp.generator, **_sampler(inp))


def _nft_health(inp: UpdateInputs, rollout: Rollout, adv: Advantages) -> Stats:
    assert inp.old_model is not None
    return nft_health(inp.model, inp.old_model, rollout, adv, inp.config, inp.generator, inp.ref_model)


def _dpo_pairs(rollout: Rollout, algo: AlgoConfig, generator: torch.Generator) -> tuple[torch.Tensor, Stats]:
    pairs = dpo_pairs(rollout, algo, generator)
    return pairs, {"pairs": float(len(pairs))}


def _update_nft(inp: UpdateInputs, rollout: Rollout, adv: Advantages) -> Stats:
    assert inp.old_model is not None
    return update_nft(
        inp.model,
        inp.old_model,
        inp.optimizer,
        rollout,
        adv,
        inp.config,
        inp.generator,
        inp.world,
        inp.ref_model,
        aux=inp.aux,
    )


def _update_dpo(inp: UpdateInputs, rollout: Rollout, pairs: torch.Tensor) -> Stats:
    assert inp.ref_model is not None
    return update_dpo(
        inp.model, inp.ref_model, inp.optimizer, rollout, pairs, inp.config, inp.generator, inp.world, aux=inp.aux
    )


METHODS: dict[str, OnlineMethod] = {
    m.name: m
    for m in (
        OnlineMethod("joint_ppo", _with_stats(ppo_advantages), _policy_gradient(critic=True), _policy_gradient_health),
        OnlineMethod("grpo", _with_stats(group_advantages), _policy_gradient(critic=False), _policy_gradient_health),
        OnlineMethod("nft", _with_stats(nft_advantages), _update_nft, _nft_health, old_model=True),
        OnlineMethod("dpo", _dpo_pairs, _update_dpo, dpo_health, reference=lambda config: True),
    )
}
assert set(METHODS) == set(ALGORITHMS), "rl/config.py's ALGORITHMS and rl/methods.py's METHODS disagree"


def get_method(name: str) -> OnlineMethod:
    """The table entry of ``name`` (already checked by ``RLConfig``)."""
    return METHODS[name]
