"""Token-level PPO with a critic for HF causal LMs (``trainer = "text_ppo"``).

TRL dropped its ``PPOTrainer`` after 1.12; this is its algorithm (and verl's GAE path) on the text
trainer core, with cosmos-framework's PPO roles: **policy** (the trained model), **rollout** (any
rollout engine, weights synced after each update), **reference** (a frozen copy of the initial policy,
for the KL penalty in the reward) and **critic** (a scalar head on its own copy of a backbone,
``*ForTokenClassification`` with one label, its own AdamW).

One iteration:

1. **rollout**: ``prompts_per_iter`` prompts, ``group_size`` completions each (1 is usual: the critic
   is the baseline), scored by the task's reward (``sample_groups``, shared with GRPO);
2. **score**: the policy's teacher-forced log-probs ("old"), the reference's, and the critic's value of
   every completion token (the value at the position that predicts it);
3. **reward**: ``r_t = -kl_coef * kl_t`` per token plus the score on the last completion token
   (``token_rewards``);
4. **GAE** over the completion tokens (the registry's ``gae``; the value after the last token is 0),
   returns ``R = A + V``, advantages whitened over the batch's tokens;
5. **update**: ``epochs`` passes of minibatches; per minibatch one policy step on the clipped
   surrogate (token mean) and one critic step on ``vf_coef`` x the clipped value loss (token mean);
6. **weight sync** to the rollout engine.

Differences from TRL's ``PPOTrainer`` by design: the critic has its own optimizer and learning rate
(as verl's; TRL steps one optimizer over policy and critic), and the whitening divides by
``std + 1e-8`` where TRL multiplies by ``rsqrt(var + 1e-8)``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.distributed import World, broadcast_parameters
from cosmos_robot.policies.registry import CheckpointError
from cosmos_robot.text.moe import with_router_aux_loss
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.algorithms.advantages import normalize_advantages
from cosmos_robot_trainers.algorithms.losses import masked_mean
from cosmos_robot_trainers.common import fsdp
from cosmos_robot_trainers.text.config import TINY_INIT, TextPPOConfig
from cosmos_robot_trainers.text.driver import (
    TextResult,
    TextRun,
    accumulated_step,
    minibatch_epochs,
    score_rows,
    share_micro_batches,
)
from cosmos_robot_trainers.text.grpo import CompletionBatch, completion_batch, sample_groups, sequence_log_probs
from cosmos_robot_trainers.text.precision import build_text_optimizer

__all__ = [
    "ImageTextValueModel",
    "build_critic",
    "critic_values",
    "ppo_advantages",
    "ppo_iteration",
    "run_text_ppo",
    "token_rewards",
]


def token_rewards(
    scores: torch.Tensor,
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor | None,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards (N, L) and the per-token KL (N, L): ``-kl_coef * kl_t`` on every completion token, plus
    ``scores`` (N,) on each row's last one. ``kl_t`` is k1 = ``logp - ref`` or k3 = ``exp(ref - logp) - 1 - (ref -
    logp)`` (TRL's ``kl_estimator``); without a reference the KL is 0."""
    kl = torch.zeros_like(mask)
    if ref_log_probs is not None:
        d = ref_log_probs.float() - log_probs.float()
        kl = (-d if estimator == "k1" else torch.exp(d) - 1.0 - d) * mask
    rewards = -kl_coef * kl
    last = (mask.cumsum(1) * mask).argmax(1)  # the last completion token of each row
    rewards[torch.arange(mask.shape[0]), last] += scores.to(rewards)
    return rewards, kl


def ppo_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float, whiten: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over completion tokens (masked columns are transparent; V after the last token is 0): (A, R = A + V),
    A whitened over the masked tokens when ``whiten``."""
    zeros = torch.zeros_like(rewards)
    adv, returns = get_algorithm("advantage", "gae")(
        rewards, values * mask, zeros, zeros[:, 0], gamma=gamma, lam=lam, mask=mask
    )
    if whiten:
        adv = normalize_advantages(adv, mask)
    return adv * mask, returns * mask


class ImageTextValueModel(torch.nn.Module):
    """The critic of an image-text policy: a copy of its backbone (vision tower + language model, no LM head) and
    a scalar head. transformers has no ``*ForTokenClassification`` for Qwen3-VL; this is the same shape of model
    (hidden states -> ``Linear(hidden, 1)``), with ``logits`` (N, L, 1) like one. ``save_pretrained`` writes the
    policy's ``config.json`` and ``model.safetensors`` (``backbone.*`` and ``score.weight``)."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.config = copy.deepcopy(policy.config)
        self.backbone = copy.deepcopy(policy.model)
        hidden = int(self.config.get_text_config().hidden_size)
        self.score = torch.nn.Linear(hidden, 1, bias=False)
        torch.nn.init.normal_(self.score.weight, std=float(getattr(self.config, "initializer_range", 0.02)))

    def forward(self, **kwargs: Any) -> Any:
        from types import SimpleNamespace

        kwargs.pop("logits_to_keep", None)
        hidden = self.backbone(**kwargs).last_hidden_state
        return SimpleNamespace(logits=self.score(hidden))

    def save_pretrained(self, out: str | Path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        root = Path(out)
        root.mkdir(parents=True, exist_ok=True)
        self.config.save_pretrained(root)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(root / "model.safetensors"))


def build_critic(config: TextPPOConfig, policy: Any) -> Any:
    """``AutoModelForTokenClassification`` with one label: from ``critic.init``, else the policy's initial weights
    (backbone copied, the head fresh). A causal LM's folder gives its backbone and a new head. An image-text
    policy's critic is an ``ImageTextValueModel`` on a copy of its backbone."""
    from transformers import AutoModelForTokenClassification

    from cosmos_robot.text.vision import is_vl_model

    device, dtype = next(policy.parameters()).device, next(policy.parameters()).dtype
    if is_vl_model(policy):
        if config.critic.init is not None:
            raise ValueError("critic.init: an image-text policy's critic starts from the policy's own weights")
        return _no_dropout(ImageTextValueModel(policy)).to(device=device, dtype=dtype).train()
    source = config.critic.init
    if source is None and config.init != TINY_INIT:
        source = config.init
    if source is not None:
        try:
            critic = AutoModelForTokenClassification.from_pretrained(source, num_labels=1, local_files_only=True)
        except Exception as exc:  # transformers raises many kinds; name the folder and the recipe key
            key = "critic.init" if config.critic.init is not None else "init (the critic's default)"
            raise CheckpointError(
                f"{key}: {source} does not load as a value model ({type(exc).__name__}: {exc})"
            ) from exc
    else:
        config_1 = copy.deepcopy(policy.config)
        config_1.num_labels = 1
        critic = AutoModelForTokenClassification.from_config(config_1)
        missing, unexpected = critic.load_state_dict(policy.state_dict(), strict=False)
        if any(not k.startswith("score.") for k in missing):
            raise ValueError(f"critic: the policy's backbone does not fit a value model (missing {missing[:3]})")
    return _no_dropout(critic).to(device=device, dtype=dtype).train()


def _no_dropout(critic: Any) -> Any:
    for module in critic.modules():  # the head's classifier dropout (0.1) would make values noisy (TRL disables it)
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return critic


def critic_values(critic: torch.nn.Module, batch: CompletionBatch) -> torch.Tensor:
    """The critic's value of each completion token (N, L): its output at the position that predicts the token."""
    start = batch.prompt_width
    out = critic(**batch.forward_kwargs(critic)).logits[..., 0]
    values = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=out.device)
    values[:, start:] = out[:, start - 1 : -1].float()
    return values * batch.mask


def _score(
    config: TextPPOConfig, model: Any, ref: Any, critic: Any, batch: CompletionBatch, world: World | None = None
) -> tuple:
    """Old log-probs, reference log-probs (or None) and old values, micro-batch by micro-batch (data
    parallel: each rank scores its share of the rows, ``driver.score_rows``)."""
    temp, micro = config.rollout.temperature, config.optim.micro_batch_size
    n, device = batch.mask.shape[0], batch.mask.device

    def rows(score: Callable[[torch.Tensor], torch.Tensor], net: Any) -> torch.Tensor:
        return score_rows(score, n, micro, device, world, fsdp.is_sharded(net))

    with torch.no_grad():
        old = rows(lambda p: sequence_log_probs(model, batch.select(p), temp), model)
        ref_lp = None if ref is None else rows(lambda p: sequence_log_probs(ref, batch.select(p), temp), ref)
        values = rows(lambda p: critic_values(critic, batch.select(p)), critic)
    return old, ref_lp, values


def ppo_iteration(
    config: TextPPOConfig,
    lm: Any,
    ref: Any,
    critic: Any,
    engine: Any,
    optimizers: tuple[Any, Any],
    it: int,
    world: World | None = None,
) -> dict[str, float]:
    """One rollout, scoring, GAE and update of policy and critic; returns the iteration's metrics. Data
    parallel (``world``): as GRPO (``grpo.sample_groups``, ``driver.minibatch_share``), every rank scores
    the joined batch and takes its share of each minibatch for the policy and the critic."""
    rcfg, algo, ocfg = config.rollout, config.algo, config.optim
    model, (optimizer, critic_opt) = lm.model, optimizers
    sampled = sample_groups(config, lm, engine, it, world)
    flat = [c for g in sampled.groups for c in g]
    device = next(model.parameters()).device
    batch = completion_batch(flat, lm.pad_id).to(device)
    scores = sampled.rewards.to(device)
    if algo.missing_eos_penalty is not None:
        scores = scores - algo.missing_eos_penalty * (~batch.stopped).float()
    t1 = time.perf_counter()
    old, ref_lp, old_values = _score(config, model, ref, critic, batch, world)
    rewards, kl = token_rewards(scores, old, ref_lp, batch.mask, algo.kl_coef, algo.kl_estimator)
    adv, returns = ppo_advantages(rewards, old_values, batch.mask, algo.gamma, algo.lam, algo.whiten_advantages)
    engine_lp = old if engine.scores_by_forward else batch.engine_log_probs
    tis = None if algo.tis_cap is None else torch.clamp(torch.exp(old - engine_lp), max=algo.tis_cap) * batch.mask
    n = batch.mask.shape[0]

    def step(mb: torch.Tensor) -> dict[str, float]:
        # data parallel: this rank's rows (a sharded model: as many micro-batches on every rank)
        pieces = share_micro_batches(mb, ocfg.micro_batch_size, world, fsdp.is_sharded(model))
        total = max(float(batch.mask[mb].sum()), 1e-9)

        def policy_parts() -> Iterator[tuple]:
            for idx, factor in pieces:
                sub = batch.select(idx)
                logp = sequence_log_probs(model, sub, rcfg.temperature)
                loss, m = get_algorithm("loss", "ppo")(
                    logp, old[idx], adv[idx], sub.mask, clip=algo.clip, dual_clip=None,
                    loss_agg="token_mean", token_weights=None if tis is None else tis[idx],
                )  # fmt: skip
                yield with_router_aux_loss(model, loss, m), factor * float(sub.mask.sum()) / total, m

        def critic_parts() -> Iterator[tuple]:
            for idx, factor in pieces:
                sub = batch.select(idx)
                vloss, m = get_algorithm("loss", "value")(
                    critic_values(critic, sub), old_values[idx], returns[idx], sub.mask,
                    clip=algo.clip_value, huber_delta=float("inf"),
                )  # fmt: skip
                yield algo.vf_coef * vloss, factor * float(sub.mask.sum()) / total, {"value_loss": vloss.detach(), **m}

        loss_value, gnorm, m = accumulated_step(model, optimizer, ocfg.grad_clip, policy_parts(), world)
        _, cnorm, cm = accumulated_step(critic, critic_opt, config.critic.grad_clip, critic_parts(), world)
        return {"loss": loss_value, "grad_norm": gnorm, "critic_grad_norm": cnorm, **m, **cm}

    update = minibatch_epochs(
        n,
        ocfg.epochs,
        ocfg.minibatch_size,
        torch.Generator().manual_seed(config.train.seed * 104_729 + it),
        step,
        device,
    )
    engine.sync_weights(model)
    metrics = {**sampled.metrics, **update}
    metrics.update(
        {
            "completion_tokens": float(batch.mask.sum(1).mean()),
            "stopped_fraction": float(batch.stopped.float().mean()),
            "kl_ref": float((kl * batch.mask).sum(1).mean()),  # per completion, summed over its tokens
            "logprob_gap_max": float(((old - engine_lp).abs() * batch.mask).max()),
            "tis_mean": float(masked_mean(tis, batch.mask)) if tis is not None else 1.0,
            "time/update": time.perf_counter() - t1,
        }
    )
    return metrics


def run_text_ppo(
    config: TextPPOConfig,
    *,
    resume: bool = True,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    log: Callable[[str], None] = print,
) -> TextResult:
    """Run (or continue) the recipe; ``stop_at_step`` stops as a kill would (tests of exact resume)."""
    run = TextRun(config, resume=resume, overwrite=overwrite, log=log)
    lm, rc, algo = run.lm, config.rollout, config.algo
    ref = run.reference() if algo.kl_coef > 0 else None
    critic = build_critic(config, run.unsharded_model())  # FSDP: from the whole copy, not the shards
    broadcast_parameters(critic, run.world)  # the value head's random init: the same on every rank
    critic_cfg = config.optim.model_copy(update={"lr": config.critic.lr, "grad_clip": config.critic.grad_clip})
    critic_opt, critic_sched = build_text_optimizer(critic, critic_cfg, config.train.steps)
    engine = run.rollout_engine()

    def load_extra(saved: dict[str, Any]) -> None:
        critic.load_state_dict(saved["critic"])
        critic_opt.load_state_dict(saved["critic_optimizer"])
        critic_sched.load_state_dict(saved["critic_scheduler"])

    def save_extra() -> dict[str, Any]:
        return {
            "critic": critic.state_dict(),
            "critic_optimizer": critic_opt.state_dict(),
            "critic_scheduler": critic_sched.state_dict(),
        }

    def step(it: int) -> dict[str, float]:
        metrics = ppo_iteration(config, lm, ref, critic, engine, (run.optimizer, critic_opt), it, run.world)
        critic_sched.step()
        return metrics

    run.restore(load_extra)
    n_params = sum(p.numel() for p in lm.model.parameters())
    control = ", shuffled rewards (control)" if config.reward.shuffle else ""
    run.log(
        f"text_ppo: {lm.model.config.model_type}, {n_params / 1e6:.3f} M parameters + a critic; "
        f"{config.train.steps} iterations of {rc.prompts_per_iter} prompts x {rc.group_size} completions "
        f"(GAE gamma {algo.gamma} lambda {algo.lam}, KL coef {algo.kl_coef}{control})"
    )
    result = run.loop(
        step,
        kind="text_ppo",
        save_extra=save_extra,
        stop_at_step=stop_at_step,
        unit="iteration",
        show=("reward_mean", "explained_variance", "eval_accuracy"),
    )
    if result.final_dir is not None and run.world.is_main:
        critic.save_pretrained(Path(config.output.dir) / "critic_final", safe_serialization=True)
    return result
