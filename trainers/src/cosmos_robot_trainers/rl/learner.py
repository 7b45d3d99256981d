"""The update phase of each algorithm: minibatches of stored decisions -> registered losses -> AdamW.

- ``update_policy_gradient``: joint PPO (clipped surrogate with dual clip + clipped Huber value loss
  on the shared trunk + optional entropy bonus and KL to the frozen initial policy) and GRPO (the same
  surrogate, or GSPO's sequence ratio over whole episodes, without a critic). Log-probs are
  recomputed from the stored denoising chains (``recompute_log_prob``), so on the first minibatch of
  every update the ratio is 1 up to float error; ``ratio_dev_first_mb`` reports max |ratio - 1|
  there and the driver refuses to continue past 1e-3 (the correctness gate).
- ``update_nft``: DiffusionNFT's forward-process loss on the executed chunks, weighted by each
  episode's optimality probability, against the "old" (rollout-time or EMA) policy's velocity.
- ``update_dpo``: Flow-DPO on (success, failure) episode pairs from the same initial state: for each
  pair, decision k of the winner against decision k' of the loser with shared flow noise and time,
  relative to the frozen initial policy.

Every function returns the mean of its per-minibatch metrics (floats) for the metrics log.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from cosmos_robot.policies.flow.sampling import SampleMode, recompute_log_prob
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.rl.advantage import Advantages
from cosmos_robot_trainers.rl.config import RLConfig
from cosmos_robot_trainers.rl.policies import RLModel
from cosmos_robot_trainers.rl.rollout import Rollout, index_inputs

__all__ = ["RATIO_GATE", "build_optimizer", "update_dpo", "update_nft", "update_policy_gradient"]

RATIO_GATE = 1e-3  # max |ratio - 1| allowed on the first minibatch of an update


def build_optimizer(model: RLModel, config: RLConfig) -> torch.optim.AdamW:
    """AdamW with the value head at ``critic_lr`` and the rest of the model at ``actor_lr``."""
    o = config.optim
    critic = [p for n, p in model.named_parameters() if n.startswith("value_head.")]
    actor = [p for n, p in model.named_parameters() if not n.startswith("value_head.")]
    device = next(model.parameters()).device
    return torch.optim.AdamW(
        [{"params": actor, "lr": o.actor_lr, "name": "actor"}, {"params": critic, "lr": o.critic_lr, "name": "critic"}],
        betas=o.betas,
        weight_decay=o.weight_decay,
        fused=device.type in ("cpu", "cuda"),
    )


class _Means:
    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            v = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
            self.sums[key] = self.sums.get(key, 0.0) + v
            self.counts[key] = self.counts.get(key, 0) + 1

    def result(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums}


def _inputs(rollout: Rollout, idx: torch.Tensor, device: torch.device) -> dict[str, Any]:
    return index_inputs(rollout.inputs, idx, device)


def _minibatches(items: torch.Tensor, size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    order = items[torch.randperm(len(items), generator=generator)]
    for start in range(0, len(order), size):
        yield order[start : start + size]


def _step(model: RLModel, optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_clip: float | None) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    if grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in params if p.grad is not None])
        )
    if not torch.isfinite(norm):
        raise FloatingPointError(f"gradient norm is {float(norm)}; lower optim.actor_lr / optim.critic_lr")
    optimizer.step()
    return float(norm)


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
) -> dict[str, float]:
    """PPO / GRPO / GSPO epochs over the rollout. ``adv.returns`` set -> joint PPO with the value loss;
    ``sequence_ratio`` -> GSPO's per-episode ratio (minibatches of whole episodes)."""
    algo, o = config.algo, config.optim
    device = next(model.parameters()).device
    replan_steps = config.rollout.replan_steps
    dims = int(getattr(model, "action_dims", model.config.action_dim))  # executed dims, never padding
    use_value = adv.returns is not None
    gspo = sequence_ratio
    keep_idx = torch.nonzero(adv.keep).flatten()
    means = _Means()
    first = True
    model.train()
    if len(keep_idx) == 0:
        return {"skipped_update": 1.0}
    episodes = torch.unique(rollout.episode[keep_idx])

    def log_prob(m: RLModel, context: Any, mb: torch.Tensor) -> Any:
        chain, sde = rollout.chain[mb].to(device), rollout.sde_step[mb].to(device)
        return recompute_log_prob(m, context, chain, sample_mode, sde, noise_level, replan_steps, dims)

    for _ in range(o.epochs):
        if gspo:  # minibatches of whole episodes (the ratio is per sequence)
            per_ep = max(1, o.minibatch_size // max(1, int(rollout.step.max()) + 1))
            batches = [
                keep_idx[torch.isin(rollout.episode[keep_idx], eps)]
                for eps in _minibatches(episodes, per_ep, generator)
            ]
        else:
            batches = list(_minibatches(keep_idx, o.minibatch_size, generator))
        for mb in batches:
            batch = _inputs(rollout, mb, device)
            context = model.encode(batch)
            lp = log_prob(model, context, mb)
            old = rollout.log_prob[mb].to(device)
            a = adv.advantages[mb].to(device)
            metrics: dict[str, Any] = {}
            loss = torch.zeros((), device=device)
            if first:
                with torch.no_grad():
                    metrics["ratio_dev_first_mb"] = float((torch.exp(lp.log_prob - old) - 1.0).abs().max())
                first = False
            if train_policy:
                if gspo:
                    pl, pm = _gspo(lp.log_prob, old, a, rollout, mb, algo.gspo_clip_low, algo.gspo_clip_high)
                else:
                    pl, pm = get_algorithm("loss", "ppo")(
                        lp.log_prob, old, a, clip=algo.clip, clip_high=algo.clip_high, dual_clip=algo.dual_clip
                    )
                loss = loss + pl
                metrics.update({"policy_loss": pl, **pm})
                if algo.entropy_coef > 0:
                    ent = lp.entropy.mean()
                    loss = loss - algo.entropy_coef * ent
                    metrics["entropy"] = ent
                if ref_model is not None and algo.kl_coef > 0:
                    with torch.no_grad():
                        ref_lp = log_prob(ref_model, ref_model.encode(batch), mb)
                    kl = get_algorithm("loss", "kl")(lp.log_prob, ref_lp.log_prob, "k3")
                    loss = loss + algo.kl_coef * kl
                    metrics["kl_ref"] = kl
            if use_value:
                assert adv.returns is not None
                v = model.value(context, detach=algo.detach_critic)
                vl, vm = get_algorithm("loss", "value")(
                    v,
                    rollout.value[mb].to(device),
                    adv.returns[mb].to(device),
                    clip=algo.value_clip,
                    huber_delta=algo.huber_delta,
                )
                loss = loss + algo.value_coef * vl
                metrics.update({"value_loss": vl, "value_mean": vm["value_mean"]})
            metrics["grad_norm"] = _step(model, optimizer, loss, o.grad_clip)
            means.add(metrics)
    return means.result()


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


def _flow_draws(n: int, model: RLModel, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = model.config
    noise = torch.randn((n, cfg.chunk_size, cfg.action_dim), generator=generator)
    return noise, model.sample_time(n, generator)


def update_nft(
    model: RLModel,
    old_model: RLModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    adv: Advantages,
    config: RLConfig,
    generator: torch.Generator,
) -> dict[str, float]:
    """DiffusionNFT epochs: x0 = the sampled chunk, r = optimality probability of its episode."""
    o, algo = config.optim, config.algo
    device = next(model.parameters()).device
    keep_idx = torch.nonzero(adv.keep).flatten()
    means = _Means()
    model.train()
    if len(keep_idx) == 0:
        return {"skipped_update": 1.0}
    x0_all = rollout.chain[:, -1]
    for _ in range(o.epochs):
        for mb in _minibatches(keep_idx.repeat(algo.nft_samples), o.minibatch_size, generator):
            batch = _inputs(rollout, mb, device)
            x0 = x0_all[mb].to(device)
            noise, t = _flow_draws(len(mb), model, generator)
            noise, t = noise.to(device), t.to(device)
            x_t = (1.0 - t[:, None, None]) * x0 + t[:, None, None] * noise
            v_theta = model.velocity(x_t, t, model.encode(batch))
            with torch.no_grad():
                v_old = old_model.velocity(x_t, t, old_model.encode(batch))
            loss, metrics = get_algorithm("loss", "nft")(
                v_theta, v_old, noise - x0, adv.advantages[mb].to(device), beta=algo.nft_beta
            )
            metrics = {"nft_loss": loss, **metrics, "grad_norm": _step(model, optimizer, loss, o.grad_clip)}
            means.add(metrics)
    return means.result()


def update_dpo(
    model: RLModel,
    ref_model: RLModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    pairs: torch.Tensor,
    config: RLConfig,
    generator: torch.Generator,
) -> dict[str, float]:
    """Flow-DPO epochs over (winner, loser) episode pairs; one decision of each per pair and draw."""
    o, algo = config.optim, config.algo
    device = next(model.parameters()).device
    means = _Means()
    model.train()
    if len(pairs) == 0:
        return {"skipped_update": 1.0}
    by_episode = [torch.nonzero(rollout.episode == e).flatten() for e in range(rollout.num_episodes)]
    x0_all = rollout.chain[:, -1]
    rows = torch.arange(len(pairs)).repeat(algo.nft_samples)
    for _ in range(o.epochs):
        for mb in _minibatches(rows, o.minibatch_size, generator):
            win, lose = [], []
            for w, lo in pairs[mb].tolist():
                dw, dl = by_episode[w], by_episode[lo]
                win.append(dw[torch.randint(len(dw), (1,), generator=generator)])
                lose.append(dl[torch.randint(len(dl), (1,), generator=generator)])
            iw, il = torch.cat(win), torch.cat(lose)
            noise, t = _flow_draws(len(mb), model, generator)
            noise, t = noise.to(device), t.to(device)
            tt = t[:, None, None]
            outs = []
            for idx in (iw, il):
                batch = _inputs(rollout, idx, device)
                x0 = x0_all[idx].to(device)
                x_t = (1.0 - tt) * x0 + tt * noise
                v_theta = model.velocity(x_t, t, model.encode(batch))
                with torch.no_grad():
                    v_ref = ref_model.velocity(x_t, t, ref_model.encode(batch))
                outs.append((v_theta, v_ref, noise - x0))
            loss, metrics = get_algorithm("loss", "flow_dpo")(*outs[0], *outs[1], beta=algo.dpo_beta)
            metrics = {"dpo_loss": loss, **metrics, "grad_norm": _step(model, optimizer, loss, o.grad_clip)}
            means.add(metrics)
    return means.result()
