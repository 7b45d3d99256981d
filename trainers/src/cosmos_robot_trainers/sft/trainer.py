"""The SFT loop: flow-matching behaviour cloning of a ``FlowModel`` on recorded demonstrations.

``run_sft(config)`` reads as named phases: prepare the run folder (fresh / resume / refuse), get the
data (record if missing, load, normalise), build model + optimizer + schedule (+ EMA), restore the
newest checkpoint, then loop ``batch -> loss -> update -> log -> checkpoint -> (eval)``, and export
``final/`` (a ``FlowPolicy`` folder) at the end.

Exact resume: everything that decides step k+1 lives in the step-k checkpoint: weights, AdamW
moments, the schedule's step, the EMA, the sampler position (batches are a pure function of it),
the trainer's CPU generator (flow noise, flow times, augmentation; drawn on the CPU whatever
``train.device`` is) and the global RNGs. With
deterministic CPU kernels and the same thread count, a run killed and resumed logs bit-identical
losses to an uninterrupted one; ``tests/trainers/test_sft.py`` checks it. Metric windows end on
checkpoint steps (``ckpt_every`` is a multiple of ``log_every``) so the logged means match too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.policies.flow import FlowModel
from cosmos_robot_trainers.common import (
    EpochBatchSampler,
    MetricsLogger,
    TrainProgress,
    capture_rng_state,
    configure_torch,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
    seed_everything,
)
from cosmos_robot_trainers.sft.config import SFTConfig
from cosmos_robot_trainers.sft.data import ensure_dataset, load_train_data
from cosmos_robot_trainers.sft.export import EMA, build_policy, evaluate_policy, export_policy
from cosmos_robot_trainers.sft.optim import build_optimizer
from cosmos_robot_trainers.sft.rundir import CHECKPOINTS, prepare_run_dir

__all__ = ["SFTResult", "run_sft"]


@dataclass
class SFTResult:
    """What one call of ``run_sft`` did."""

    out_dir: Path
    step: int  # the last step trained (== config.train.steps when finished)
    finished: bool  # reached config.train.steps
    resumed_from: int | None  # checkpoint step this call started from
    final_dir: Path | None  # the exported policy folder (when finished or stopped by the wall-clock cap)
    train_wall_s: float  # training seconds of this call (data loading and recording excluded)
    total_train_wall_s: float  # training seconds of the whole run, across resumes
    data_wall_s: float  # seconds spent recording (if any) and loading data in this call
    record: dict[str, Any] | None = None  # the recorder's summary when this call recorded the dataset
    last_metrics: dict[str, Any] = field(default_factory=dict)
    eval_results: dict[str, Any] | None = None  # results.json of the final evaluation (eval.final)


class _Window:
    """Running sums of one logging window (reset on log steps, which include every checkpoint step)."""

    def __init__(self) -> None:
        self.n = 0
        self.sums: dict[str, float] = {}

    def add(self, values: dict[str, float]) -> None:
        self.n += 1
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value

    def means(self) -> dict[str, float]:
        return {key: value / max(self.n, 1) for key, value in self.sums.items()}


def run_sft(
    config: SFTConfig,
    *,
    resume: bool = True,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    log: Callable[[str], None] = print,
) -> SFTResult:
    """Train (or continue training) the recipe.

    ``stop_at_step`` stops after that step as a kill would: no extra checkpoint, log record or
    export (tests use it to check that a resumed run matches an uninterrupted one).
    """
    tcfg = config.train
    out = Path(config.output.dir)
    base = _load_init(config)  # a pi05 checkpoint to fine-tune (None: a new flow policy); fails before any folder
    ckpt_path = prepare_run_dir(config, resume=resume, overwrite=overwrite)
    configure_torch(tcfg.num_threads, tcfg.deterministic)

    # --- data ------------------------------------------------------------------------------------
    t_data = time.perf_counter()
    record = ensure_dataset(config.data, log=log)
    data: Any
    if base is None:
        data = load_train_data(config.data, config.model)
    else:
        from cosmos_robot_trainers.sft.pi05 import load_pi05_train_data

        data = load_pi05_train_data(config.data, base)
    data_wall_s = time.perf_counter() - t_data
    log(f"data: {len(data)} samples from {data.num_episodes} episodes ({data_wall_s:.1f} s)")

    # --- model, optimizer, schedule, sampler, generators -----------------------------------------
    seed_everything(tcfg.seed)
    device = torch.device(tcfg.device)
    model: Any
    if base is None:
        model = FlowModel(config.model).to(device)
    else:
        from cosmos_robot_trainers.sft.pi05 import Pi05SFTModel

        model = Pi05SFTModel(base.model, base.action_dim).to(device)

    def servable() -> Any:
        if base is None:
            return build_policy(model, data.stats, ema)
        from cosmos_robot_trainers.sft.pi05 import build_pi05_policy

        return build_pi05_policy(model, base, data.stats, ema)

    model.train()
    optimizer, scheduler = build_optimizer(model, config.optim, tcfg.steps)
    ema = EMA(model, tcfg.ema_decay) if tcfg.ema_decay is not None else None
    sampler = EpochBatchSampler(len(data), tcfg.batch_size, tcfg.seed, data.sample_weights(config.data.task_weighting))
    generator = torch.Generator().manual_seed(tcfg.seed + 1)
    start, prior_wall_s = 0, 0.0
    if ckpt_path is not None:
        start, prior_wall_s = _restore(ckpt_path, model, optimizer, scheduler, ema, sampler, generator, data)
        log(f"resuming from {ckpt_path} (step {start})")
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params / 1e6:.2f} M parameters; {tcfg.steps} steps of batch {sampler.batch_size}")

    stop = min(tcfg.steps, stop_at_step) if stop_at_step is not None else tcfg.steps
    logger = MetricsLogger(out, resume_step=start, tensorboard=config.output.tensorboard)
    if start == 0:
        logger.log_text("config", f"```\n{config.model_dump_json(indent=2)}\n```")
    window, step = _Window(), start
    last: dict[str, Any] = {}
    t0 = time.perf_counter()
    t_window, steps_in_window = t0, 0
    # the cap counts the whole run's training time, across resumes
    deadline = t0 + 60 * tcfg.max_wall_minutes - prior_wall_s if tcfg.max_wall_minutes else math.inf
    stopped_by_clock = False

    def checkpoint(at: int) -> None:
        wall = prior_wall_s + time.perf_counter() - t0
        state: dict[str, Any] = {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "ema": ema.state_dict() if ema is not None else None,
            "sampler": sampler.state_dict(),
            "generator": generator.get_state(),
            "rng": capture_rng_state(),
            "data": data.fingerprint(),
            "train_wall_s": wall,
        }
        info = {"epoch": round(sampler.epoch, 3), "train_wall_s": round(wall, 1), **last}
        save_checkpoint(out / CHECKPOINTS, at, model.state_dict(), state, info, keep_last=tcfg.keep_checkpoints)

    try:
        with TrainProgress(tcfg.steps, start, config.name, enabled=tcfg.progress) as bar:
            while step < stop:
                # phase: batch
                batch = data.batch(sampler.next_indices(), config.augment, generator, config.model.text_buckets)
                noise, times = _flow_draws(model, batch["actions"], generator)
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                # phase: loss + update
                loss, _ = model.flow_loss(batch, noise=noise.to(device), time=times.to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = _clip(model, config.optim.grad_clip)
                optimizer.step()
                scheduler.step()
                if ema is not None:
                    ema.update(model)
                step += 1
                steps_in_window += 1
                loss_value = float(loss.detach())
                if not math.isfinite(loss_value):
                    raise FloatingPointError(f"step {step}: loss is {loss_value}; lower optim.lr or check the data")
                window.add({"loss": loss_value, "grad_norm": grad_norm})
                # phase: log
                if step % tcfg.log_every == 0 or step == tcfg.steps:
                    now = time.perf_counter()
                    rate = steps_in_window / max(now - t_window, 1e-9)
                    last = {
                        **window.means(),
                        "lr": optimizer.param_groups[0]["lr"],
                        "epoch": round(sampler.epoch, 4),
                        "steps_per_s": round(rate, 3),
                        "train_wall_s": round(prior_wall_s + now - t0, 2),
                    }
                    logger.log(step, last)
                    bar.update(step, {"loss": last["loss"]}, rate=rate)
                    window, t_window, steps_in_window = _Window(), now, 0
                # phase: checkpoint
                out_of_time = time.perf_counter() > deadline
                if step % tcfg.ckpt_every == 0 or step == tcfg.steps or out_of_time:
                    checkpoint(step)
                # phase: eval (optional)
                if config.eval.every and step % config.eval.every == 0 and step < tcfg.steps:
                    policy = servable()
                    results = evaluate_policy(policy, config.eval, out / "eval" / f"step_{step:06d}", f"sft:step{step}")
                    logger.log(step, {"eval_success": results["totals"]["success_rate"]})
                if out_of_time:
                    stopped_by_clock = True
                    log(f"train.max_wall_minutes reached at step {step}; exporting what we have")
                    break
    finally:
        logger.close()

    train_wall_s = time.perf_counter() - t0
    total_wall = prior_wall_s + train_wall_s
    finished = step >= tcfg.steps
    result = SFTResult(
        out_dir=out,
        step=step,
        finished=finished,
        resumed_from=start if ckpt_path is not None else None,
        final_dir=None,
        train_wall_s=train_wall_s,
        total_train_wall_s=total_wall,
        data_wall_s=data_wall_s,
        record=record,
        last_metrics=last,
    )
    if finished or stopped_by_clock:
        policy = servable()
        result.final_dir = export_policy(policy, out / "final")
        log(f"final policy: {result.final_dir} (training {total_wall / 60:.1f} min)")
        if config.output.plot:
            from cosmos_robot_trainers.common.plot import plot_learning_curve

            plot_learning_curve(out, keys=("loss", "grad_norm", "lr", "eval_success"))
        if config.eval.final:
            result.eval_results = evaluate_policy(policy, config.eval, out / "eval" / "final", "sft:final")
            log(f"final eval: {100 * result.eval_results['totals']['success_rate']:.1f}% success")
    return result


def _load_init(config: SFTConfig) -> Any:
    """The ``init`` checkpoint as a ``Pi05Policy`` (the only family SFT fine-tunes from a folder), or None."""
    if config.init is None:
        return None
    from cosmos_robot.policies import CheckpointError, detect_family

    family = detect_family(config.init)
    if family != "pi05":
        raise CheckpointError(
            f"init: {config.init} is a {family!r} checkpoint; SFT fine-tunes pi05 folders "
            "(a flow policy trains from a [model] table)"
        )
    from cosmos_robot.policies.pi05.policy import Pi05Policy

    return Pi05Policy.from_pretrained(config.init, device=config.train.device, cuda_graphs=False)


def _flow_draws(model: Any, actions: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Flow noise and times drawn on the CPU generator: the same numbers on any device."""
    noise = torch.randn(actions.shape, generator=generator)
    return noise, model.sample_time(actions.shape[0], generator)


def _clip(model: torch.nn.Module, max_norm: float | None) -> float:
    if max_norm is None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))


def _restore(
    path: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ema: EMA | None,
    sampler: EpochBatchSampler,
    generator: torch.Generator,
    data: Any,
) -> tuple[int, float]:
    ckpt = load_checkpoint(path)
    state = ckpt.state
    if state.get("data") != data.fingerprint():
        raise ValueError(
            f"{path}: the dataset changed since this checkpoint (saved {state.get('data')}, now {data.fingerprint()}); "
            "pass --overwrite to start over"
        )
    model.load_state_dict(ckpt.model)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if ema is not None:
        if state.get("ema") is None:
            raise ValueError(f"{path}: saved without an EMA but train.ema_decay is set")
        ema.load_state_dict(state["ema"])
    sampler.load_state_dict(state["sampler"])
    generator.set_state(state["generator"])
    restore_rng_state(state["rng"])
    return ckpt.step, float(state.get("train_wall_s", 0.0))
