"""The update phase of each algorithm: minibatches of stored decisions -> registered losses -> AdamW.

- ``update_policy_gradient``: joint PPO (clipped surrogate with dual clip + clipped Huber value loss
  on the shared trunk + optional entropy bonus and KL to the frozen initial policy) and GRPO (the same
  surrogate, or GSPO's sequence ratio over whole episodes, without a critic). Log-probs are
  recomputed from the stored denoising chains (``recompute_log_prob``), so on the first minibatch of
  every update the ratio is 1 up to float error; ``ratio_dev_first_mb`` reports max |ratio - 1|
  there and the driver refuses to continue past 1e-3 (the correctness gate).
- ``split_half_cosine``: a health metric, no step: the cosine between the policy-loss gradients of
  one minibatch from each of two random halves of the iteration's episodes (``train.grad_cosine_every``).
- ``accumulated_step`` (shared with ``regression.py``'s DiffusionNFT and Flow-DPO updates): the
  backward of the rows' loss, in ``optim.micro_batch_size`` micro-batches each weighted by its share
  (the gradient is the whole part's with one micro-batch's activations), then each parameter group
  clipped on its own (actor ``optim.grad_clip``, value head ``optim.critic_grad_clip``; one global clip
  let the critic's norm shrink the actor's step), pre-clip norms logged per group. An ``aux`` loss
  (the ``[bc]`` demonstration loss, ``rl/demos.py``) is added once per step, whatever the algorithm.

Log-probs cover the rows ``[:replan_steps]`` and the action dims ``rollout.logprob_dims`` (the same
set the rollout sampled with). Every function returns the mean of its per-minibatch metrics (floats).

Data-parallel learners (``world``, under ``torchrun``): every rank holds the whole rollout and draws
the same minibatches from the same generator; each takes its contiguous share of a minibatch
(``rank_share``), weights its loss by that share so that the gradients averaged over ranks are the
whole minibatch's (``accumulated_step``), and the metrics are combined with the same weights
(``Means.result``). One process is the world of one, where all of this is the identity.
A sharded learner (``train.fsdp``) gathers its blocks in every forward, so every rank runs the same
number of micro-batches (the most any rank needs; a rank with fewer rows computes one at weight 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cosmos_robot.distributed import World, max_over_ranks, rank_share, sum_over_ranks
from cosmos_robot.policies.flow.sampling import SampleMode, recompute_log_prob
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.common import fsdp
from cosmos_robot_trainers.rl.advantage import Advantages
from cosmos_robot_trainers.rl.config import OptimConfig, RLConfig
from cosmos_robot_trainers.rl.inputs import AuxLoss
from cosmos_robot_trainers.rl.policies import RLModel
from cosmos_robot_trainers.rl.rollout import Rollout, index_inputs

__all__ = [
    "RATIO_GATE",
    "Means",
    "build_optimizer",
    "minibatches",
    "accumulated_step",
    "logprob_dims",
    "episode_split_minibatches",
    "policy_gradient",
    "policy_gradient_health",
    "split_half_cosine",
    "split_halves",
    "update_policy_gradient",
]

RATIO_GATE = 1e-3  # max |ratio - 1| allowed on the first minibatch of an update


def build_optimizer(model: RLModel, config: RLConfig) -> torch.optim.AdamW:
    """AdamW with the value head at ``critic_lr`` and the rest of the model at ``actor_lr``."""
    o = config.optim
    critic = [p for n, p in model.named_parameters() if n.startswith("value_head.")]
    actor = [p for n, p in model.named_parameters() if not n.startswith("value_head.")]
    device = next(model.parameters()).device
    # a sharded learner that left tensors whole (a mixed-dtype checkpoint's minority, fsdp.shard_model) steps
    # them one by one: the fused and foreach kernels take a group's DTensors and plain tensors together
    apart = fsdp.is_sharded(model) and any(p.dim() > 0 for p in fsdp.replicated_params(model))
    return torch.optim.AdamW(
        [{"params": actor, "lr": o.actor_lr, "name": "actor"}, {"params": critic, "lr": o.critic_lr, "name": "critic"}],
        betas=o.betas,
        weight_decay=o.weight_decay,
        fused=device.type in ("cpu", "cuda") and not apart,
        foreach=False if apart else None,
    )


MAX_KEYS = frozenset({"ratio_dev_first_mb"})  # worst cases: the largest over ranks, not a mean


class Means:
    """Running means of per-minibatch metrics (tensors or floats). Under data parallelism each rank adds
    its share's metrics with its share's weight (``rank_share``); ``result(world)`` then gives the
    metrics of the whole minibatches (the weights average to 1 over ranks)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, values: dict[str, Any], weight: float = 1.0) -> None:
        for key, value in values.items():
            v = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
            w = 1.0 if key in MAX_KEYS else weight
            self.sums[key] = self.sums.get(key, 0.0) + v * w
            self.counts[key] = self.counts.get(key, 0) + 1

    def result(self, world: World | None = None) -> dict[str, float]:
        out = {k: self.sums[k] / self.counts[k] for k in self.sums}
        if world is None or not world.distributed:
            return out
        keys = sorted(k for k in out if k not in MAX_KEYS)  # the same keys on every rank: the same code ran
        summed = sum_over_ranks(torch.tensor([out[k] for k in keys], dtype=torch.float64), world)
        merged = {k: float(v) / world.world_size for k, v in zip(keys, summed.tolist(), strict=True)}
        merged.update({k: max_over_ranks(out[k], world) for k in sorted(MAX_KEYS & out.keys())})
        return merged


def _inputs(rollout: Rollout, idx: torch.Tensor, device: torch.device) -> dict[str, Any]:
    return index_inputs(rollout.inputs, idx, device)


def minibatches(items: torch.Tensor, size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    order = items[torch.randperm(len(items), generator=generator)]
    for start in range(0, len(order), size):
        yield order[start : start + size]


def accumulated_step(
    model: RLModel,
    optimizer: torch.optim.Optimizer,
    rows: torch.Tensor,
    loss_fn: Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any]]],
    optim: OptimConfig,
    world: World | None = None,
    weight: float = 1.0,
    units: torch.Tensor | None = None,
    aux: AuxLoss | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One optimizer step on ``loss_fn(rows)``, cut into ``optim.micro_batch_size`` micro-batches (whole ``units``
    each, e.g. GSPO's episodes): each part's ``loss_fn(part)`` is weighted by its share of the rows (as
    data-parallel ranks are, ``rank_share``) and back-propagated on its own, so the accumulated gradient
    is that of ``loss_fn(rows)``. Returns ``(the weighted loss, metrics)``: the parts' metrics combined
    by share (``MAX_KEYS``: the largest) and the step's gradient norms. ``aux(model)`` is back-propagated
    once on top, at weight 1 on every rank (the same draws everywhere, so the rank average is itself)."""
    size = optim.micro_batch_size
    k = 1 if size is None else max(1, math.ceil(len(rows) / size))
    sharded = fsdp.is_sharded(model)
    if sharded and world is not None and size is not None:  # every rank gathers the blocks as often
        k = int(max_over_ranks(float(k), world))
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros(())
    merged: dict[str, float] = {}
    for i in range(k):
        part, share = (rows, 1.0) if k == 1 else rank_share(rows, World(rank=i, world_size=k), units)
        share /= k
        loss, metrics = loss_fn(part)
        scaled = loss * (weight * share) if weight * share != 1.0 else loss
        scaled.backward()
        total = total + float(loss.detach()) * share
        for key, value in metrics.items():
            v = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
            if key in MAX_KEYS:
                merged[key] = max(merged.get(key, -math.inf), v)
            else:
                merged[key] = merged.get(key, 0.0) + v * share
    if aux is not None:
        aux_loss, aux_metrics = aux(model)
        aux_loss.backward()
        merged.update({k: float(v) for k, v in aux_metrics.items()})
    return total, {**merged, **_finish_step(model, optimizer, optim, world)}


def _finish_step(
    model: RLModel, optimizer: torch.optim.Optimizer, optim: OptimConfig, world: World | None
) -> dict[str, float]:
    """Average the gradients over ranks, clip each parameter group on its own, step; the norms."""
    fsdp.average_gradients(model, world)
    clips = {"actor": optim.grad_clip, "critic": optim.critic_grad_clip}
    norms: dict[str, float] = {}
    for group in optimizer.param_groups:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            continue
        name = str(group.get("name", "actor"))
        norm = fsdp.clip_gradients(params, clips[name])
        if not math.isfinite(norm):
            raise FloatingPointError(f"{name} gradient norm is {norm}; lower optim.actor_lr / optim.critic_lr")
        norms[f"grad_norm_{name}"] = norm
    optimizer.step()
    norms["grad_norm"] = math.sqrt(sum(v * v for v in norms.values()))
    return norms


def logprob_dims(model: RLModel, config: RLConfig) -> tuple[int, ...]:
    """The action dims the log-probs and losses cover: ``rollout.logprob_dims`` within the executed
    (never padding) dims of the model, the same set the rollout sampled with."""
    return config.logprob_dims(int(getattr(model, "action_dims", model.config.action_dim)))


@dataclass
class _PolicyGradient:
    """One PPO / GRPO / GSPO update's fixed inputs; ``loss(mb)`` is a minibatch's joint loss."""

    model: RLModel
    rollout: Rollout
    adv: Advantages
    config: RLConfig
    sample_mode: SampleMode
    noise_level: float
    dims: tuple[int, ...]
    ref_model: RLModel | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def log_prob(self, m: RLModel, context: Any, mb: torch.Tensor) -> Any:
        chain, sde = self.rollout.chain[mb].to(self.device), self.rollout.sde_step[mb].to(self.device)
        h = self.config.rollout.replan_steps
        return recompute_log_prob(m, context, chain, self.sample_mode, sde, self.noise_level, h, self.dims)

    def surrogate(self, mb: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any], Any, Any, dict[str, Any]]:
        """The per-decision clipped surrogate of ``mb``: ``(loss, metrics, log-probs, context, batch)``."""
        algo = self.config.algo
        batch = _inputs(self.rollout, mb, self.device)
        context = self.model.encode(batch)
        lp = self.log_prob(self.model, context, mb)
        new, old, a = self.ratio_terms(lp, mb)
        pl, pm = get_algorithm("loss", "ppo")(
            new, old, a, clip=algo.clip, clip_high=algo.clip_high, dual_clip=algo.dual_clip
        )
        return pl, pm, lp, context, batch

    def ratio_terms(self, lp: Any, mb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log-prob, old log-prob, advantage)`` at ``algo.ratio_level``: ``(B,)``, ``(B, h)`` or ``(B, h, d)``,
        the advantage shaped to broadcast over the decision's rows / elements."""
        level = self.config.algo.ratio_level
        a = self.adv.advantages[mb].to(self.device)
        if level == "chunk":
            return lp.log_prob, self.rollout.log_prob[mb].to(self.device), a
        if self.rollout.elem_log_prob is None:
            raise ValueError(f"algo.ratio_level {level!r} needs per-element old log-probs; this rollout has none")
        old = self.rollout.elem_log_prob[mb].to(self.device)
        if level == "action":
            return lp.dim_log_prob.sum(-1), old.sum(-1), a[:, None]
        return lp.dim_log_prob, old, a[:, None, None]

    def loss(self, mb: torch.Tensor, *, train_policy: bool, gspo: bool, first: bool) -> tuple[torch.Tensor, dict]:
        algo = self.config.algo
        pl, pm, lp, context, batch = self.surrogate(mb)
        old = self.rollout.log_prob[mb].to(self.device)
        metrics: dict[str, Any] = {}
        loss = torch.zeros((), device=self.device)
        if first:
            with torch.no_grad():
                metrics["ratio_dev_first_mb"] = float((torch.exp(lp.log_prob - old) - 1.0).abs().max())
        if train_policy:
            if gspo:
                a = self.adv.advantages[mb].to(self.device)
                pl, pm = _gspo(lp.log_prob, old, a, self.rollout, mb, algo.gspo_clip_low, algo.gspo_clip_high)
            loss = loss + pl
            metrics.update({"policy_loss": pl, **pm})
            if algo.entropy_coef > 0:
                ent = lp.entropy.mean()
                loss = loss - algo.entropy_coef * ent
                metrics["entropy"] = ent
            if self.ref_model is not None and algo.kl_coef > 0:
                with torch.no_grad():
                    ref_lp = self.log_prob(self.ref_model, self.ref_model.encode(batch), mb)
                kl = get_algorithm("loss", "kl")(lp.log_prob, ref_lp.log_prob, "k3")
                loss = loss + algo.kl_coef * kl
                metrics["kl_ref"] = kl
        if self.adv.returns is not None:
            v = self.model.value(context, detach=algo.detach_critic)
            vl, vm = get_algorithm("loss", "value")(
                v,
                self.rollout.value[mb].to(self.device),
                self.adv.returns[mb].to(self.device),
                clip=algo.value_clip,
                huber_delta=algo.huber_delta,
            )
            loss = loss + algo.value_coef * vl
            metrics.update({"value_loss": vl, "value_mean": vm["value_mean"]})
        return loss, metrics


def policy_gradient(
    model: RLModel,
    rollout: Rollout,
    adv: Advantages,
    config: RLConfig,
    *,
    sample_mode: SampleMode,
    noise_level: float,
    ref_model: RLModel | None = None,
) -> _PolicyGradient:
    """The minibatch losses of a PPO / GRPO update over ``rollout`` (log-probs over ``logprob_dims``)."""
    dims = logprob_dims(model, config)
    return _PolicyGradient(model, rollout, adv, config, sample_mode, noise_level, dims, ref_model)


def update_policy_gradient(
    model: RLModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    adv: Advantages,
    config: RLConfig,
    generator: torch.Generator,
    *,
    sample_mode: SampleMode,
    num_flow_steps: int,
    noise_level: float,
    train_policy: bool = True,
    sequence_ratio: bool = False,
    ref_model: RLModel | None = None,
    world: World | None = None,
    aux: AuxLoss | None = None,
) -> dict[str, float]:
    """PPO / GRPO / GSPO epochs over the rollout. ``adv.returns`` set -> joint PPO with the value loss;
    ``sequence_ratio`` -> GSPO's per-episode ratio (minibatches of whole episodes); ``world``: this
    rank's shares of the minibatches (module docstring)."""
    world = world or World()
    o = config.optim
    pg = policy_gradient(
        model, rollout, adv, config, sample_mode=sample_mode, noise_level=noise_level, ref_model=ref_model
    )
    keep_idx = torch.nonzero(adv.keep).flatten()
    means = Means()
    first = True
    model.train()
    if len(keep_idx) == 0:
        return {"skipped_update": 1.0}
    episodes = torch.unique(rollout.episode[keep_idx])
    for _ in range(o.epochs):
        if sequence_ratio:  # minibatches of whole episodes (the ratio is per sequence)
            per_ep = max(1, o.minibatch_size // max(1, int(rollout.step.max()) + 1))
            batches = [
                keep_idx[torch.isin(rollout.episode[keep_idx], eps)] for eps in minibatches(episodes, per_ep, generator)
            ]
        else:
            batches = list(minibatches(keep_idx, o.minibatch_size, generator))
        for mb in batches:
            units = rollout.episode[mb] if sequence_ratio else None
            mine, weight = rank_share(mb, world, units)

            def loss_fn(part: torch.Tensor, first: bool = first) -> tuple[torch.Tensor, dict[str, Any]]:
                return pg.loss(part, train_policy=train_policy, gspo=sequence_ratio, first=first)

            mine_units = rollout.episode[mine] if sequence_ratio else None
            _, metrics = accumulated_step(model, optimizer, mine, loss_fn, o, world, weight, mine_units, aux)
            first = False
            means.add(metrics, weight)
    return means.result(world)


def _gspo(
    log_prob: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    rollout: Rollout,
    mb: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GSPO over the minibatch's episodes: decisions laid out as (episodes, steps) with a mask."""
    eps, local = torch.unique(rollout.episode[mb], return_inverse=True)
    steps = rollout.step[mb]
    t_max = int(steps.max()) + 1
    shape = (len(eps), t_max)
    lp = torch.zeros(shape, device=log_prob.device).index_put((local, steps), log_prob)
    lo = torch.zeros(shape, device=log_prob.device).index_put((local, steps), old)
    mask = torch.zeros(shape, dtype=torch.bool, device=log_prob.device).index_put(
        (local, steps), torch.ones_like(steps, dtype=torch.bool)
    )
    ep_adv = torch.zeros(len(eps), device=log_prob.device).index_put((local,), adv)
    loss, metrics = get_algorithm("loss", "gspo")(lp, lo, ep_adv, mask=mask, clip_low=clip_low, clip_high=clip_high)
    return loss, metrics


def split_halves(units: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``units`` (e.g. episode ids) shuffled and cut into two halves."""
    order = units[torch.randperm(len(units), generator=generator)]
    return order[: len(order) // 2], order[len(order) // 2 :]


def split_half_cosine(
    model: RLModel, minibatches: tuple[torch.Tensor, torch.Tensor], loss_of: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, float]:
    """``grad_cosine_split_half``: the cosine between the actor gradients (every parameter but the value
    head) of ``loss_of`` on two minibatches drawn from disjoint halves of the data. The model and its
    ``.grad`` are left unchanged (a sharded model's gradients are left unset: ``fsdp.grad_cosine``).
    Near 0 (the diagnosis: -0.04 on a 64-episode tabletop iteration) the two halves disagree on the
    direction: a minibatch step is mostly noise; clearly positive means the iteration's data carries a
    shared direction."""
    params = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("value_head.")]
    if fsdp.is_sharded(model):
        return {"grad_cosine_split_half": fsdp.grad_cosine(model, params, minibatches, loss_of)}
    flat = []
    for mb in minibatches:
        grads = torch.autograd.grad(loss_of(mb), params, allow_unused=True)
        flat.append(torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)]))
    cos = torch.nn.functional.cosine_similarity(flat[0], flat[1], dim=0)
    return {"grad_cosine_split_half": float(cos)}


def episode_split_minibatches(
    rollout: Rollout, keep: torch.Tensor, size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One minibatch of kept decisions from each random half of the kept episodes (None: < 2 episodes)."""
    keep_idx = torch.nonzero(keep).flatten()
    episodes = torch.unique(rollout.episode[keep_idx])
    if len(episodes) < 2:
        return None
    halves = split_halves(episodes, generator)
    out = []
    for half in halves:
        rows = keep_idx[torch.isin(rollout.episode[keep_idx], half)]
        out.append(rows[torch.randperm(len(rows), generator=generator)[:size]])
    return out[0], out[1]


def policy_gradient_health(
    model: RLModel,
    rollout: Rollout,
    adv: Advantages,
    config: RLConfig,
    generator: torch.Generator,
    *,
    sample_mode: SampleMode,
    noise_level: float,
) -> dict[str, float]:
    """Split-half cosine of the per-decision clipped surrogate's gradient (before the update: ratio 1)."""
    mbs = episode_split_minibatches(rollout, adv.keep, config.optim.minibatch_size, generator)
    if mbs is None:
        return {}
    pg = policy_gradient(model, rollout, adv, config, sample_mode=sample_mode, noise_level=noise_level)
    model.train()
    return split_half_cosine(model, mbs, lambda mb: pg.surrogate(mb)[0])
