"""Recipes of the text trainers (``text_sft``, and the text RL trainers that share these tables).

The tables mirror the robot trainers' (``init``, ``[optim]``, ``[train]``, ``[eval]``, ``[output]``)
so a recipe reads the same whichever kind of policy it trains; what is text-specific is where the
model comes from (an HF folder, or ``tiny:<model_type>`` built from ``[model]``), where the
conversations come from (a generated task or a JSONL file) and how they are batched (packing).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from cosmos_robot.config import StrictModel
from cosmos_robot_trainers.common.loop_config import LoopConfig
from cosmos_robot_trainers.common.output import OutputConfig
from cosmos_robot_trainers.sft.config import OptimConfig

__all__ = [
    "RUNTIME_FIELDS",
    "TextDataConfig",
    "TextEvalConfig",
    "TextSFTConfig",
    "TextTrainConfig",
    "TinyLMConfig",
]

TINY_PREFIX = "tiny:"
TINY_INIT = "tiny:hf_causal_lm"  # a random model built from the recipe's [model] table


class TinyLMConfig(StrictModel):
    """The architecture of a ``tiny:hf_causal_lm`` model (random init, character tokenizer)."""

    # qwen3_vl: an image-text Qwen3-VL (tiny vision tower; prompts of visual tasks such as shapes/count)
    model_type: Literal["qwen3", "qwen2", "qwen3_moe", "qwen3_vl"] = "qwen3"
    hidden: int = Field(default=64, ge=8)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    kv_heads: int = Field(default=2, ge=1)
    intermediate: int = Field(default=128, ge=8)
    experts: int = Field(default=4, ge=2)  # qwen3_moe only
    vision_hidden: int = Field(default=32, ge=8)  # qwen3_vl only: the vision tower's width
    vision_depth: int = Field(default=2, ge=1)  # qwen3_vl only: its blocks
    image_side: int = Field(default=64, ge=32)  # qwen3_vl only: images are resized to this square (pixels)
    max_positions: int = Field(default=512, ge=16)
    alphabet: str = "printable"  # the character tokenizer's alphabet: "printable", "arithmetic" or the characters
    seed: int = 0  # initialisation seed


class TextDataConfig(StrictModel):
    """Conversations to train on: generated from a text task, or read from a JSONL file."""

    task: str | None = "addition"  # a text task (cosmos_robot.text.tasks): its train split's prompts + solutions
    path: str | None = None  # or a JSONL file, one {"messages": [{"role", "content"}, ...]} per line
    examples: int = Field(default=4000, ge=1)  # conversations drawn from the task (ignored for `path`)
    seed: int = 0  # which train-split problems the task draws
    max_length: int = Field(default=512, ge=8)  # tokens per conversation (longer ones are truncated and counted)
    packing: bool = True  # best-fit-decreasing packing into rows of `pack_length` tokens
    pack_length: int = Field(default=512, ge=8)  # tokens per packed row

    @model_validator(mode="after")
    def _one_source(self) -> TextDataConfig:
        if (self.task is None) == (self.path is None):
            raise ValueError("give exactly one of data.task (a generated text task) or data.path (a JSONL file)")
        if self.packing and self.pack_length < self.max_length:
            raise ValueError(f"data.pack_length ({self.pack_length}) must be >= data.max_length ({self.max_length})")
        return self


class TextTrainConfig(LoopConfig):
    """Length, batching, seeding, precision and cadence."""

    batch_size: int = Field(default=8, ge=1)  # rows per step (packed rows, or conversations without packing)
    dtype: Literal["float32", "bfloat16"] = "float32"
    # data-parallel runs (--nproc N): shard parameters, gradients and AdamW state (FSDP2); the RL trainers keep
    # a whole copy for the rollout engine, refreshed from the shards after every update
    fsdp: bool = False
    # "sharded": every rank writes its own shards of model and AdamW state (torch.distributed.checkpoint)
    # instead of gathering them on rank 0; resumable at any world size, sharded or not; final/ stays an HF folder
    checkpoint_format: Literal["whole", "sharded"] = "whole"

    @model_validator(mode="after")
    def _sharded_precision(self) -> TextTrainConfig:
        if self.checkpoint_format == "sharded" and self.dtype != "float32":
            raise ValueError(
                "train.checkpoint_format = 'sharded' writes float32 models' shards; a bfloat16 run keeps float32 "
                "master weights beside its model, which it saves whole: use checkpoint_format = 'whole'"
            )
        return self


class TextEvalConfig(StrictModel):
    """Held-out exact-answer accuracy during and after training (greedy, the eval command's numbers)."""

    task: str | None = None  # default: data.task
    every: int = Field(default=0, ge=0)  # steps between evaluations (0: none during training)
    initial: bool = False
    final: bool = True
    prompts: int = Field(default=500, ge=1)  # held-out prompts per evaluation
    seed: int = 0
    max_new_tokens: int = Field(default=16, ge=1)
    # 0: greedy (the default, `eval --suite text/...`'s number); > 0: one seeded sample per prompt at this
    # temperature (pass@1 of the sampling policy, what RL at that temperature optimises)
    temperature: float = Field(default=0.0, ge=0)


class TextSFTOptimConfig(OptimConfig):
    """AdamW + schedule, and how each step's rows are split into forward/backward passes."""

    # rows per forward/backward (each process's part of the batch): gradients of the micro-batches, each
    # weighted by its share of the batch's trained tokens, add up to the same step (None: all rows at once)
    micro_batch_size: int | None = Field(default=None, ge=1)


class TextSFTConfig(StrictModel):
    """Conversation SFT of an HF causal LM: assistant-only loss, packing, exact resume."""

    trainer: Literal["text_sft"] = "text_sft"
    name: str = "text_sft"
    init: str  # an HF causal-LM folder, or tiny:hf_causal_lm (a random model built from [model])
    model: TinyLMConfig = Field(default_factory=lambda: TinyLMConfig())
    data: TextDataConfig = Field(default_factory=lambda: TextDataConfig())
    optim: TextSFTOptimConfig = Field(default_factory=lambda: TextSFTOptimConfig())
    train: TextTrainConfig = Field(default_factory=lambda: TextTrainConfig())
    eval: TextEvalConfig = Field(default_factory=lambda: TextEvalConfig())
    output: OutputConfig

    @model_validator(mode="after")
    def _model_only_for_tiny(self) -> TextSFTConfig:
        if "model" in self.model_fields_set and self.init != TINY_INIT:
            raise ValueError(f"a [model] table builds a {TINY_INIT} model; an HF folder `init` keeps its own")
        return self


RUNTIME_FIELDS = frozenset(
    {
        "name",
        "train.log_every",
        "train.ckpt_every",
        "train.keep_checkpoints",
        "train.max_wall_minutes",
        "train.progress",
        "train.fsdp",
        "train.checkpoint_format",
        "rollout.placement",
        "optim.micro_batch_size",
        "rollout.engine_cpus",
        "rollout.engine_gpus",
        "rollout.weight_sync",
        "output",
        "eval",
    }
)


def eval_task(config: Any) -> str | None:
    """The task evaluated in training: ``eval.task``, else ``data.task``."""
    return config.eval.task or config.data.task


class VLLMOptions(StrictModel):
    """``[rollout.vllm]``: the colocated vLLM engine's settings (cosmos_robot.text.vllm_engine)."""

    gpu_memory_utilization: float = Field(default=0.3, gt=0, lt=1)  # share of the whole GPU for vLLM
    enforce_eager: bool = False  # True: no CUDA graphs (quicker start, slower decode)
    max_model_len: int | None = Field(default=None, ge=16)  # None: the model config's


class TextRolloutConfig(StrictModel):
    """How completions are sampled: engine, group size, prompts per iteration, sampling parameters."""

    # "transformers": continuous batching (the default; fastest on a CPU); "transformers_static": one padded
    # generate with a static, compiled KV cache (for a GPU); "vllm": vLLM colocated on the trainer's GPU
    engine: Literal["transformers", "transformers_static", "vllm"] = "transformers"
    vllm: VLLMOptions = VLLMOptions()
    prompts_per_iter: int = Field(default=16, ge=1)  # distinct prompts per iteration
    group_size: int = Field(default=8, ge=2)  # completions per prompt (G)
    max_new_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, gt=0)  # the trainer scores log-probs at the same temperature
    top_p: float = Field(default=1.0, gt=0, le=1)
    # where the engine runs: "local" (in the learner's process, on its model) or "ray" (a Ray actor of its own
    # with engine_cpus / engine_gpus, holding a copy of the model synced after every update; remote_engine.py)
    placement: Literal["local", "ray"] = "local"
    engine_cpus: float = Field(default=1.0, gt=0)
    engine_gpus: float = Field(default=0.0, ge=0)
    # placement = "ray": weights to the engine actor through Ray's object store, or by a broadcast in a
    # process group of the learner and the actor (NCCL between GPUs, gloo otherwise)
    weight_sync: Literal["object_store", "collective"] = "object_store"

    @model_validator(mode="after")
    def _placement(self) -> TextRolloutConfig:
        if self.placement == "local" and (self.weight_sync != "object_store" or self.engine_gpus > 0):
            raise ValueError(
                "rollout.weight_sync and rollout.engine_gpus apply to an engine in a Ray actor "
                "(rollout.placement = 'ray'); a local engine runs on the learner's own model and device"
            )
        return self

    def engine_options(self) -> dict[str, dict[str, Any]]:
        """Each engine's own table, for ``make_engine``."""
        return {"vllm": self.vllm.model_dump()}


class TextRewardConfig(StrictModel):
    """Where rewards come from; ``shuffle`` is the control run (rewards permuted across the batch)."""

    name: str | None = None  # a registered scorer (exact_match, gsm8k, countdown, ...) or an http(s):// service
    timeout_s: float = Field(default=30.0, gt=0)  # reward service timeout per batch
    shuffle: bool = False  # control: permute rewards across the iteration's completions (no signal left)


class TextAlgoConfig(StrictModel):
    """GRPO family: advantage estimator, policy loss, aggregation, clipping, filters, KL, IS correction.

    GRPO: advantage "grpo", loss "ppo", loss_agg "seq_mean_token_mean". Dr-GRPO: "dr_grpo" +
    "seq_mean_token_sum_norm" (normaliser max_new_tokens). DAPO: "token_mean", clip_high 0.28,
    overlong_filter. GSPO: loss "gspo" (sequence ratio, clip 3e-4 / 4e-4).
    """

    advantage: Literal["grpo", "dr_grpo"] = "grpo"
    std_eps: float = Field(default=1e-4, gt=0)  # GRPO's std epsilon (TRL 1e-4)
    policy_loss: Literal["ppo", "gspo"] = "ppo"
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "seq_mean_token_mean"
    clip: float = Field(default=0.2, gt=0)  # PPO clip (lower side)
    clip_high: float | None = Field(default=None, gt=0)  # DAPO clip-higher (None: = clip)
    dual_clip: float | None = Field(default=None, gt=1)  # verl's clip_ratio_c (None: off, as TRL)
    gspo_clip_low: float = Field(default=3e-4, gt=0)
    gspo_clip_high: float = Field(default=4e-4, gt=0)
    filter_groups: bool = True  # drop groups whose rewards are all equal (zero advantage, only dilute)
    overlong_filter: bool = False  # DAPO: completions cut at max_new_tokens do not train
    kl_coef: float = Field(default=0.0, ge=0)  # k3 KL to the frozen initial model (0: no reference loaded)
    tis_cap: float | None = Field(default=2.0, gt=0)  # truncated IS weight min(exp(logp_old - logp_engine), cap)


class TextRLOptimConfig(OptimConfig):
    """AdamW + schedule, and how each iteration's completions are split into updates."""

    epochs: int = Field(default=1, ge=1)  # passes over each iteration's completions (mu)
    minibatch_size: int = Field(default=64, ge=1)  # completions (GRPO) or pairs (DPO) per optimizer step
    # per forward/backward: gradients of micro-batches accumulate to one minibatch step (None: the whole
    # minibatch at once). What makes a real model fit: 128 x 256 tokens of Qwen3-0.6B at once peaked at 101 GiB.
    micro_batch_size: int | None = Field(default=None, ge=1)


class TextRLTrainConfig(TextTrainConfig):
    steps: int = Field(default=100, ge=1)  # iterations (rollout + update), named steps like every trainer's
    ckpt_every: int = Field(default=10, ge=1)
    log_every: int = Field(default=1, ge=1)


class TextOnlineRLConfig(StrictModel):
    """What every on-policy text trainer's recipe has: the model, the task its prompts come from, the reward,
    the optimizer, the run. GRPO, PPO and OPD add their rollout, algorithm (and critic or teacher) tables."""

    trainer: str
    name: str
    init: str  # an HF causal-LM folder (e.g. a text_sft run's final/) or tiny:hf_causal_lm
    model: TinyLMConfig = Field(default_factory=lambda: TinyLMConfig())
    data: TextDataConfig = Field(default_factory=lambda: TextDataConfig())
    reward: TextRewardConfig = Field(default_factory=lambda: TextRewardConfig())
    optim: TextRLOptimConfig = Field(
        default_factory=lambda: TextRLOptimConfig(lr=1e-6, warmup_steps=0, schedule="constant")
    )
    train: TextRLTrainConfig = Field(default_factory=lambda: TextRLTrainConfig())
    eval: TextEvalConfig = Field(default_factory=lambda: TextEvalConfig())
    output: OutputConfig

    @model_validator(mode="after")
    def _needs_a_task(self) -> TextOnlineRLConfig:
        if self.data.task is None:
            raise ValueError(f"{self.trainer} samples prompts from a text task: set data.task")
        return self


class TextGRPOConfig(TextOnlineRLConfig):
    """Online GRPO-family RL of an HF causal LM on a text task with a reward provider."""

    trainer: Literal["text_grpo"] = "text_grpo"
    name: str = "text_grpo"
    rollout: TextRolloutConfig = Field(default_factory=lambda: TextRolloutConfig())
    algo: TextAlgoConfig = Field(default_factory=lambda: TextAlgoConfig())


class TextPPORolloutConfig(TextRolloutConfig):
    """PPO's rollout: as GRPO's, but one completion per prompt is the usual setting (the critic is the baseline)."""

    group_size: int = Field(default=1, ge=1)


class TextPPOAlgoConfig(StrictModel):
    """Token PPO with a critic (TRL <= 1.12's ``PPOTrainer``; verl's GAE estimator).

    Per-token reward ``r_t = -kl_coef * kl_t`` (``kl_t`` the ``kl_estimator`` of the rollout policy against
    the frozen reference) plus the task score on the last completion token (minus ``missing_eos_penalty``
    when the completion was cut); GAE over the completion tokens (the value after the last one is 0);
    advantages whitened over the batch's tokens; the clipped surrogate and the clipped value loss
    ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-clip_value) - R)^2)``, both token means."""

    gamma: float = Field(default=1.0, ge=0, le=1)
    lam: float = Field(default=0.95, ge=0, le=1)
    clip: float = Field(default=0.2, gt=0)
    clip_value: float = Field(default=0.2, gt=0)  # TRL 0.2, verl 0.5
    vf_coef: float = Field(default=0.1, gt=0)  # scales the critic's loss (TRL's default)
    kl_coef: float = Field(default=0.05, ge=0)  # KL penalty in the reward (0: no reference model loaded)
    kl_estimator: Literal["k1", "k3"] = "k1"  # TRL's kl_estimator
    missing_eos_penalty: float | None = Field(default=None, ge=0)
    whiten_advantages: bool = True
    tis_cap: float | None = Field(default=2.0, gt=0)  # as GRPO's: engine/trainer mismatch correction


class TextPPOCriticConfig(StrictModel):
    """The value model: a scalar head on its own copy of a backbone (TRL's and verl's separate critic)."""

    # None: the policy's own starting weights (init) under a fresh head; or an HF folder (a causal LM's backbone
    # or a *ForTokenClassification with one label)
    init: str | None = None
    lr: float = Field(default=1e-5, gt=0)  # verl's critic lr
    grad_clip: float | None = Field(default=1.0, gt=0)


class TextPPOConfig(TextOnlineRLConfig):
    """Token-level PPO of an HF causal LM with a critic and a KL-to-reference penalty in the reward."""

    trainer: Literal["text_ppo"] = "text_ppo"
    name: str = "text_ppo"
    rollout: TextPPORolloutConfig = Field(default_factory=lambda: TextPPORolloutConfig())
    algo: TextPPOAlgoConfig = Field(default_factory=lambda: TextPPOAlgoConfig())
    critic: TextPPOCriticConfig = Field(default_factory=lambda: TextPPOCriticConfig())
    optim: TextRLOptimConfig = Field(
        default_factory=lambda: TextRLOptimConfig(lr=3e-6, warmup_steps=0, schedule="constant", epochs=4)
    )


class TextOPDAlgoConfig(StrictModel):
    """On-policy distillation: the student samples, the teacher scores every completion token.

    ``loss = "jsd"``: the generalised Jensen-Shannon divergence over the whole vocabulary (GKD; TRL's
    ``GKDTrainer.generalized_jsd_loss``): ``beta`` 0 is the forward KL(teacher || student), 1 the reverse
    KL(student || teacher) (on-policy distillation), in between ``beta KL(T || M) + (1 - beta) KL(S || M)`` with
    ``M = beta T + (1 - beta) S``; summed over completion tokens and divided by their number.
    ``loss = "sampled_token"``: ``log p_teacher(x_t) - log p_student(x_t)`` of each sampled token is a dense
    reward; its discounted sum over the following tokens (``gamma``; 0: the token's own) is the advantage of the
    PPO clipped surrogate (TRL's MiniLLM ``rkl_advantage``)."""

    loss: Literal["jsd", "sampled_token"] = "jsd"
    beta: float = Field(default=1.0, ge=0, le=1)
    temperature: float = Field(default=1.0, gt=0)  # the JSD's softmax temperature
    gamma: float = Field(default=0.0, ge=0, le=1)  # sampled_token: discount of the future per-token rewards
    clip: float = Field(default=0.2, gt=0)  # sampled_token: PPO clip


class TextOPDTeacherConfig(StrictModel):
    """The teacher: a frozen HF causal-LM folder in this process, sharing the student's tokenizer."""

    init: str


class TextOPDConfig(TextOnlineRLConfig):
    """On-policy distillation of an HF causal LM (the student, ``init``) from a teacher on a task's prompts; the
    task's reward is logged (``train_accuracy``), not trained on."""

    trainer: Literal["text_opd"] = "text_opd"
    name: str = "text_opd"
    teacher: TextOPDTeacherConfig
    rollout: TextPPORolloutConfig = Field(default_factory=lambda: TextPPORolloutConfig())
    algo: TextOPDAlgoConfig = Field(default_factory=lambda: TextOPDAlgoConfig())


class TextDPOAlgoConfig(StrictModel):
    """DPO: loss form, beta, and how pairs are made from sampled groups."""

    loss: Literal["sigmoid", "ipo"] = "sigmoid"
    beta: float = Field(default=0.1, gt=0)
    pairs_per_prompt: int = Field(default=2, ge=1)  # (higher-reward, lower-reward) pairs drawn per sampled group


class TextDPOConfig(StrictModel):
    """DPO of an HF causal LM against its frozen initial model.

    Pairs come from ``data.path`` (JSONL lines ``{"prompt": [messages] | "text", "chosen": "...",
    "rejected": "..."}``, offline) or, with ``data.task``, from the policy's own samples: each
    iteration samples groups like GRPO and pairs a higher-reward completion with a lower-reward one
    of the same prompt (online / iterative DPO; TRL's OnlineDPOTrainer with a rule-based judge).
    """

    trainer: Literal["text_dpo"] = "text_dpo"
    name: str = "text_dpo"
    init: str
    model: TinyLMConfig = Field(default_factory=lambda: TinyLMConfig())
    data: TextDataConfig = Field(default_factory=lambda: TextDataConfig())
    rollout: TextRolloutConfig = Field(default_factory=lambda: TextRolloutConfig())
    reward: TextRewardConfig = Field(default_factory=lambda: TextRewardConfig())
    algo: TextDPOAlgoConfig = Field(default_factory=lambda: TextDPOAlgoConfig())
    optim: TextRLOptimConfig = Field(
        default_factory=lambda: TextRLOptimConfig(lr=1e-6, warmup_steps=0, schedule="constant")
    )
    train: TextRLTrainConfig = Field(default_factory=lambda: TextRLTrainConfig())
    eval: TextEvalConfig = Field(default_factory=lambda: TextEvalConfig())
    output: OutputConfig
