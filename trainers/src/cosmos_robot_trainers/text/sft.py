"""Conversation SFT of HF causal LMs: chat template, assistant-only loss, best-fit packing, exact resume.

``run_text_sft(config)`` has the robot SFT loop's phases and shares its pieces (run folder with
refusal of a changed recipe, ``EpochBatchSampler``, checkpoints with RNG state, JSONL + TensorBoard,
progress bar, learning curve): load the model (an HF folder or ``tiny:<model_type>``), tokenize the
conversations (``cosmos_robot.text.chat``), pack them into rows (``cosmos_robot.text.packing``), then
``batch -> packed forward (use_cache=False) -> token NLL on assistant tokens -> update``, and export
``final/``, an HF folder with a manifest that ``transformers`` and ``eval --suite text/...`` load.

Loss: the sum of the assistant tokens' NLL over the batch divided by their count (TRL's SFT "nll"
with ``num_items_in_batch``: every trained token weighs the same, however the rows were packed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.text.chat import TokenizedConversation, tokenize_conversation
from cosmos_robot.text.hf import CausalLM, load_causal_lm
from cosmos_robot.text.packing import collate_rows, pack_bfd, packed_logits, token_log_probs
from cosmos_robot.text.tasks import get_task, task_examples
from cosmos_robot.text.tiny import tiny_from_table
from cosmos_robot_trainers.common import (
    EpochBatchSampler,
    MetricsLogger,
    TrainProgress,
    configure_torch,
    seed_everything,
)
from cosmos_robot_trainers.common import rundir as _rundir
from cosmos_robot_trainers.sft.optim import build_optimizer
from cosmos_robot_trainers.text.config import RUNTIME_FIELDS, TINY_INIT, TINY_PREFIX, TextSFTConfig
from cosmos_robot_trainers.text.state import evaluate_config, finish_run, restore_text_state, save_text_state

__all__ = ["TextSFTResult", "load_lm", "run_text_sft", "sft_loss"]


@dataclass
class TextSFTResult:
    out_dir: Path
    step: int
    finished: bool
    resumed_from: int | None
    final_dir: Path | None
    train_wall_s: float
    last_metrics: dict[str, Any] = field(default_factory=dict)
    eval_accuracy: float | None = None


def load_lm(init: str, tiny: Any, dtype: str, device: str) -> CausalLM:
    """``tiny:hf_causal_lm`` built from ``tiny`` (a ``TinyLMConfig``), or an HF folder loaded offline."""
    if init == TINY_INIT:
        lm = tiny_from_table(tiny.model_dump())
        lm.model.to(device=device, dtype=getattr(torch, dtype))
        return lm
    if init.startswith(TINY_PREFIX):
        raise ValueError(f"init: {init!r}: the text trainers build {TINY_INIT!r} from [model], or load an HF folder")
    return load_causal_lm(init, dtype=dtype, device=device)


def load_conversations(
    config: TextSFTConfig, tokenizer: Any, log: Callable[[str], None]
) -> list[TokenizedConversation]:
    """The training conversations, tokenized with their assistant masks (truncations counted and logged)."""
    dcfg = config.data
    if dcfg.task is not None:
        examples = task_examples(get_task(dcfg.task), "train", dcfg.examples, dcfg.seed)
        items = [
            (f"{ex.task} seed {ex.seed}", ex.prompt + [{"role": "assistant", "content": ex.solution}])
            for ex in examples
        ]
    else:
        path = Path(str(dcfg.path))
        if not path.is_file():
            raise FileNotFoundError(f"data.path: {path} does not exist")
        items = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc})") from exc
            if not isinstance(row, dict) or "messages" not in row:
                raise ValueError(f"{path}:{n}: expected an object with 'messages'")
            items.append((f"{path}:{n}", row["messages"]))
    convs = [tokenize_conversation(tokenizer, msgs, max_length=dcfg.max_length, where=where) for where, msgs in items]
    cut = sum(c.truncated for c in convs)
    tokens = sum(len(c.input_ids) for c in convs)
    trained = sum(sum(c.assistant_mask) for c in convs)
    log(f"data: {len(convs)} conversations, {tokens} tokens ({trained} trained), {cut} truncated to {dcfg.max_length}")
    return convs


def make_rows(config: TextSFTConfig, convs: list[TokenizedConversation]) -> list[list[int]]:
    """Conversation indices per training row: packed (best-fit decreasing) or one each."""
    if not config.data.packing:
        return [[i] for i in range(len(convs))]
    return [row.members for row in pack_bfd([len(c.input_ids) for c in convs], config.data.pack_length)]


def sft_loss(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Mean NLL over the batch's trained tokens, and their count."""
    logits = packed_logits(model, batch["input_ids"], batch["position_ids"])
    logp = token_log_probs(logits, batch["labels"])
    count = int((batch["labels"][:, 1:] != -100).sum())
    return -logp.sum() / max(count, 1), count


def run_text_sft(
    config: TextSFTConfig,
    *,
    resume: bool = True,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    log: Callable[[str], None] = print,
) -> TextSFTResult:
    """Train (or continue) the recipe; ``stop_at_step`` stops as a kill would (tests of exact resume)."""
    out = Path(config.output.dir)
    ckpt_path = _rundir.prepare_run_dir(config, out, RUNTIME_FIELDS, resume=resume, overwrite=overwrite)
    tcfg = config.train
    configure_torch(tcfg.num_threads, tcfg.deterministic)
    seed_everything(tcfg.seed)
    lm = load_lm(config.init, config.model, tcfg.dtype, tcfg.device)
    model = lm.model
    model.train()
    convs = load_conversations(config, lm.tokenizer, log)
    rows = make_rows(config, convs)
    optimizer, scheduler = build_optimizer(model, config.optim, tcfg.steps)
    sampler = EpochBatchSampler(len(rows), min(tcfg.batch_size, len(rows)), tcfg.seed)
    start, prior_wall = 0, 0.0
    if ckpt_path is not None:
        start, saved = restore_text_state(ckpt_path, model, optimizer, scheduler)
        sampler.load_state_dict(saved["sampler"])
        prior_wall = float(saved.get("train_wall_s", 0.0))
        log(f"resuming from {ckpt_path} (step {start})")
    params = sum(p.numel() for p in model.parameters())
    log(
        f"model: {model.config.model_type}, {params / 1e6:.3f} M parameters; {len(rows)} rows, "
        f"{tcfg.steps} steps of {sampler.batch_size}"
    )
    logger = MetricsLogger(out, resume_step=start, tensorboard=config.output.tensorboard)
    if start == 0 and config.eval.initial:
        acc = evaluate_config(lm, config)
        if acc is not None:
            logger.log(0, {"eval_accuracy": acc})
            log(f"initial eval: {100 * acc:.1f}% exact")
    stop = min(tcfg.steps, stop_at_step) if stop_at_step is not None else tcfg.steps
    t0 = time.perf_counter()
    step, last, stopped_by_clock = start, {}, False
    sums: dict[str, float] = {}
    n_window, t_window = 0, t0
    try:
        with TrainProgress(tcfg.steps, start, config.name, enabled=tcfg.progress) as bar:
            while step < stop:
                idx = sampler.next_indices()
                batch = collate_rows(
                    [[(convs[i].input_ids, convs[i].assistant_mask) for i in rows[r]] for r in idx.tolist()], lm.pad_id
                )
                batch = {k: v.to(tcfg.device) for k, v in batch.items()}
                loss, count = sft_loss(model, batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip or float("inf"))
                optimizer.step()
                scheduler.step()
                step += 1
                n_window += 1
                for k, v in (("loss", float(loss.detach())), ("grad_norm", float(gnorm)), ("tokens", float(count))):
                    sums[k] = sums.get(k, 0.0) + v
                if step % tcfg.log_every == 0 or step == stop:
                    now = time.perf_counter()
                    last = {k: v / n_window for k, v in sums.items()}
                    last.update(lr=float(scheduler.get_last_lr()[0]), steps_per_s=n_window / max(now - t_window, 1e-9))
                    sums, n_window, t_window = {}, 0, now
                    if config.eval.every and step % config.eval.every == 0 and step < tcfg.steps:
                        acc = evaluate_config(lm, config)
                        if acc is not None:
                            last["eval_accuracy"] = acc
                    logger.log(step, last)
                    bar.update(step, last)
                if step % tcfg.ckpt_every == 0 or step == tcfg.steps:
                    extra = {"sampler": sampler.state_dict(), "train_wall_s": prior_wall + time.perf_counter() - t0}
                    save_text_state(
                        out,
                        step,
                        model,
                        optimizer,
                        scheduler,
                        extra,
                        tcfg.keep_checkpoints,
                        info={"loss": last.get("loss")},
                    )
                if tcfg.max_wall_minutes and prior_wall + time.perf_counter() - t0 > 60 * tcfg.max_wall_minutes:
                    stopped_by_clock = step < stop
                    log(f"train.max_wall_minutes reached after step {step}; exporting what we have")
                    break
    finally:
        logger.close()
    result = TextSFTResult(
        out, step, step >= tcfg.steps, start if ckpt_path else None, None, time.perf_counter() - t0, last
    )
    if result.finished or stopped_by_clock:
        source = f"text_sft:{config.name}:step{step}"
        result.final_dir, result.eval_accuracy = finish_run(lm, config, step, source, log)
    return result
