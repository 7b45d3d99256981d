"""The SFT recipe: what data, which model, how to optimise, how long, where to write.

Every field documents its unit and purpose (a recipe is read more often than this file). A recipe
is a TOML file in ``recipes/`` validated by this model; ``--set train.lr=1e-3`` overrides a field
and a typo is an error naming the dotted field with a "did you mean".

``RUNTIME_FIELDS`` lists what may change when a run is resumed (logging cadence, output options,
evaluation hooks): anything else changes what the model learns, and resuming into a folder whose
saved recipe differs in such a field is refused, naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from cosmos_robot.config import StrictModel
from cosmos_robot.policies.flow import FlowConfig
from cosmos_robot_trainers.common.evaluation import EvalHookConfig
from cosmos_robot_trainers.common.output import OutputConfig

__all__ = [
    "OUTPUT_DIR",
    "RUNTIME_FIELDS",
    "AugmentConfig",
    "FinetuneConfig",
    "DataConfig",
    "NEW_MODEL_FAMILY",
    "OptimConfig",
    "OutputConfig",
    "SFTConfig",
    "TrainConfig",
    "training_relevant_diff",
]

TABLETOP_TASKS = ["reach", "push", "pick_place", "open_drawer"]


OUTPUT_DIR = "{output.dir}"  # in data.root: the run's output.dir


class DataConfig(StrictModel):
    """The demonstrations: a LeRobotDataset folder, recorded from the scripted experts if missing."""

    # LeRobotDataset folder; relative paths are relative to the working directory, and "{output.dir}" is the
    # run's output folder, so by default a recording lives (and moves, with --set output.dir=...) with its run
    root: str = f"{OUTPUT_DIR}/demos"
    record_if_missing: bool = False  # record it with `cosmos-robot record`'s code when `root` does not exist
    suite: str = "tabletop"  # the suite whose scripted experts record it (tabletop, driving)
    tasks: list[str] = Field(default_factory=lambda: list(TABLETOP_TASKS))  # the suite's tasks to record
    episodes_per_task: int = Field(default=50, ge=1)  # scripted-expert episodes recorded per task
    record_image_size: int = Field(default=128, ge=8)  # camera side (pixels) when recording
    record_seed: int = 0  # base seed of the recorded episodes' layouts
    record_num_envs: int = Field(default=2, ge=1)  # envs recording in parallel (speed only)
    record_cameras: bool = True  # record the suite's cameras (False: vectors only, for camera-free policies)
    record_expert_noise: float = Field(default=0.0, ge=0)  # DART-style perturbation of the executed actions
    record_noise_tasks: list[str] = Field(default_factory=list)  # tasks record_expert_noise perturbs (empty: all)
    record_max_steps: int | None = Field(default=None, ge=1)  # cap on each recorded episode's steps (None: the task's)
    max_episodes_per_task: int | None = Field(default=None, ge=1)  # train on only the first N episodes of each task
    task_weighting: Literal["frames", "balanced"] = "frames"  # sample frames uniformly, or each task equally often


class AugmentConfig(StrictModel):
    """Image augmentation applied to each training batch (never at inference)."""

    random_shift: int = Field(default=0, ge=0)  # pad by this many pixels (edge) and crop back at a random offset (DrQ)
    brightness: float = Field(default=0.0, ge=0.0, le=1.0)  # multiply each image by 1 +- U(brightness)
    contrast: float = Field(default=0.0, ge=0.0, le=1.0)  # scale deviation from the image mean by 1 +- U(contrast)


class OptimConfig(StrictModel):
    """AdamW with warmup and a decaying schedule."""

    lr: float = Field(default=3e-4, gt=0)  # peak learning rate
    weight_decay: float = Field(default=1e-4, ge=0)  # AdamW decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    eps: float = Field(default=1e-8, gt=0)  # AdamW epsilon
    grad_clip: float | None = Field(default=1.0, gt=0)  # clip the global grad norm to this (None: no clipping)
    warmup_steps: int = Field(default=100, ge=0)  # linear warmup from 0 to `lr` over this many steps
    schedule: Literal["cosine", "linear", "constant"] = "cosine"  # decay after warmup
    min_lr_ratio: float = Field(default=0.05, ge=0, le=1)  # final lr = lr * min_lr_ratio (cosine / linear)


class TrainConfig(StrictModel):
    """Length, batching, seeding and the logging / checkpoint cadence."""

    steps: int = Field(default=1000, ge=1)  # optimizer steps in total
    batch_size: int = Field(default=64, ge=1)  # samples per step
    # forward/backward passes per optimizer step: the batch's gradient in grad_accum micro-batches (less
    # activation memory, the same step); batch_size must divide by grad_accum x the training processes
    grad_accum: int = Field(default=1, ge=1)
    # "bf16": forward and loss under torch.autocast(bfloat16) (CUDA and CPU), weights, gradients and AdamW
    # state stay float32; "fp32": float32 throughout
    precision: Literal["fp32", "bf16"] = "fp32"
    seed: int = 0  # seeds the model init, the data order, noise and augmentation
    ema_decay: float | None = Field(default=None, gt=0, lt=1)  # keep an EMA of the weights (exported when set)
    log_every: int = Field(default=50, ge=1)  # steps between metric records (metrics.jsonl, TensorBoard)
    ckpt_every: int = Field(default=500, ge=1)  # steps between training checkpoints (a multiple of log_every)
    keep_checkpoints: int = Field(default=2, ge=1)  # newest checkpoint folders kept
    device: str = "cpu"  # torch device of the model ("cpu", "cuda", "cuda:1"); the data stay on the CPU
    num_threads: int | None = Field(default=2, ge=1)  # torch intra-op threads (None: torch's default)
    deterministic: bool = True  # deterministic kernels (exact resume); slightly slower on some ops
    max_wall_minutes: float | None = Field(default=None, gt=0)  # stop (checkpoint + export) after this much training
    progress: bool = True  # show the progress bar (stderr)
    # data-parallel runs (--nproc N): shard parameters, gradients, AdamW state and the EMA over the processes
    # (FSDP2) instead of replicating them; checkpoints stay whole, so a run may resume with or without it
    fsdp: bool = False
    # "sharded": every rank writes its own shards with torch.distributed.checkpoint (no gathering on one
    # process); resumable at any world size, sharded or not; `cosmos-robot export` consolidates it
    checkpoint_format: Literal["whole", "sharded"] = "whole"

    @model_validator(mode="after")
    def _cadence(self) -> TrainConfig:
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be a multiple of train.grad_accum ({self.grad_accum})"
            )
        if self.ckpt_every % self.log_every:
            raise ValueError(
                f"train.ckpt_every ({self.ckpt_every}) must be a multiple of train.log_every ({self.log_every}) "
                "so a resumed run logs the same records"
            )
        return self


class FinetuneConfig(StrictModel):
    """How an ``init`` checkpoint is fine-tuned, where its family offers the choice (GR00T: the backbone
    is frozen; ``sft.groot``). Families without these choices refuse anything but the defaults."""

    tune: list[str] | None = (
        None  # the parts that train (GR00T: projector, diffusion_model, vlln); None: the checkpoint's
    )
    # cache the frozen backbone's output per frame: auto (unless [augment] changes images), on, or off (every batch)
    feature_cache: Literal["auto", "on", "off"] = "auto"
    embodiment: str | None = None  # GR00T's embodiment tag the data train (None: the checkpoint's own)


# the family a recipe without ``init`` trains: its [model] table is a FlowConfig
NEW_MODEL_FAMILY = "flow"


class SFTConfig(StrictModel):
    """A supervised fine-tuning (behaviour cloning) run of a flow-matching policy."""

    trainer: Literal["sft"] = "sft"  # which trainer runs this recipe
    name: str = "sft"  # run name (shown in logs)
    init: str | None = None  # fine-tune this checkpoint folder (a family with SFT: pi05) or tiny:<family>
    data: DataConfig
    model: FlowConfig = Field(default_factory=lambda: FlowConfig())  # the flow policy's architecture (no init)
    augment: AugmentConfig = Field(default_factory=lambda: AugmentConfig())
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig())
    finetune: FinetuneConfig = Field(default_factory=lambda: FinetuneConfig())
    train: TrainConfig = Field(default_factory=lambda: TrainConfig())
    eval: EvalHookConfig = Field(default_factory=lambda: EvalHookConfig())
    output: OutputConfig

    @model_validator(mode="after")
    def _data_root(self) -> SFTConfig:
        if OUTPUT_DIR in self.data.root:
            self.data.root = self.data.root.replace(OUTPUT_DIR, self.output.dir.rstrip("/") or "/")
        return self

    @model_validator(mode="after")
    def _init_or_model(self) -> SFTConfig:
        if self.init is not None and "model" in self.model_fields_set:
            raise ValueError(
                "give either `init` (fine-tune a checkpoint folder, whose architecture it keeps) or a [model] table "
                "(train a new flow policy), not both"
            )
        return self


RUNTIME_FIELDS = frozenset(
    {
        "name",
        "data.record_if_missing",
        "data.record_num_envs",
        "train.log_every",
        "train.ckpt_every",
        "train.keep_checkpoints",
        "train.max_wall_minutes",
        "train.progress",
        "train.fsdp",
        "train.grad_accum",
        "train.checkpoint_format",
        "output",
        "eval",
    }
)


def training_relevant_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``field: saved X, now Y`` for every training-relevant field of an SFT recipe that differs."""
    from cosmos_robot_trainers.common.rundir import training_relevant_diff as diff

    return diff(saved, current, RUNTIME_FIELDS)
