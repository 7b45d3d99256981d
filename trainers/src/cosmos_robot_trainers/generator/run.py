"""The run skeleton the generator trainers share: folder, model, LoRA, optimizer, resume, loop, final.

Why one skeleton: SFT, Flow-DPO and DiffusionNFT differ only in what one step does (a batch of
captioned images, a batch of preference pairs, a rollout-and-update iteration) and in a little state
of their own (NFT's EMA old policy, DPO's pairs). ``GenRun`` owns the rest the same way for all
three, on the pieces every trainer shares (``common``): the run folder (fresh / resume / refuse a
changed recipe), threads and seeds, AdamW and its schedule, exact resume (trained weights,
optimizer, schedule, RNGs, the trainer's own tensors), metrics to JSONL + TensorBoard, held-out
evaluation, checkpoints, the wall-clock cap, and ``final/``: a diffusers pipeline folder (LoRA
merged) that ``Cosmos3OmniPipeline.from_pretrained`` loads, plus ``report.html``.

Data parallel (``cosmos-robot train RECIPE --nproc N`` / torchrun; cosmos_robot/distributed.py), as the
robot and text trainers: every rank makes the single-process run's draws for the whole batch and
computes its contiguous share (``share``), weighted so that the gradients averaged over ranks
(``generator.flow.optimizer_step``) are the whole batch's; rank 0 alone owns the folder, logs,
evaluates, checkpoints and exports (the others wait in their next collective). The checkpoint is the
single-process one, so a run resumes at any world size.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.config import ConfigError
from cosmos_robot.distributed import (
    World,
    any_rank,
    barrier,
    broadcast_parameters,
    broadcast_text,
    shard_range,
    world_from_env,
)
from cosmos_robot.generation.cosmos3 import Cosmos3Generator, GenShape
from cosmos_robot_trainers.common import (
    MetricsLogger,
    NullMetricsLogger,
    TrainProgress,
    capture_rng_state,
    configure_torch,
    fsdp,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
    seed_everything,
)
from cosmos_robot_trainers.common import rundir as _rundir
from cosmos_robot_trainers.common.plot import plot_learning_curve
from cosmos_robot_trainers.generator.config import GENERATOR_RUNTIME_FIELDS, reward_fn
from cosmos_robot_trainers.generator.prompts import heldout_prompts, train_prompts
from cosmos_robot_trainers.generator.report import save_grid
from cosmos_robot_trainers.sft.optim import build_optimizer

__all__ = ["GenResult", "GenRun", "merged_transformer", "resolve_init", "to_uint8"]

StepFn = Callable[[int], dict[str, float]]


@dataclass
class GenResult:
    """What one call of a generator trainer did."""

    out_dir: Path
    step: int
    finished: bool
    resumed_from: int | None
    final_dir: Path | None
    train_wall_s: float
    last_metrics: dict[str, Any] = field(default_factory=dict)
    initial_eval: dict[str, float] = field(default_factory=dict)
    final_eval: dict[str, float] = field(default_factory=dict)


def to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """``(B, 3, F, H, W)`` in [-1, 1] -> ``(B, F, H, W, 3)`` uint8 (what rewards and reports take)."""
    arr = ((pixels.detach().float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return arr.permute(0, 2, 3, 4, 1).cpu().numpy()


def _apply_lora(transformer: Any, rank: int, alpha: int, targets: tuple[str, ...]) -> None:
    from peft import LoraConfig

    names = {name.rsplit(".", 1)[-1] for name, _ in transformer.named_modules()}
    missing = [t for t in targets if t not in names]
    if missing:
        raise ValueError(f"lora.targets: {missing} name no module of the transformer")
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=True))


def merged_transformer(transformer: Any) -> Any:
    """A plain transformer (no peft layers) whose weights are ``transformer``'s with LoRA merged in."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not any(isinstance(m, BaseTunerLayer) for m in transformer.modules()):
        return transformer
    work = copy.deepcopy(transformer)
    for module in work.modules():
        if isinstance(module, BaseTunerLayer):
            module.merge()
    state = {}
    for key, value in work.state_dict().items():
        if ".lora_" in key:
            continue
        state[key.replace(".base_layer.", ".")] = value
    plain = type(transformer).from_config(transformer.config)
    plain.load_state_dict(state, strict=True)
    return plain


TINY_SHAPES = "tiny:cosmos3_shapes"
TINY_CACHE = Path("runs/cache/cosmos3_shapes_base")


def resolve_init(init: str, log: Callable[[str], None]) -> Path:
    """``init``'s pipeline folder; ``tiny:cosmos3_shapes`` is built once (the shapes-pretrained VAE, a random
    transformer; ``cosmos_robot.generation.tiny``, about 4 minutes) into ``runs/cache/`` and reused."""
    if not init.startswith("tiny:"):
        return Path(init)
    if init != TINY_SHAPES:
        raise ValueError(f"init: unknown tiny model {init!r}; the built-in one is {TINY_SHAPES!r}")
    if not (TINY_CACHE / "model_index.json").is_file():
        from cosmos_robot.generation.tiny import build_tiny_generator

        log(f"init {init}: building the tiny pipeline into {TINY_CACHE} (VAE pretrained on shapes) ...")
        tmp = TINY_CACHE.with_name(TINY_CACHE.name + ".tmp")
        build_tiny_generator(tmp, log=log)
        tmp.replace(TINY_CACHE)
    return TINY_CACHE


class GenRun:
    """``run = GenRun(config, ...)``; the trainer builds its own objects; ``run.restore(...)``; ``run.loop(...)``."""

    def __init__(
        self, config: Any, *, resume: bool, overwrite: bool, log: Callable[[str], None], updates_per_step: int = 1
    ) -> None:
        tcfg = config.train
        self.world: World = world_from_env(tcfg.device)
        if self.world.distributed and tcfg.batch_size % self.world.world_size:
            raise ConfigError(
                f"train.batch_size={tcfg.batch_size} is not divisible by the {self.world.world_size} training processes"
            )
        groups = getattr(getattr(config, "algo", None), "prompts_per_iter", None)
        if self.world.distributed and groups is not None and groups % self.world.world_size:
            raise ConfigError(
                f"algo.prompts_per_iter={groups} is not divisible by the {self.world.world_size} training "
                "processes (each samples an equal share of the rollout's groups)"
            )
        self.config, self.log = config, (log if self.world.is_main else _quiet)
        self.out = Path(config.output.dir)
        ckpt = None
        if self.world.is_main:
            fields = GENERATOR_RUNTIME_FIELDS
            ckpt = _rundir.prepare_run_dir(config, self.out, fields, resume=resume, overwrite=overwrite)
            resolve_init(config.init, log)  # a tiny pipeline is built once, by rank 0
        shared = broadcast_text(str(ckpt) if ckpt is not None else None, self.world)
        self.ckpt_path = Path(shared) if shared is not None else None
        configure_torch(tcfg.num_threads, tcfg.deterministic)
        seed_everything(tcfg.seed)
        self.gen = Cosmos3Generator.from_pretrained(resolve_init(config.init, self.log), tcfg.device)
        self.shape = GenShape(config.shape.num_frames, config.shape.height, config.shape.width, config.shape.fps)
        self.gen.pipe.vae.requires_grad_(False)
        tr = self.gen.transformer
        if config.lora.rank > 0:
            tr.requires_grad_(False)
            _apply_lora(tr, config.lora.rank, config.lora.alpha, config.lora.targets)
        tr.train()
        broadcast_parameters(tr, self.world)
        if self.world.distributed:
            ws, per = self.world.world_size, tcfg.batch_size // self.world.world_size
            self.log(f"data parallel: {ws} processes ({self.world.backend}), {per} samples of each batch per process")
        self.sharded = self.world.distributed and tcfg.fsdp
        # FSDP: a whole copy beside the shards, for what runs on one rank or off the training lockstep:
        # the initial model the trainers copy (NFT's old policy, the references), evaluations, DPO's
        # ranking, the export and the report (``whole()``, refreshed from the shards by ``gather()``)
        self.unsharded: Any = copy.deepcopy(tr) if self.sharded else None
        if self.sharded:
            fsdp.shard_model(tr, methods=(), keep_dtypes=True)
            n = self.world.world_size
            self.log(f"fsdp: the transformer's parameters, gradients and AdamW state sharded over {n} processes; "
                     "each keeps a whole copy for evaluation and export")  # fmt: skip
        elif tcfg.fsdp:
            self.log("train.fsdp shards over data-parallel processes (--nproc N); this run keeps whole tensors")
        self.trainable = {n: p for n, p in tr.named_parameters() if p.requires_grad}
        groups = [{"params": list(self.trainable.values()), "weight_decay": config.optim.weight_decay}]
        self.optimizer, self.scheduler = build_optimizer(tr, config.optim, tcfg.steps * updates_per_step, groups=groups)
        self.reward = reward_fn(config.reward)
        self.prompts = train_prompts(config.prompts, config.eval.prompts)
        self.heldout = heldout_prompts(config.prompts, config.eval.prompts)
        self.generator = torch.Generator().manual_seed(tcfg.seed)  # the trainer's own draws (t, eps, order)
        self.start, self.prior_wall = 0, 0.0
        self.evals: list[dict[str, Any]] = []

    # --- data parallelism ------------------------------------------------------------------------------
    def share(self, total: int, what: str = "train.batch_size") -> tuple[slice, float]:
        """This rank's contiguous rows of a batch of ``total`` equal-sized samples and its loss weight (world
        size x its share): the mean over ranks of the weighted losses is the whole batch's mean loss."""
        if not self.world.distributed:
            return slice(0, total), 1.0
        lo, hi = shard_range(total, self.world, what)
        return slice(lo, hi), self.world.world_size * (hi - lo) / total

    def initial_copy(self) -> Any:
        """A frozen whole copy of the transformer as it is now (before training: the initial model)."""
        source = self.unsharded if self.sharded else self.gen.transformer
        return copy.deepcopy(source).requires_grad_(False).eval()

    def gather(self) -> None:
        """FSDP: the shards gathered into the whole copy (every rank: a collective); nothing otherwise."""
        if self.sharded:
            fsdp.copy_full_into(self.gen.transformer, self.unsharded)

    @contextmanager
    def whole(self) -> Iterator[None]:
        """The whole copy in the pipeline's place (FSDP; as of the last ``gather``), for code one rank runs."""
        if not self.sharded:
            yield
            return
        was = self.unsharded.training
        with self.gen.using(self.unsharded.train(self.gen.transformer.training)):
            yield
        self.unsharded.train(was)

    # --- state ---------------------------------------------------------------------------------------
    def trained_state(self) -> dict[str, torch.Tensor]:
        """The trained parameters, whole (FSDP: gathered on every rank, a collective)."""
        return {n: fsdp.full_tensor(p.detach()) for n, p in self.trainable.items()}

    def restore(self, load_extra: Callable[[dict[str, Any]], None] | None = None) -> None:
        if self.ckpt_path is None:
            return
        ck = load_checkpoint(self.ckpt_path)
        missing = sorted(set(self.trainable) - set(ck.model))
        if missing:
            raise ValueError(f"{self.ckpt_path}: checkpoint lacks trained parameters {missing[:3]}")
        fsdp.load_full_params(self.gen.transformer, {name: ck.model[name] for name in self.trainable})
        if self.sharded:
            fsdp.load_full_optimizer_state(self.gen.transformer, self.optimizer, ck.state["optimizer"])
        else:
            with fsdp.kernels_kept(self.optimizer):  # a sharded run's checkpoint saved tensor-by-tensor steps
                self.optimizer.load_state_dict(ck.state["optimizer"])
        self.scheduler.load_state_dict(ck.state["scheduler"])
        restore_rng_state(ck.state["rng"])
        self.generator.set_state(ck.state["generator"])
        self.start, self.prior_wall = ck.step, float(ck.state.get("wall_s", 0.0))
        self.evals = json.loads(ck.state.get("evals", "[]"))
        if load_extra is not None:
            load_extra(ck.state.get("extra", {}))
        self.log(f"resumed from {self.ckpt_path} (step {ck.step})")

    def save(self, step: int, wall_s: float, extra: dict[str, Any]) -> None:
        """Rank 0 writes the one-process checkpoint (FSDP: gathered from every rank first)."""
        trained = self.trained_state()
        optim_sd = fsdp.full_optimizer_state(self.gen.transformer, self.optimizer) if self.sharded else None
        if not self.world.is_main:  # the same state on every rank: rank 0 writes it
            return
        state = {
            "optimizer": optim_sd if optim_sd is not None else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": capture_rng_state(),
            "generator": self.generator.get_state(),
            "wall_s": wall_s,
            "evals": json.dumps(self.evals),
            "extra": extra,
        }
        root, keep = self.out / _rundir.CHECKPOINTS, self.config.train.keep_checkpoints
        save_checkpoint(root, step, trained, state, info={"trainer": self.config.trainer}, keep_last=keep)

    # --- sampling and evaluation -------------------------------------------------------------------
    def generate(self, prompts: list[str], seeds: list[int]) -> torch.Tensor:
        """Clean latents ``(B, C, T, h, w)`` of the current model (deterministic, eval mode)."""
        tr = self.gen.transformer
        was = tr.training
        tr.eval()
        try:
            s = self.config.sample
            return torch.stack(
                [self.gen.sample(p, self.shape, sd, s.num_steps, s.guidance) for p, sd in zip(prompts, seeds)]
            )
        finally:
            tr.train(was)

    @torch.no_grad()
    def images(self, latents: torch.Tensor) -> np.ndarray:
        return to_uint8(self.gen.decode(latents))

    def evaluate(self, step: int, extra: Callable[[], dict[str, float]] | None = None) -> dict[str, float]:
        """Mean reward of held-out prompts' generations (fixed noise seeds), plus the trainer's own numbers;
        on rank 0 (``{}`` elsewhere; FSDP: the whole copy, gathered by every rank first)."""
        self.gather()
        if not self.world.is_main:
            return {}
        with self.whole():
            return self._evaluate(step, extra)

    def _evaluate(self, step: int, extra: Callable[[], dict[str, float]] | None) -> dict[str, float]:
        seeds = [self.config.eval.seed * 100_003 + i for i in range(len(self.heldout))]
        imgs = self.images(self.generate(self.heldout, seeds))
        scores = np.asarray(self.reward(imgs, self.heldout), np.float64)
        save_grid(imgs, self.out / "eval" / f"step_{step:06d}.png")
        result = {
            "step": float(step),
            "heldout_reward": float(scores.mean()),
            "heldout_reward_std": float(scores.std()),
        }
        if extra is not None:
            result.update(extra())
        self.evals.append({**result, "scores": [float(s) for s in scores]})
        shown = ", ".join(f"{k} {v:.4f}" for k, v in result.items() if k not in ("step", "heldout_reward_std"))
        self.log(f"eval @ {step} ({self.config.reward.name}): {shown}")
        return result

    # --- the loop ----------------------------------------------------------------------------------
    def loop(
        self,
        step_fn: StepFn,
        extra_state: Callable[[], dict[str, Any]] = dict,
        extra_eval: Callable[[], dict[str, float]] | None = None,
        stop_at_step: int | None = None,
    ) -> GenResult:
        """Steps ``start + 1 ..`` of ``step_fn``; ``stop_at_step`` ends after that step's checkpoint as a
        killed run would (tests of exact resume)."""
        cfg, tcfg, main = self.config, self.config.train, self.world.is_main
        if main:
            metrics = MetricsLogger(self.out, resume_step=self.start, tensorboard=cfg.output.tensorboard)
        else:
            metrics = NullMetricsLogger()
        if self.start == 0 and cfg.eval.initial and not self.evals:
            metrics.log(0, {f"eval/{k}": v for k, v in self.evaluate(0, extra_eval).items() if k != "step"})
        begin, step, last, finished, by_clock = time.monotonic(), self.start, {}, True, False
        window: list[dict[str, float]] = []
        try:
            show = tcfg.progress and main
            with TrainProgress(tcfg.steps, start=self.start, description=cfg.trainer, enabled=show) as bar:
                for step in range(self.start + 1, tcfg.steps + 1):
                    window.append(step_fn(step))
                    if step % tcfg.log_every == 0 or step == tcfg.steps:
                        last = {k: float(np.mean([w[k] for w in window if k in w])) for k in window[-1]}
                        last["lr"] = float(self.scheduler.get_last_lr()[0])
                        metrics.log(step, last)
                        window = []
                        bar.update(step, last)
                    if cfg.eval.every and step % cfg.eval.every == 0 and step != tcfg.steps:
                        metrics.log(
                            step, {f"eval/{k}": v for k, v in self.evaluate(step, extra_eval).items() if k != "step"}
                        )
                    wall = self.prior_wall + time.monotonic() - begin
                    if step % tcfg.ckpt_every == 0 or step == tcfg.steps:
                        self.save(step, wall, extra_state())
                    if stop_at_step is not None and step >= stop_at_step and step < tcfg.steps:
                        self.save(step, wall, extra_state())
                        finished = False
                        break
                    out_of_time = tcfg.max_wall_minutes is not None and wall >= tcfg.max_wall_minutes * 60
                    if tcfg.max_wall_minutes is not None:  # every rank stops at the same step
                        out_of_time = any_rank(out_of_time, self.world)
                    if out_of_time and step < tcfg.steps:
                        self.log(f"train.max_wall_minutes={tcfg.max_wall_minutes} reached at step {step}; "
                                 "evaluating and exporting what we have")  # fmt: skip
                        self.save(step, wall, extra_state())
                        by_clock = True
                        break
        finally:
            metrics.close()
        return self._finish(step, finished, by_clock, begin, last, extra_eval)

    def _finish(
        self,
        step: int,
        finished: bool,
        by_clock: bool,
        begin: float,
        last: dict[str, float],
        extra_eval: Callable[[], dict[str, float]] | None,
    ) -> GenResult:
        """Final evaluation, ``final/``, plot and report: for a finished run and for one stopped by the wall
        clock (its result says not finished: a rerun resumes it), not for one stopped at ``stop_at_step``."""
        wall = self.prior_wall + time.monotonic() - begin
        self.gather()
        if not self.world.is_main:  # rank 0 evaluates and exports
            barrier(self.world)
            return GenResult(self.out, step, finished and not by_clock, None, None, wall, last)
        with self.whole():
            final_dir = self._export(step, finished or by_clock, extra_eval)
        resumed = None if self.ckpt_path is None else self.start
        first = {k: v for k, v in self.evals[0].items() if k != "scores"} if self.evals else {}
        final = {k: v for k, v in self.evals[-1].items() if k != "scores"} if self.evals else {}
        barrier(self.world)
        return GenResult(self.out, step, finished and not by_clock, resumed, final_dir, wall, last, first, final)

    def _export(self, step: int, export: bool, extra_eval: Callable[[], dict[str, float]] | None) -> Path | None:
        """Rank 0: the final evaluation, ``final/``, the plot, the report and evals.jsonl."""
        from cosmos_robot_trainers.generator.report import write_report

        cfg, final_dir = self.config, None
        if export and cfg.eval.final and (not self.evals or self.evals[-1]["step"] != step):
            self._evaluate(step, extra_eval)
        if export:
            final_dir = self.out / "final"
            pipe = copy.copy(self.gen.pipe)
            pipe.register_modules(transformer=merged_transformer(self.gen.transformer))
            pipe.save_pretrained(final_dir)
            facts = {
                "trainer": cfg.trainer,
                "step": step,
                "shape": cfg.shape.model_dump(),
                "sample": cfg.sample.model_dump(),
                "reward": cfg.reward.name,
                "evals": [{k: v for k, v in e.items() if k != "scores"} for e in self.evals],
            }
            (final_dir / "cosmos_robot_generator.json").write_text(json.dumps(facts, indent=2) + "\n")
        if cfg.output.plot and (self.out / "metrics.jsonl").exists():
            plot_learning_curve(self.out, keys=("loss", "lr"), out=self.out / "learning_curve.png")
        if cfg.eval.report and export and self.evals:
            write_report(self, self.out / "report.html")
        self._write_evals()
        return final_dir

    def _write_evals(self) -> None:
        with (self.out / "evals.jsonl").open("w") as fh:
            for e in self.evals:
                fh.write(json.dumps(e) + "\n")


def _quiet(_: str) -> None:
    pass


def resume_point(out: Path) -> Path | None:
    return latest_checkpoint(out / _rundir.CHECKPOINTS)
