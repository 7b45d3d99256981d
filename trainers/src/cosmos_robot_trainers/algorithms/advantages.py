"""Advantage estimators (pure torch functions, registered as kind ``"advantage"``).

Sources are sections of ``shared/research/rl_vla_anchors.md`` (cited as "notes §x.y"):

- ``gae``: RLinf's GAE over chunk steps (notes §1.4, checklist item 7 for truncation bootstrapping).
- ``grpo``: RLinf's group-normalised trajectory return (notes §1.4; also Flow-GRPO, notes §3.1).
- ``dr_grpo``: Dr. GRPO (Liu et al., "Understanding R1-Zero-Like Training", arXiv 2503.20783; NOT in the notes):
  the same group baseline without the std division. Its second change, a constant length normaliser, lives in
  the loss: ``ppo_policy_loss(..., loss_agg="seq_mean_token_sum_norm", norm_constant=L_max)``.
- ``filter_groups``: RLinf ``filter_rewards`` / DAPO dynamic sampling (notes §1.4, checklist item 9).
- ``normalize_advantages``: masked batch whitening (notes §1.4, "advantages normalized over the batch (masked)").
- ``nft_optimality``: DiffusionNFT's reward -> optimality probability r in [0, 1] (notes §3.2).
"""

from __future__ import annotations

import torch

from cosmos_robot_trainers.algorithms.losses import masked_mean
from cosmos_robot_trainers.algorithms.registry import register


@register("advantage", "gae")
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
    truncated_bootstrap: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over (B, T) chunk steps; returns ``(advantages, returns)``.

    Notes §1.4 (RLinf ``compute_gae_advantages_and_returns``), with ``dones[:, t] = 1`` meaning the episode
    ended (terminated or truncated) right after step t, so the next value and advantage are cut::

        δ_t = r_t + γ·V_{t+1}·(1 − done_t) − V_t          (V_T = last_values)
        A_t = δ_t + γλ·(1 − done_t)·A_{t+1}
        returns_t = A_t + V_t

    RLinf writes ``done_{t+1}`` because its dones tensor has T+1 entries with a leading "done before step 0";
    ``dones[:, t]`` here is its ``done_{t+1}``.

    Truncation (checklist item 7): at a time-limit step set ``dones[:, t] = 1`` and
    ``truncated_bootstrap[:, t] = V(s_final)`` (the value of the observation the env returned before resetting;
    0 elsewhere); then ``r_t += γ·truncated_bootstrap_t``, i.e. the cut return is bootstrapped rather than
    treated as terminal.

    ``mask`` (B, T), 1 = valid: invalid (padded) steps are transparent — they get advantage and return 0, and
    the recursion carries V_{t+1} and A_{t+1} across them unchanged, so they never leak into valid steps.
    """
    if rewards.shape != values.shape or rewards.shape != dones.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, dones must share (B, T)")
    rewards = rewards.float()
    values = values.float()
    nonterminal = 1.0 - dones.float()
    if truncated_bootstrap is not None:
        rewards = rewards + gamma * truncated_bootstrap.float()
    valid = torch.ones_like(rewards, dtype=torch.bool) if mask is None else mask.bool()
    next_value = last_values.float()
    next_adv = torch.zeros_like(next_value)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value * nonterminal[:, t] - values[:, t]
        adv_t = delta + gamma * lam * nonterminal[:, t] * next_adv
        m = valid[:, t]
        advantages[:, t] = torch.where(m, adv_t, torch.zeros_like(adv_t))
        next_adv = torch.where(m, adv_t, next_adv)
        next_value = torch.where(m, values[:, t], next_value)
    returns = torch.where(valid, advantages + values, torch.zeros_like(values))
    return advantages, returns


def _group_stats(
    returns: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (mean, unbiased std, count, min, max) of the sample's group."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    x = returns.float()
    count = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, inverse, torch.ones_like(x))
    mean = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, inverse, x) / count
    sq = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, inverse, (x - mean[inverse]) ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    lo = torch.full((n_groups,), float("inf"), dtype=x.dtype).scatter_reduce(0, inverse, x, reduce="amin")
    hi = torch.full((n_groups,), float("-inf"), dtype=x.dtype).scatter_reduce(0, inverse, x, reduce="amax")
    return mean[inverse], std[inverse], count[inverse], lo[inverse], hi[inverse]


@register("advantage", "grpo")
def grpo(returns: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, normalize_std: bool = True) -> torch.Tensor:
    """Group-relative advantages for (B,) trajectory returns; samples with equal ``group_ids`` share a reset state.

    Notes §1.4 (RLinf ``adv_type: grpo``, G = 8)::

        A_i = (R_i − mean_G(R)) / (std_G(R) + eps)       (normalize_std=True, GRPO)
        A_i =  R_i − mean_G(R)                            (normalize_std=False, Dr. GRPO)

    std is the unbiased (Bessel) group std, as ``torch.std`` in RLinf/verl; a group of one sample gets std 0;
    constant groups (and single samples) get A = 0. The (B,) result is broadcast to every chunk step by the caller.
    """
    mean, std, _, _, _ = _group_stats(returns, group_ids)
    adv = returns.float() - mean
    if not normalize_std:
        return adv
    denom = std + eps
    # a constant group has adv = 0 exactly; keep it 0 even with eps = 0
    return torch.where(denom > 0, adv / denom.clamp(min=torch.finfo(adv.dtype).tiny), torch.zeros_like(adv))


@register("advantage", "dr_grpo")
def dr_grpo(returns: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO advantages (arXiv 2503.20783, not in the notes): ``R_i − mean_G(R)``, no std division.

    Dr. GRPO also replaces the per-sequence length normalisation of the loss with a constant (e.g. the maximum
    number of chunk steps): use ``ppo_policy_loss(..., loss_agg="seq_mean_token_sum_norm", norm_constant=L)``.
    """
    return grpo(returns, group_ids, normalize_std=False)


def filter_groups(
    returns: torch.Tensor,
    group_ids: torch.Tensor,
    low: float | None = None,
    high: float | None = None,
    tol: float = 0.0,
) -> torch.Tensor:
    """Boolean (B,) keep-mask that drops uninformative GRPO groups (notes §1.4 ``filter_rewards``, checklist 9).

    A group is dropped when all its outcomes are equal (max − min <= tol: success rate 0 or 1, so every
    GRPO advantage is 0). With ``low``/``high`` (DAPO-style dynamic sampling; RLinf keeps mean success in
    [0.1, 0.9]) a group is also dropped unless ``low <= mean_G(R) <= high``.
    """
    mean, _, _, lo, hi = _group_stats(returns, group_ids)
    keep = (hi - lo) > tol
    if low is not None:
        keep &= mean >= low
    if high is not None:
        keep &= mean <= high
    return keep


def normalize_advantages(advantages: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Masked batch whitening (notes §1.4): ``(A − mean_valid(A)) / (std_valid(A) + eps)``, invalid entries → 0.

    std is the unbiased masked std (verl ``masked_whiten``); with fewer than two valid entries it is 0.
    """
    adv = advantages.float()
    m = torch.ones_like(adv) if mask is None else mask.float().expand_as(adv)
    mean = masked_mean(adv, m)
    n = m.sum()
    var = ((adv - mean) ** 2 * m).sum() / (n - 1).clamp(min=1)
    out = (adv - mean) / (var.sqrt() + eps)
    return out * m


@register("advantage", "nft_optimality")
def nft_optimality(advantages: torch.Tensor, a_max: float = 5.0) -> torch.Tensor:
    """DiffusionNFT optimality probability r in [0, 1] from (group-normalised) advantages (notes §3.2).

    Paper: ``r = 1/2 + 1/2·clip((R − E_c[R]) / Z_c, −1, 1)``; code: ``r = clamp(clip(A, ±A_max)/A_max/2 + 1/2, 0, 1)``
    with A_max = 5 (implemented here; pass ``grpo`` advantages as A).
    """
    a = advantages.float().clamp(-a_max, a_max)
    return (a / a_max / 2 + 0.5).clamp(0.0, 1.0)
