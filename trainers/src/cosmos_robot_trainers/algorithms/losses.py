"""Losses (pure torch functions, registered as kind ``"loss"``).

Sources are sections of ``shared/research/rl_vla_anchors.md`` (cited as "notes §x.y"):

- ``ppo`` (notes §1.4, RLinf ``compute_ppo_actor_loss``): clipped surrogate with dual clip, masked token-mean;
  ``loss_agg`` also offers the sequence-mean forms, including Dr. GRPO's constant normaliser (arXiv 2503.20783).
- ``gspo`` (GSPO, Zheng et al., arXiv 2507.18071; NOT in the notes): sequence-level importance ratio.
- ``value`` (notes §1.4): value-clipped Huber critic loss.
- ``kl`` (k1/k2/k3 estimators; Schulman's "Approximating KL divergence" note, as in verl). Notes §1.4: the
  embodied RLinf path uses no KL term; Flow-GRPO's Gaussian-mean KL (notes §3.1) is not this function.
- ``entropy`` (notes §1.4, §1.2: total = actor + critic − coef·H, coef 0.005 for Flow-Noise).
- ``nft`` (notes §3.2, DiffusionNFT negative-aware forward-process loss, paper form).
- ``flow_dpo`` (notes §3.3, Flow-DPO / Diffusion-DPO).
- ``flow_dpo_trajectory``: the same preference over whole episodes (implicit rewards summed per episode).

Sign convention: every function returns a loss to MINIMISE. Policy/value/NFT/DPO losses return
``(loss, metrics)`` with ``metrics`` a dict of detached scalar tensors; ``kl_penalty`` and ``entropy_bonus``
return a scalar tensor. Masks are 1 (or True) for entries that count and broadcast against the data;
padded/invalid entries contribute neither to numerators nor to denominators.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cosmos_robot_trainers.algorithms.registry import register

Metrics = dict[str, torch.Tensor]

LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``sum(x·m) / max(sum(m), 1)`` over all entries; ``mask`` broadcasts against ``x`` (None = all count)."""
    if mask is None:
        return x.mean()
    m = mask.to(x.dtype).expand_as(x)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def _per_sample_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Masked mean over all non-batch dims -> (B,)."""
    m = torch.ones_like(x) if mask is None else mask.to(x.dtype).expand_as(x)
    dims = tuple(range(1, x.dim()))
    if not dims:
        return x * m
    return (x * m).sum(dims) / m.sum(dims).clamp(min=1.0)


def _aggregate(
    loss: torch.Tensor, mask: torch.Tensor | None, loss_agg: str, norm_constant: float | None
) -> torch.Tensor:
    """Reduce an elementwise (B, ...) loss; the first dim is the sequence (trajectory) dim."""
    if loss_agg == "token_mean":
        return masked_mean(loss, mask)
    m = torch.ones_like(loss) if mask is None else mask.to(loss.dtype).expand_as(loss)
    dims = tuple(range(1, loss.dim()))
    seq_sum = (loss * m).sum(dims) if dims else loss * m
    seq_count = m.sum(dims) if dims else m
    has_tokens = (seq_count > 0).to(loss.dtype)
    if loss_agg == "seq_mean_token_mean":
        per_seq = seq_sum / seq_count.clamp(min=1.0)
    elif loss_agg == "seq_mean_token_sum_norm":
        if norm_constant is None or norm_constant <= 0:
            raise ValueError("loss_agg='seq_mean_token_sum_norm' needs a positive norm_constant (Dr. GRPO)")
        per_seq = seq_sum / norm_constant
    else:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; choose one of {', '.join(LOSS_AGGS)}")
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


def aggregate(
    loss: torch.Tensor, mask: torch.Tensor | None, loss_agg: str = "token_mean", norm_constant: float | None = None
) -> torch.Tensor:
    """The policy losses' reduction of an elementwise (B, ...) loss (linear: a KL term aggregated the same way
    and added equals adding it per token first, as TRL does)."""
    return _aggregate(loss, mask, loss_agg, norm_constant)


@register("loss", "ppo")
def ppo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip: float = 0.2,
    dual_clip: float | None = 3.0,
    clip_high: float | None = None,
    loss_agg: str = "token_mean",
    norm_constant: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate with dual clip (notes §1.4, RLinf), masked token-mean by default.

    Exactly the notes' formula and sign convention (a loss to minimise)::

        ratio = exp(logp − logp_old)
        L1 = −A·ratio;   L2 = −A·clip(ratio, 1 − clip, 1 + clip_high)   (clip_high defaults to clip)
        L  = max(L1, L2)
        L  = min(L, sign(A)·c·A)          with c = dual_clip = 3

    For A < 0, sign(A)·c·A = −c·A = c·|A|, so the loss of a negative-advantage sample is capped at the value it
    has at ratio = c. For A > 0 the cap is inert (L ≤ −A·(1 − clip) < 0 < c·A), and at A = 0 both are 0, so this
    equals verl/RLinf's ``where(A < 0, min(L, −c·A), L)``. ``dual_clip=None`` disables it.

    Shapes: ``log_prob``/``old_log_prob`` (B, ...) at the chosen log-prob granularity (chunk/action/token level,
    notes §1.2); ``advantages`` and ``mask`` broadcast to that shape. ``loss_agg``: ``token_mean`` (RLinf),
    ``seq_mean_token_mean`` (mean over the first dim of per-sequence token means) or ``seq_mean_token_sum_norm``
    (Dr. GRPO: per-sequence token sum / ``norm_constant``, then mean over sequences).

    Metrics: ``clip_fraction`` (share of valid entries where the clipped term L2 is active), ``dual_clip_fraction``,
    ``approx_kl`` (k3 = (ratio − 1) − log ratio, cleanrl's estimator), ``approx_kl_k1`` (mean(logp_old − logp)),
    ``ratio_mean``.

    ``token_weights`` (broadcast like ``advantages``, no gradient) multiply each entry's loss before the
    aggregation: the truncated importance-sampling correction of a rollout engine whose sampling
    log-probs differ from the trainer's (TRL's ``vllm_importance_sampling_correction``).
    """
    high = clip if clip_high is None else clip_high
    log_ratio = log_prob.float() - old_log_prob.float()
    ratio = torch.exp(log_ratio)
    adv = advantages.float().expand_as(ratio)
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - clip, 1.0 + high)
    loss = torch.maximum(loss1, loss2)
    dual_clipped = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        cap = torch.sign(adv) * dual_clip * adv
        dual_clipped = loss > cap
        loss = torch.minimum(loss, cap)
    if token_weights is not None:
        loss = loss * token_weights.detach().float().expand_as(loss)
    total = _aggregate(loss, mask, loss_agg, norm_constant)
    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((loss2 > loss1).float(), mask),
            "dual_clip_fraction": masked_mean(dual_clipped.float(), mask),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
            "approx_kl_k1": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return total, metrics


@register("loss", "gspo")
def gspo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (arXiv 2507.18071; not in the notes): one importance ratio per sequence (first dim = sequence)::

        s_i = exp( mean_{valid t}(logp_{i,t} − logp_old_{i,t}) )       (length-normalised sequence ratio)
        L_i = max(−A_i·s_i, −A_i·clip(s_i, 1 − clip_low, 1 + clip_high))
        loss = mean over sequences with at least one valid token

    ``advantages`` is (B,) (or anything with B elements). The paper's clip range is (3e-4, 4e-4), the default.
    """
    log_ratio = log_prob.float() - old_log_prob.float()
    seq_log_ratio = _per_sample_mean(log_ratio, mask)
    if mask is None:
        has_tokens = torch.ones_like(seq_log_ratio)
    else:
        m = mask.to(log_ratio.dtype).expand_as(log_ratio)
        has_tokens = (m.sum(tuple(range(1, m.dim()))) > 0).to(log_ratio.dtype) if m.dim() > 1 else m
    s = torch.exp(seq_log_ratio)
    adv = advantages.float().reshape(s.shape)
    loss1 = -adv * s
    loss2 = -adv * torch.clamp(s, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    total = masked_mean(loss, has_tokens)
    with torch.no_grad():
        metrics = {
            "clip_fraction": masked_mean((loss2 > loss1).float(), has_tokens),
            "ratio_mean": masked_mean(s, has_tokens),
            "approx_kl_k1": masked_mean(-seq_log_ratio, has_tokens),
        }
    return total, metrics


@register("loss", "value")
def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip: float | None = 0.2,
    huber_delta: float = 10.0,
) -> tuple[torch.Tensor, Metrics]:
    """Value-clipped Huber critic loss (notes §1.4, RLinf)::

        V_clip = V_old + clip(V − V_old, −clip, +clip)
        L = max( Huber_δ(R − V), Huber_δ(R − V_clip) ),   Huber_δ(e) = e²/2 if |e| <= δ else δ·(|e| − δ/2)
        loss = masked mean of L,  δ = huber_delta = 10

    ``clip=None`` gives the unclipped Huber loss. Metrics: ``value_clip_fraction`` (share where the clipped term
    is larger), ``explained_variance`` = 1 − Var(R − V)/Var(R) over valid entries, ``value_mean``.
    """
    v = values.float()
    ret = returns.float()
    loss = F.huber_loss(v, ret, reduction="none", delta=huber_delta)
    clipped_larger = torch.zeros_like(loss, dtype=torch.bool)
    if clip is not None:
        v_clip = old_values.float() + torch.clamp(v - old_values.float(), -clip, clip)
        loss_clip = F.huber_loss(v_clip, ret, reduction="none", delta=huber_delta)
        clipped_larger = loss_clip > loss
        loss = torch.maximum(loss, loss_clip)
    total = masked_mean(loss, mask)
    with torch.no_grad():
        ret_mean = masked_mean(ret, mask)
        var_ret = masked_mean((ret - ret_mean) ** 2, mask)
        err = ret - v
        var_err = masked_mean((err - masked_mean(err, mask)) ** 2, mask)
        ev = torch.where(var_ret > 0, 1.0 - var_err / var_ret.clamp(min=1e-12), torch.zeros_like(var_ret))
        metrics = {
            "value_clip_fraction": masked_mean(clipped_larger.float(), mask),
            "explained_variance": ev,
            "value_mean": masked_mean(v, mask),
        }
    return total, metrics


@register("loss", "kl")
def kl_penalty(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "k3", mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Masked-mean KL(π_θ || π_ref) estimate from sampled log-probs (Schulman's estimators, as in verl).

    With d = logp_ref − logp:  k1 = −d;  k2 = d²/2;  k3 = exp(d) − d − 1 (unbiased, >= 0; clamped to <= 10 as in
    verl);  ``abs`` = |d|. Notes §1.4: RLinf's embodied PPO uses no KL term; this is for recipes that add one
    (e.g. the GR00T N1.7 config's kl_beta 0.01).
    """
    d = ref_log_prob.float() - log_prob.float()
    if kind == "k1":
        kl = -d
    elif kind == "k2":
        kl = 0.5 * d**2
    elif kind == "k3":
        kl = torch.clamp(torch.exp(d) - d - 1.0, max=10.0)
    elif kind == "abs":
        kl = d.abs()
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2, k3 or abs")
    return masked_mean(kl, mask)


@register("loss", "entropy")
def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor | None = None, coef: float = 1.0) -> torch.Tensor:
    """Entropy term as a loss to ADD: ``−coef·masked_mean(H)`` (notes §1.4: total = actor + critic − coef·H).

    Notes §1.2: only Flow-Noise has a policy entropy (Gaussian ½·log(2πeσ²) per dim), coef 0.005.
    """
    return -coef * masked_mean(entropy.float(), mask)


@register("loss", "nft")
def nft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    target: torch.Tensor,
    r: torch.Tensor,
    beta: float = 1.0,
    mask: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """DiffusionNFT negative-aware forward-process loss, paper form (notes §3.2, arXiv 2509.16117).

    With x_t = (1 − t)·x0 + t·ε and flow target v = ε − x0 (the caller builds ``target``)::

        v+ = (1 − β)·v_old + β·v_θ          (implicit positive policy)
        v− = (1 + β)·v_old − β·v_θ          (implicit negative policy)
        L(θ) = E[ r·||v+ − v||² + (1 − r)·||v− − v||² ]

    ``r`` (B,) is the optimality probability in [0, 1] (``nft_optimality``). ``v_old`` is the EMA "old" policy's
    velocity and is detached here. ||·||² is taken as the masked mean over the non-batch dims (the code's MSE; a
    constant rescaling of the sum), so padded action dims/steps do not count; the batch is then averaged,
    each sample scaled by ``weight`` (B,) when given (the robot trainer's per-episode weighting).

    Not implemented here (code-form extras, notes §3.2): the x0-space adaptive weighting, the ×A_max/β scale and
    the 1e-4 KL-to-reference term; a caller can scale the loss or add ``||v_θ − v_ref||²`` itself.
    """
    v_old = v_old.detach().float()
    v_theta = v_theta.float()
    tgt = target.float()
    v_pos = (1.0 - beta) * v_old + beta * v_theta
    v_neg = (1.0 + beta) * v_old - beta * v_theta
    e_pos = _per_sample_mean((v_pos - tgt) ** 2, mask)
    e_neg = _per_sample_mean((v_neg - tgt) ** 2, mask)
    rr = r.float().reshape(e_pos.shape)
    per_sample = rr * e_pos + (1.0 - rr) * e_neg
    if weight is not None:
        per_sample = per_sample * weight.float().reshape(e_pos.shape)
    loss = per_sample.mean()
    with torch.no_grad():
        metrics = {"nft_pos_mse": e_pos.mean(), "nft_neg_mse": e_neg.mean(), "r_mean": rr.mean()}
    return loss, metrics


def flow_dpo_logits(
    v_theta_w: torch.Tensor,
    v_ref_w: torch.Tensor,
    target_w: torch.Tensor,
    v_theta_l: torch.Tensor,
    v_ref_l: torch.Tensor,
    target_l: torch.Tensor,
    beta: float = 100.0,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The (B,) logits of ``flow_dpo_loss`` and the four per-sample errors ``(e_θ(w), e_ref(w), e_θ(l), e_ref(l))``."""
    e_tw = _per_sample_mean((v_theta_w.float() - target_w.float()) ** 2, mask)
    e_rw = _per_sample_mean((v_ref_w.detach().float() - target_w.float()) ** 2, mask)
    e_tl = _per_sample_mean((v_theta_l.float() - target_l.float()) ** 2, mask)
    e_rl = _per_sample_mean((v_ref_l.detach().float() - target_l.float()) ** 2, mask)
    return -0.5 * beta * ((e_tw - e_rw) - (e_tl - e_rl)), (e_tw, e_rw, e_tl, e_rl)


@register("loss", "flow_dpo")
def flow_dpo_loss(
    v_theta_w: torch.Tensor,
    v_ref_w: torch.Tensor,
    target_w: torch.Tensor,
    v_theta_l: torch.Tensor,
    v_ref_l: torch.Tensor,
    target_l: torch.Tensor,
    beta: float = 100.0,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Flow-DPO (notes §3.3; flow_grpo ``train_sd3_dpo.py``), Diffusion-DPO's form on velocity errors::

        e(m, x) = ||v_m(x_t) − u||²,  u = ε − x0   (same ε and t for winner w and loser l)
        L = −log σ( −β/2 · [ (e_θ(w) − e_ref(w)) − (e_θ(l) − e_ref(l)) ] ),   β = 100

    ||·||² is the masked mean over non-batch dims (as the code's ``.mean``); the reference velocities are detached.
    Diffusion-DPO (arXiv 2311.12908) is the same formula with ε-prediction errors (β_dpo = 5000 there).
    Metrics: ``implicit_acc`` (share with a positive logit, a zero logit counting one half: 0.5 at
    initialisation), ``logit_mean``, ``model_margin``
    (e_θ(w) − e_θ(l), mean) and ``ref_margin``.
    """
    logit, (e_tw, e_rw, e_tl, e_rl) = flow_dpo_logits(
        v_theta_w, v_ref_w, target_w, v_theta_l, v_ref_l, target_l, beta, mask
    )
    loss = -F.logsigmoid(logit).mean()
    with torch.no_grad():
        metrics = {
            "implicit_acc": ((logit > 0).float() + 0.5 * (logit == 0).float()).mean(),  # a tie counts one half
            "logit_mean": logit.mean(),
            "model_margin": (e_tw - e_tl).mean(),
            "ref_margin": (e_rw - e_rl).mean(),
        }
    return loss, metrics


@register("loss", "flow_dpo_trajectory")
def flow_dpo_trajectory_loss(
    diff_w: torch.Tensor,
    pair_w: torch.Tensor,
    diff_l: torch.Tensor,
    pair_l: torch.Tensor,
    num_pairs: int,
    beta: float = 100.0,
    reduce: str = "sum",
) -> tuple[torch.Tensor, Metrics]:
    """Flow-DPO over whole episodes: Diffusion-DPO's implicit reward summed over each episode's decisions::

        d = e_θ(x) − e_ref(x) per decision (the ``flow_dpo`` errors, ``diff_w`` / ``diff_l``)
        L = −log σ( −β/2 · [ Σ_{decisions of w} d − Σ_{decisions of l} d ] ),  mean over the pairs

    ``reduce = "mean"`` divides each episode's sum by its number of decisions (length-normalised, as
    SimPO normalises sequence log-probs): with sums, an episode's implicit reward grows with its length.

    ``pair_w`` / ``pair_l`` give the pair (0..num_pairs−1) each decision belongs to. Diffusion-DPO sums the
    per-step terms of a denoising chain (arXiv 2311.12908); here the chain is the episode's sequence of
    action chunks. Metrics: ``implicit_acc`` (share of pairs with a positive logit), ``logit_mean``.
    """
    if reduce not in ("sum", "mean"):
        raise ValueError(f"reduce: expected 'sum' or 'mean', got {reduce!r}")

    def per_pair(diff: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
        idx = pair.to(diff.device)
        total = torch.zeros(num_pairs, device=diff.device).index_add(0, idx, diff.float())
        if reduce == "sum":
            return total
        count = torch.zeros(num_pairs, device=diff.device).index_add(0, idx, torch.ones_like(diff.float()))
        return total / count.clamp(min=1.0)

    logit = -0.5 * beta * (per_pair(diff_w, pair_w) - per_pair(diff_l, pair_l))
    loss = -F.logsigmoid(logit).mean()
    with torch.no_grad():
        metrics = {"implicit_acc": (logit > 0).float().mean(), "logit_mean": logit.mean()}
    return loss, metrics


@register("loss", "dpo")
def dpo_loss(
    chosen_logp: torch.Tensor,
    rejected_logp: torch.Tensor,
    ref_chosen_logp: torch.Tensor,
    ref_rejected_logp: torch.Tensor,
    beta: float = 0.1,
    kind: str = "sigmoid",
) -> tuple[torch.Tensor, Metrics]:
    """DPO over (P,) sequence log-probs (TRL ``DPOTrainer``; text_posttrain_anchors.md §1c)::

        d = (logp_c − ref_c) − (logp_r − ref_r)
        sigmoid:  L = mean(−log σ(β·d))                    (Rafailov et al.; TRL's default, β = 0.1)
        ipo:      L = mean((d − 1/(2β))²)                  (Azar et al.; pass length-normalised log-probs,
                                                            as TRL does for ipo)

    Metrics: ``reward_accuracy`` (share with d > 0), ``margin`` (β·d mean), ``chosen_reward`` and
    ``rejected_reward`` (β·(logp − ref) means, TRL's logged rewards).
    """
    d = (chosen_logp.float() - ref_chosen_logp.float().detach()) - (
        rejected_logp.float() - ref_rejected_logp.float().detach()
    )
    if kind == "sigmoid":
        loss = -F.logsigmoid(beta * d).mean()
    elif kind == "ipo":
        loss = ((d - 1.0 / (2.0 * beta)) ** 2).mean()
    else:
        raise ValueError(f"unknown DPO loss {kind!r}; choose sigmoid or ipo")
    with torch.no_grad():
        metrics = {
            "reward_accuracy": (d > 0).float().mean(),
            "margin": (beta * d).mean(),
            "chosen_reward": (beta * (chosen_logp.float() - ref_chosen_logp.float())).mean(),
            "rejected_reward": (beta * (rejected_logp.float() - ref_rejected_logp.float())).mean(),
        }
    return loss, metrics
