"""The RL recipe: which policy to start from, how to roll out, which algorithm, how long, where to write.

One config model serves every online algorithm (``trainer`` = ``joint_ppo``, ``grpo``, ``nft`` or
``dpo``): they share the rollout (vectorized tabletop envs, one batched policy call per decision,
an action chunk as one MDP step), the optimizer, the checkpoint cadence and the evaluation hook, and
differ in the ``[algo]`` fields each one reads (listed per field). Every field documents its unit
and purpose; ``--set algo.clip=0.1`` overrides one and a typo is an error naming the dotted field.

``RUNTIME_FIELDS`` may change when a run is resumed; anything else changes what the policy learns and
resuming into a folder whose saved recipe differs in it is refused, naming the field.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cosmos_robot.config import StrictModel
from cosmos_robot.policies.flow.sampling import SampleMode
from cosmos_robot_trainers.common.evaluation import EvalSchedule
from cosmos_robot_trainers.common.output import OutputConfig

__all__ = [
    "ALGORITHMS",
    "StartNoise",
    "RUNTIME_FIELDS",
    "AlgoConfig",
    "BCConfig",
    "EnvConfig",
    "EvalConfig",
    "OptimConfig",
    "OutputConfig",
    "RLConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainConfig",
]


# Where each chunk's denoising starts (x at t = 1). "serving": the noise serving starts from (the flow
# family serves from one fixed seeded draw), so exploration comes only from the sampler's stochastic
# steps and an ODE rollout IS the served policy; "episode": one draw per episode, reused for each of
# its chunks (episodes differ, chunks stay consistent: what ODE-sampled NFT groups need); "fresh": a
# new draw per chunk. The diagnosis measured why it matters (strong checkpoint, 25 episodes/task):
# served ODE 79%, fresh-noise ODE 66%: switching modes from chunk to chunk costs 13 points.
StartNoise = Literal["serving", "episode", "fresh"]


@dataclass(frozen=True)
class AlgorithmNeeds:
    """What an online algorithm asks of the recipe (checked when the config loads)."""

    min_group_size: int  # episodes per initial state it compares
    log_probs: bool  # needs the rollout sampler's log-probs (so not sample_mode "ode")
    sample_mode: SampleMode = "flow_sde"  # the rollout sampler that rollout.sample_mode "auto" picks
    start_noise: StartNoise = "serving"  # the denoising start that rollout.start_noise "auto" picks


# trainer name -> its needs; the update and advantage of each are rl/methods.py's METHODS
ALGORITHMS: dict[str, AlgorithmNeeds] = {
    "joint_ppo": AlgorithmNeeds(min_group_size=1, log_probs=True),
    "grpo": AlgorithmNeeds(min_group_size=2, log_probs=True),
    # NFT needs no likelihoods and regresses onto the sampled chunks: ODE samples are what serving
    # executes, while the SDE's injected noise would be regressed onto as well
    "nft": AlgorithmNeeds(min_group_size=1, log_probs=False, sample_mode="ode", start_noise="episode"),
    "dpo": AlgorithmNeeds(min_group_size=2, log_probs=False),
}
TABLETOP_TASKS = ["reach", "push", "pick_place", "open_drawer"]

# suite -> the action dims that log-probs and the NFT / DPO regression losses cover under
# rollout.logprob_dims = "auto" (a suite not listed: all dims). Tabletop actions are
# [dx, dy, dz, drx, dry, drz, gripper]; the scripted experts (8 episodes per task, seeds 1000-1007,
# every one a success) use per-dim action std, in env action units:
#   reach       0.421 0.417 0.297 | 0.0036 0.0032 0.     | 0.
#   push        0.362 0.306 0.440 | 0.0062 0.0086 0.0014 | 0.
#   pick_place  0.290 0.432 0.488 | 0.0023 0.0015 0.175  | 0.988
#   open_drawer 0.493 0.206 0.300 | 0.0023 0.0066 0.     | 0.
# drx and dry (the fingers-down corrections) stay at or below 2% of each task's largest std (0.9% and
# 1.3% pooled): no task needs them, yet each adds a full Gaussian term per executed row to the log-prob
# (the diagnosis: split-half gradient cosine -0.08 on the rotation dims alone, +0.014 on the others).
# drz (the yaw that pick_place turns to the cube) and the gripper stay.
SUITE_LOGPROB_DIMS: dict[str, tuple[int, ...]] = {"tabletop": (0, 1, 2, 5, 6)}


class EnvConfig(StrictModel):
    """The simulated envs the rollouts run on: one multi-task env of the suite per slot (a process each)."""

    suite: str = (
        "tabletop"  # env suite (cosmos_robot_envs.eval): tabletop, or libero_spatial / _object / _goal / _10 / _90
    )
    tasks: list[str] = Field(default_factory=lambda: list(TABLETOP_TASKS))  # the suite's tasks, assigned round-robin
    num_envs: int = Field(default=8, ge=1)  # envs stepping in lockstep (one batched policy call per decision)
    vector_mode: Literal["sync", "async", "ray"] = "async"  # in-process, a process per env, or a Ray actor per env
    image_size: int = Field(default=128, ge=8)  # camera side the envs render (the policy resizes, as when serving)
    max_steps: int | None = Field(default=None, ge=1)  # cap on env steps per episode (None: each task's own)
    step_timeout: float = Field(default=60.0, gt=0)  # seconds before a silent env worker counts as hung
    seed: int = 0  # base of the episode seeds (layouts); eval uses eval.seed instead


class RolloutConfig(StrictModel):
    """How episodes are collected each iteration."""

    episodes_per_iter: int = Field(default=32, ge=1)  # episodes per iteration (a multiple of algo.group_size)
    replan_steps: int = Field(default=5, ge=1)  # actions executed open-loop per chunk (<= chunk_size): one MDP step
    # rollout sampler: flow_sde / flow_noise (with log-probs), ode (NFT/DPO only); auto: the trainer's
    # (ALGORITHMS: ode for nft, flow_sde otherwise)
    sample_mode: Literal["auto", "flow_sde", "flow_noise", "ode"] = "auto"
    # action-dim indices the log-probs and NFT / DPO losses cover; "all"; "auto": the suite's
    # (SUITE_LOGPROB_DIMS: tabletop leaves out drx, dry), else all
    logprob_dims: Literal["auto", "all"] | list[int] = "auto"
    # where each chunk's denoising starts (StartNoise above): serving / episode / fresh; "auto": the
    # trainer's (ALGORITHMS: episode for nft, whose ODE rollouts explore only through it; else serving)
    start_noise: Literal["auto", "serving", "episode", "fresh"] = "auto"
    num_flow_steps: int | None = Field(default=None, ge=1)  # denoising steps K (None: the checkpoint's)
    noise_level: float | None = Field(default=None, gt=0)  # Flow-SDE a in sigma_t = a sqrt(t/(1-t)) (None: ckpt)
    # share of each iteration's groups that rerun seeds whose last group had mixed outcomes (seed_replay.py:
    # only those groups' advantages say how to turn a failure into a success); 0: every group a fresh seed
    seed_replay: float = Field(default=0.0, ge=0, lt=1)
    seed_replay_pool: int = Field(default=64, ge=1)  # the most seeds the replay pool keeps
    num_workers: int = Field(default=1, ge=1)  # rollout workers; > 1 runs them as Ray actors (pip install ray)
    # Ray rollout workers' placement (num_workers > 1): each worker is one bundle of a placement group with
    # these resources (0 CPUs and 0 GPUs: no placement group, actors go where Ray puts them); a GPU share
    # puts the worker's policy on its GPU (e.g. 0.25: four workers share one GPU)
    worker_cpus: float = Field(default=0.0, ge=0)
    worker_gpus: float = Field(default=0.0, ge=0)
    placement: Literal["pack", "spread", "strict_pack", "strict_spread"] = "pack"  # the group's strategy
    placement_timeout_s: float = Field(default=300.0, gt=0)  # how long to wait for the cluster to place the group
    # how Ray rollout workers get the learner's weights each iteration: "object_store" (numpy arrays through
    # Ray's object store) or "collective" (a broadcast in a process group of the learner and its workers:
    # NCCL when both sides are on GPUs, gloo otherwise; common/weight_sync.py)
    weight_sync: Literal["object_store", "collective"] = "object_store"

    @model_validator(mode="after")
    def _dims(self) -> RolloutConfig:
        if self.weight_sync == "collective" and self.num_workers == 1:
            raise ValueError(
                "rollout.weight_sync = 'collective' broadcasts to Ray rollout workers (rollout.num_workers > 1); "
                "the one in-process worker samples from the learner's own model"
            )
        dims = self.logprob_dims
        if isinstance(dims, list) and (not dims or len(set(dims)) != len(dims) or min(dims) < 0):
            raise ValueError(f"rollout.logprob_dims: expected distinct action-dim indices >= 0, got {dims}")
        return self


class RewardConfig(StrictModel):
    """The MDP reward: a registered provider's step reward (scaled) plus optional potential-based shaping."""

    # per-step reward provider (algorithms/rewards.py): "env" (the env's own: tabletop's sparse success),
    # or a driving preset: "progress_safety", "distance_to_gt" (AlpaGym's)
    provider: str = "env"
    success_coef: float = Field(default=1.0, gt=0)  # scale of the provider's reward (env: the success step's)
    shaping_coef: float = Field(default=0.0, ge=0)  # c in c * (phi(s') - phi(s)), phi = info["dense_reward"]
    # a driving preset's named terms re-weighted, e.g. {progress = 10.0} (unnamed terms keep weight 1)
    term_weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("provider")
    @classmethod
    def _known(cls, value: str) -> str:
        from cosmos_robot_trainers.algorithms import get

        get("reward", value)  # UnknownAlgorithmError (a ValueError) lists the registered providers
        return value

    @model_validator(mode="after")
    def _weights_name_terms(self) -> RewardConfig:
        if not self.term_weights:
            return self
        from cosmos_robot_envs.driving.env import PRESET_TERMS

        terms = PRESET_TERMS.get(self.provider)
        if terms is None:
            raise ValueError(
                f"reward.term_weights re-weights a driving preset's terms; reward.provider {self.provider!r} "
                f"has none (use one of {list(PRESET_TERMS)})"
            )
        unknown = sorted(set(self.term_weights) - set(terms))
        if unknown:
            raise ValueError(
                f"reward.term_weights: {unknown} are not terms of {self.provider!r}; its terms are {list(terms)}"
            )
        return self


class AlgoConfig(StrictModel):
    """Algorithm hyperparameters (each line says which trainers read it)."""

    gamma: float = Field(default=0.99, ge=0, le=1)  # joint_ppo: discount per chunk step
    lam: float = Field(default=0.95, ge=0, le=1)  # joint_ppo: GAE lambda
    clip: float = Field(default=0.2, gt=0)  # joint_ppo, grpo: PPO ratio clip
    clip_high: float | None = Field(default=None, gt=0)  # joint_ppo, grpo: upper clip (None: = clip; DAPO 0.28)
    dual_clip: float | None = Field(default=3.0, gt=1)  # joint_ppo, grpo: dual-clip constant c (None: off)
    value_coef: float = Field(default=0.5, ge=0)  # joint_ppo: weight of the value loss in the joint loss
    value_clip: float | None = Field(default=0.2, gt=0)  # joint_ppo: value clipping around the old value
    huber_delta: float = Field(default=10.0, gt=0)  # joint_ppo: Huber delta of the value loss
    # joint_ppo, grpo: what one importance ratio covers: "chunk" (the executed slice summed: one ratio per
    # decision), "action" (one per executed action row, summed over logprob_dims) or "element" (one per
    # (row, dim)); the advantage is broadcast (RLinf's logprob_type chunk_level / action_level / token_level)
    ratio_level: Literal["chunk", "action", "element"] = "chunk"
    entropy_coef: float = Field(default=0.0, ge=0)  # joint_ppo, grpo: entropy bonus (flow_noise; RLinf 0.005)
    # joint_ppo, grpo: k3 KL to the frozen initial policy; nft: DiffusionNFT's reference term, the masked
    # mean ||v_theta - v_ref||^2 on the same (x_t, t) (0: none)
    kl_coef: float = Field(default=0.0, ge=0)
    detach_critic: bool = False  # joint_ppo: stop value gradients at the shared trunk
    # joint_ppo: what the critic reads: "policy" (the value head on the policy's shared trunk) or
    # "privileged" (its own MLP on the env's state + object_state, tabletop only; dropped at export)
    critic_inputs: Literal["policy", "privileged"] = "policy"
    critic_warmup_iters: int = Field(default=0, ge=0)  # joint_ppo: iterations that train only the value head
    normalize_advantages: bool = True  # joint_ppo: whiten advantages over the batch
    # joint_ppo: whiten over the whole batch, or within each task (every task's decisions then weigh the
    # same in the update, however rare its successes or large its returns)
    whiten_over: Literal["batch", "task"] = "batch"
    group_size: int = Field(default=1, ge=1)  # grpo, nft, dpo: episodes sharing one initial state (G)
    advantage: Literal["grpo", "dr_grpo"] = "grpo"  # grpo, nft: group-normalised (std) or Dr-GRPO (no std)
    policy_loss: Literal["ppo", "gspo"] = "ppo"  # grpo: per-decision clipped ratio or GSPO sequence ratio
    gspo_clip_low: float = Field(default=3e-4, gt=0)  # grpo + gspo: lower clip of the sequence ratio
    gspo_clip_high: float = Field(default=4e-4, gt=0)  # grpo + gspo: upper clip of the sequence ratio
    # grpo, nft, dpo: what a group compares its episodes by: "success" (0 / 1), "return" (the summed
    # provider reward: AlpaGym's one episode-level reward, broadcast as the advantage to every tick) or
    # "shaped" (the summed MDP reward the learner sees: success_coef x return + the progress shaping, which
    # telescopes to shaping_coef x (final progress - initial progress); members of a group share the
    # initial state, so a group where every episode failed still ranks them by how far each one got)
    group_score: Literal["success", "return", "shaped"] = "success"
    filter_groups: bool = True  # grpo, nft: drop groups whose episodes all scored the same
    # grpo, nft + filter_groups: what "all the same" compares: the group score ("score"), or success
    # ("success": DAPO's filter on correctness; with group_score "return" a group whose episodes all
    # crashed, or all arrived, is dropped even though their returns differ, so an iteration without a
    # split group takes no optimizer step: Adam's normalised step would follow that noise at full size)
    filter_on: Literal["score", "success"] = "score"
    # grpo: which decisions an episode's outcome is credited to. "episode" (AlpaGym): the group advantage of
    # the episode's score, the same on every decision. "reward_to_go": each decision's discounted MDP
    # rewards from it on (credit_gamma per decision), compared with the group's other episodes at the same
    # decision index (they share the seed, so the same moment of the same traffic): a collision's penalty
    # lands on the decisions of the seconds before it, and the earlier ones are ranked by the progress
    # that follows them (the per-tick form of group_score "return"; advantage.py; on driving it did not keep
    # the pace it was meant to: docs/driving.md, run U)
    credit: Literal["episode", "reward_to_go"] = "episode"
    credit_gamma: float = Field(default=1.0, ge=0, le=1)  # grpo + credit reward_to_go: discount per decision
    nft_beta: float = Field(default=1.0, gt=0)  # nft: guidance strength beta of v+/v-
    nft_a_max: float = Field(default=5.0, gt=0)  # nft: advantage clip A_max of the optimality probability
    nft_old_decay: float = Field(default=0.0, ge=0, lt=1)  # nft: EMA decay of the "old" policy (0: = theta)
    # nft: the decay rises by this much per iteration from 0 up to nft_old_decay (DiffusionNFT's schedule:
    # 0.001 per step up to 0.5); 0: nft_old_decay from the first iteration
    nft_old_decay_ramp: float = Field(default=0.0, ge=0)
    # nft: which policy the rollouts sample: "old" (DiffusionNFT collects its data with v_old, so the loss's
    # v_old is the velocity field of the samples it regresses on) or "current" (theta, the earlier behaviour)
    nft_sampler: Literal["old", "current"] = "old"
    nft_samples: int = Field(default=1, ge=1)  # nft, dpo: (t, noise) draws per decision and epoch
    # nft: what one optimality probability r weighs in the loss. "episode": every episode of a kept group the
    # same, whatever its length (its decisions share 1 / length), so a group's (2r - 1) sums to zero and the
    # negative branch has no net push away from the data; "decision": every decision the same (failed
    # episodes run longer, so r's decision mean sits below 1/2 and, with the old policy following the
    # current one, the policy drifts away from its own samples geometrically: advantage.py)
    nft_weighting: Literal["episode", "decision"] = "episode"
    dpo_beta: float = Field(default=100.0, gt=0)  # dpo: Flow-DPO beta
    dpo_pairs_per_group: int = Field(default=4, ge=1)  # dpo: (success, failure) episode pairs per group
    # dpo: what a pair compares: "trajectory" (the implicit reward summed over each episode's decisions)
    # or "first_decision" (both episodes' step-0 decisions: same initial state, same observation)
    dpo_pairing: Literal["trajectory", "first_decision"] = "trajectory"
    # dpo + trajectory: each episode's implicit reward as the "mean" over its decisions (length-normalised)
    # or Diffusion-DPO's "sum". Why mean: failures run to the time limit, so they have more decisions; on
    # the policy's own samples e_theta - e_ref is negative, so a sum makes the longer loser look preferred
    # (measured: implicit accuracy 0.94 -> 0 within 11 iterations, success 32% -> 6%, beta 5 and 100)
    dpo_trajectory_reduce: Literal["mean", "sum"] = "mean"


class OptimConfig(StrictModel):
    """AdamW over two parameter groups: the value head (critic lr) and everything else (actor lr)."""

    actor_lr: float = Field(default=1e-5, gt=0)  # policy (encoder, trunk, expert, noise head) learning rate
    critic_lr: float = Field(default=1e-3, gt=0)  # value head learning rate
    weight_decay: float = Field(default=0.0, ge=0)  # AdamW decoupled weight decay
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas (RLinf)
    grad_clip: float | None = Field(default=1.0, gt=0)  # actor grad-norm clip (all but the value head; None: off)
    critic_grad_clip: float | None = Field(default=1.0, gt=0)  # value-head grad-norm clip (None: off)
    epochs: int = Field(default=4, ge=1)  # passes over each iteration's data
    freeze_vlm: bool = False  # pi05: freeze SigLIP + the Gemma VLM (train the action expert and the value head)
    minibatch_size: int = Field(default=128, ge=1)  # decisions (dpo: episode pairs) per optimizer step
    # rows per forward/backward: each process's part of a minibatch in micro-batches whose gradients add up
    # to the same step (less activation memory; GSPO cuts at whole episodes); None: the whole part at once
    micro_batch_size: int | None = Field(default=None, ge=1)


class TrainConfig(StrictModel):
    """Length, seeding, devices and the checkpoint / logging cadence."""

    iterations: int = Field(default=100, ge=1)  # rollout + update iterations
    seed: int = 0  # seeds sampling noise, minibatch order and flow draws
    device: str = "cpu"  # torch device of the learner and the in-process rollout model
    num_threads: int | None = Field(default=2, ge=1)  # torch intra-op threads
    deterministic: bool = True  # deterministic kernels (exact resume)
    ckpt_every: int = Field(default=5, ge=1)  # iterations between checkpoints
    keep_checkpoints: int = Field(default=2, ge=1)  # newest checkpoint folders kept
    max_wall_minutes: float | None = Field(default=None, gt=0)  # stop (checkpoint + export) after this long
    progress: bool = True  # progress bar on stderr
    # iterations between split-half gradient-cosine health checks (grad_cosine_split_half; 0: never)
    grad_cosine_every: int = Field(default=1, ge=0)
    # data-parallel learners (--nproc N): shard the learner's parameters, gradients and AdamW state (FSDP2);
    # each rank keeps a whole copy for its rollouts, refreshed from the shards after every update
    fsdp: bool = False
    # "sharded": every rank writes its own shards of the learner and AdamW state (torch.distributed.checkpoint)
    # instead of rank 0 gathering them; any world size resumes, `cosmos-robot export` consolidates
    checkpoint_format: Literal["whole", "sharded"] = "whole"


class EvalConfig(EvalSchedule):
    """The shared eval schedule with RL's defaults: evaluate before, during (every 10 iterations) and after
    training, deterministically (ODE) on held-out layouts; its success is the learning curve. The suite,
    tasks, image size and executed chunk length are the training env's (``env``, ``rollout``)."""

    every: int = Field(default=10, ge=0)  # iterations between evaluations (0: none between eval.initial and eval.final)
    initial: bool = True  # evaluate the starting policy before training
    final: bool = True  # evaluate the final policy
    final_episodes_per_task: int | None = Field(default=25, ge=1)  # episodes per task of the final evaluation
    num_envs: int = Field(default=8, ge=1)  # envs in lockstep
    vector_mode: Literal["sync", "async"] = "async"
    max_steps: int | None = Field(default=None, ge=1)  # cap on env steps per episode (None: each task's own)


class BCConfig(StrictModel):
    """Demonstration-augmented RL (DAPG, Rajeswaran et al. 2018): the flow-matching loss of SFT on a
    demonstration dataset, added to every optimizer step of the RL update with weight
    ``coef * decay ** iteration``. Why: from a few-shot start the hard tasks' rare successes give RL
    almost no gradient while the shared network moves for the easy ones; the demonstrations hold what
    SFT learnt of the hard tasks in place (and keep teaching it) while RL improves the rest."""

    data: str | None = None  # LeRobot dataset root (recorded by `cosmos-robot record`, an SFT recipe's data.root)
    coef: float = Field(default=0.0, ge=0)  # weight of the demonstration loss (0: off)
    decay: float = Field(default=1.0, gt=0, le=1)  # per-iteration factor on coef (DAPG's lambda_1)
    batch_size: int = Field(default=128, ge=1)  # demonstration frames per optimizer step
    max_episodes_per_task: int | None = Field(default=None, ge=1)  # the first N demonstrations per instruction
    task_weighting: Literal["balanced", "frames"] = "balanced"  # tasks drawn equally often, or frames uniformly
    # only the demonstrations of these instructions (the dataset's task strings; None: all): anchor the
    # tasks RL leaves without signal, not the ones it is improving
    instructions: list[str] | None = None

    @model_validator(mode="after")
    def _used(self) -> BCConfig:
        if self.coef > 0 and self.data is None:
            raise ValueError("bc.coef > 0 needs bc.data (the demonstration dataset's folder)")
        if self.data is not None and self.coef == 0:
            raise ValueError(f"bc.data is {self.data!r} but bc.coef is 0: the demonstrations would never be used")
        return self


class RLConfig(StrictModel):
    """An online RL run that post-trains a flow policy checkpoint in simulation."""

    trainer: str  # which algorithm: a key of ALGORITHMS (joint_ppo, grpo, nft, dpo)
    name: str = "rl"  # run name (logs)
    init: str  # the starting checkpoint folder (any family with RL: an SFT run's final/, ...) or tiny:<family>
    env: EnvConfig = Field(default_factory=lambda: EnvConfig())
    rollout: RolloutConfig = Field(default_factory=lambda: RolloutConfig())
    reward: RewardConfig = Field(default_factory=lambda: RewardConfig())
    algo: AlgoConfig = Field(default_factory=lambda: AlgoConfig())
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig())
    train: TrainConfig = Field(default_factory=lambda: TrainConfig())
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig())
    bc: BCConfig = Field(default_factory=lambda: BCConfig())
    output: OutputConfig

    @model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        g = self.algo.group_size
        if self.rollout.episodes_per_iter % g:
            raise ValueError(
                f"rollout.episodes_per_iter ({self.rollout.episodes_per_iter}) must be a multiple of "
                f"algo.group_size ({g})"
            )
        if self.trainer not in ALGORITHMS:
            hint = difflib.get_close_matches(self.trainer, list(ALGORITHMS), n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ValueError(f"trainer: unknown algorithm {self.trainer!r} (known: {', '.join(ALGORITHMS)}){extra}")
        needs = ALGORITHMS[self.trainer]
        if self.algo.filter_on == "success" and not self.algo.filter_groups:
            raise ValueError("algo.filter_on = 'success' chooses what algo.filter_groups compares; set filter_groups")
        if self.algo.credit != "episode" and (
            self.trainer != "grpo" or self.algo.policy_loss != "ppo" or self.algo.group_score == "success"
        ):
            raise ValueError(
                f"algo.credit {self.algo.credit!r} ranks each decision by the rewards that follow it: it needs "
                f"trainer 'grpo' (got {self.trainer!r}) with policy_loss 'ppo' (got {self.algo.policy_loss!r}; "
                f"GSPO's ratio is per episode) and group_score 'return' or 'shaped' (got {self.algo.group_score!r})"
            )
        if self.rollout.seed_replay > 0 and g < 2:
            raise ValueError(
                "rollout.seed_replay reruns seeds whose group had both successes and failures; it needs "
                f"algo.group_size >= 2 (got {g})"
            )
        if g < needs.min_group_size:
            raise ValueError(
                f"algo.group_size must be >= {needs.min_group_size} for {self.trainer} "
                "(episodes compared per initial state)"
            )
        if self.sample_mode == "ode" and self.start_noise == "serving" and g > 1:
            raise ValueError(
                f"rollout.sample_mode 'ode' from rollout.start_noise 'serving' is deterministic: the "
                f"{g} episodes of a group would be identical; use start_noise 'episode' or 'fresh'"
            )
        if needs.log_probs and self.sample_mode == "ode":
            raise ValueError(
                f"rollout.sample_mode 'ode' has no log-probs; {self.trainer} needs 'flow_sde' or 'flow_noise'"
            )
        if self.env.suite != "tabletop" and self.reward.shaping_coef > 0:
            raise ValueError(
                f"reward.shaping_coef needs the env's progress signal (info['dense_reward']), which only the "
                f"tabletop suite has; env.suite is {self.env.suite!r}: set reward.shaping_coef = 0"
            )
        if self.algo.group_score == "shaped" and self.reward.shaping_coef == 0:
            raise ValueError(
                "algo.group_score 'shaped' ranks a group's episodes by their progress shaping, but "
                "reward.shaping_coef is 0 (then it is the scaled return): set reward.shaping_coef > 0 or "
                "algo.group_score = 'return'"
            )
        if self.algo.ratio_level != "chunk" and (
            self.trainer not in ("joint_ppo", "grpo") or self.algo.policy_loss == "gspo"
        ):
            raise ValueError(
                f"algo.ratio_level {self.algo.ratio_level!r} applies to the PPO surrogate of joint_ppo and grpo "
                f"(trainer {self.trainer!r}, policy_loss {self.algo.policy_loss!r}); GSPO's ratio is per episode"
            )
        if self.algo.critic_inputs == "privileged":
            if self.trainer != "joint_ppo" or self.env.suite != "tabletop" or self.rollout.num_workers != 1:
                raise ValueError(
                    "algo.critic_inputs 'privileged' reads the tabletop env's object_state in the rollout process: "
                    f"it needs trainer joint_ppo (got {self.trainer!r}), env.suite tabletop (got "
                    f"{self.env.suite!r}) and rollout.num_workers 1 (got {self.rollout.num_workers})"
                )
        if self.rollout.num_workers > self.env.num_envs:
            raise ValueError(
                f"rollout.num_workers ({self.rollout.num_workers}) exceeds env.num_envs ({self.env.num_envs})"
            )
        return self

    @property
    def sample_mode(self) -> SampleMode:
        """The rollout sampler: ``rollout.sample_mode``, or the trainer's (``ALGORITHMS``) for "auto"."""
        mode = self.rollout.sample_mode
        return ALGORITHMS[self.trainer].sample_mode if mode == "auto" else mode

    @property
    def start_noise(self) -> StartNoise:
        """Where rollout chunks start denoising: ``rollout.start_noise``, or the trainer's for "auto"."""
        mode = self.rollout.start_noise
        return ALGORITHMS[self.trainer].start_noise if mode == "auto" else mode

    def logprob_dims(self, action_dims: int) -> tuple[int, ...]:
        """The action-dim indices the log-probs and losses cover (``rollout.logprob_dims``), checked
        against the policy's ``action_dims``."""
        dims = self.rollout.logprob_dims
        if dims == "all":
            return tuple(range(action_dims))
        if dims == "auto":
            return SUITE_LOGPROB_DIMS.get(self.env.suite, tuple(range(action_dims)))
        if max(dims) >= action_dims:
            raise ValueError(f"rollout.logprob_dims {dims}: the policy has {action_dims} action dims")
        return tuple(sorted(dims))


# fields a resume may change: where the work runs, not what is learnt. rollout.num_workers is one, as the
# learner world size is: N learner processes deal episode groups as N rollout workers do, so a run
# saved by either resumes on the other with the same numbers (docs/scale.md)
RUNTIME_FIELDS = frozenset(
    {
        "name",
        "env.vector_mode",
        "rollout.num_workers",
        "rollout.worker_cpus",
        "rollout.worker_gpus",
        "rollout.placement",
        "rollout.placement_timeout_s",
        "rollout.weight_sync",
        "optim.micro_batch_size",
        "env.step_timeout",
        "train.ckpt_every",
        "train.keep_checkpoints",
        "train.max_wall_minutes",
        "train.progress",
        "train.grad_cosine_every",
        "train.fsdp",
        "train.checkpoint_format",
        "train.iterations",
        "output",
        "eval",
    }
)
