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

from collections.abc import Callable
from typing import Any, cast

import torch

from cosmos_robot.config import ConfigError
from cosmos_robot.distributed import World, mean_over_ranks, shard_range
from cosmos_robot.text.chat import TokenizedConversation, read_jsonl, tokenize_conversation
from cosmos_robot.text.moe import with_router_aux_loss
from cosmos_robot.text.packing import collate_rows, pack_bfd, packed_logits, token_log_probs
from cosmos_robot.text.tasks import get_task, task_examples
from cosmos_robot.text.vision import ImageInputs, collate_vl_rows, example_conversation
from cosmos_robot_trainers.common import EpochBatchSampler
from cosmos_robot_trainers.text.config import TextSFTConfig
from cosmos_robot_trainers.text.driver import TextResult, TextRun, finish_step

__all__ = ["load_conversations", "make_rows", "run_text_sft", "sft_loss"]


def load_conversations(
    config: TextSFTConfig, tokenizer: Any, log: Callable[[str], None], processor: Any = None
) -> tuple[list[TokenizedConversation], list[ImageInputs | None] | None]:
    """The training conversations, tokenized with their assistant masks (truncations counted and logged), and
    each one's images (None for a text task)."""
    dcfg = config.data
    images: list[ImageInputs | None] | None = None
    if dcfg.task is not None:
        examples = task_examples(get_task(dcfg.task), "train", dcfg.examples, dcfg.seed)
        made = [example_conversation(tokenizer, processor, ex, dcfg.max_length) for ex in examples]
        convs = [c for c, _ in made]
        if any(ex.images for ex in examples):
            images = [im for _, im in made]
    else:
        rows = read_jsonl(dcfg.path, ("messages",), 'one conversation per line: {"messages": [...]}')
        convs = [
            tokenize_conversation(tokenizer, row["messages"], max_length=dcfg.max_length, where=where)
            for where, row in rows
        ]
    cut = sum(c.truncated for c in convs)
    tokens = sum(len(c.input_ids) for c in convs)
    trained = sum(sum(c.assistant_mask) for c in convs)
    pictures = f", {len(images)} with images" if images else ""
    log(
        f"data: {len(convs)} conversations{pictures}, {tokens} tokens ({trained} trained), {cut} truncated to "
        f"{dcfg.max_length}"
    )
    return convs, images


def make_rows(config: TextSFTConfig, convs: list[TokenizedConversation]) -> list[list[int]]:
    """Conversation indices per training row: packed (best-fit decreasing) or one each."""
    if not config.data.packing:
        return [[i] for i in range(len(convs))]
    return [row.members for row in pack_bfd([len(c.input_ids) for c in convs], config.data.pack_length)]


def sft_loss(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """Mean NLL over the batch's trained tokens, and their count (image arguments, if any, go to the forward)."""
    images = {k: v for k, v in batch.items() if k not in ("input_ids", "position_ids", "labels")}
    logits = packed_logits(model, batch["input_ids"], batch["position_ids"], **images)
    logp = token_log_probs(logits, batch["labels"])
    count = int((batch["labels"][:, 1:] != -100).sum())
    return -logp.sum() / max(count, 1), count


def _tokens(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["labels"][:, 1:] != -100).sum())


def _chunks(lo: int, hi: int, size: int | None) -> list[tuple[int, int]]:
    step = hi - lo if size is None else size
    return [(a, min(a + step, hi)) for a in range(lo, hi, max(step, 1))]


def micro_batches_of(
    batch: dict[str, torch.Tensor], world: World, micro: int | None = None
) -> list[tuple[dict[str, torch.Tensor], float]]:
    """This rank's rows of a collated global batch, in micro-batches of ``micro`` rows, each with its loss
    weight: world size x its share of the global batch's trained tokens, so that the weighted token means,
    summed over micro-batches and averaged over ranks, are the global batch's token mean."""
    n = int(batch["input_ids"].shape[0])
    lo, hi = shard_range(n, world) if world.distributed else (0, n)
    total = _tokens(batch)
    parts = []
    for a, b in _chunks(lo, hi, micro):
        part = batch if (a, b) == (0, n) else {k: v[a:b] for k, v in batch.items()}
        parts.append((part, world.world_size * _tokens(part) / max(total, 1)))
    return parts


def vl_micro_batches(
    model: Any, rows: list[list[tuple[list[int], list[int], Any]]], pad_id: int, world: World, micro: int | None = None
) -> list[tuple[dict[str, Any], float]]:
    """``micro_batches_of`` for image-text rows: each micro-batch collates only its rows (the images' patches
    are concatenated over a batch's images, so a collated batch cannot be cut by rows), weighted by its
    share of the global batch's trained tokens, counted on the text alone."""
    lo, hi = shard_range(len(rows), world) if world.distributed else (0, len(rows))
    total = _tokens(collate_rows([[(ids, mask) for ids, mask, _ in row] for row in rows], pad_id))
    parts = []
    for a, b in _chunks(lo, hi, micro):
        part = collate_vl_rows(model, rows[a:b], pad_id)
        parts.append((part, world.world_size * _tokens(part) / max(total, 1)))
    return parts


def run_text_sft(
    config: TextSFTConfig,
    *,
    resume: bool = True,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    log: Callable[[str], None] = print,
) -> TextResult:
    """Train (or continue) the recipe; ``stop_at_step`` stops as a kill would (tests of exact resume)."""
    run = TextRun(config, resume=resume, overwrite=overwrite, log=log)
    lm, tcfg, world = run.lm, config.train, run.world
    convs, images = load_conversations(config, lm.tokenizer, run.log, lm.processor)
    rows = make_rows(config, convs)
    sampler = EpochBatchSampler(len(rows), min(tcfg.batch_size, len(rows)), tcfg.seed)
    if sampler.batch_size % world.world_size:
        raise ConfigError(
            f"the batch is min(train.batch_size, rows) = {sampler.batch_size} rows, not divisible by the "
            f"{world.world_size} training processes"
        )
    run.restore(lambda saved: sampler.load_state_dict(saved["sampler"]))
    params = sum(p.numel() for p in lm.model.parameters())
    run.log(
        f"model: {lm.model.config.model_type}, {params / 1e6:.3f} M parameters; {len(rows)} rows, "
        f"{tcfg.steps} steps of {sampler.batch_size}"
    )

    def step(_: int) -> dict[str, float]:
        members = [rows[r] for r in sampler.next_indices().tolist()]
        if images is not None:  # image-text rows: M-RoPE positions and the rows' images
            rows_vl = [[(convs[i].input_ids, convs[i].assistant_mask, images[i]) for i in m] for m in members]
            parts = vl_micro_batches(lm.model, rows_vl, lm.pad_id, world, config.optim.micro_batch_size)
        else:
            ids = [[(convs[i].input_ids, convs[i].assistant_mask) for i in m] for m in members]
            parts = micro_batches_of(collate_rows(ids, lm.pad_id), world, config.optim.micro_batch_size)
        run.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {"loss": 0.0, "tokens": 0.0}
        for i, (batch, weight) in enumerate(parts):
            if run.sharded:  # FSDP reduce-scatters once, after the last micro-batch
                cast(Any, lm.model).set_requires_gradient_sync(i == len(parts) - 1)
            loss, count = sft_loss(lm.model, {k: v.to(tcfg.device) for k, v in batch.items()})
            aux: dict[str, Any] = {}
            total = with_router_aux_loss(lm.model, loss, aux)  # MoE models: the router balancing term
            (total * weight).backward()
            metrics["loss"] += float(loss.detach()) * weight
            metrics["tokens"] += float(count) * world.world_size
            for k, v in aux.items():
                metrics[k] = metrics.get(k, 0.0) + float(v) * weight
        metrics = {k: mean_over_ranks(v, world) for k, v in metrics.items()}
        return {**metrics, "grad_norm": finish_step(lm.model, run.optimizer, config.optim.grad_clip, world)}

    sampler_state = lambda: {"sampler": sampler.state_dict()}  # noqa: E731
    return run.loop(step, kind="text_sft", save_extra=sampler_state, stop_at_step=stop_at_step)
