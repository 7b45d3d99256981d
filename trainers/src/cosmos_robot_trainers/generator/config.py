"""Recipes of the generator trainers: ``generator_sft``, ``generator_dpo`` and ``generator_nft``.

The tables mirror the other trainers' (``init``, ``[optim]``, ``[train]``, ``[eval]``, ``[output]``);
what is generator-specific is what is generated (``[shape]``: frames and size), how the transformer
adapts (``[lora]``: peft LoRA, or full fine-tuning), how samples are drawn (``[sample]``), where
rewards come from (``[reward]``: a local scorer or an HTTP service) and the algorithm's own table.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from cosmos_robot.config import StrictModel
from cosmos_robot_trainers.common.loop_config import LoopConfig
from cosmos_robot_trainers.common.output import OutputConfig
from cosmos_robot_trainers.sft.config import OptimConfig

__all__ = [
    "GENERATOR_RUNTIME_FIELDS",
    "GenDPOConfig",
    "GenNFTConfig",
    "GenSFTConfig",
]


class ShapeConfig(StrictModel):
    """What is generated: 1 frame is text-to-image, 4k + 1 frames text-to-video."""

    num_frames: int = Field(default=1, ge=1)
    height: int = Field(default=64, ge=16)  # pixels, a multiple of 16
    width: int = Field(default=64, ge=16)
    fps: float = Field(default=24.0, gt=0)

    @model_validator(mode="after")
    def _valid(self) -> ShapeConfig:
        from cosmos_robot.generation.cosmos3 import GenShape

        GenShape(self.num_frames, self.height, self.width, self.fps)  # raises naming the field
        return self


class LoraConfig(StrictModel):
    """peft LoRA on the transformer's linear layers; ``rank = 0``: full fine-tuning."""

    rank: int = Field(default=0, ge=0)
    alpha: int = Field(default=16, gt=0)  # LoRA scale alpha / rank
    # module-name suffixes adapted: both attention pathways' projections by default
    targets: tuple[str, ...] = (
        "to_q",
        "to_k",
        "to_v",
        "to_out",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
    )


class SampleConfig(StrictModel):
    """The deterministic sampler (the pipeline's flow-UniPC ODE) used for rollouts and reports."""

    num_steps: int = Field(default=8, ge=1)
    guidance: float = Field(default=1.0, ge=1.0)  # classifier-free guidance; 1: off (NFT trains without it)


class RewardConfig(StrictModel):
    """One reward: a local scorer (``cosmos_robot.generation.rewards``) or an http(s):// service."""

    name: str = "brightness"  # jpeg_compressibility, brightness, color_match, or http(s)://host:port/path
    timeout_s: float = Field(default=30.0, gt=0)  # a service's timeout per batch
    retries: int = Field(default=2, ge=0)  # a service's retries on a connection failure or timeout

    @model_validator(mode="after")
    def _known(self) -> RewardConfig:
        if not is_service(self.name):
            from cosmos_robot.generation.rewards import get_reward

            get_reward(self.name)  # an unknown name is an error naming the known ones
        return self


class PromptsConfig(StrictModel):
    """Prompts: procedural shapes captions (``shapes``), or one prompt per line of a text file."""

    source: str = "shapes"  # "shapes", or a path to a text file (one prompt per line)
    seed: int = 0  # the train prompts' seed; held-out prompts use seed + 1_000_000
    count: int = Field(default=256, ge=1)  # distinct training prompts (shapes); a file uses its lines


class GenTrainConfig(LoopConfig):
    """Length, batching, seeding and cadence (``steps``: NFT iterations; optimizer steps otherwise)."""

    log_every: int = Field(default=10, ge=1)
    ckpt_every: int = Field(default=100, ge=1)  # a multiple of log_every
    batch_size: int = Field(default=16, ge=1)  # samples (DPO: pairs) per optimizer step
    timestep_sampling: Literal["uniform", "logit_normal"] = "logit_normal"  # how sigma in (0, 1) is drawn
    # data-parallel runs (--nproc N): shard the transformer's parameters, gradients and AdamW state (FSDP2)
    fsdp: bool = False


class GenEvalConfig(StrictModel):
    """Held-out evaluation: mean reward of generations for unseen prompts (and DPO's held-out accuracy)."""

    every: int = Field(default=0, ge=0)  # steps between evaluations (0: only initial and final)
    initial: bool = True
    final: bool = True
    prompts: int = Field(default=32, ge=1)  # held-out prompts
    seed: int = 0  # the noise seed of the held-out samples
    report: bool = True  # <output.dir>/report.html: before/after grid and reward histograms


class SFTDataConfig(StrictModel):
    """Image/video-caption pairs: procedural shapes, or a folder of images (or clips) with captions."""

    source: str = "shapes"  # "shapes", or a folder: <name>.png (or <name>/ of frame PNGs) + <name>.txt
    count: int = Field(default=4096, ge=1)  # shapes scenes drawn (a folder uses every pair)
    seed: int = 0


class _GenBase(StrictModel):
    name: str = "generator"
    init: str  # a diffusers Cosmos3 pipeline folder
    shape: ShapeConfig = Field(default_factory=lambda: ShapeConfig())
    lora: LoraConfig = Field(default_factory=lambda: LoraConfig())
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=0, schedule="constant"))
    train: GenTrainConfig = Field(default_factory=lambda: GenTrainConfig())
    sample: SampleConfig = Field(default_factory=lambda: SampleConfig())
    reward: RewardConfig = Field(default_factory=lambda: RewardConfig())
    prompts: PromptsConfig = Field(default_factory=lambda: PromptsConfig())
    eval: GenEvalConfig = Field(default_factory=lambda: GenEvalConfig())
    output: OutputConfig


class GenSFTConfig(_GenBase):
    """Flow-matching SFT on image/video-caption pairs (the pipeline's own velocity target)."""

    trainer: Literal["generator_sft"] = "generator_sft"
    data: SFTDataConfig = Field(default_factory=lambda: SFTDataConfig())


class DPOConfig(StrictModel):
    """Diffusion-DPO on (winner, loser) pairs of the same prompt."""

    beta: float = Field(default=100.0, gt=0)  # the flow_dpo loss's beta (on per-element velocity MSEs)
    # "samples": pairs ranked by the reward among `group_size` samples of the initial model per prompt
    # (the best against the worst); "jsonl": a preference file (data_path)
    pairs: Literal["samples", "jsonl"] = "samples"
    data_path: str | None = None  # JSONL: {"prompt": str, "chosen": image path, "rejected": image path}
    group_size: int = Field(default=4, ge=2)  # samples per prompt when ranking
    # ranked pairs whose reward margin (best - worst) is below this are dropped (near-ties carry no
    # preference, only noise); 0: only exact ties are dropped
    min_margin: float = Field(default=0.0, ge=0)
    heldout_pairs: int = Field(default=64, ge=1)  # pairs of held-out prompts for the implicit accuracy
    noise_draws: int = Field(default=4, ge=1)  # (t, eps) draws averaged per held-out pair in the accuracy

    @model_validator(mode="after")
    def _source(self) -> DPOConfig:
        if (self.pairs == "jsonl") != (self.data_path is not None):
            raise ValueError("algo.pairs = 'jsonl' needs algo.data_path (and 'samples' takes none)")
        return self


class GenDPOConfig(_GenBase):
    trainer: Literal["generator_dpo"] = "generator_dpo"
    algo: DPOConfig = Field(default_factory=lambda: DPOConfig())

    @model_validator(mode="after")
    def _jsonl_images(self) -> GenDPOConfig:
        if self.algo.pairs == "jsonl" and self.shape.num_frames != 1:
            raise ValueError(
                f"a preference JSONL holds images: shape.num_frames must be 1 (got {self.shape.num_frames}); "
                "video pairs come from ranked samples (algo.pairs = 'samples')"
            )
        return self


class NFTConfig(StrictModel):
    """DiffusionNFT: groups per prompt, advantage-weighted forward-process loss, EMA old policy."""

    prompts_per_iter: int = Field(default=8, ge=1)
    group_size: int = Field(default=8, ge=2)  # samples per prompt (G)
    beta: float = Field(default=1.0, gt=0)  # the implicit policies' step v_old +- beta (v_theta - v_old)
    adv_clip: float = Field(default=5.0, gt=0)  # r = clip(A, +-adv_clip) / adv_clip / 2 + 1/2
    epochs: int = Field(default=1, ge=1)  # passes over an iteration's samples
    old_decay: float = Field(default=0.9, ge=0, lt=1)  # EMA of the old policy toward the trained one per iteration
    kl_coef: float = Field(default=0.0, ge=0)  # ||v_theta - v_ref||^2 to the initial model (the reference: 1e-4)


class GenNFTConfig(_GenBase):
    trainer: Literal["generator_nft"] = "generator_nft"
    algo: NFTConfig = Field(default_factory=lambda: NFTConfig())

    @model_validator(mode="after")
    def _batch(self) -> GenNFTConfig:
        per_iter = self.algo.prompts_per_iter * self.algo.group_size
        if per_iter % self.train.batch_size:
            raise ValueError(
                f"train.batch_size ({self.train.batch_size}) must divide the samples of an iteration "
                f"(algo.prompts_per_iter x algo.group_size = {per_iter})"
            )
        return self


GENERATOR_RUNTIME_FIELDS = frozenset(
    {"name", "train.log_every", "train.ckpt_every", "train.keep_checkpoints", "train.max_wall_minutes",
     "train.progress", "train.fsdp", "output", "eval"}
)  # fmt: skip


def is_service(name: str) -> bool:
    return name.startswith(("http://", "https://"))


def reward_fn(cfg: RewardConfig) -> Any:
    """The configured reward: a local scorer by name, or an ``HttpImageReward``."""
    from cosmos_robot.generation.rewards import HttpImageReward, get_reward

    if is_service(cfg.name):
        return HttpImageReward(cfg.name, cfg.timeout_s, cfg.retries)
    return get_reward(cfg.name)
