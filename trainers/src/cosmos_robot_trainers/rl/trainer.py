"""The RL driver: a loop of named, timed phases over iterations (house style item 8, verl's ``fit``).

    rollout -> reward -> old_logprob -> advantage -> update -> weight_sync  [-> eval] [-> checkpoint]

- rollout: the iteration's episode schedule on the vectorized envs (``rollout.py``), stochastic
  sampling with log-probs (Flow-SDE / Flow-Noise; NFT and DPO may use plain ODE from random noise);
- reward: per-episode success and return, training success rate by task;
- old_logprob: the stored rollout log-probs and values are the "old" ones (the rollout model is the
  learner's model); this phase checks them (finite, right shapes) and, with a KL term, nothing else;
- advantage: GAE (joint PPO), group-normalised success (GRPO, NFT's optimality), preference pairs (DPO);
- update: the algorithm's epochs of minibatches (``learner.py``); the first minibatch's ratio must be 1
  within ``RATIO_GATE`` or the run stops with an error naming the cause;
- weight_sync: Ray workers receive the new weights; NFT's "old" policy moves toward the current one.

Exact resume: per-iteration generators are seeded from (train.seed, iteration), episode layouts
from (env.seed, iteration), and a checkpoint holds the model, the optimizer, NFT's old model, the
global RNG state, the iteration and the wall time, so a run killed and resumed repeats the
uninterrupted run's numbers. ``final/`` is a ``FlowPolicy`` folder (``serve --ckpt``, ``eval --ckpt``).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cosmos_robot_trainers.common import (
    MetricsLogger,
    TrainProgress,
    capture_rng_state,
    configure_torch,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
    seed_everything,
)
from cosmos_robot_trainers.common.rundir import CHECKPOINTS, prepare_run_dir
from cosmos_robot_trainers.rl.advantage import dpo_pairs, group_advantages, nft_optimality, ppo_advantages
from cosmos_robot_trainers.rl.config import RUNTIME_FIELDS, RLConfig
from cosmos_robot_trainers.rl.learner import (
    RATIO_GATE,
    build_optimizer,
    update_dpo,
    update_nft,
    update_policy_gradient,
)
from cosmos_robot_trainers.rl.policies import RLModel, frozen_copy, load_rl_policy
from cosmos_robot_trainers.rl.rollout import Rollout, episode_specs
from cosmos_robot_trainers.rl.workers import make_rollouts
from cosmos_robot_trainers.sft.config import EvalHookConfig
from cosmos_robot_trainers.sft.export import evaluate_policy, export_policy

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
    e = config.eval
    return EvalHookConfig(
        suite=config.env.suite,
        tasks=list(config.env.tasks),
        episodes_per_task=episodes,
        num_envs=e.num_envs,
        replan_steps=config.rollout.replan_steps,
        image_size=config.env.image_size,
        seed=e.seed,
        vector_mode=e.vector_mode,
    )


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
    out = Path(config.output.dir)
    device = torch.device(tcfg.device)
    # a bad init fails before any folder is made
    policy = load_rl_policy(config.init, device, config.rollout.noise_level, config.optim.freeze_vlm)
    ckpt_path = prepare_run_dir(config, out, RUNTIME_FIELDS, resume=resume, overwrite=overwrite)
    configure_torch(tcfg.num_threads, tcfg.deterministic)
    seed_everything(tcfg.seed)
    model = policy.model
    steps = config.rollout.num_flow_steps
    if steps is not None and steps != model.config.num_flow_steps:
        # the policy is trained (and so evaluated and exported) for the sampler the rollouts use
        ckpt_steps = model.config.num_flow_steps
        log(f"serving with {steps} denoising steps (rollout.num_flow_steps; the checkpoint has {ckpt_steps})")
        policy.set_num_flow_steps(steps)
    ref_model = frozen_copy(model) if (config.trainer == "dpo" or config.algo.kl_coef > 0) else None
    old_model = frozen_copy(model) if config.trainer == "nft" else None
    optimizer = build_optimizer(model, config)
    start, prior_wall = 0, 0.0
    if ckpt_path is not None:
        start, prior_wall = _restore(ckpt_path, model, optimizer, old_model)
        log(f"resuming from {ckpt_path} (iteration {start})")
    mode = config.rollout.sample_mode
    k_steps = config.rollout.num_flow_steps or model.config.num_flow_steps
    noise_level = config.rollout.noise_level or model.config.noise_level
    log(
        f"{config.trainer}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters from {config.init}; "
        f"{config.rollout.episodes_per_iter} episodes x {tcfg.iterations} iterations on {config.env.num_envs} envs "
        f"({mode}, K={k_steps})"
    )
    stop = min(tcfg.iterations, stop_at_iteration) if stop_at_iteration is not None else tcfg.iterations
    logger = MetricsLogger(out, resume_step=start, tensorboard=config.output.tensorboard)
    result = RLResult(out, start, False, start if ckpt_path is not None else None, None, prior_wall)
    rollouts = make_rollouts(config, policy)
    t0 = time.perf_counter()
    deadline = t0 + 60 * tcfg.max_wall_minutes - prior_wall if tcfg.max_wall_minutes else math.inf

    def evaluate(label: str, episodes: int) -> dict[str, Any]:
        served = policy.servable(copy.deepcopy(model))
        return evaluate_policy(served, _eval_cfg(config, episodes), out / "eval" / label, f"{config.trainer}:{label}")

    def checkpoint(at: int) -> None:
        wall = prior_wall + time.perf_counter() - t0
        state = {
            "optimizer": optimizer.state_dict(),
            "old_model": old_model.state_dict() if old_model is not None else None,
            "rng": capture_rng_state(),
            "wall_s": wall,
        }
        save_checkpoint(
            out / CHECKPOINTS, at, model.state_dict(), state, {"wall_s": round(wall, 1)}, tcfg.keep_checkpoints
        )

    try:
        if start == 0 and config.eval.initial:
            res = evaluate("iter_000000", config.eval.episodes_per_task)
            logger.log(0, {"eval_success": res["totals"]["success_rate"]})
            log(f"initial eval: {100 * res['totals']['success_rate']:.1f}% success")
        it = start
        with TrainProgress(tcfg.iterations, start, config.name, enabled=tcfg.progress) as bar:
            while it < stop:
                phases = _Phases()
                t_iter = time.perf_counter()
                specs = episode_specs(config, it)
                rollout: Rollout = phases.run("rollout", rollouts.collect, specs, _seed(config, it, 0))
                metrics: dict[str, Any] = phases.run("reward", _reward_stats, rollout)
                metrics.update(phases.run("old_logprob", _check_rollout, rollout))
                gen = torch.Generator().manual_seed(_seed(config, it, 1))
                args = (config, model, optimizer, rollout, gen, it, ref_model, old_model, mode, k_steps, noise_level)
                metrics.update(phases.run("advantage+update", _update, *args))
                phases.run("weight_sync", _sync, config, rollouts, model, old_model)
                it += 1
                iter_wall = time.perf_counter() - t_iter
                metrics.update(phases.times)
                metrics.update({f"time/rollout_{k}": round(v, 4) for k, v in rollout.wall_s.items()})
                metrics.update(
                    {
                        "env_steps": rollout.env_steps,
                        "decisions": rollout.num_decisions,
                        "env_steps_per_s": rollout.env_steps / max(iter_wall, 1e-9),
                        "iter_wall_s": iter_wall,
                        "wall_s": prior_wall + time.perf_counter() - t0,
                    }
                )
                dev = metrics.get("ratio_dev_first_mb")
                if dev is not None and dev > RATIO_GATE:
                    raise RatioGateError(
                        f"iteration {it}: importance ratio on the first minibatch deviates from 1 by {dev:.2e} "
                        f"(> {RATIO_GATE}); the learner does not recompute the rollout's log-probs "
                        "(dropout, a different noise_level / num_flow_steps, or weights not synced)"
                    )
                out_of_time = time.perf_counter() > deadline
                last_iter = it == tcfg.iterations or out_of_time
                if config.eval.every and (it % config.eval.every == 0) and not last_iter:
                    res = evaluate(f"iter_{it:06d}", config.eval.episodes_per_task)
                    metrics["eval_success"] = res["totals"]["success_rate"]
                    result.eval_history.append((it, metrics["eval_success"]))
                logger.log(it, metrics)
                result.last_metrics = metrics
                bar.update(it, {"train_success": metrics["train_success"], "eval": metrics.get("eval_success", "-")})
                if it % tcfg.ckpt_every == 0 or last_iter:
                    checkpoint(it)
                if config.output.plot and "eval_success" in metrics:
                    _plot(out)
                if out_of_time:
                    log(f"train.max_wall_minutes reached after iteration {it}; exporting what we have")
                    break
        result.iteration = it
        result.finished = it >= tcfg.iterations
        result.total_wall_s = prior_wall + time.perf_counter() - t0
        if result.finished or it < stop:  # finished, or stopped by the clock
            served = policy.servable(copy.deepcopy(model))
            result.final_dir = export_policy(served, out / "final")
            log(f"final policy: {result.final_dir} ({result.total_wall_s / 60:.1f} min)")
            if config.eval.final:
                res = evaluate("final", config.eval.final_episodes_per_task)
                result.final_eval = res
                logger.log(it, {"eval_success": res["totals"]["success_rate"], "final_eval": 1})
                log(f"final eval: {100 * res['totals']['success_rate']:.1f}% success")
            if config.output.plot:
                _plot(out)
    finally:
        rollouts.close()
        logger.close()
    return result


def _update(
    config: RLConfig,
    model: RLModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    gen: torch.Generator,
    iteration: int,
    ref_model: RLModel | None,
    old_model: RLModel | None,
    mode: Any,
    k_steps: int,
    noise_level: float,
) -> dict[str, float]:
    algo = config.algo
    if config.trainer in ("joint_ppo", "grpo"):
        adv = ppo_advantages(rollout, algo) if config.trainer == "joint_ppo" else group_advantages(rollout, algo)
        warm = config.trainer == "joint_ppo" and iteration < algo.critic_warmup_iters
        out = update_policy_gradient(
            model,
            optimizer,
            rollout,
            adv,
            config,
            gen,
            sample_mode=mode,
            num_flow_steps=k_steps,
            noise_level=noise_level,
            train_policy=not warm,
            ref_model=ref_model,
        )
        return {**adv.stats, **out}
    if config.trainer == "nft":
        assert old_model is not None
        adv = nft_optimality(rollout, algo)
        return {**adv.stats, **update_nft(model, old_model, optimizer, rollout, adv, config, gen)}
    assert ref_model is not None
    pairs = dpo_pairs(rollout, algo, gen)
    return {"pairs": float(len(pairs)), **update_dpo(model, ref_model, optimizer, rollout, pairs, config, gen)}


def _sync(config: RLConfig, rollouts: Any, model: RLModel, old_model: RLModel | None) -> None:
    rollouts.sync(model)
    if old_model is not None:  # NFT: old <- decay * old + (1 - decay) * theta
        d = config.algo.nft_old_decay
        with torch.no_grad():
            for po, p in zip(old_model.parameters(), model.parameters()):
                po.lerp_(p.detach(), 1.0 - d)


def _plot(out: Path) -> None:
    from cosmos_robot_trainers.common.plot import plot_learning_curve

    plot_learning_curve(out, keys=CURVE_KEYS)


def _restore(
    path: Path, model: RLModel, optimizer: torch.optim.Optimizer, old_model: RLModel | None
) -> tuple[int, float]:
    ckpt = load_checkpoint(path)
    model.load_state_dict(ckpt.model)
    optimizer.load_state_dict(ckpt.state["optimizer"])
    if old_model is not None:
        if ckpt.state.get("old_model") is None:
            raise ValueError(f"{path}: saved without NFT's old model")
        old_model.load_state_dict(ckpt.state["old_model"])
    restore_rng_state(ckpt.state["rng"])
    return ckpt.step, float(ckpt.state.get("wall_s", 0.0))
