"""The RL driver: a loop of named, timed phases over iterations (house style item 8, verl's ``fit``).

    rollout -> reward -> old_logprob -> advantage [-> health] -> update -> weight_sync  [-> eval] [-> checkpoint]

- rollout: the iteration's episode schedule on the vectorized envs (``rollout.py``), stochastic
  sampling with log-probs (Flow-SDE / Flow-Noise; NFT and DPO may use plain ODE from random noise);
- reward: per-episode success and return, training success rate by task;
- old_logprob: the stored rollout log-probs and values are the "old" ones (the rollout model is the
  learner's model); this phase checks them (finite, right shapes) and, with a KL term, nothing else;
- advantage: GAE (joint PPO), group-normalised success (GRPO, NFT's optimality), preference pairs (DPO);
- health (every ``train.grad_cosine_every`` iterations): the split-half gradient cosine of the
  algorithm's loss, before the update, with the model unchanged;
- update: the algorithm's epochs of minibatches (``learner.py``); the first minibatch's ratio must be 1
  within ``RATIO_GATE`` or the run stops with an error naming the cause;
- weight_sync: NFT's "old" policy moves toward the current one; Ray workers receive the weights they
  sample with (NFT samples the old policy by default, as DiffusionNFT collects its data with v_old).

Exact resume: per-iteration generators are seeded from (train.seed, iteration), episode layouts
from (env.seed, iteration), and a checkpoint holds the model, the optimizer, NFT's old model, the
global RNG state, the iteration and the wall time, so a run killed and resumed repeats the
uninterrupted run's numbers. ``final/`` is a ``FlowPolicy`` folder (``serve --ckpt``, ``eval --ckpt``).

Data-parallel learners (``torchrun`` / ``cosmos-robot train RECIPE --nproc N``): each rank collects its
share of the iteration's episode groups on its share of the envs (``workers.DataParallelRollouts``), the
parts are joined on every rank, every rank computes the same advantages and takes its share of each
minibatch with the gradients averaged (``learner.py``). Models and optimizers stay identical on every
rank, so rank 0 alone writes the run folder (metrics, checkpoints, evaluations, ``final/``; sharded
learners gather for it first, below) and a checkpoint resumes at any world size.

``train.fsdp`` (with ``--nproc N``): the learner is a sharded copy of the policy's model (FSDP2,
``common/fsdp.py``: parameters, gradients and AdamW state 1/N per rank); the adapter keeps the whole
model for the rollouts, evaluations and the export, refreshed from the shards in the weight_sync phase
(a rank's rollout calls the model as often as its episodes need, which no two ranks agree on, so
rollouts cannot run on the shards; verl's "hybrid engine" splits the two the same way). Checkpoints
gather to the one-process form, so runs cross between sharded, replicated and single-process learners.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.distributed import World, any_rank, barrier, broadcast_parameters, broadcast_text, world_from_env
from cosmos_robot.policies.flow.sampling import SampleMode
from cosmos_robot.policies.init_source import resolve_init
from cosmos_robot.policies.interfaces import Demonstrations
from cosmos_robot_envs.tabletop.tasks import OBJECT_STATE_DIM, STATE_DIM
from cosmos_robot_trainers.common import (
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
from cosmos_robot_trainers.common.evaluation import EvalHookConfig, evaluate_policy
from cosmos_robot_trainers.common.export import export_policy
from cosmos_robot_trainers.common.rundir import CHECKPOINTS, prepare_run_dir
from cosmos_robot_trainers.rl.config import RUNTIME_FIELDS, RLConfig
from cosmos_robot_trainers.rl.critic import attach_privileged_critic, unwrap
from cosmos_robot_trainers.rl.demos import DemoTerm, load_demos, sample_weights
from cosmos_robot_trainers.rl.learner import RATIO_GATE, build_optimizer
from cosmos_robot_trainers.rl.methods import UpdateInputs, get_method
from cosmos_robot_trainers.rl.policies import RLAdapter, RLModel, frozen_copy, load_rl_adapter
from cosmos_robot_trainers.rl.rollout import Rollout, episode_specs
from cosmos_robot_trainers.rl.seed_replay import SeedReplay
from cosmos_robot_trainers.rl.workers import LocalRollouts, Rollouts, check_learner_world, make_rollouts

__all__ = ["RLResult", "RatioGateError", "run_rl"]

CURVE_KEYS = ("eval_success", "train_success", "policy_loss", "value_loss", "clip_fraction", "env_steps_per_s")


class RatioGateError(RuntimeError):
    """The importance ratio was not 1 on the first minibatch: rollout and learner disagree."""


@dataclass
class RLResult:
    out_dir: Path
    iteration: int
    finished: bool
    resumed_from: int | None
    final_dir: Path | None
    total_wall_s: float
    last_metrics: dict[str, Any] = field(default_factory=dict)
    eval_history: list[tuple[int, float]] = field(default_factory=list)
    final_eval: dict[str, Any] | None = None

    @property
    def step(self) -> int:
        """The last iteration trained (what ``cosmos-robot train`` prints as the step)."""
        return self.iteration


class _Phases:
    """Wall time of each named phase of one iteration."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.times[f"time/{name}"] = round(time.perf_counter() - t0, 4)
        return out


def _seed(config: RLConfig, iteration: int, stream: int) -> int:
    return (config.train.seed * 1_000_003 + iteration * 101 + stream) % (2**63)


def _eval_cfg(config: RLConfig, episodes: int) -> EvalHookConfig:
    """The eval hook on the training env's suite, tasks, image size and executed chunk length."""
    env = {
        "suite": config.env.suite,
        "tasks": list(config.env.tasks),
        "replan_steps": config.rollout.replan_steps,
        "image_size": config.env.image_size,
        "episodes_per_task": episodes,
    }
    return EvalHookConfig.model_validate({**config.eval.model_dump(), **env})


def _reward_stats(rollout: Rollout) -> dict[str, float]:
    out = {
        "train_success": float(rollout.ep_success.mean()),
        "episode_return": float(rollout.ep_return.mean()),
        "episode_length": float(rollout.ep_length.float().mean()),
        "episodes_failed": float(rollout.ep_failed.sum()),
    }
    for task in sorted(set(rollout.ep_task)):
        sel = torch.tensor([t == task for t in rollout.ep_task])
        out[f"train_success/{task}"] = float(rollout.ep_success[sel].mean())
    return out


def _check_rollout(rollout: Rollout) -> dict[str, float]:
    for name in ("log_prob", "value", "chain", "reward"):
        tensor = getattr(rollout, name)
        if not torch.isfinite(tensor).all():
            raise FloatingPointError(f"rollout.{name} has non-finite values; lower the learning rates")
    return {"old_log_prob_mean": float(rollout.log_prob.mean()), "old_value_mean": float(rollout.value.mean())}


@dataclass
class _Run:
    """One run between iterations: the models, optimizer, rollout workers, logger and clocks."""

    config: RLConfig
    policy: RLAdapter
    model: RLModel
    ref_model: RLModel | None  # frozen reference (DPO, or a KL term)
    old_model: RLModel | None  # NFT's slowly moving "old" policy
    optimizer: torch.optim.Optimizer
    sample_mode: SampleMode
    k_steps: int  # denoising steps of the rollout sampler
    noise_level: float
    start: int  # the checkpoint iteration this call resumed from (0 for a fresh run)
    prior_wall: float  # wall seconds of the calls before this one
    logger: MetricsLogger | NullMetricsLogger
    rollouts: Rollouts
    t0: float  # perf_counter() when this call's training started
    deadline: float  # perf_counter() past which train.max_wall_minutes stops the run
    world: World = field(default_factory=World)  # the data-parallel learner ranks
    demos: Demonstrations | None = None  # [bc]'s demonstrations in the model's space (rl/demos.py)
    sharded: bool = False  # train.fsdp: ``model`` is the sharded learner, ``policy.model`` the whole copy
    seed_replay: SeedReplay | None = None  # rollout.seed_replay's pool of seeds in doubt (seed_replay.py)

    @property
    def out(self) -> Path:
        return Path(self.config.output.dir)

    def wall_s(self) -> float:
        """Wall seconds of the whole run so far, across resumes."""
        return self.prior_wall + time.perf_counter() - self.t0


def run_rl(
    config: RLConfig,
    *,
    resume: bool = True,
    overwrite: bool = False,
    stop_at_iteration: int | None = None,
    log: Callable[[str], None] = print,
) -> RLResult:
    """Train (or continue) the recipe; ``stop_at_iteration`` stops like a kill would (tests)."""
    tcfg = config.train
    world = world_from_env(tcfg.device)
    check_learner_world(config, world)
    if not world.is_main:
        log = _quiet  # rank 0 speaks for the run
    # a bad init fails before any folder is made
    init = resolve_init(config.init, log=log)
    policy = load_rl_adapter(init, torch.device(tcfg.device), config.rollout.noise_level, config.optim.freeze_vlm)
    if config.algo.critic_inputs == "privileged":
        attach_privileged_critic(policy, STATE_DIM + OBJECT_STATE_DIM, seed=tcfg.seed)
    demos = load_demos(config.bc, policy)  # a bad bc.data fails before any folder is made, too
    if demos is not None:
        log(
            f"bc: {len(demos)} demonstration frames ({demos.num_episodes} episodes) from {config.bc.data}, "
            f"coef {config.bc.coef} x {config.bc.decay}^iteration per optimizer step"
        )
    ckpt_path = None
    if world.is_main:
        ckpt_path = prepare_run_dir(config, Path(config.output.dir), RUNTIME_FIELDS, resume=resume, overwrite=overwrite)
    shared = broadcast_text(str(ckpt_path) if ckpt_path is not None else None, world)
    ckpt_path = Path(shared) if shared is not None else None
    configure_torch(tcfg.num_threads, tcfg.deterministic)
    run = _setup(config, policy, ckpt_path, log, world, demos)
    stop = min(tcfg.iterations, stop_at_iteration) if stop_at_iteration is not None else tcfg.iterations
    result = RLResult(run.out, run.start, False, run.start if ckpt_path is not None else None, None, run.prior_wall)
    try:
        if run.start == 0 and config.eval.initial and world.is_main:
            res = _evaluate(run, "iter_000000", config.eval.episodes_per_task)
            run.logger.log(0, {"eval_success": res["totals"]["success_rate"]})
            log(f"initial eval: {100 * res['totals']['success_rate']:.1f}% success")
        _train(run, stop, result, log)
        if (result.finished or result.iteration < stop) and world.is_main:  # finished, or stopped by the clock
            _export_and_evaluate(run, result, log)
    finally:
        run.rollouts.close()
        run.logger.close()
    barrier(world)
    return result


def _quiet(_: str) -> None:
    pass


def _setup(
    config: RLConfig,
    policy: RLAdapter,
    ckpt_path: Path | None,
    log: Callable[[str], None],
    world: World,
    demos: Demonstrations | None = None,
) -> _Run:
    """Phase setup: reference / old models, optimizer, restored from ``ckpt_path``; logger and rollout workers."""
    tcfg = config.train
    seed_everything(tcfg.seed)
    model = policy.model
    broadcast_parameters(model, world)  # identical starts on every learner rank
    _serve_with_rollout_steps(config, policy, log)
    method = get_method(config.trainer)
    ref_model = frozen_copy(model) if method.reference(config) else None
    old_model = frozen_copy(model) if method.old_model else None
    sharded = world.distributed and tcfg.fsdp
    if sharded:
        model = _sharded_learner(policy, world, log)
    elif tcfg.fsdp:
        log("train.fsdp shards over data-parallel learner processes (--nproc N); this run keeps whole tensors")
    optimizer = build_optimizer(model, config)
    start, prior_wall = 0, 0.0
    replay = (
        SeedReplay(config.rollout.seed_replay, config.rollout.seed_replay_pool) if config.rollout.seed_replay else None
    )
    if ckpt_path is not None:
        whole = policy.model if sharded else None
        start, prior_wall = _restore(ckpt_path, model, optimizer, old_model, whole, replay)
        log(f"resuming from {ckpt_path} (iteration {start})")
    mode = config.sample_mode
    k_steps = config.rollout.num_flow_steps or model.config.num_flow_steps
    noise_level = config.rollout.noise_level or model.config.noise_level
    log(
        f"{config.trainer}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters from {config.init}; "
        f"{config.rollout.episodes_per_iter} episodes x {tcfg.iterations} iterations on {config.env.num_envs} envs "
        f"({mode}, K={k_steps})"
    )
    logger: MetricsLogger | NullMetricsLogger = NullMetricsLogger()
    if world.is_main:
        logger = MetricsLogger(Path(config.output.dir), resume_step=start, tensorboard=config.output.tensorboard)
    if world.distributed:
        log(
            f"data parallel: {world.world_size} learner processes ({world.backend}); each collects its share "
            "of the episode groups and takes its share of each minibatch"
        )
    rollouts = make_rollouts(config, policy, world)
    if start > 0:  # Ray rollout workers were built from the init; a resumed learner's weights are the checkpoint's
        rollouts.sync(_sampled_model(config, old_model, policy.model))
    t0 = time.perf_counter()
    return _Run(
        config=config,
        policy=policy,
        model=model,
        ref_model=ref_model,
        old_model=old_model,
        optimizer=optimizer,
        sample_mode=mode,
        k_steps=k_steps,
        noise_level=noise_level,
        start=start,
        prior_wall=prior_wall,
        logger=logger,
        rollouts=rollouts,
        t0=t0,
        deadline=t0 + 60 * tcfg.max_wall_minutes - prior_wall if tcfg.max_wall_minutes else math.inf,
        world=world,
        demos=demos,
        sharded=sharded,
        seed_replay=replay,
    )


def _sharded_learner(policy: RLAdapter, world: World, log: Callable[[str], None]) -> RLModel:
    """``train.fsdp``: a copy of the policy's model, sharded over the learner ranks (FSDP2 units: the
    family's ``fsdp_units`` when its adapter names them, else every block of its ModuleList stacks)."""
    learner = copy.deepcopy(policy.model)
    # a checkpoint that mixes dtypes keeps them (the rollouts' whole copy must compute what the shards do):
    # each unit's minority dtype stays whole
    units = policy.fsdp_units(learner)
    fsdp.shard_model(learner, units=units, methods=fsdp.RL_FORWARD_METHODS, keep_dtypes=True)
    whole = sum(p.numel() for p in fsdp.replicated_params(learner))
    total = sum(p.numel() for p in learner.parameters())
    log(
        f"fsdp: learner parameters, gradients and AdamW state sharded over {world.world_size} processes ({whole} "
        f"of {total} whole); each keeps a whole copy for its rollouts"
    )
    return learner


def _serve_with_rollout_steps(config: RLConfig, policy: RLAdapter, log: Callable[[str], None]) -> None:
    """The policy is trained (and so evaluated and exported) for the sampler the rollouts use."""
    steps = config.rollout.num_flow_steps
    ckpt_steps = policy.model.config.num_flow_steps
    if steps is not None and steps != ckpt_steps:
        log(f"serving with {steps} denoising steps (rollout.num_flow_steps; the checkpoint has {ckpt_steps})")
        policy.set_num_flow_steps(steps)


# what the one line per iteration shows, in order (when the iteration logged it)
LINE_KEYS = (
    "train_success",
    "episode_return",
    "eval_success",
    "policy_loss",
    "value_loss",
    "nft_loss",
    "dpo_loss",
    "ratio_dev_first_mb",
    "kl_ref",
    "entropy",
    "grad_norm",
    "grad_cosine_split_half",
)


def iteration_line(it: int, total: int, metrics: dict[str, Any]) -> str:
    """``iter 3/10: train_success=0.5 episode_return=1.2 policy_loss=-0.013 ... (12.3 s)``: a log file's view."""
    shown = " ".join(f"{k}={metrics[k]:.4g}" for k in LINE_KEYS if isinstance(metrics.get(k), (int, float)))
    wall = sum(v for k, v in metrics.items() if k.startswith("time/") and not k.startswith("time/rollout_"))
    return f"iter {it}/{total}: {shown} ({wall:.1f} s)"


def _train(run: _Run, stop: int, result: RLResult, log: Callable[[str], None]) -> None:
    """The loop up to iteration ``stop``: the iteration's phases, the ratio gate, [eval], log, [checkpoint]."""
    config, tcfg = run.config, run.config.train
    it = run.start
    main = run.world.is_main
    progress = TrainProgress(  # off a terminal the iteration lines below are the progress
        tcfg.iterations, run.start, config.name, enabled=tcfg.progress and main, unit="iteration", plain_lines=False
    )
    with progress as bar:
        while it < stop:
            metrics = _iteration(run, it)
            it += 1
            _check_ratio_gate(metrics, it)
            out_of_time = any_rank(time.perf_counter() > run.deadline, run.world)
            last_iter = it == tcfg.iterations or out_of_time
            if config.eval.every and (it % config.eval.every == 0) and not last_iter and main:
                res = _evaluate(run, f"iter_{it:06d}", config.eval.episodes_per_task)
                metrics["eval_success"] = res["totals"]["success_rate"]
                result.eval_history.append((it, metrics["eval_success"]))
            run.logger.log(it, metrics)
            result.last_metrics = metrics
            log(iteration_line(it, tcfg.iterations, metrics))
            bar.update(it, {"train_success": metrics["train_success"], "eval": metrics.get("eval_success", "-")})
            collective = run.sharded or tcfg.checkpoint_format == "sharded"  # every rank gathers or writes
            if (it % tcfg.ckpt_every == 0 or last_iter) and (main or collective):
                _checkpoint(run, it)
            if config.output.plot and "eval_success" in metrics and main:
                _plot(run.out)
            if out_of_time:
                log(f"train.max_wall_minutes reached after iteration {it}; exporting what we have")
                break
    result.iteration = it
    result.finished = it >= tcfg.iterations
    result.total_wall_s = run.wall_s()


def _iteration(run: _Run, it: int) -> dict[str, Any]:
    """rollout -> reward -> old_logprob -> advantage -> update -> weight_sync, each timed; the metrics."""
    config = run.config
    phases = _Phases()
    t_iter = time.perf_counter()
    n_groups = config.rollout.episodes_per_iter // config.algo.group_size
    replayed = run.seed_replay.pick(n_groups) if run.seed_replay is not None else []
    specs = episode_specs(config, it, replayed)
    rollout: Rollout = phases.run("rollout", _collect, run, specs, _seed(config, it, 0))
    metrics: dict[str, Any] = phases.run("reward", _reward_stats, rollout)
    if run.seed_replay is not None:
        metrics.update(run.seed_replay.update(specs, rollout, it, replayed))
    metrics.update(phases.run("old_logprob", _check_rollout, rollout))
    gen = torch.Generator().manual_seed(_seed(config, it, 1))
    adv, adv_stats = phases.run("advantage", _advantage, config, rollout, gen)
    metrics.update(adv_stats)
    every = config.train.grad_cosine_every
    if every and it % every == 0:  # before the update, on its own generator: the update is unchanged
        health_gen = torch.Generator().manual_seed(_seed(config, it, 2))
        metrics.update(phases.run("health", _health, run, rollout, adv, health_gen, it))
    metrics.update(phases.run("update", _update, run, rollout, adv, gen, it))
    phases.run("weight_sync", _sync, run, it)
    iter_wall = time.perf_counter() - t_iter
    metrics.update(phases.times)
    metrics.update({f"time/rollout_{k}": round(v, 4) for k, v in rollout.wall_s.items()})
    metrics.update(
        {
            "env_steps": rollout.env_steps,
            "decisions": rollout.num_decisions,
            "env_steps_per_s": rollout.env_steps / max(iter_wall, 1e-9),
            "iter_wall_s": iter_wall,
            "wall_s": run.wall_s(),
        }
    )
    return metrics


def _check_ratio_gate(metrics: dict[str, Any], it: int) -> None:
    dev = metrics.get("ratio_dev_first_mb")
    if dev is not None and dev > RATIO_GATE:
        raise RatioGateError(
            f"iteration {it}: importance ratio on the first minibatch deviates from 1 by {dev:.2e} "
            f"(> {RATIO_GATE}); the learner does not recompute the rollout's log-probs "
            "(dropout, a different noise_level / num_flow_steps, or weights not synced)"
        )


def _evaluate(run: _Run, label: str, episodes: int) -> dict[str, Any]:
    """Phase eval: a copy of the current model, served with the ODE, on held-out layouts."""
    served = run.policy.servable(copy.deepcopy(unwrap(run.policy.model)))
    config = run.config
    return evaluate_policy(served, _eval_cfg(config, episodes), run.out / "eval" / label, f"{config.trainer}:{label}")


def _checkpoint(run: _Run, at: int) -> None:
    """Phase checkpoint: model, optimizer, NFT's old model, the global RNGs and the wall time (sharded:
    every rank gathers, rank 0 writes the one-process form; ``train.checkpoint_format = "sharded"``: every
    rank writes its own shards of learner and optimizer, rank 0 the rest)."""
    keep = run.config.train.keep_checkpoints
    if run.config.train.checkpoint_format == "sharded":
        wall = run.wall_s()
        state = {
            "old_model": run.old_model.state_dict() if run.old_model is not None else None,
            "rng": capture_rng_state(),
            "wall_s": wall,
            "seed_replay": run.seed_replay.state_dict() if run.seed_replay is not None else None,
        }
        root, info = run.out / CHECKPOINTS, {"wall_s": round(wall, 1)}
        main = run.world.is_main
        save_sharded_checkpoint(root, at, run.model, run.optimizer, state, info, keep, main, lambda: barrier(run.world))
        return
    if run.sharded:
        weights, optim_sd = fsdp.full_state(run.model, run.optimizer)
        if not run.world.is_main:
            return
    else:
        weights, optim_sd = run.model.state_dict(), run.optimizer.state_dict()
    wall = run.wall_s()
    state = {
        "optimizer": optim_sd,
        "old_model": run.old_model.state_dict() if run.old_model is not None else None,
        "rng": capture_rng_state(),
        "wall_s": wall,
        "seed_replay": run.seed_replay.state_dict() if run.seed_replay is not None else None,
    }
    save_checkpoint(run.out / CHECKPOINTS, at, weights, state, {"wall_s": round(wall, 1)}, keep)


def _export_and_evaluate(run: _Run, result: RLResult, log: Callable[[str], None]) -> None:
    """Phase export: ``final/`` (a ``FlowPolicy`` folder), the final evaluation and the learning curve."""
    config, it = run.config, result.iteration
    served = run.policy.servable(copy.deepcopy(unwrap(run.policy.model)))
    result.final_dir = export_policy(served, run.out / "final", source=f"{config.trainer}:{config.name}:iter{it}")
    log(f"final policy: {result.final_dir} ({result.total_wall_s / 60:.1f} min)")
    if config.eval.final:
        res = _evaluate(run, "final", config.eval.episodes(final=True))
        result.final_eval = res
        run.logger.log(it, {"eval_success": res["totals"]["success_rate"], "final_eval": 1})
        log(f"final eval: {100 * res['totals']['success_rate']:.1f}% success")
    if config.output.plot:
        _plot(run.out)


def _advantage(config: RLConfig, rollout: Rollout, gen: torch.Generator) -> tuple[Any, dict[str, float]]:
    """Phase advantage: the algorithm's targets (GAE, group-normalised success, NFT's optimality, DPO's pairs)."""
    return get_method(config.trainer).advantage(rollout, config.algo, gen)


def _update_inputs(run: _Run, gen: torch.Generator, iteration: int) -> UpdateInputs:
    """The run's models, optimizer and sampler settings (same field names), plus this iteration's generator
    and demonstration loss."""
    own = ("generator", "iteration", "aux")
    shared = {f.name: getattr(run, f.name) for f in fields(UpdateInputs) if f.name not in own and hasattr(run, f.name)}
    aux = None
    if run.demos is not None:
        weights = sample_weights(run.demos.prompts, run.config.bc.task_weighting)
        aux = DemoTerm.for_iteration(run.demos, weights, run.config.bc, iteration, _seed(run.config, iteration, 3))
    return UpdateInputs(**shared, generator=gen, iteration=iteration, aux=aux)


def _health(run: _Run, rollout: Rollout, adv: Any, gen: torch.Generator, iteration: int) -> dict[str, float]:
    """Phase health: the split-half gradient cosine of the algorithm's loss (no optimizer step)."""
    return get_method(run.config.trainer).health(_update_inputs(run, gen, iteration), rollout, adv)


def _update(run: _Run, rollout: Rollout, adv: Any, gen: torch.Generator, iteration: int) -> dict[str, float]:
    """Phase update: the algorithm's epochs of minibatches (``learner.py``, ``regression.py``)."""
    return get_method(run.config.trainer).update(_update_inputs(run, gen, iteration), rollout, adv)


def _sampled_model(config: RLConfig, old_model: RLModel | None, whole: RLModel) -> RLModel:
    """The model the rollouts sample: NFT's old policy with ``algo.nft_sampler = "old"`` (DiffusionNFT's
    data collection), else the current one (``whole``)."""
    return old_model if old_model is not None and config.algo.nft_sampler == "old" else whole


def _samples_from_old(run: _Run) -> bool:
    return _sampled_model(run.config, run.old_model, run.policy.model) is not run.policy.model


def _collect(run: _Run, specs: Any, seed: int) -> Rollout:
    """Phase rollout. In-process rollouts sample from the policy's own module, so when they must sample
    the old policy its parameters trade places with the old policy's for the rollout (and back); Ray
    workers were sent the old policy's weights in weight_sync instead."""
    local = isinstance(getattr(run.rollouts, "inner", run.rollouts), LocalRollouts)
    if not (local and _samples_from_old(run)):
        return run.rollouts.collect(specs, seed)
    assert run.old_model is not None
    pairs = list(zip(run.policy.model.parameters(), run.old_model.parameters(), strict=True))
    for p, po in pairs:
        p.data, po.data = po.data, p.data
    try:
        return run.rollouts.collect(specs, seed)
    finally:
        for p, po in pairs:
            p.data, po.data = po.data, p.data


def nft_old_decay(algo: Any, iteration: int) -> float:
    """The old policy's EMA decay after iteration ``iteration`` (0-based): ``nft_old_decay``, or with
    ``nft_old_decay_ramp`` rising from 0 by that much per iteration up to it."""
    if algo.nft_old_decay_ramp <= 0:
        return float(algo.nft_old_decay)
    return float(min(algo.nft_old_decay, algo.nft_old_decay_ramp * iteration))


def _sync(run: _Run, iteration: int) -> None:
    """Phase weight_sync: NFT's old policy moves toward the new weights; the rollout model (the shards
    gathered into the whole copy, ``train.fsdp``) and rollout workers get the weights they sample with
    (the new ones, or the old policy's: ``_samples_from_old``)."""
    whole = run.policy.model
    if run.sharded:
        fsdp.copy_full_into(run.model, whole)
    if run.old_model is not None:  # NFT: old <- decay * old + (1 - decay) * theta
        d = nft_old_decay(run.config.algo, iteration)
        with torch.no_grad():
            for po, p in zip(run.old_model.parameters(), whole.parameters()):
                po.lerp_(p.detach(), 1.0 - d)
    run.rollouts.sync(_sampled_model(run.config, run.old_model, whole))


def _plot(out: Path) -> None:
    from cosmos_robot_trainers.common.plot import plot_learning_curve

    plot_learning_curve(out, keys=CURVE_KEYS)


def _restore(
    path: Path,
    model: RLModel,
    optimizer: torch.optim.Optimizer,
    old_model: RLModel | None,
    whole: RLModel | None = None,
    replay: SeedReplay | None = None,
) -> tuple[int, float]:
    """Load a checkpoint into the learner (``whole`` given: ``model`` is sharded and ``whole`` the
    rollouts' copy, both loaded from the one-process form) and the seed-replay pool it saved."""
    ckpt = load_checkpoint(path)
    if ckpt.sharded is not None:  # each rank reads its shards, whatever the world size that wrote them
        load_sharded_into(ckpt.sharded, model, optimizer)
        if whole is not None:
            fsdp.copy_full_into(model, whole)
    elif whole is not None:
        whole.load_state_dict(ckpt.model)  # first: sharding the state below turns its entries into DTensors
        fsdp.load_full_state(model, optimizer, ckpt.model, ckpt.state["optimizer"])
    else:
        model.load_state_dict(ckpt.model)
        with fsdp.kernels_kept(optimizer):  # a sharded run's checkpoint saved tensor-by-tensor steps
            optimizer.load_state_dict(ckpt.state["optimizer"])
    if old_model is not None:
        if ckpt.state.get("old_model") is None:
            raise ValueError(f"{path}: saved without NFT's old model")
        old_model.load_state_dict(ckpt.state["old_model"])
    restore_rng_state(ckpt.state["rng"])
    if replay is not None:
        replay.load_state_dict(ckpt.state.get("seed_replay") or [])
    return ckpt.step, float(ckpt.state.get("wall_s", 0.0))
