"""``generator_nft``: DiffusionNFT of a Cosmos3 generator with groups of samples per prompt.

One iteration (verl's phases, timed): **rollout** ``group_size`` deterministic samples (the pipeline's
ODE, no guidance) for each of ``prompts_per_iter`` training prompts from the *old* policy; **reward**
them (a local scorer or the HTTP service); **advantage**: group-relative (``grpo``), clipped and mapped
to the optimality probability ``r = clip(A, +-A_max) / A_max / 2 + 1/2`` (``nft_optimality``);
**update**: ``epochs`` passes of minibatches of the ``nft`` loss on the forward process of the sampled
latents (``x_t = (1 - s) x0 + s eps``, target ``eps - x0``) with the old policy's velocity as ``v_old``;
**sync**: the old policy moves toward the trained one as an EMA (``old_decay``), the DiffusionNFT
reference's "EMA old policy". An optional ``kl_coef`` adds ``||v_theta - v_ref||^2`` to the initial model.

At ``theta = theta_old`` the loss's gradient is ``beta (2r - 1)`` times the flow-matching gradient, so
r > 1/2 samples are pulled toward and r < 1/2 pushed away from (a test checks it on the real model).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from cosmos_robot.distributed import all_gather_rows, mean_over_ranks
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.algorithms import nft_optimality
from cosmos_robot_trainers.common import fsdp
from cosmos_robot_trainers.generator.config import GenNFTConfig
from cosmos_robot_trainers.generator.flow import draw_sigmas, noised, optimizer_step, prompt_ids
from cosmos_robot_trainers.generator.run import GenResult, GenRun

__all__ = ["nft_minibatch_loss", "run_generator_nft"]


def nft_minibatch_loss(
    run: GenRun,
    old: Any,
    ref: Any | None,
    x0: torch.Tensor,
    r: torch.Tensor,
    prompts: list[str],
    ids_cache: dict[str, list[int]],
    rows: slice | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The ``nft`` loss of one minibatch of sampled latents ``x0`` with optimality ``r`` (one (sigma, eps) draw);
    ``rows``: the part computed here (a data-parallel rank's share; the draws are made for all of it)."""
    cfg = run.config
    eps = torch.randn(x0.shape, generator=run.generator).to(x0)
    sig = draw_sigmas(len(x0), run.generator, cfg.train.timestep_sampling)
    if rows is not None:
        x0, eps, sig, r, prompts = x0[rows], eps[rows], sig[rows], r[rows], prompts[rows]
    x_t, target = noised(x0, eps, sig)
    ids = prompt_ids(run.gen, prompts, run.shape, ids_cache)
    v = run.gen.velocities(x_t, sig, ids, run.shape)
    with torch.no_grad():
        with run.gen.using(old):
            v_old = run.gen.velocities(x_t, sig, ids, run.shape)
    loss, m = get_algorithm("loss", "nft")(v, v_old, target, r.to(v.device), beta=cfg.algo.beta)
    metrics = {k: float(val) for k, val in m.items()}
    if ref is not None and cfg.algo.kl_coef > 0:
        with torch.no_grad():
            with run.gen.using(ref):
                v_ref = run.gen.velocities(x_t, sig, ids, run.shape)
        kl = ((v - v_ref) ** 2).mean()
        loss = loss + cfg.algo.kl_coef * kl
        metrics["kl_ref"] = float(kl.detach())
    return loss, metrics


def _rollout(run: GenRun, old: Any) -> tuple[torch.Tensor, list[str], np.ndarray]:
    """``prompts_per_iter`` x ``group_size`` samples of the old policy: latents, prompts, rewards. Data
    parallel: every rank draws the whole iteration's prompts and seeds, samples and scores its contiguous
    share of the groups, and the shares are joined on every rank (latents and rewards as tensors)."""
    a = run.config.algo
    pick = torch.randint(len(run.prompts), (a.prompts_per_iter,), generator=run.generator).tolist()
    prompts = [run.prompts[i] for i in pick for _ in range(a.group_size)]
    seeds = torch.randint(2**31 - 1, (len(prompts),), generator=run.generator).tolist()
    groups, _ = run.share(a.prompts_per_iter, "algo.prompts_per_iter")
    mine = slice(groups.start * a.group_size, groups.stop * a.group_size)
    with run.gen.using(old):
        lat = run.generate(prompts[mine], seeds[mine])
    rewards = torch.as_tensor(run.reward(run.images(lat), prompts[mine]), dtype=torch.float64)
    lat = torch.cat([part.to(lat.device) for part in all_gather_rows(lat.contiguous(), run.world)])
    rewards = torch.cat(all_gather_rows(rewards, run.world))
    return lat, prompts, rewards.numpy()


@torch.no_grad()
def _ema(old: Any, run: GenRun, decay: float) -> None:
    params = dict(old.named_parameters())
    for name, p in run.trainable.items():  # FSDP: each gathered whole (every rank: a collective)
        params[name].mul_(decay).add_(fsdp.full_tensor(p.detach()), alpha=1.0 - decay)


def run_generator_nft(
    config: GenNFTConfig, *, resume: bool, overwrite: bool, log: Callable[[str], None], stop_at_step: int | None = None
) -> GenResult:
    a, tcfg = config.algo, config.train
    per_iter = a.prompts_per_iter * a.group_size
    updates = a.epochs * per_iter // tcfg.batch_size
    run = GenRun(config, resume=resume, overwrite=overwrite, log=log, updates_per_step=updates)
    old = run.initial_copy()
    ref = copy.deepcopy(old) if a.kl_coef > 0 else None  # the initial model (before any restore)

    def load_extra(extra: dict[str, Any]) -> None:
        params = dict(old.named_parameters())
        with torch.no_grad():
            for name, value in extra["old"].items():
                params[name].copy_(value)

    run.restore(load_extra)
    ids_cache: dict[str, list[int]] = {}
    group_ids = torch.arange(a.prompts_per_iter).repeat_interleave(a.group_size)

    def step(_: int) -> dict[str, float]:
        t0 = time.monotonic()
        lat, prompts, rewards = _rollout(run, old)
        t1 = time.monotonic()
        adv = get_algorithm("advantage", "grpo")(torch.as_tensor(rewards, dtype=torch.float32), group_ids)
        r = nft_optimality(adv, a.adv_clip)
        sums: dict[str, float] = {}
        for _ in range(a.epochs):
            order = torch.randperm(per_iter, generator=run.generator)
            for start in range(0, per_iter, tcfg.batch_size):
                idx = order[start : start + tcfg.batch_size]
                rows, weight = run.share(len(idx))
                mb_prompts = [prompts[i] for i in idx]
                loss, m = nft_minibatch_loss(run, old, ref, lat[idx], r[idx], mb_prompts, ids_cache, rows)
                norm = optimizer_step(run, loss, weight)
                m = {k: mean_over_ranks(v * weight, run.world) for k, v in {"loss": float(loss.detach()), **m}.items()}
                m["grad_norm"] = norm
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v / updates
        _ema(old, run, a.old_decay)
        return {**sums, "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
                "rollout_s": t1 - t0, "update_s": time.monotonic() - t1}  # fmt: skip

    def extra_state() -> dict[str, Any]:
        params = dict(old.named_parameters())
        return {"old": {name: params[name].detach().clone() for name in run.trainable}}

    return run.loop(step, stop_at_step=stop_at_step, extra_state=extra_state)
