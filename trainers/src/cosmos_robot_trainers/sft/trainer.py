"""The SFT loop: flow-matching behaviour cloning on recorded demonstrations, for any family with an SFT adapter.

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

Data parallel (``torchrun``, or ``cosmos-robot train RECIPE --nproc N``; cosmos_robot/distributed.py):
every rank draws the whole global batch as one process would and trains on its slice; gradients and the
logged loss are averaged over ranks, and rank 0 alone records data, writes metrics and checkpoints,
evaluates and exports. The checkpoint is the single-process one, so a run resumes at any world size.
``train.fsdp`` shards parameters, gradients, AdamW state and the EMA instead (common/fsdp.py); its
checkpoints are gathered whole, so they too resume with or without sharding.

``train.grad_accum`` cuts each rank's part of the batch into micro-batches, each weighted by its share
of the global batch's loss normaliser, so the accumulated gradient is the whole batch's (under FSDP the
reduce-scatter runs once, after the last). ``train.precision = "bf16"`` runs forward and loss under
``torch.autocast(bfloat16)`` with float32 weights, gradients and AdamW state (data parallel too); under
FSDP the float32 shards are also gathered in bf16 (``MixedPrecisionPolicy``), so no float32 weight is
held for autocast to copy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from cosmos_robot.config import ConfigError
from cosmos_robot.distributed import (
    World,
    any_rank,
    barrier,
    broadcast_parameters,
    broadcast_text,
    mean_over_ranks,
    shard_range,
    world_from_env,
)
from cosmos_robot.policies.init_source import resolve_init
from cosmos_robot.policies.registry import family_of, get_family
from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_trainers.common import (
    EpochBatchSampler,
    MetricsLogger,
    NullMetricsLogger,
    TrainProgress,
    capture_rng_state,
    configure_torch,
    fsdp,
    load_checkpoint,
    load_sharded_into,
    restore_rng_state,
    save_checkpoint,
    save_sharded_checkpoint,
    seed_everything,
)
from cosmos_robot_trainers.common.evaluation import evaluate_policy
from cosmos_robot_trainers.common.export import EMA, export_policy
from cosmos_robot_trainers.sft.adapter import SFTAdapter, SFTData
from cosmos_robot_trainers.sft.config import NEW_MODEL_FAMILY, SFTConfig
from cosmos_robot_trainers.sft.data import ensure_dataset
from cosmos_robot_trainers.sft.optim import build_optimizer
from cosmos_robot_trainers.sft.rundir import CHECKPOINTS, prepare_run_dir

__all__ = ["SFTResult", "heldout_loss", "run_sft"]


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

    def __init__(self, started: float) -> None:
        self.started = started  # perf_counter() at the window's start (its steps/s)
        self.n = 0
        self.sums: dict[str, float] = {}

    def add(self, values: dict[str, float]) -> None:
        self.n += 1
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value

    def means(self) -> dict[str, float]:
        return {key: value / max(self.n, 1) for key, value in self.sums.items()}


@dataclass
class _Run:
    """One run between steps: what a checkpoint saves (model to generator), the logger and the clocks."""

    config: SFTConfig
    adapter: SFTAdapter
    data: SFTData
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ema: EMA | None
    sampler: EpochBatchSampler
    generator: torch.Generator  # CPU draws (flow noise, flow times, augmentation): the same on any device
    logger: MetricsLogger
    world: World  # this process among the data-parallel ranks (a world of one by default)
    start: int  # the checkpoint step this call resumed from (0 for a fresh run)
    prior_wall_s: float  # training seconds of the calls before this one
    step: int  # the last step trained
    t0: float = 0.0  # perf_counter() when this call's training started
    window: _Window = field(default_factory=lambda: _Window(0.0))
    last: dict[str, Any] = field(default_factory=dict)  # the last logged metrics

    @property
    def out(self) -> Path:
        return Path(self.config.output.dir)

    def wall_s(self, now: float) -> float:
        """Training seconds of the whole run at ``now``, across resumes."""
        return self.prior_wall_s + now - self.t0

    @property
    def sharded(self) -> bool:
        return self.world.distributed and self.config.train.fsdp

    def whole_model(self) -> nn.Module | None:
        """The model with whole parameters: itself, or with FSDP a fresh one holding the gathered weights on
        rank 0 (None elsewhere; a collective)."""
        if not self.sharded:
            return self.model if self.world.is_main else None
        state = fsdp.full_model_state(self.model)
        if not self.world.is_main:
            return None
        # on the CPU, with the random state put back after the build: checkpoints save it, and rank 0's must
        # stay the other ranks' (a resume is exact only then)
        with torch.random.fork_rng(devices=[]):
            fresh = getattr(self.adapter, "fresh_model", self.adapter.build_model)  # not over sharded modules
            whole = fresh(self.config, torch.device("cpu"))
        whole.load_state_dict(state)
        return whole

    def whole_ema(self) -> EMA | None:
        """The EMA with whole tensors (gathered from the shards under FSDP: a collective, every rank calls it)."""
        return self.ema.whole() if self.ema is not None else None

    def servable(self, model: nn.Module | None = None, ema: EMA | None = None) -> BatchPolicy:
        return self.adapter.servable(model if model is not None else self.model, self.data, ema or self.ema)


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
    world = world_from_env(config.train.device)
    if config.train.batch_size % world.world_size:
        raise ConfigError(
            f"train.batch_size={config.train.batch_size} is not divisible by the {world.world_size} training processes"
        )
    if config.train.batch_size % (world.world_size * config.train.grad_accum):
        raise ConfigError(
            f"train.batch_size={config.train.batch_size} is not divisible into train.grad_accum="
            f"{config.train.grad_accum} micro-batches on each of the {world.world_size} training processes"
        )
    if not world.is_main:
        log = _quiet  # rank 0 speaks for the run
    adapter = sft_adapter(config, log)  # a bad init fails before any folder is made
    ckpt_path = prepare_run_dir(config, resume=resume, overwrite=overwrite) if world.is_main else None
    shared = broadcast_text(str(ckpt_path) if ckpt_path is not None else None, world)
    ckpt_path = Path(shared) if shared is not None else None
    configure_torch(config.train.num_threads, config.train.deterministic)
    data, record, data_wall_s = _load_data(config, adapter, log, world)
    run = _setup(config, adapter, data, ckpt_path, log, world)
    steps = config.train.steps
    if run.start == 0 and config.eval.initial:
        _evaluate(run)  # step 0: the starting policy, the learning curve's first point
    try:
        stopped_by_clock = _train(run, min(steps, stop_at_step) if stop_at_step is not None else steps, log)
    finally:
        run.logger.close()
    train_wall_s = time.perf_counter() - run.t0
    result = SFTResult(
        out_dir=run.out,
        step=run.step,
        finished=run.step >= steps,
        resumed_from=run.start if ckpt_path is not None else None,
        final_dir=None,
        train_wall_s=train_wall_s,
        total_train_wall_s=run.prior_wall_s + train_wall_s,
        data_wall_s=data_wall_s,
        record=record,
        last_metrics=run.last,
    )
    if result.finished or stopped_by_clock:
        _export_and_evaluate(run, result, log)
    barrier(world)
    return result


def _quiet(_: str) -> None:
    pass


def _load_data(
    config: SFTConfig, adapter: SFTAdapter, log: Callable[[str], None], world: World
) -> tuple[SFTData, dict[str, Any] | None, float]:
    """Phase data: record the dataset if it is missing (rank 0), load it; ``(data, recorder summary or None,
    seconds)``."""
    t_data = time.perf_counter()
    record = ensure_dataset(config.data, log=log) if world.is_main else None
    barrier(world)
    data = adapter.load_data(config)
    data_wall_s = time.perf_counter() - t_data
    log(f"data: {len(data)} samples from {data.num_episodes} episodes ({data_wall_s:.1f} s)")
    return data, record, data_wall_s


def _setup(
    config: SFTConfig,
    adapter: SFTAdapter,
    data: SFTData,
    ckpt_path: Path | None,
    log: Callable[[str], None],
    world: World,
) -> _Run:
    """Phase setup: model, optimizer, schedule (+ EMA), sampler, generator, restored from ``ckpt_path``; logger."""
    tcfg = config.train
    seed_everything(tcfg.seed)
    device = torch.device(tcfg.device)
    model = adapter.build_model(config, device)
    broadcast_parameters(model, world)
    if world.distributed and tcfg.fsdp:
        if not getattr(adapter, "supports_fsdp", False):
            raise ConfigError(
                f"train.fsdp: the {type(adapter).__name__} family cannot be sharded yet (it names no FSDP units "
                "or cannot rebuild a whole copy for export); use data parallelism without train.fsdp"
            )
        units = adapter.fsdp_units(model) if hasattr(adapter, "fsdp_units") else None
        # one dtype per unit: bf16 runs shard float32 masters gathered in bf16 (FSDP's MixedPrecisionPolicy;
        # autocast alone would keep a bf16 copy of every gathered weight for the backward); a checkpoint that mixes
        # dtypes (pi0.5's bf16 layers beside float32 norms) is sharded as float32 masters
        compute = torch.bfloat16 if tcfg.precision == "bf16" else None
        if compute is None and len({p.dtype for p in model.parameters() if p.is_floating_point()}) > 1:
            log("fsdp: the model mixes parameter dtypes; its shards are float32 masters")
            model.float()
        fsdp.shard_model(model, compute_dtype=compute, units=units)
        whole = sum(p.numel() for p in fsdp.replicated_params(model))
        log(f"fsdp: parameters, gradients and AdamW state sharded over {world.world_size} processes ({whole} whole)")
    elif tcfg.fsdp:
        log("train.fsdp shards over data-parallel processes (--nproc N); this one-process run keeps whole tensors")
    model.train()
    optimizer, scheduler = build_optimizer(model, config.optim, tcfg.steps, adapter.param_groups(model, config))
    ema = EMA(model, tcfg.ema_decay) if tcfg.ema_decay is not None else None
    sampler = EpochBatchSampler(len(data), tcfg.batch_size, tcfg.seed, data.sample_weights(config.data.task_weighting))
    generator = torch.Generator().manual_seed(tcfg.seed + 1)
    start, prior_wall_s = 0, 0.0
    if ckpt_path is not None:
        sharded = world.distributed and tcfg.fsdp
        start, prior_wall_s = _restore(ckpt_path, model, optimizer, scheduler, ema, sampler, generator, data, sharded)
        log(f"resuming from {ckpt_path} (step {start})")
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params / 1e6:.2f} M parameters; {tcfg.steps} steps of batch {sampler.batch_size}")
    if world.is_main:
        logger = MetricsLogger(Path(config.output.dir), resume_step=start, tensorboard=config.output.tensorboard)
    else:
        logger = NullMetricsLogger()
    if world.distributed:
        per = tcfg.batch_size // world.world_size
        log(f"data parallel: {world.world_size} processes ({world.backend}), {per} samples of each batch per process")
    if start == 0:
        logger.log_text("config", f"```\n{config.model_dump_json(indent=2)}\n```")
    return _Run(
        config=config,
        adapter=adapter,
        data=data,
        device=device,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        ema=ema,
        sampler=sampler,
        generator=generator,
        logger=logger,
        world=world,
        start=start,
        prior_wall_s=prior_wall_s,
        step=start,
    )


def _train(run: _Run, stop: int, log: Callable[[str], None]) -> bool:
    """The loop up to step ``stop``: batch -> loss + update -> log -> checkpoint -> (eval).

    Returns True when ``train.max_wall_minutes`` stopped it (after a checkpoint).
    """
    tcfg, eval_every = run.config.train, run.config.eval.every
    run.t0 = time.perf_counter()
    run.window = _Window(run.t0)
    # the cap counts the whole run's training time, across resumes
    deadline = run.t0 + 60 * tcfg.max_wall_minutes - run.prior_wall_s if tcfg.max_wall_minutes else math.inf
    with TrainProgress(tcfg.steps, run.start, run.config.name, enabled=tcfg.progress and run.world.is_main) as bar:
        while run.step < stop:
            _train_step(run, _next_batch(run))
            if run.step % tcfg.log_every == 0 or run.step == tcfg.steps:
                _log_window(run, bar)
            out_of_time = time.perf_counter() > deadline
            if deadline != math.inf:  # every rank stops at the same step (a collective follows)
                out_of_time = any_rank(out_of_time, run.world)
            if run.step % tcfg.ckpt_every == 0 or run.step == tcfg.steps or out_of_time:
                _checkpoint(run)
            if eval_every and run.step % eval_every == 0 and run.step < tcfg.steps:
                _evaluate(run)
            if out_of_time:
                log(f"train.max_wall_minutes reached at step {run.step}; exporting what we have")
                return True
    return False


@dataclass
class _Micro:
    """One forward/backward of a step: its samples and flow draws (on the CPU until its turn), and the weight that makes
    the sum of the weighted micro-batch losses, averaged over the ranks, the global batch's loss."""

    batch: dict[str, torch.Tensor]
    noise: torch.Tensor
    times: torch.Tensor
    weight: float


def _next_batch(run: _Run) -> list[_Micro]:
    """Phase batch: the global batch, every draw on the CPU generator, cut into this rank's
    ``train.grad_accum`` micro-batches. In a data-parallel run the whole global batch is drawn and this
    rank's slice kept (the module docstring). Each part's weight is world size x its share of the global
    batch's loss normaliser, so the weighted losses sum, and average over ranks, to the global batch's
    loss: the same step as one process taking the whole batch at once (1.0 for one part in one process)."""
    config, generator = run.config, run.generator
    batch = run.data.batch(run.sampler.next_indices(), config.augment, generator, config.model.text_buckets)
    noise = torch.randn(batch["actions"].shape, generator=generator)  # CPU draws: same on any device
    times = run.adapter.sample_time(run.model, noise.shape[0], generator)
    world, parts = run.world, config.train.grad_accum
    if not world.distributed and parts == 1:
        return [_Micro(batch, noise, times, 1.0)]
    total = run.data.loss_mass(batch)
    lo, hi = shard_range(noise.shape[0], world)
    per = (hi - lo) // parts
    micro = []
    for i in range(parts):
        a, b = lo + i * per, lo + (i + 1) * per
        part = run.data.shard_batch(batch, a, b)
        weight = world.world_size * run.data.loss_mass(part) / max(total, 1e-12)
        micro.append(_Micro(part, noise[a:b], times[a:b], weight))
    return micro


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _train_step(run: _Run, micro: list[_Micro]) -> None:
    """Phase loss + update: the micro-batches' forward and backward (``train.precision``'s autocast), one
    optimizer and schedule step (and the EMA's); adds to the window."""
    run.optimizer.zero_grad(set_to_none=True)
    autocast = run.config.train.precision == "bf16"  # under FSDP beside its bf16 gathers: float32 inputs meet them
    loss_sum = 0.0
    for i, part in enumerate(micro):
        if run.sharded:  # FSDP reduce-scatters the gradients once, after the last micro-batch
            cast(Any, run.model).set_requires_gradient_sync(i == len(micro) - 1)
        batch, noise, times = _to(part.batch, run.device), part.noise.to(run.device), part.times.to(run.device)
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = run.adapter.flow_loss(run.model, batch, noise, times)
        if part.weight != 1.0:
            loss = loss * part.weight
        loss.backward()
        loss_sum += float(loss.detach())
    fsdp.average_gradients(run.model, run.world)
    grad_norm = fsdp.clip_gradients(run.model.parameters(), run.config.optim.grad_clip)
    run.optimizer.step()
    run.scheduler.step()
    if run.ema is not None:
        run.ema.update(run.model)
    run.step += 1
    loss_value = mean_over_ranks(loss_sum, run.world)
    if not math.isfinite(loss_value):
        raise FloatingPointError(f"step {run.step}: loss is {loss_value}; lower optim.lr or check the data")
    run.window.add({"loss": loss_value, "grad_norm": grad_norm})


def _log_window(run: _Run, bar: TrainProgress) -> None:
    """Phase log: the window's means, lr, epoch, rate and wall time; then a new window."""
    now = time.perf_counter()
    rate = run.window.n / max(now - run.window.started, 1e-9)
    run.last = {
        **run.window.means(),
        "lr": run.optimizer.param_groups[0]["lr"],
        "epoch": round(run.sampler.epoch, 4),
        "steps_per_s": round(rate, 3),
        "train_wall_s": round(run.wall_s(now), 2),
    }
    run.logger.log(run.step, run.last)
    bar.update(run.step, {"loss": run.last["loss"]}, rate=rate)
    run.window = _Window(now)


def _checkpoint(run: _Run) -> None:
    """Phase checkpoint: everything that decides the next step (the module docstring lists it); rank 0
    saves it, the same for every rank (with FSDP, gathered from the shards first). ``checkpoint_format =
    "sharded"``: every rank writes its own shards of model and optimizer instead (a collective)."""
    sharded_format = run.config.train.checkpoint_format == "sharded"
    weights: dict[str, Any] = {}
    optimizer: dict[str, Any] | None = None
    if run.sharded and not sharded_format:
        weights, optimizer = fsdp.full_state(run.model, run.optimizer)
    elif run.world.is_main and not sharded_format:
        weights, optimizer = run.model.state_dict(), run.optimizer.state_dict()
    ema = run.ema.state_dict() if run.ema is not None else None  # gathered from the shards under FSDP
    if not run.world.is_main and not sharded_format:
        return
    wall = run.wall_s(time.perf_counter())
    state: dict[str, Any] = {
        "optimizer": optimizer,
        "scheduler": run.scheduler.state_dict(),
        "ema": ema,
        "sampler": run.sampler.state_dict(),
        "generator": run.generator.get_state(),
        "rng": capture_rng_state(),
        "data": run.data.fingerprint(),
        "train_wall_s": wall,
    }
    info = {"epoch": round(run.sampler.epoch, 3), "train_wall_s": round(wall, 1), **run.last}
    keep = run.config.train.keep_checkpoints
    if sharded_format:
        state.pop("optimizer")
        save_sharded_checkpoint(
            run.out / CHECKPOINTS, run.step, run.model, run.optimizer, state, info, keep, run.world.is_main,
            lambda: barrier(run.world),
        )  # fmt: skip
        return
    save_checkpoint(run.out / CHECKPOINTS, run.step, weights, state, info, keep_last=keep)


def _evaluate(run: _Run) -> None:
    """Phase eval (``eval.initial`` at step 0, every ``eval.every`` steps): the servable policy on the eval
    suite, on rank 0."""
    step, whole, ema = run.step, run.whole_model(), run.whole_ema()
    if whole is None:
        return
    folder = run.out / "eval" / f"step_{step:06d}"
    results = evaluate_policy(run.servable(whole, ema), run.config.eval, folder, f"sft:step{step}")
    run.logger.log(step, {"eval_success": results["totals"]["success_rate"]})


def _export_and_evaluate(run: _Run, result: SFTResult, log: Callable[[str], None]) -> None:
    """Phase export: ``final/`` (a servable policy folder), the learning curve and the final evaluation."""
    config, out, whole, ema = run.config, run.out, run.whole_model(), run.whole_ema()
    if whole is None:  # not rank 0
        return
    policy = run.servable(whole, ema)
    result.final_dir = export_policy(policy, out / "final", source=f"sft:{config.name}:step{run.step}")
    log(f"final policy: {result.final_dir} (training {result.total_train_wall_s / 60:.1f} min)")
    if config.output.plot:
        from cosmos_robot_trainers.common.plot import plot_learning_curve

        plot_learning_curve(out, keys=("loss", "grad_norm", "lr", "eval_success"))
    if config.eval.final:
        result.eval_results = evaluate_policy(policy, config.eval, out / "eval" / "final", "sft:final", final=True)
        log(f"final eval: {100 * result.eval_results['totals']['success_rate']:.1f}% success")


def sft_adapter(config: SFTConfig, log: Callable[[str], None] = print) -> SFTAdapter:
    """The SFT adapter of the recipe's family (the ``init`` folder's, else a new ``[model]``), base loaded."""
    init = resolve_init(config.init, log=log) if config.init is not None else None
    family = family_of(init) if init is not None else get_family(NEW_MODEL_FAMILY)
    adapter = family.sft_adapter()
    if not isinstance(adapter, SFTAdapter):
        raise TypeError(f"family {family.name!r}: sft={family.sft!r} does not implement SFTAdapter")
    adapter.load_base(config, init)
    return adapter


def _restore(
    path: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ema: EMA | None,
    sampler: EpochBatchSampler,
    generator: torch.Generator,
    data: Any,
    sharded: bool = False,
) -> tuple[int, float]:
    ckpt = load_checkpoint(path)
    state = ckpt.state
    if state.get("data") != data.fingerprint():
        raise ValueError(
            f"{path}: the dataset changed since this checkpoint (saved {state.get('data')}, now {data.fingerprint()}); "
            "pass --overwrite to start over"
        )
    if ckpt.sharded is not None:  # each rank reads its shards, whatever the world size that wrote them
        load_sharded_into(ckpt.sharded, model, optimizer)
    elif sharded:  # the whole checkpoint, sharded into this rank's parameters and AdamW state
        fsdp.load_full_state(model, optimizer, ckpt.model, state["optimizer"])
    else:
        model.load_state_dict(ckpt.model)
        with fsdp.kernels_kept(optimizer):  # a sharded run's checkpoint saved tensor-by-tensor steps
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


def heldout_loss(
    config: SFTConfig, *, batches: int = 20, batch_size: int = 64, log: Callable[[str], None] = print
) -> dict[str, float]:
    """The flow loss of ``config.init`` (no training) on ``config.data.root``: ``batches`` batches with the
    loop's draws (batch, noise, time) from a generator seeded ``train.seed``, the model in eval mode.

    For held-out evaluation of fine-tuned checkpoints: score the starting folder and the result on
    demonstrations neither trained on (``benchmarks/sft_heldout_loss.py``). Needs a family that
    fine-tunes an ``init`` folder (pi05, groot)."""
    if config.init is None:
        raise ValueError("heldout_loss scores a checkpoint folder: set init")
    adapter = sft_adapter(config, log)
    configure_torch(config.train.num_threads, config.train.deterministic)
    data = adapter.load_data(config)
    device = torch.device(config.train.device)
    model = adapter.build_model(config, device)
    model.eval()
    sampler = EpochBatchSampler(len(data), batch_size, config.train.seed)
    generator = torch.Generator().manual_seed(config.train.seed)
    losses = []
    with torch.no_grad():
        for _ in range(batches):
            batch = data.batch(sampler.next_indices(), None, generator, config.model.text_buckets)
            noise = torch.randn(batch["actions"].shape, generator=generator)
            times = adapter.sample_time(model, noise.shape[0], generator)
            batch = {k: v.to(device) for k, v in batch.items()}
            losses.append(float(adapter.flow_loss(model, batch, noise.to(device), times.to(device))))
    values = np.asarray(losses)
    sem = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")
    return {"loss": float(values.mean()), "sem": sem, "batches": len(values), "samples": len(data)}
