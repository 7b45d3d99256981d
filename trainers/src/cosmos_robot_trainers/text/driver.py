"""The run skeleton every text trainer shares: set up, restore, loop with logging / eval / checkpoints, finish.

Why one driver: SFT, GRPO and DPO differ only in what one step does (a packed SFT batch, a rollout +
policy update, a batch of preference pairs) and in a little state of their own (SFT's sampler
position). ``TextRun`` owns the rest, the same way for all three: the run folder (fresh / resume /
refuse a changed recipe), torch threads and seeds, the model (an HF folder or ``tiny:hf_causal_lm``),
AdamW and its schedule, exact resume (model, optimizer, schedule, RNGs, the trainer's own state),
metrics averaged over ``log_every`` steps to JSONL + TensorBoard, held-out evaluation every
``eval.every`` steps, checkpoints, the wall-clock cap, and ``final/`` (HF folder + manifest,
evaluated, learning curve).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.config import ConfigError
from cosmos_robot.distributed import (
    World,
    all_gather_rows,
    any_rank,
    barrier,
    broadcast_parameters,
    broadcast_text,
    rank_share,
    sum_over_ranks,
    world_from_env,
)
from cosmos_robot.text.engines import make_engine
from cosmos_robot.text.hf import CausalLM
from cosmos_robot.text.moe import install_router_aux_loss
from cosmos_robot_trainers.common import (
    MetricsLogger,
    NullMetricsLogger,
    TrainProgress,
    configure_torch,
    fsdp,
    seed_everything,
)
from cosmos_robot_trainers.common import rundir as _rundir
from cosmos_robot_trainers.text.config import RUNTIME_FIELDS
from cosmos_robot_trainers.text.precision import build_text_optimizer
from cosmos_robot_trainers.text.state import (
    evaluate_config,
    finish_run,
    load_lm,
    restore_text_state,
    save_text_state,
)

__all__ = [
    "TextResult",
    "TextRun",
    "accumulated_step",
    "finish_step",
    "micro_batches",
    "minibatch_epochs",
    "minibatch_share",
    "score_rows",
    "share_micro_batches",
]

StepFn = Callable[[int], dict[str, float]]


@dataclass
class TextResult:
    """What one call of a text trainer did."""

    out_dir: Path
    step: int  # the last step (iteration) trained
    finished: bool
    resumed_from: int | None
    final_dir: Path | None
    train_wall_s: float
    last_metrics: dict[str, Any] = field(default_factory=dict)
    eval_accuracy: float | None = None  # of the final evaluation


class TextRun:
    """``run = TextRun(config, ...)``; build the trainer's own objects; ``run.restore(...)``; ``run.loop(step_fn)``."""

    def __init__(self, config: Any, *, resume: bool, overwrite: bool, log: Callable[[str], None]) -> None:
        tcfg = config.train
        # data parallel (every text trainer; docs/scale.md): rank 0 owns the run folder and speaks for the run
        self.world: World = world_from_env(tcfg.device)
        if self.world.distributed and config.trainer == "text_sft" and tcfg.batch_size % self.world.world_size:
            raise ConfigError(
                f"train.batch_size={tcfg.batch_size} is not divisible by the {self.world.world_size} training processes"
            )
        prompts = getattr(getattr(config, "rollout", None), "prompts_per_iter", None)
        if self.world.distributed and prompts is not None and prompts % self.world.world_size:
            raise ConfigError(
                f"rollout.prompts_per_iter={prompts} is not divisible by the {self.world.world_size} training "
                "processes (each samples an equal share of the prompts)"
            )
        self.config, self.log = config, (log if self.world.is_main else _quiet)
        self.out = Path(config.output.dir)
        ckpt = None
        if self.world.is_main:
            ckpt = _rundir.prepare_run_dir(config, self.out, RUNTIME_FIELDS, resume=resume, overwrite=overwrite)
        shared = broadcast_text(str(ckpt) if ckpt is not None else None, self.world)
        self.ckpt_path = Path(shared) if shared is not None else None
        configure_torch(tcfg.num_threads, tcfg.deterministic)
        seed_everything(tcfg.seed)
        self.lm: CausalLM = load_lm(config.init, config.model, tcfg.dtype, tcfg.device)
        broadcast_parameters(self.lm.model, self.world)
        self.sharded = self.world.distributed and tcfg.fsdp
        self.half = torch.float32 if tcfg.dtype == "float32" else getattr(torch, tcfg.dtype)
        if self.sharded:  # a bf16 model's shards are float32 masters, computed in bf16 (common/fsdp.py)
            fsdp.shard_model(self.lm.model, compute_dtype=self.half, units=language_units(self.lm.model))
            mixed = f"; float32 masters computed in {tcfg.dtype}" if self.half != torch.float32 else ""
            self.log(
                f"fsdp: parameters, gradients and AdamW state sharded over {self.world.world_size} processes{mixed}"
            )
        elif tcfg.fsdp:
            self.log("train.fsdp shards over data-parallel processes (--nproc N); this run keeps whole tensors")
        if self.world.distributed and config.trainer == "text_sft":
            ws, per = self.world.world_size, tcfg.batch_size // self.world.world_size
            self.log(f"data parallel: {ws} processes ({self.world.backend}), {per} rows of each batch per process")
        elif self.world.distributed:
            self.log(
                f"data parallel: {self.world.world_size} processes ({self.world.backend}); each samples its share "
                "of the prompts and takes its share of each minibatch"
            )
        self.lm.model.train()
        install_router_aux_loss(self.lm.model)  # MoE: the router balancing loss joins training forwards
        self.optimizer, self.scheduler = build_text_optimizer(self.lm.model, config.optim, tcfg.steps)
        self.start, self.prior_wall = 0, 0.0
        self.remote_engines: list[Any] = []
        self.rollout_model: Any = None  # FSDP: the whole copy the rollout engine samples from

    def unsharded_model(self) -> Any:
        """The learner's model with whole parameters on every rank (what the rollout engine samples from,
        and what a PPO critic starts from): the learner itself, or with FSDP a whole copy in
        ``train.dtype`` holding the gathered shards (a rank's generation runs as many forwards as its own
        completions need, which no two ranks agree on, so it cannot run on the shards; verl's "hybrid
        engine" splits the two the same way). Refreshed after every update (``_FromShards``)."""
        if not self.sharded:
            return self.lm.model
        if self.rollout_model is None:
            tcfg = self.config.train
            with torch.random.fork_rng(devices=[]):  # a tiny model's random init must not move the seeds
                whole = load_lm(self.config.init, self.config.model, tcfg.dtype, tcfg.device).model
            self.rollout_model = whole.train(self.lm.model.training)
            fsdp.copy_full_into(self.lm.model, self.rollout_model)
        return self.rollout_model

    @property
    def mixed(self) -> bool:
        """FSDP in mixed precision: float32 shards computed in ``train.dtype``."""
        return self.sharded and self.half != torch.float32

    def rollout_engine(self) -> Any:
        """The recipe's rollout engine: on this process's model (``rollout.placement = "local"``), or in a Ray
        actor of its own holding a synced copy (``"ray"``; text/remote_engine.py)."""
        rc, lm = self.config.rollout, self.lm
        model = self.unsharded_model()
        engine: Any
        if rc.placement == "ray":
            from cosmos_robot_trainers.text.remote_engine import RayEngine

            engine = RayEngine(self.config, model, self.world)
            self.remote_engines.append(engine)
        else:
            engine = make_engine(rc.engine, model, lm.tokenizer, lm.stop_ids, lm.pad_id, rc.engine_options())
        return _FromShards(engine, lm.model, model) if self.sharded else engine

    def whole_lm(self) -> CausalLM | None:
        """The model with whole parameters on rank 0 (None elsewhere): itself, or with FSDP the rollout
        engine's whole copy (RL: synced after every update), else a fresh copy holding the gathered weights
        (a collective)."""
        if not self.sharded:
            return self.lm if self.world.is_main else None
        if self.rollout_model is not None:  # the RL trainers' whole copy, current since the last update
            lm = self.lm
            return CausalLM(self.rollout_model, lm.tokenizer, lm.folder, lm.processor) if self.world.is_main else None
        state = fsdp.full_model_state(self.lm.model)
        if not self.world.is_main:
            return None
        tcfg = self.config.train
        with torch.random.fork_rng(devices=[]):  # rank 0's random state must stay the other ranks'
            lm = load_lm(self.config.init, self.config.model, tcfg.dtype, "cpu")
        lm.model.load_state_dict(state)
        return lm

    def reference(self) -> Any:
        """A frozen copy of the initial model (KL penalties, DPO)."""
        tcfg = self.config.train
        ref = load_lm(self.config.init, self.config.model, tcfg.dtype, tcfg.device).model.eval()
        return ref.requires_grad_(False)

    def restore(self, load_extra: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Continue from the newest checkpoint, if the run folder has one."""
        if self.ckpt_path is None:
            return
        self.start, saved = restore_text_state(
            self.ckpt_path, self.lm.model, self.optimizer, self.scheduler, sharded=self.sharded, mixed=self.mixed
        )
        self.prior_wall = float(saved.get("train_wall_s", 0.0))
        if self.rollout_model is not None:  # the engine's whole copy takes the restored shards
            fsdp.copy_full_into(self.lm.model, self.rollout_model)
        if load_extra is not None:
            load_extra(saved)
        self.log(f"resuming from {self.ckpt_path} (step {self.start})")

    def _checkpoint(self, step: int, extra: dict[str, Any], last: dict[str, float]) -> None:
        """Everything that decides the next step: rank 0's whole checkpoint (with FSDP gathered from the
        shards first, a collective), or with ``train.checkpoint_format = "sharded"`` every rank's shards."""
        tcfg, model, info = self.config.train, self.lm.model, {"loss": last.get("loss")}
        if tcfg.checkpoint_format == "sharded":
            save_text_state(
                self.out, step, model, self.optimizer, self.scheduler, extra, tcfg.keep_checkpoints, info,
                sharded_world=self.world,
            )  # fmt: skip
            return
        gathered = fsdp.full_state(model, self.optimizer) if self.sharded else None
        if gathered is not None and self.mixed:  # the one-process bf16 run's form (MasterWeights)
            gathered = fsdp.as_master_checkpoint(model, *gathered, self.half)
        if self.world.is_main:
            save_text_state(
                self.out, step, model, self.optimizer, self.scheduler, extra, tcfg.keep_checkpoints, info, gathered
            )

    def loop(
        self,
        step_fn: StepFn,
        *,
        kind: str,
        save_extra: Callable[[], dict[str, Any]] | None = None,
        stop_at_step: int | None = None,
        unit: str = "step",
        show: tuple[str, ...] = ("loss", "eval_accuracy"),
    ) -> TextResult:
        """Run ``step_fn(step) -> metrics`` up to ``train.steps``; ``stop_at_step`` stops as a kill would."""
        config, tcfg, main = self.config, self.config.train, self.world.is_main
        if main:
            logger = MetricsLogger(self.out, resume_step=self.start, tensorboard=config.output.tensorboard)
        else:
            logger = NullMetricsLogger()
        if self.start == 0 and config.eval.initial:
            whole = self.whole_lm()
            acc = evaluate_config(whole, config) if whole is not None else None
            if acc is not None:
                logger.log(0, {"eval_accuracy": acc})
                self.log(f"initial eval: {100 * acc:.1f}% exact")
        stop = min(tcfg.steps, stop_at_step) if stop_at_step is not None else tcfg.steps
        t0 = time.perf_counter()
        step, last, by_clock = self.start, {}, False
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        n_window, t_window = 0, t0
        try:
            bar_on = tcfg.progress and main
            with TrainProgress(tcfg.steps, self.start, config.name, enabled=bar_on, unit=unit) as bar:
                while step < stop:
                    metrics = step_fn(step)
                    self.scheduler.step()
                    step += 1
                    n_window += 1
                    for k, v in metrics.items():
                        sums[k], counts[k] = sums.get(k, 0.0) + float(v), counts.get(k, 0) + 1
                    if config.eval.every and step % config.eval.every == 0 and step < tcfg.steps:
                        whole = self.whole_lm()
                        acc = evaluate_config(whole, config) if whole is not None else None
                        if acc is not None:
                            sums["eval_accuracy"], counts["eval_accuracy"] = acc, 1
                    if step % tcfg.log_every == 0 or step == stop:
                        now = time.perf_counter()
                        last = {k: v / counts[k] for k, v in sums.items()}
                        last.update(
                            lr=float(self.scheduler.get_last_lr()[0]), steps_per_s=n_window / max(now - t_window, 1e-9)
                        )
                        sums, counts, n_window, t_window = {}, {}, 0, now
                        logger.log(step, last)
                        bar.update(step, {k: last[k] for k in show if k in last})
                    if step % tcfg.ckpt_every == 0 or step == tcfg.steps:
                        wall = self.prior_wall + time.perf_counter() - t0
                        self._checkpoint(step, {**(save_extra() if save_extra else {}), "train_wall_s": wall}, last)
                    if tcfg.max_wall_minutes and any_rank(
                        self.prior_wall + time.perf_counter() - t0 > 60 * tcfg.max_wall_minutes, self.world
                    ):
                        by_clock = step < stop
                        self.log(f"train.max_wall_minutes reached after {unit} {step}; exporting what we have")
                        break
        finally:
            logger.close()
            for engine in self.remote_engines:  # Ray engine actors end with the run
                engine.close()
        result = TextResult(
            self.out,
            step,
            step >= tcfg.steps,
            self.start if self.ckpt_path else None,
            None,
            time.perf_counter() - t0,
            last,
        )
        whole = self.whole_lm() if result.finished or by_clock else None
        if whole is not None:
            source = f"{kind}:{config.name}:{unit}{step}"
            result.final_dir, result.eval_accuracy = finish_run(whole, config, step, source, self.log)
        barrier(self.world)
        return result


def _quiet(_: str) -> None:
    pass


def language_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """FSDP units of a causal LM: the blocks of its ``ModuleList`` stacks outside a vision tower. A vision
    tower runs only for the micro-batches that have images, which ranks need not share, and every rank
    must gather the same units; so it stays in the root unit, gathered for every forward."""
    return [
        block
        for name, module in reversed(list(model.named_modules()))  # inner stacks first: FSDP nests bottom-up
        if isinstance(module, torch.nn.ModuleList) and not any(v in name for v in ("visual", "vision"))
        for block in module
    ]


class _FromShards:
    """A rollout engine over the whole copy of a sharded learner: ``sync_weights`` gathers the shards
    into the copy (every rank: a collective), then syncs the engine from it; the rest is the engine's."""

    def __init__(self, engine: Any, learner: torch.nn.Module, whole: torch.nn.Module) -> None:
        self.engine, self.learner, self.whole = engine, learner, whole

    def sync_weights(self, model: Any) -> None:
        if model is not self.learner:
            raise ValueError("the rollout engine follows the sharded learner it was built for")
        fsdp.copy_full_into(self.learner, self.whole)
        self.engine.sync_weights(self.whole)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def micro_batches(rows: Any, size: int | None) -> list[Any]:
    """``rows`` (a 1-D tensor or a list) in consecutive pieces of ``size`` (None: one piece)."""
    n = len(rows)
    step = n if not size else size
    return [rows[i : i + step] for i in range(0, n, max(step, 1))]


def score_rows(
    score: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    micro: int | None,
    device: Any,
    world: World | None = None,
    lockstep: bool = False,
) -> torch.Tensor:
    """``score(rows)`` (a tensor with one leading entry per row) for rows ``0..n-1``, micro-batch by
    micro-batch: the no-gradient scoring passes (old and reference log-probs, a teacher's, a critic's
    values) over a batch every rank holds.

    Data parallel (``world``): each rank scores a contiguous share of the micro-batches and the shares
    are joined (``all_gather_rows``), so the pass costs 1/N of the single-process one and every row is
    still scored in the same micro-batch as in one process. With fewer micro-batches than ranks (no
    ``micro_batch_size``) the rows are split evenly instead; with fewer rows than ranks every rank
    scores them all. ``lockstep`` (a sharded model, which gathers its blocks in every forward): a rank
    with fewer micro-batches than another scores its first one again and drops it."""
    rows = torch.arange(n, device=device)
    pieces = micro_batches(rows, micro)
    if world is None or not world.distributed or n < world.world_size:
        return torch.cat([score(p) for p in pieces])
    size, rank = world.world_size, world.rank
    if len(pieces) < size:
        pieces = list(torch.tensor_split(rows, size))
    mine = pieces[len(pieces) * rank // size : len(pieces) * (rank + 1) // size]
    scored = torch.cat([score(p) for p in mine])
    for _ in range(-(-len(pieces) // size) - len(mine) if lockstep else 0):
        score(pieces[0])
    return torch.cat(all_gather_rows(scored, world))


def minibatch_share(mb: torch.Tensor, world: World | None) -> tuple[torch.Tensor, float]:
    """``(rows, factor)``: this data-parallel rank's rows of minibatch ``mb`` and the factor by which its
    micro-batches' weights (their share of the WHOLE minibatch's tokens or sequences) are multiplied so
    that ``accumulated_step``'s average over ranks is the whole minibatch's gradient: the world size, or
    0 for the stand-in row of a rank left without rows (``rank_share``). ``(mb, 1.0)`` in one process."""
    if world is None or not world.distributed:
        return mb, 1.0
    rows, weight = rank_share(mb, world)
    return rows, (float(world.world_size) if weight else 0.0)


def share_micro_batches(
    mb: torch.Tensor, micro: int | None, world: World | None, lockstep: bool = False
) -> list[tuple[Any, float]]:
    """``(rows, factor)`` per micro-batch of this rank's share of minibatch ``mb`` (``minibatch_share``,
    ``micro_batches``). ``lockstep`` (a sharded model): every rank runs as many micro-batches as the rank
    with the largest share, the extra ones a stand-in row at factor 0."""
    mine, factor = minibatch_share(mb, world)
    out: list[tuple[Any, float]] = [(rows, factor) for rows in micro_batches(mine, micro)]
    if lockstep and world is not None and world.distributed:
        largest = max(1, -(-len(mb) // world.world_size))  # tensor_split: rank 0's share
        most = len(micro_batches(range(largest), micro))
        out += [(mine[:1], 0.0)] * (most - len(out))
    return out


def accumulated_step(
    model: torch.nn.Module,
    optimizer: Any,
    grad_clip: float | None,
    parts: Iterable[tuple[torch.Tensor, float, dict[str, Any]]],
    world: World | None = None,
) -> tuple[float, float, dict[str, float]]:
    """One optimizer step over micro-batches: ``parts`` yields ``(loss, weight, metrics)`` per micro-batch,
    where ``weight`` is its share of the minibatch (its sequences, or its tokens for a token mean), so
    the accumulated gradient is the whole minibatch's. Each part's graph is freed by its backward, so
    a step holds one micro-batch's activations. Returns (loss, pre-clip gradient norm, metrics), the
    loss and metrics weighted like the gradient. Data parallel (``world``): each rank's parts are its
    share of the minibatch, weighted x world size; gradients, loss and metrics are averaged over ranks."""
    optimizer.zero_grad(set_to_none=True)
    total, metrics = 0.0, dict[str, float]()
    for loss, weight, m in parts:
        (loss * weight).backward()
        total += float(loss.detach()) * weight
        for k, v in m.items():
            metrics[k] = metrics.get(k, 0.0) + float(v) * weight
    if world is not None and world.distributed:
        keys = sorted(metrics)
        summed = sum_over_ranks(torch.tensor([total, *(metrics[k] for k in keys)], dtype=torch.float64), world)
        means = (summed / world.world_size).tolist()
        total, metrics = means[0], dict(zip(keys, means[1:], strict=True))
    return total, finish_step(model, optimizer, grad_clip, world), metrics


def minibatch_epochs(
    n: int,
    epochs: int,
    minibatch_size: int,
    generator: torch.Generator,
    step: Callable[[torch.Tensor], dict[str, float]],
    device: Any = None,
) -> dict[str, float]:
    """The update phase shared by GRPO, PPO, OPD and online DPO: ``epochs`` passes over ``n`` rows, each
    in a fresh order drawn from ``generator``, ``step(minibatch rows)`` per ``minibatch_size`` slice (one
    optimizer step each, returning its metrics). Returns each metric's mean over the steps; the order
    depends only on the generator's state, so a resumed run draws the same minibatches."""
    sums: dict[str, float] = {}
    n_steps = 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        order = order if device is None else order.to(device)
        for start in range(0, n, minibatch_size):
            for k, v in step(order[start : start + minibatch_size]).items():
                sums[k] = sums.get(k, 0.0) + v
            n_steps += 1
    return {k: v / max(n_steps, 1) for k, v in sums.items()}


def clip_and_step(
    model: torch.nn.Module, loss: torch.Tensor, optimizer: Any, grad_clip: float | None, world: World | None = None
) -> float:
    """``zero_grad -> backward -> (average over data-parallel ranks) -> clip -> step``; the pre-clip gradient
    norm."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return finish_step(model, optimizer, grad_clip, world)


def finish_step(model: torch.nn.Module, optimizer: Any, grad_clip: float | None, world: World | None = None) -> float:
    """After the backward pass(es): ``(average over data-parallel ranks) -> clip -> step``; the pre-clip
    gradient norm."""
    fsdp.average_gradients(model, world)
    norm = fsdp.clip_gradients(model.parameters(), grad_clip or None)
    optimizer.step()
    return norm
