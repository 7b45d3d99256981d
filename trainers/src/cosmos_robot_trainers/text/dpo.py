"""DPO (sigmoid, IPO) for HF causal LMs: offline preference pairs, or pairs from the policy's own samples.

Sequence log-prob = the SUM of the completion tokens' log-probs (TRL's DPO); IPO uses the mean
(length-normalised, as TRL does for ``loss_type="ipo"``). The reference is the frozen initial model.

With ``data.task`` each iteration samples ``group_size`` completions for each of
``prompts_per_iter`` prompts from the current policy (the GRPO rollout), scores them, and pairs a
higher-reward completion with a lower-reward one of the same prompt: the same-state pairing DPO
needs (both members answer the same prompt). ``reward.shuffle`` permutes the rewards first, the
control that must not learn. With ``data.path`` the pairs are read once from JSONL and cycled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.distributed import World
from cosmos_robot.text.chat import prompt_ids, read_jsonl
from cosmos_robot.text.engines import Completion
from cosmos_robot.text.moe import with_router_aux_loss
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.common import EpochBatchSampler, fsdp
from cosmos_robot_trainers.text.config import TextDPOConfig
from cosmos_robot_trainers.text.driver import (
    TextResult,
    TextRun,
    accumulated_step,
    minibatch_epochs,
    score_rows,
    share_micro_batches,
)
from cosmos_robot_trainers.text.grpo import completion_batch, sample_groups, sequence_log_probs

__all__ = ["dpo_update", "load_pairs", "pair_log_probs", "run_text_dpo", "sampled_pairs"]


def load_pairs(path: Path, tokenizer: Any, stop_id: int) -> list[tuple[Completion, Completion]]:
    """(chosen, rejected) completions of each JSONL line; errors name the line and field."""
    pairs = []
    for where, row in read_jsonl(path, ("prompt", "chosen", "rejected"), "a pair has prompt, chosen, rejected"):
        prompt = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": str(row["prompt"])}]
        ids = prompt_ids(tokenizer, prompt, where=where)
        made = []
        for key in ("chosen", "rejected"):
            if not isinstance(row[key], str):
                raise ValueError(f"{where}: {key!r} must be a string")
            toks = list(tokenizer.encode(row[key], add_special_tokens=False)) + [stop_id]
            made.append(Completion(ids, toks, [0.0] * len(toks), True, row[key]))
        pairs.append((made[0], made[1]))
    return pairs


def sampled_pairs(
    groups: list[list[Completion]], rewards: torch.Tensor, per_prompt: int, generator: torch.Generator
) -> list[tuple[Completion, Completion]]:
    """Up to ``per_prompt`` (higher, lower reward) pairs within each group, drawn at random."""
    out: list[tuple[Completion, Completion]] = []
    k = len(groups[0]) if groups else 0
    for i, group in enumerate(groups):
        r = rewards[i * k : (i + 1) * k]
        options = [(a, b) for a in range(k) for b in range(k) if r[a] > r[b]]
        order = torch.randperm(len(options), generator=generator)[:per_prompt].tolist()
        out.extend((group[options[j][0]], group[options[j][1]]) for j in order)
    return out


def pair_log_probs(
    model: Any, pairs: list[tuple[Completion, Completion]], pad_id: int, temperature: float, mean: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence log-probs (P,) of the chosen and rejected completions (sum, or mean for IPO)."""
    batch = completion_batch([c for c, _ in pairs] + [r for _, r in pairs], pad_id).to(next(model.parameters()).device)
    lp = sequence_log_probs(model, batch, temperature).sum(1)
    if mean:
        lp = lp / batch.mask.sum(1).clamp(min=1)
    p = len(pairs)
    return lp[:p], lp[p:]


def dpo_update(
    config: TextDPOConfig,
    lm: Any,
    ref: Any,
    optimizer: Any,
    pairs: list[tuple[Completion, Completion]],
    generator: torch.Generator,
    world: World | None = None,
) -> dict[str, float]:
    """``epochs`` passes of minibatch DPO steps over ``pairs``; the mean metrics (data parallel: every
    rank holds the same pairs and takes its share of each minibatch, ``driver.minibatch_share``)."""
    algo, ocfg, rcfg = config.algo, config.optim, config.rollout
    mean = algo.loss == "ipo"
    micro = ocfg.micro_batch_size
    with torch.no_grad():  # data parallel: each rank scores its share of the pairs (driver.score_rows)
        device = next(lm.model.parameters()).device
        refs = score_rows(
            lambda p: torch.stack(
                pair_log_probs(ref, pairs[int(p[0]) : int(p[-1]) + 1], lm.pad_id, rcfg.temperature, mean), dim=1
            ),
            len(pairs),
            micro,
            device,
            world,
            fsdp.is_sharded(ref),
        )
        ref_c, ref_r = refs[:, 0], refs[:, 1]

    def parts(mb: torch.Tensor) -> Iterator[tuple[torch.Tensor, float, dict[str, Any]]]:
        for rows, factor in share_micro_batches(mb, micro, world, fsdp.is_sharded(lm.model)):
            idx = rows.tolist()
            pc, pr = pair_log_probs(lm.model, [pairs[i] for i in idx], lm.pad_id, rcfg.temperature, mean)
            loss, m = get_algorithm("loss", "dpo")(pc, pr, ref_c[idx], ref_r[idx], algo.beta, algo.loss)
            # MoE: the router balancing term
            yield with_router_aux_loss(lm.model, loss, m), factor * len(idx) / len(mb), m

    def step(mb: torch.Tensor) -> dict[str, float]:
        loss_value, gnorm, m = accumulated_step(lm.model, optimizer, ocfg.grad_clip, parts(mb), world)
        return {"loss": loss_value, "grad_norm": gnorm, **m}

    return minibatch_epochs(len(pairs), ocfg.epochs, ocfg.minibatch_size, generator, step)


def run_text_dpo(
    config: TextDPOConfig,
    *,
    resume: bool = True,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    log: Callable[[str], None] = print,
) -> TextResult:
    """Run (or continue) the recipe; ``stop_at_step`` stops as a kill would (tests of exact resume)."""
    run = TextRun(config, resume=resume, overwrite=overwrite, log=log)
    lm, algo, rcfg = run.lm, config.algo, config.rollout
    ref = run.reference()
    offline = load_pairs(Path(str(config.data.path)), lm.tokenizer, lm.stop_ids[0]) if config.data.path else None
    engine = run.rollout_engine() if offline is None else None  # offline pairs sample nothing (FSDP: no copy)
    sampler = (
        EpochBatchSampler(len(offline), min(rcfg.prompts_per_iter, len(offline)), config.train.seed)
        if offline
        else None
    )
    run.restore(lambda saved: sampler.load_state_dict(saved["sampler"]) if sampler is not None else None)
    source = f"{len(offline)} pairs from {config.data.path}" if offline else f"pairs sampled from {config.data.task}"
    control = ", shuffled rewards (control)" if config.reward.shuffle else ""
    run.log(f"text_dpo ({algo.loss}, beta {algo.beta}): {source}; {config.train.steps} iterations{control}")

    def iteration(it: int) -> dict[str, float]:
        g = torch.Generator().manual_seed(config.train.seed * 7919 + it)
        metrics: dict[str, float] = {}
        if offline is not None and sampler is not None:
            pairs = [offline[i] for i in sampler.next_indices().tolist()]
        else:
            assert engine is not None
            sampled = sample_groups(config, lm, engine, it, run.world)
            metrics.update(sampled.metrics)
            pairs = sampled_pairs(sampled.groups, sampled.rewards, algo.pairs_per_prompt, g)
        metrics["pairs"] = float(len(pairs))
        if pairs:
            metrics.update(dpo_update(config, lm, ref, run.optimizer, pairs, g, run.world))
            if engine is not None:
                engine.sync_weights(lm.model)
        return metrics

    return run.loop(
        iteration,
        kind="text_dpo",
        save_extra=(lambda: {"sampler": sampler.state_dict()}) if sampler is not None else None,
        stop_at_step=stop_at_step,
        unit="iteration",
        show=("reward_mean", "loss", "eval_accuracy"),
    )
