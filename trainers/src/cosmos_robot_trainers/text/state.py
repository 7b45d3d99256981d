"""Checkpoint, resume and export of a text trainer's state (shared by text SFT, GRPO and DPO).

Everything that decides the next step is saved: the model, AdamW, the schedule, the trainer's own
state (sampler position, iteration counters) and every RNG, so a killed and resumed run logs the
same numbers as an uninterrupted one. ``export_lm`` writes ``final/`` as an HF folder with a
manifest (staged, then swapped in).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.text.hf import CausalLM, load_causal_lm, save_causal_lm
from cosmos_robot.text.tasks import task_examples
from cosmos_robot.text.tiny import tiny_from_table
from cosmos_robot_trainers.common import (
    capture_rng_state,
    load_checkpoint,
    load_sharded_into,
    restore_rng_state,
    save_checkpoint,
    save_sharded_checkpoint,
)
from cosmos_robot_trainers.common.rundir import CHECKPOINTS
from cosmos_robot_trainers.text.config import TINY_INIT, TINY_PREFIX, eval_task

__all__ = [
    "evaluate_config",
    "export_lm",
    "finish_run",
    "load_lm",
    "restore_text_state",
    "save_text_state",
]


def save_text_state(
    out: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra: dict[str, Any],
    keep: int,
    info: dict[str, Any] | None = None,
    whole: tuple[dict[str, Any], dict[str, Any]] | None = None,
    sharded_world: Any = None,
) -> Path:
    """Rank 0's whole checkpoint. ``whole``: the (model, optimizer) state gathered from FSDP shards, saved
    instead of the objects'. ``sharded_world`` (``train.checkpoint_format = "sharded"``): every rank of
    that world writes its shards of model and AdamW state and rank 0 the trainer state beside them (a
    collective: every rank calls it)."""
    state = {"scheduler": scheduler.state_dict(), "rng": capture_rng_state(), **extra}
    if sharded_world is not None:
        from cosmos_robot.distributed import barrier

        world = sharded_world
        return save_sharded_checkpoint(
            out / CHECKPOINTS, step, model, optimizer, state, info, keep, world.is_main, lambda: barrier(world)
        )
    weights, optimizer_state = whole if whole is not None else (model.state_dict(), optimizer.state_dict())
    state = {"optimizer": optimizer_state, **state}
    return save_checkpoint(out / CHECKPOINTS, step, weights, state, info=info, keep_last=keep)


def restore_text_state(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    sharded: bool = False,
    mixed: bool = False,
) -> tuple[int, dict[str, Any]]:
    """Load ``path`` into the objects (``sharded``: into FSDP shards; ``mixed``: float32 shards of a bf16
    run, from the one-process run's master weights); ``(step, the whole saved state)`` for the trainer's
    own fields. A sharded checkpoint (``train.checkpoint_format``) is read by every rank, whatever the
    world size and sharding that wrote it."""
    ck = load_checkpoint(path)
    if ck.sharded is not None:
        load_sharded_into(ck.sharded, model, optimizer)
    elif sharded:
        from cosmos_robot_trainers.common import fsdp

        weights, optim_sd = ck.model, ck.state["optimizer"]
        if mixed:
            weights, optim_sd = fsdp.from_master_checkpoint(model, weights, optim_sd)
        fsdp.load_full_state(model, optimizer, weights, optim_sd)
    else:
        from cosmos_robot_trainers.common.fsdp import kernels_kept

        model.load_state_dict(ck.model)
        with kernels_kept(optimizer):  # a sharded run's checkpoint saved its own kernel choice
            optimizer.load_state_dict(ck.state["optimizer"])
    scheduler.load_state_dict(ck.state["scheduler"])
    restore_rng_state(ck.state["rng"])
    return ck.step, ck.state


def export_lm(lm: CausalLM, out: Path, source: str) -> Path:
    """The model as an HF folder with a manifest (staged, then swapped in)."""
    from cosmos_robot.manifest import staged_folder

    info = {"source": source, "target": "hf_causal_lm", "family": "hf_causal_lm"}
    with staged_folder(out, info) as tmp:
        save_causal_lm(lm, tmp)
    return out


def finish_run(
    lm: CausalLM, config: Any, step: int, source: str, log: Callable[[str], None]
) -> tuple[Path, float | None]:
    """Export ``final/``, evaluate it (``eval.final``; logged as the final point) and plot the curve."""
    from cosmos_robot_trainers.common import MetricsLogger

    out = Path(config.output.dir)
    final = export_lm(lm, out / "final", source)
    log(f"final model: {final}")
    accuracy = evaluate_config(lm, config) if config.eval.final else None
    if accuracy is not None:
        with MetricsLogger(out, resume_step=step, tensorboard=config.output.tensorboard) as final_log:
            final_log.log(step, {"eval_accuracy": accuracy, "final_eval": 1})
        log(f"final eval: {100 * accuracy:.1f}% exact on {config.eval.prompts} held-out prompts")
    if config.output.plot:
        from cosmos_robot_trainers.common.plot import plot_learning_curve

        plot_learning_curve(out, keys=("loss", "reward_mean", "train_accuracy", "eval_accuracy"))
    return final, accuracy


def evaluate_config(lm: CausalLM, config: Any) -> float | None:
    """Greedy exact accuracy on the recipe's held-out prompts (``[eval]``; the task defaults to ``data.task``)."""
    from cosmos_robot.text.evaluate import evaluate_lm

    task = eval_task(config)
    if task is None:
        return None
    ecfg = config.eval
    examples = task_examples(task, "eval", ecfg.prompts, ecfg.seed)
    rows = evaluate_lm(lm, examples, max_new_tokens=ecfg.max_new_tokens, temperature=ecfg.temperature, seed=ecfg.seed)
    return sum(r["success"] for r in rows) / len(rows)


def load_lm(init: str, tiny: Any, dtype: str, device: str) -> CausalLM:
    """``tiny:hf_causal_lm`` built from ``tiny`` (a ``TinyLMConfig``), or an HF folder loaded offline."""
    if init == TINY_INIT:
        lm = tiny_from_table(tiny.model_dump())
        lm.model.to(device=device, dtype=getattr(torch, dtype))
        return lm
    if init.startswith(TINY_PREFIX):
        raise ValueError(f"init: {init!r}: the text trainers build {TINY_INIT!r} from [model], or load an HF folder")
    return load_causal_lm(init, dtype=dtype, device=device)
