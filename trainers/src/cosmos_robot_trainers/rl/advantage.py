"""From a ``Rollout`` to per-decision advantages and targets, for each algorithm.

The registered pure functions (``algorithms.gae``, ``grpo``, ``dr_grpo``, ``filter_groups``,
``nft_optimality``) work on (B, T) or per-episode tensors; this module only lays the flat decision
list of a rollout out as episodes x decisions and back, and builds Flow-DPO's preference pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.algorithms.advantages import filter_groups, normalize_advantages
from cosmos_robot_trainers.rl.config import AlgoConfig
from cosmos_robot_trainers.rl.rollout import Rollout

__all__ = [
    "Advantages",
    "dpo_pairs",
    "episode_scores",
    "episode_weights",
    "episode_layout",
    "group_advantages",
    "nft_advantages",
    "ppo_advantages",
    "tick_advantages",
    "whiten",
]


@dataclass
class Advantages:
    """Per-decision advantages (M,), value targets (M,) (PPO only) and the decisions that train (M,)."""

    advantages: torch.Tensor
    returns: torch.Tensor | None
    keep: torch.Tensor  # bool
    stats: dict[str, float]
    weights: torch.Tensor | None = None  # (M,) per-decision loss weights, mean 1 over kept (nft: episode weighting)


def episode_layout(rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index (E, T) into the decisions, valid mask (E, T))`` with decisions in episode order."""
    e, m = rollout.num_episodes, rollout.num_decisions
    t_max = int(rollout.step.max()) + 1 if m else 1
    index = torch.zeros((e, t_max), dtype=torch.long)
    valid = torch.zeros((e, t_max), dtype=torch.bool)
    index[rollout.episode, rollout.step] = torch.arange(m)
    valid[rollout.episode, rollout.step] = True
    return index, valid


def ppo_advantages(rollout: Rollout, algo: AlgoConfig) -> Advantages:
    """GAE over each episode's chunk steps (truncations bootstrapped with V(final obs)), then whitened."""
    index, valid = episode_layout(rollout)
    take = lambda x: torch.where(valid, x[index], torch.zeros((), dtype=x.dtype))  # noqa: E731
    dones = take(rollout.done.float())
    adv, ret = get_algorithm("advantage", "gae")(
        take(rollout.reward),
        take(rollout.value),
        dones,
        torch.zeros(rollout.num_episodes),
        gamma=algo.gamma,
        lam=algo.lam,
        truncated_bootstrap=take(rollout.bootstrap),
        mask=valid,
    )
    flat_adv = torch.zeros(rollout.num_decisions)
    flat_ret = torch.zeros(rollout.num_decisions)
    flat_adv[index[valid]] = adv[valid]
    flat_ret[index[valid]] = ret[valid]
    raw_mean = float(flat_adv.mean()) if rollout.num_decisions else 0.0
    if algo.normalize_advantages:
        flat_adv = whiten(flat_adv, rollout, algo.whiten_over)
    value = rollout.value
    var_ret = float(flat_ret.var()) if rollout.num_decisions > 1 else 0.0
    explained = 1.0 - float((flat_ret - value).var()) / var_ret if var_ret > 0 else float("nan")
    keep = torch.ones(rollout.num_decisions, dtype=torch.bool)
    return Advantages(flat_adv, flat_ret, keep, {"adv_raw_mean": raw_mean, "explained_variance": explained})


def whiten(adv: torch.Tensor, rollout: Rollout, over: str) -> torch.Tensor:
    """Per-decision advantages whitened over the whole batch, or (``over="task"``) within each task."""
    if over == "batch":
        return normalize_advantages(adv)
    task_of = [rollout.ep_task[int(e)] for e in rollout.episode]
    out = torch.zeros_like(adv)
    for task in sorted(set(task_of)):
        mask = torch.tensor([t == task for t in task_of], dtype=torch.bool)
        out += normalize_advantages(adv, mask)
    return out


def episode_scores(rollout: Rollout, algo: AlgoConfig) -> torch.Tensor:
    """(E,) what a group compares its episodes by (``algo.group_score``): success, the provider's summed
    reward, or the summed shaped reward of the episode's decisions (what the learner's rewards add up to)."""
    if algo.group_score == "shaped":
        return torch.zeros(rollout.num_episodes).index_add_(0, rollout.episode, rollout.reward)
    return (rollout.ep_success if algo.group_score == "success" else rollout.ep_return).clone()


def group_advantages(rollout: Rollout, algo: AlgoConfig) -> Advantages:
    """GRPO / Dr-GRPO advantages of each episode's score within its group, broadcast to its decisions.

    The score is success or (AlpaGym) the episode's summed reward (``episode_scores``). Episodes whose
    worker crashed do not count; with ``filter_groups`` groups whose episodes all scored the same are
    dropped (their advantages are all zero anyway, they only dilute), or with ``filter_on = "success"``
    those whose episodes all succeeded or all failed, whatever their returns. ``groups_mixed_success`` counts the
    groups with both successes and failures: where the scores are returns (driving), a group whose
    episodes all crash still differs in progress, but only a mixed group says how to avoid the crash.
    """
    ok = ~rollout.ep_failed
    returns = episode_scores(rollout, algo)
    groups = rollout.ep_group.clone()
    groups[~ok] = -1 - torch.arange(int((~ok).sum()))  # a crashed episode is its own (filtered) group
    ep_adv = get_algorithm("advantage", algo.advantage)(returns, groups)
    adv = ep_adv[rollout.episode] if algo.credit == "episode" else tick_advantages(rollout, algo, groups)
    ep_keep = ok.clone()
    if algo.filter_groups:
        ep_keep &= filter_groups(rollout.ep_success if algo.filter_on == "success" else returns, groups)
    kept_groups = int(torch.unique(groups[ep_keep]).numel())
    all_groups = int(torch.unique(groups[ok]).numel())
    success = rollout.ep_success[ok]
    mixed = [g for g in torch.unique(groups[ok]) if success[groups[ok] == g].unique().numel() > 1]
    stats = {"groups_kept": float(kept_groups), "groups_total": float(all_groups)}
    stats["groups_mixed_success"] = float(len(mixed))
    return Advantages(adv, None, ep_keep[rollout.episode], stats)


def tick_advantages(rollout: Rollout, algo: AlgoConfig, groups: torch.Tensor) -> torch.Tensor:
    """(M,) ``algo.credit = "reward_to_go"``: each decision's discounted reward-to-go, group-normalised
    (``algo.advantage``) among the episodes of its group (``groups``, per episode) at the same decision index.

    Why: the members of a group replay one seed, so their decision t faces the same moment of the same
    traffic, and the spread of their rewards-to-go says how much the choices from t on mattered. Broadcast
    (AlpaGym's) credit gives a collision's penalty to every decision of the episode. The hypothesis was that
    this made every crash-removing driving run slower on seeds it never crashed on; measured, it did not
    help (docs/driving.md, run U: slower still), so it is an option, not the default. With ``credit_gamma``
    below 1 the penalty reaches back about 1 / (1 - gamma) decisions. A decision index that only one episode
    of its group reached (the others ended) gets advantage 0. The rewards-to-go are GAE's returns with zero
    values and lambda 1.
    """
    index, valid = episode_layout(rollout)
    rewards = torch.where(valid, rollout.reward[index], torch.zeros(()))
    zeros = torch.zeros_like(rewards)
    _, to_go = get_algorithm("advantage", "gae")(
        rewards, zeros, zeros, torch.zeros(index.shape[0]), gamma=algo.credit_gamma, lam=1.0, mask=valid
    )
    t_max = index.shape[1]
    tick_group = groups[:, None] * t_max + torch.arange(t_max)[None, :]  # unique per (group, index); groups may be < 0
    out = torch.zeros(rollout.num_decisions)
    out[index[valid]] = get_algorithm("advantage", algo.advantage)(to_go[valid], tick_group[valid])
    return out


def episode_weights(rollout: Rollout, keep: torch.Tensor) -> torch.Tensor:
    """(M,) weights that give every kept episode the same total weight, whatever its number of decisions:
    1 / (its decisions), scaled to mean 1 over the kept decisions (0 elsewhere)."""
    lengths = torch.bincount(rollout.episode, minlength=rollout.num_episodes).float()
    w = torch.where(keep, 1.0 / lengths[rollout.episode].clamp(min=1.0), torch.zeros(()))
    total = w.sum()
    return w * (keep.sum() / total) if float(total) > 0 else w


def nft_advantages(rollout: Rollout, algo: AlgoConfig) -> Advantages:
    """DiffusionNFT's optimality probability r per decision (from the group advantage of its episode).

    Why ``nft_weighting = "episode"`` by default: at a point x_t the NFT loss is minimised by
    v_theta = v_old + E[(2r - 1)(v - v_old)] / beta. If r's mean is 1/2 - c/2 (failed episodes run
    longer, so they have more decisions than the successes of their group), that holds a term
    -c E[v - v_old] / beta: the policy steps away from its own samples, the old policy follows, and the
    gap grows by (1 + c / beta) per iteration (measured: loss 0.2 -> 250 in 100 iterations, r's decision
    mean 0.45-0.47). Weighting each episode the same makes each group's (2r - 1) sum to zero.
    """
    grp = group_advantages(rollout, algo)
    r = get_algorithm("advantage", "nft_optimality")(grp.advantages, a_max=algo.nft_a_max)
    if algo.group_size == 1:  # no groups: baseline is the batch's mean score
        scores = episode_scores(rollout, algo)
        adv = scores - scores.mean()
        r = get_algorithm("advantage", "nft_optimality")(adv[rollout.episode] * algo.nft_a_max, a_max=algo.nft_a_max)
        grp.keep = ~rollout.ep_failed[rollout.episode]
    weights = episode_weights(rollout, grp.keep) if algo.nft_weighting == "episode" else None
    stats = dict(grp.stats)
    kept = grp.keep.float() if weights is None else weights
    if float(kept.sum()) > 0:  # r's mean as the loss weighs it (1/2: no net push away from the samples)
        stats["r_mean_weighted"] = float((r * kept).sum() / kept.sum())
    return Advantages(r, None, grp.keep, stats, weights)


def dpo_pairs(rollout: Rollout, algo: AlgoConfig, generator: torch.Generator) -> torch.Tensor:
    """``(P, 2)`` episode pairs (winner, loser) from the same initial state: with ``group_score``
    "success" a success and a failure; with "return" or "shaped" any two episodes whose scores differ,
    the higher one winning."""
    pairs: list[tuple[int, int]] = []
    ok = ~rollout.ep_failed
    scores = episode_scores(rollout, algo)
    for group in torch.unique(rollout.ep_group).tolist():
        members = torch.nonzero((rollout.ep_group == group) & ok).flatten().tolist()
        all_pairs = [(w, lo) for w in members for lo in members if scores[w] > scores[lo]]
        if not all_pairs:
            continue
        order = torch.randperm(len(all_pairs), generator=generator)[: algo.dpo_pairs_per_group]
        pairs.extend(all_pairs[i] for i in order.tolist())
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
