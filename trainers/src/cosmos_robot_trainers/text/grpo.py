"""Online GRPO, Dr-GRPO, DAPO and GSPO for HF causal LMs on the shared algorithm registry.

One iteration (the robot RL driver's phases, with tokens for chunks):

1. **rollout**: ``prompts_per_iter`` train-split prompts of the task, ``group_size`` completions each
   from the rollout engine, with the engine's per-token log-probs;
2. **reward**: the task's scorer (or the recipe's, or an HTTP service); ``reward.shuffle`` permutes
   the rewards across the batch (the control run that must not learn);
3. **log-probs**: the trainer's own teacher-forced log-probs ("old", at the sampling temperature),
   and the reference model's when ``kl_coef > 0``; the engine's are compared (``logprob_gap``) and,
   where they differ, a truncated importance weight ``min(exp(old - engine), tis_cap)`` corrects the
   loss (identical engines give weight 1);
4. **advantage**: the registry's ``grpo`` / ``dr_grpo`` over each prompt's group, broadcast to its
   tokens; all-equal groups are dropped (``filter_groups``), and with ``overlong_filter`` (DAPO)
   completions cut at ``max_new_tokens`` do not train;
5. **update**: ``epochs`` passes of minibatches through the registry's ``ppo`` loss (token-level
   ratio, aggregation ``loss_agg``, clip-higher, optional dual clip) or ``gspo`` (sequence ratio),
   plus ``kl_coef`` x k3 aggregated the same way;
6. **weight sync** to the engine (the transformers engine shares the tensors: free).

How our settings map onto TRL 1.16's ``GRPOTrainer`` (tests/text/test_trl_parity.py checks the
losses and gradients): ``loss_agg="seq_mean_token_mean"`` = ``loss_type="grpo"``;
``"token_mean"`` = ``"bnpo"`` (and ``"dapo"`` on one process with one minibatch per generation
batch); ``"seq_mean_token_sum_norm"`` with ``norm_constant = max_new_tokens`` = ``"dr_grpo"``;
``policy_loss="gspo"`` = ``importance_sampling_level="sequence"`` with ``loss_type="grpo"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cosmos_robot.text.chat import prompt_ids
from cosmos_robot.text.engines import Completion, SamplingParams, make_engine
from cosmos_robot.text.rewards import HttpReward, get_reward
from cosmos_robot.text.tasks import TextExample, get_task, task_examples
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.algorithms.advantages import filter_groups
from cosmos_robot_trainers.algorithms.losses import aggregate, masked_mean
from cosmos_robot_trainers.text.config import TextAlgoConfig, TextGRPOConfig
from cosmos_robot_trainers.text.driver import TextResult, TextRun, clip_and_step

__all__ = [
    "CompletionBatch",
    "SampledGroups",
    "completion_batch",
    "grpo_iteration",
    "grpo_loss",
    "run_text_grpo",
    "sample_groups",
    "score_groups",
    "sequence_log_probs",
]

IGNORE = -100


@dataclass
class CompletionBatch:
    """Prompt + completion rows, right-padded: ids (N, L), attention (N, L), completion-token mask (N, L)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor  # 1 on completion tokens (the ones scored and trained)
    engine_log_probs: torch.Tensor  # (N, L), the engine's log-prob of each completion token, 0 elsewhere
    stopped: torch.Tensor  # (N,) bool

    def select(self, rows: torch.Tensor) -> CompletionBatch:
        return CompletionBatch(*(getattr(self, f)[rows.to(self.input_ids.device)] for f in self.__dataclass_fields__))

    def to(self, device: Any) -> CompletionBatch:
        return CompletionBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def completion_batch(completions: list[Completion], pad_id: int) -> CompletionBatch:
    width = max(len(c.prompt_ids) + len(c.ids) for c in completions)
    n = len(completions)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    elp = torch.zeros((n, width), dtype=torch.float32)
    for i, c in enumerate(completions):
        p, k = len(c.prompt_ids), len(c.ids)
        ids[i, : p + k] = torch.tensor(c.prompt_ids + c.ids)
        attn[i, : p + k] = 1
        mask[i, p : p + k] = 1.0
        elp[i, p : p + k] = torch.tensor(c.log_probs)
    stopped = torch.tensor([c.stopped for c in completions], dtype=torch.bool)
    return CompletionBatch(ids, attn, mask, elp, stopped)


def sequence_log_probs(model: Any, batch: CompletionBatch, temperature: float = 1.0) -> torch.Tensor:
    """Teacher-forced log-prob of each completion token (N, L) at ``temperature``; 0 off the completion."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    logits = logits[:, :-1].float() / temperature
    targets = batch.input_ids[:, 1:]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(batch.input_ids.shape, dtype=logp.dtype, device=logp.device)
    out[:, 1:] = logp
    return out * batch.mask


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    algo: TextAlgoConfig,
    max_new_tokens: int,
    ref_logp: torch.Tensor | None = None,
    tis: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss of a minibatch (sequence-level ``advantages`` (N,), token tensors (N, L))."""
    adv = advantages.reshape(-1, 1)
    if algo.policy_loss == "gspo":
        loss, metrics = get_algorithm("loss", "gspo")(
            logp, old_logp, advantages, mask, clip_low=algo.gspo_clip_low, clip_high=algo.gspo_clip_high
        )
        agg, norm = "seq_mean_token_mean", None
    else:
        agg = algo.loss_agg
        norm = float(max_new_tokens) if agg == "seq_mean_token_sum_norm" else None
        loss, metrics = get_algorithm("loss", "ppo")(
            logp,
            old_logp,
            adv,
            mask,
            clip=algo.clip,
            dual_clip=algo.dual_clip,
            clip_high=algo.clip_high,
            loss_agg=agg,
            norm_constant=norm,
            token_weights=tis,
        )
    if ref_logp is not None and algo.kl_coef > 0:
        d = ref_logp - logp
        k3 = torch.exp(d) - d - 1.0
        loss = loss + algo.kl_coef * aggregate(k3, mask, agg, norm)
        metrics["kl_ref"] = masked_mean(k3.detach(), mask)
    return loss, metrics


def score_groups(config: Any, examples: list[TextExample], groups: list[list[Completion]]) -> torch.Tensor:
    """Rewards (N,) of the flattened groups from the recipe's reward (default: the task's scorer)."""
    name = config.reward.name or get_task(examples[0].task).reward
    scorer = get_reward(name)
    texts = [c.text for g in groups for c in g]
    truths = [ex.ground_truth() for ex, g in zip(examples, groups) for _ in g]
    if isinstance(scorer, HttpReward):
        scorer.timeout_s = config.reward.timeout_s
        return torch.tensor(scorer.batch(texts, truths), dtype=torch.float32)
    return torch.tensor([float(scorer(t, gt)) for t, gt in zip(texts, truths)], dtype=torch.float32)


@dataclass
class SampledGroups:
    """One iteration's rollout: prompts, ``group_size`` completions each, and their rewards (N,)."""

    examples: list[TextExample]
    groups: list[list[Completion]]
    rewards: torch.Tensor  # the rewards trained on (permuted in the shuffled control)
    metrics: dict[str, float]


def sample_groups(config: Any, lm: Any, engine: Any, it: int) -> SampledGroups:
    """Train-split prompts of iteration ``it``, their completions from the engine, and rewards.

    ``reward_mean`` / ``train_accuracy`` are of the true rewards, also in the shuffled control."""
    rcfg = config.rollout
    t0 = time.perf_counter()
    examples = task_examples(
        get_task(str(config.data.task)), "train", rcfg.prompts_per_iter, seed=config.data.seed * 100_003 + it
    )
    prompts = [prompt_ids(lm.tokenizer, ex.prompt, where=f"{ex.task} seed {ex.seed}") for ex in examples]
    params = SamplingParams(rcfg.max_new_tokens, rcfg.temperature, rcfg.top_p, seed=config.train.seed * 1_000_003 + it)
    groups = engine.generate(prompts, rcfg.group_size, params)
    t_rollout = time.perf_counter() - t0
    rewards = score_groups(config, examples, groups)
    metrics = {
        "reward_mean": float(rewards.mean()),
        "train_accuracy": float((rewards >= 1.0).float().mean()),
        "time/rollout": t_rollout,
        "tokens_per_s": float(sum(len(c.ids) for g in groups for c in g)) / max(t_rollout, 1e-9),
    }
    if config.reward.shuffle:
        g = torch.Generator().manual_seed(config.train.seed * 7919 + it)
        rewards = rewards[torch.randperm(len(rewards), generator=g)]
    return SampledGroups(examples, groups, rewards, metrics)


def grpo_iteration(config: TextGRPOConfig, lm: Any, ref: Any, engine: Any, optimizer: Any, it: int) -> dict[str, float]:
    """One rollout + update; returns the iteration's metrics."""
    rcfg, algo, ocfg = config.rollout, config.algo, config.optim
    model = lm.model
    sampled = sample_groups(config, lm, engine, it)
    examples, groups, rewards = sampled.examples, sampled.groups, sampled.rewards
    group_ids = torch.arange(len(examples)).repeat_interleave(rcfg.group_size)
    if algo.advantage == "grpo":
        adv = get_algorithm("advantage", "grpo")(rewards, group_ids, eps=algo.std_eps)
    else:
        adv = get_algorithm("advantage", "dr_grpo")(rewards, group_ids)
    keep = filter_groups(rewards, group_ids) if algo.filter_groups else torch.ones_like(rewards, dtype=torch.bool)
    flat = [c for g in groups for c in g]
    batch = completion_batch(flat, lm.pad_id)
    if algo.overlong_filter:
        keep &= batch.stopped
    metrics: dict[str, float] = {
        **sampled.metrics,
        "groups_kept": float(keep.view(-1, rcfg.group_size).any(1).sum()),
        "completion_tokens": float(batch.mask.sum(1).mean()),
        "stopped_fraction": float(batch.stopped.float().mean()),
    }
    rows = torch.nonzero(keep).flatten()
    if rows.numel() == 0:
        metrics.update({"trained_completions": 0.0, "time/update": 0.0})
        return metrics
    t1 = time.perf_counter()
    device = next(model.parameters()).device
    batch = batch.select(rows).to(device)
    adv = adv[rows].to(device)
    with torch.no_grad():
        old = sequence_log_probs(model, batch, rcfg.temperature)
        ref_lp = sequence_log_probs(ref, batch, rcfg.temperature) if ref is not None else None
    gap = (old - batch.engine_log_probs).abs() * batch.mask
    tis = None
    if algo.tis_cap is not None:
        tis = torch.clamp(torch.exp(old - batch.engine_log_probs), max=algo.tis_cap) * batch.mask
    sums: dict[str, float] = {}
    n_steps = 0
    g = torch.Generator().manual_seed(config.train.seed * 104_729 + it)
    for _ in range(ocfg.epochs):
        order = torch.randperm(rows.numel(), generator=g).to(device)
        for start in range(0, rows.numel(), ocfg.minibatch_size):
            mb = order[start : start + ocfg.minibatch_size]
            sub = batch.select(mb)
            logp = sequence_log_probs(model, sub, rcfg.temperature)
            loss, m = grpo_loss(
                logp,
                old[mb],
                adv[mb],
                sub.mask,
                algo,
                rcfg.max_new_tokens,
                None if ref_lp is None else ref_lp[mb],
                None if tis is None else tis[mb],
            )
            gnorm = clip_and_step(model, loss, optimizer, ocfg.grad_clip)
            n_steps += 1
            for k, v in {
                "loss": float(loss.detach()),
                "grad_norm": gnorm,
                **{k: float(x) for k, x in m.items()},
            }.items():
                sums[k] = sums.get(k, 0.0) + v
    engine.sync_weights(model)
    metrics.update({k: v / n_steps for k, v in sums.items()})
    metrics.update(
        {
            "trained_completions": float(rows.numel()),
            "logprob_gap_max": float(gap.max()),
            "tis_mean": float(masked_mean(tis, batch.mask)) if tis is not None else 1.0,
            "time/update": time.perf_counter() - t1,
        }
    )
    return metrics


def run_text_grpo(
    config: TextGRPOConfig,
    *,
    resume: bool = True,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    log: Callable[[str], None] = print,
) -> TextResult:
    """Run (or continue) the recipe; ``stop_at_step`` stops as a kill would (tests of exact resume)."""
    run = TextRun(config, resume=resume, overwrite=overwrite, log=log)
    lm = run.lm
    ref = run.reference() if config.algo.kl_coef > 0 else None
    engine = make_engine(config.rollout.engine, lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    run.restore()
    rc, algo = config.rollout, config.algo
    params = sum(p.numel() for p in lm.model.parameters())
    control = ", shuffled rewards (control)" if config.reward.shuffle else ""
    log(
        f"text_grpo: {lm.model.config.model_type}, {params / 1e6:.3f} M parameters; {config.train.steps} iterations "
        f"of {rc.prompts_per_iter} prompts x {rc.group_size} completions "
        f"({algo.advantage}, {algo.policy_loss}, {algo.loss_agg}{control})"
    )
    return run.loop(
        lambda it: grpo_iteration(config, lm, ref, engine, run.optimizer, it),
        kind="text_grpo",
        stop_at_step=stop_at_step,
        unit="iteration",
        show=("reward_mean", "train_accuracy", "eval_accuracy"),
    )
