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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cosmos_robot.distributed import World, all_gather_json, all_gather_rows, shard_range, sum_over_ranks
from cosmos_robot.text.engines import Completion, SamplingParams
from cosmos_robot.text.moe import with_router_aux_loss
from cosmos_robot.text.rewards import HttpReward, get_reward
from cosmos_robot.text.tasks import TextExample, get_task, task_examples
from cosmos_robot.text.vision import example_prompt, image_kwargs
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.algorithms.advantages import filter_groups
from cosmos_robot_trainers.algorithms.losses import aggregate, masked_mean
from cosmos_robot_trainers.common import fsdp
from cosmos_robot_trainers.text.config import TextAlgoConfig, TextGRPOConfig
from cosmos_robot_trainers.text.driver import (
    TextResult,
    TextRun,
    accumulated_step,
    minibatch_epochs,
    score_rows,
    share_micro_batches,
)

__all__ = [
    "CompletionBatch",
    "SampledGroups",
    "completion_batch",
    "grpo_iteration",
    "grpo_loss",
    "run_text_grpo",
    "sample_groups",
    "score_groups",
    "selective_log_softmax",
    "sequence_log_probs",
]

IGNORE = -100


@dataclass
class CompletionBatch:
    """Prompt + completion rows (N, L): prompts left-padded so every completion starts at column
    ``prompt_width`` (TRL's layout), completions right-padded. ``mask`` is 1 on completion tokens (the
    ones scored and trained); ``engine_log_probs`` holds the engine's log-prob of each, 0 elsewhere."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor
    engine_log_probs: torch.Tensor
    stopped: torch.Tensor  # (N,) bool
    prompt_width: int = 0
    images: list[Any] | None = None  # image-text prompts: each row's ImageInputs (cosmos_robot.text.vision)

    TENSORS = ("input_ids", "attention_mask", "mask", "engine_log_probs", "stopped")

    def select(self, rows: torch.Tensor) -> CompletionBatch:
        rows = rows.to(self.input_ids.device)
        images = None if self.images is None else [self.images[int(r)] for r in rows]
        return self._with(lambda t: t[rows], images)

    def to(self, device: Any) -> CompletionBatch:
        return self._with(lambda t: t.to(device), self.images)

    def _with(self, fn: Callable[[torch.Tensor], torch.Tensor], images: list[Any] | None) -> CompletionBatch:
        ids, attn, mask, elp, stopped = (fn(getattr(self, f)) for f in self.TENSORS)
        return CompletionBatch(ids, attn, mask, elp, stopped, self.prompt_width, images)

    def forward_kwargs(self, model: Any) -> dict[str, Any]:
        """The model's inputs for these rows (ids, mask, and the images of image-text prompts); no KV cache."""
        kwargs = {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "use_cache": False}
        if self.images is not None:
            kwargs.update(image_kwargs(model, self.input_ids, self.images))
        return kwargs


def completion_batch(completions: list[Completion], pad_id: int) -> CompletionBatch:
    start = max(len(c.prompt_ids) for c in completions)
    width = start + max(max(len(c.ids) for c in completions), 1)
    n = len(completions)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    elp = torch.zeros((n, width), dtype=torch.float32)
    for i, c in enumerate(completions):
        p, k = len(c.prompt_ids), len(c.ids)
        ids[i, start - p : start + k] = torch.tensor(c.prompt_ids + c.ids)
        attn[i, start - p : start + k] = 1
        mask[i, start : start + k] = 1.0
        if c.log_probs:  # empty: the engine's log-probs are the trainer's own pass (see grpo_iteration)
            elp[i, start : start + k] = torch.tensor(c.log_probs)
    stopped = torch.tensor([c.stopped for c in completions], dtype=torch.bool)
    images = [c.images for c in completions] if any(c.images is not None for c in completions) else None
    return CompletionBatch(ids, attn, mask, elp, stopped, prompt_width=start, images=images)


LOGSOFTMAX_CHUNK_ELEMENTS = 2**28  # fp32 elements per chunk (1 GiB): the transient memory of one chunk


def _chunk_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def selective_log_softmax(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)[targets]`` in fp32, (..., V) -> (...), without keeping a (..., V) fp32 tensor.

    Rows are processed in chunks of ``LOGSOFTMAX_CHUNK_ELEMENTS``; under autograd each chunk is
    recomputed in the backward pass (activation checkpointing), so a step holds the model-dtype logits
    and one chunk, not the fp32 log-softmax of the whole batch (20 GiB for 128 x 256 tokens of a
    151,936-token vocabulary)."""
    flat, flat_t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    rows = max(1, LOGSOFTMAX_CHUNK_ELEMENTS // logits.shape[-1])
    if flat.shape[0] <= rows:
        return _chunk_log_probs(flat, flat_t, temperature).reshape(targets.shape)
    parts = []
    for i in range(0, flat.shape[0], rows):
        chunk, tchunk = flat[i : i + rows], flat_t[i : i + rows]
        if torch.is_grad_enabled() and chunk.requires_grad:
            from torch.utils.checkpoint import checkpoint

            parts.append(checkpoint(_chunk_log_probs, chunk, tchunk, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_log_probs(chunk, tchunk, temperature))
    return torch.cat(parts).reshape(targets.shape)


def sequence_log_probs(model: Any, batch: CompletionBatch, temperature: float = 1.0) -> torch.Tensor:
    """Teacher-forced log-prob of each completion token (N, L) at ``temperature``; 0 off the completion.

    Only the completion columns' logits are computed (``logits_to_keep``): with a 151k vocabulary the
    prompt's logits would be most of the memory of a step."""
    start = batch.prompt_width
    keep = batch.input_ids.shape[1] - start + 1
    logits = model(**batch.forward_kwargs(model), logits_to_keep=keep).logits
    logp = selective_log_softmax(logits[:, -keep:-1], batch.input_ids[:, start:], temperature)
    out = torch.zeros(batch.input_ids.shape, dtype=logp.dtype, device=logp.device)
    out[:, start:] = logp
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


def gather_groups(
    groups: list[list[Completion]], rewards: torch.Tensor, world: World
) -> tuple[list[list[Completion]], torch.Tensor]:
    """Every rank's groups and rewards, joined in rank order on every rank. Completions travel as JSON
    (token ids, log-probs, text, stop flag): a rank can only send data, never code."""
    if not world.distributed:
        return groups, rewards
    fields = ("prompt_ids", "ids", "log_probs", "stopped", "text")
    mine = [[{f: getattr(c, f) for f in fields} for c in g] for g in groups]
    joined = [[Completion(**c) for c in g] for part in all_gather_json(mine, world) for g in part]
    return joined, torch.cat(all_gather_rows(rewards, world))


def attach_images(groups: list[list[Completion]], inputs: list[tuple[list[int], Any]]) -> None:
    """Give the joined groups' completions (sent as JSON, without pixels) their prompt's image inputs,
    built on this rank from the same examples; a prompt whose ids differ from the group's is an error
    (the ranks disagree on the iteration's prompts), never a silent mismatch of images and text."""
    if len(groups) != len(inputs):
        raise RuntimeError(f"joined {len(groups)} groups for {len(inputs)} prompts: the ranks disagree on the prompts")
    for i, (group, (prompt, images)) in enumerate(zip(groups, inputs, strict=True)):
        for completion in group:
            if completion.prompt_ids != prompt:
                raise RuntimeError(f"group {i}: its prompt ids differ from this rank's prompt {i}")
            completion.images = images


@dataclass
class SampledGroups:
    """One iteration's rollout: prompts, ``group_size`` completions each, and their rewards (N,)."""

    examples: list[TextExample]
    groups: list[list[Completion]]
    rewards: torch.Tensor  # the rewards trained on (permuted in the shuffled control)
    metrics: dict[str, float]


def sample_groups(config: Any, lm: Any, engine: Any, it: int, world: World | None = None) -> SampledGroups:
    """Train-split prompts of iteration ``it``, their completions from the engine, and rewards.

    Data parallel (``world``): each rank samples and scores its contiguous share of the prompts (its
    own sampling seed), and the groups and rewards are joined on every rank in prompt order, as JSON
    and tensors (``gather_groups``). ``reward_mean`` / ``train_accuracy`` are of the true rewards, also
    in the shuffled control."""
    rcfg = config.rollout
    world = world or World()
    t0 = time.perf_counter()
    examples = task_examples(
        get_task(str(config.data.task)), "train", rcfg.prompts_per_iter, seed=config.data.seed * 100_003 + it
    )
    lo, hi = shard_range(len(examples), world, "rollout.prompts_per_iter")
    # image prompts: every rank builds every prompt's image inputs, so the joined groups get their images
    # back locally (``attach_images``) instead of pixels travelling between ranks
    everyone = world.distributed and get_task(str(config.data.task)).render is not None
    built = [example_prompt(lm.tokenizer, lm.processor, ex) for ex in (examples if everyone else examples[lo:hi])]
    inputs = built[lo:hi] if everyone else built
    images = [im for _, im in inputs]
    params = SamplingParams(
        rcfg.max_new_tokens,
        rcfg.temperature,
        rcfg.top_p,
        seed=config.train.seed * 1_000_003 + it + 7919 * world.rank,
        log_probs=not engine.scores_by_forward,  # else the trainer's "old" pass is the same
    )
    visual = any(im is not None for im in images)
    groups = engine.generate([p for p, _ in inputs], rcfg.group_size, params, images=images if visual else None)
    t_rollout = time.perf_counter() - t0
    rewards = score_groups(config, examples[lo:hi], groups)
    groups, rewards = gather_groups(groups, rewards, world)
    if everyone:
        attach_images(groups, built)
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


def grpo_iteration(
    config: TextGRPOConfig, lm: Any, ref: Any, engine: Any, optimizer: Any, it: int, world: World | None = None
) -> dict[str, float]:
    """One rollout + update; returns the iteration's metrics. Data parallel (``world``): every rank holds
    the joined groups, computes the same advantages and draws the same minibatches, and takes its
    contiguous share of each (``rank_share``) with the gradients averaged over ranks."""
    rcfg, algo, ocfg = config.rollout, config.algo, config.optim
    world = world or World()
    model = lm.model
    sampled = sample_groups(config, lm, engine, it, world)
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
    micro = ocfg.micro_batch_size
    # one update per batch (TRL's num_iterations = 1): the "old" log-probs are the update's own, detached,
    # so the separate scoring pass is skipped (ratio exactly 1, as in TRL)
    single = ocfg.epochs == 1 and ocfg.minibatch_size >= rows.numel()
    forward_engine = engine.scores_by_forward  # sampled from this model: old is its log-prob
    with torch.no_grad():  # data parallel: each rank scores its share of the rows (driver.score_rows)

        def score(net: Any) -> torch.Tensor:
            return score_rows(
                lambda p: sequence_log_probs(net, batch.select(p), rcfg.temperature),
                rows.numel(),
                micro,
                device,
                world,
                fsdp.is_sharded(net),
            )

        old = None if single else score(model)
        ref_lp = None if ref is None else score(ref)
    seen_old = torch.zeros_like(batch.mask) if old is None else old
    per_token = algo.loss_agg == "token_mean" and algo.policy_loss != "gspo"  # else a mean over sequences

    def parts(mb: torch.Tensor) -> Iterator[tuple[torch.Tensor, float, dict[str, Any]]]:
        total = float(batch.mask[mb].sum()) if per_token else float(mb.numel())
        # data parallel: this rank's rows (a sharded model: as many micro-batches on every rank)
        for idx, factor in share_micro_batches(mb, micro, world, fsdp.is_sharded(model)):
            stand_in = factor == 0.0
            sub = batch.select(idx)
            logp = sequence_log_probs(model, sub, rcfg.temperature)
            old_i = logp.detach() if old is None else old[idx]
            if not stand_in:
                seen_old[idx] = old_i
            engine_i = old_i if forward_engine else sub.engine_log_probs
            tis_i = None
            if algo.tis_cap is not None:
                tis_i = torch.clamp(torch.exp(old_i - engine_i), max=algo.tis_cap) * sub.mask
            loss, m = grpo_loss(
                logp,
                old_i,
                adv[idx],
                sub.mask,
                algo,
                rcfg.max_new_tokens,
                None if ref_lp is None else ref_lp[idx],
                tis_i,
            )
            loss = with_router_aux_loss(model, loss, m)  # MoE models: the router balancing term
            yield loss, factor * (float(sub.mask.sum()) if per_token else float(idx.numel())) / max(total, 1e-9), m

    def step(mb: torch.Tensor) -> dict[str, float]:
        loss_value, gnorm, m = accumulated_step(model, optimizer, ocfg.grad_clip, parts(mb), world)
        return {"loss": loss_value, "grad_norm": gnorm, **m}

    seed = config.train.seed * 104_729 + it
    update = minibatch_epochs(
        rows.numel(), ocfg.epochs, ocfg.minibatch_size, torch.Generator().manual_seed(seed), step, device
    )
    engine.sync_weights(model)
    if old is None and world.distributed:  # each rank saw its own rows' log-probs: join them
        seen_old = sum_over_ranks(seen_old.detach().cpu(), world).to(seen_old)
    metrics.update(update)
    metrics.update(_engine_gap(seen_old, batch, forward_engine, algo.tis_cap))
    metrics.update({"trained_completions": float(rows.numel()), "time/update": time.perf_counter() - t1})
    return metrics


def _engine_gap(old: torch.Tensor, batch: CompletionBatch, forward_engine: bool, tis_cap: float | None) -> dict:
    """How far the trainer's old log-probs are from the rollout engine's (the off-policy gap, and the
    truncated importance weight's mean when ``tis_cap`` corrects for it)."""
    engine_lp = old if forward_engine else batch.engine_log_probs
    gap = (old - engine_lp).abs() * batch.mask
    tis = None if tis_cap is None else torch.clamp(torch.exp(old - engine_lp), max=tis_cap)
    return {
        "logprob_gap_max": float(gap.max()),
        "logprob_gap_mean": float(masked_mean(gap, batch.mask)),
        "tis_mean": float(masked_mean(tis, batch.mask)) if tis is not None else 1.0,
    }


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
    engine = run.rollout_engine()
    run.restore()
    rc, algo = config.rollout, config.algo
    params = sum(p.numel() for p in lm.model.parameters())
    control = ", shuffled rewards (control)" if config.reward.shuffle else ""
    run.log(
        f"text_grpo: {lm.model.config.model_type}, {params / 1e6:.3f} M parameters; {config.train.steps} iterations "
        f"of {rc.prompts_per_iter} prompts x {rc.group_size} completions "
        f"({algo.advantage}, {algo.policy_loss}, {algo.loss_agg}{control})"
    )
    return run.loop(
        lambda it: grpo_iteration(config, lm, ref, engine, run.optimizer, it, run.world),
        kind="text_grpo",
        stop_at_step=stop_at_step,
        unit="iteration",
        show=("reward_mean", "train_accuracy", "eval_accuracy"),
    )
