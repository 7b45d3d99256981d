"""The sampler gate: does the rollout sampler act like the policy we serve and score?

Why: PPO improves the policy its rollouts sample. When that sampler differs from serving's (fresh noise
per chunk, a stochastic step), RL optimises a weaker policy than the one evaluated: the diagnosis
measured served ODE 79% against fresh-noise ODE 66% on the strong checkpoint. The gate runs the same
episodes (same tasks, same layout seeds) twice through the rollout worker: once with the recipe's
sampler (``rollout.sample_mode`` from ``rollout.start_noise``) and once with the serving sampler (ODE
from the serving noise, which reproduces ``FlowPolicy.infer_batch`` exactly), and reports both success
rates with Wilson intervals and their gap. Paired seeds keep the layout luck out of the gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cosmos_robot_envs.eval.stats import wilson_interval
from cosmos_robot_trainers.rl.config import RLConfig
from cosmos_robot_trainers.rl.policies import RLAdapter
from cosmos_robot_trainers.rl.rollout import EpisodeSpec, RolloutWorker, train_tasks

__all__ = ["SamplerGap", "gate_specs", "sampler_gap", "serving_sampler"]


@dataclass
class SamplerGap:
    """Success of the rollout sampler and of the serving sampler on the same episodes."""

    episodes: int
    rollout_successes: int
    serving_successes: int
    per_task: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # task -> (episodes, rollout, serving)

    @property
    def gap_points(self) -> float:
        """Serving minus rollout success, in percentage points (positive: the rollout sampler is weaker)."""
        return 100.0 * (self.serving_successes - self.rollout_successes) / self.episodes

    def summary(self) -> dict[str, Any]:
        def rate(k: int) -> dict[str, float]:
            lo, hi = wilson_interval(k, self.episodes)
            return {"success": k / self.episodes, "wilson_low": lo, "wilson_high": hi}

        return {
            "episodes": self.episodes,
            "rollout": rate(self.rollout_successes),
            "serving": rate(self.serving_successes),
            "gap_points": self.gap_points,
            "per_task": {t: {"episodes": n, "rollout": r, "serving": s} for t, (n, r, s) in self.per_task.items()},
        }


def gate_specs(config: RLConfig, episodes_per_task: int, seed: int = 1000) -> list[EpisodeSpec]:
    """``episodes_per_task`` episodes of each training task on layout seeds ``seed + i`` (eval-style)."""
    specs: list[EpisodeSpec] = []
    for task in train_tasks(config):
        for i in range(episodes_per_task):
            specs.append(EpisodeSpec(len(specs), task, seed + i, len(specs)))
    return specs


def serving_sampler(config: RLConfig) -> RLConfig:
    """``config`` with the serving sampler: ODE from the serving noise (what ``serve`` and ``eval`` run)."""
    rollout = config.rollout.model_copy(update={"sample_mode": "ode", "start_noise": "serving"})
    return config.model_copy(update={"rollout": rollout, "algo": config.algo.model_copy(update={"group_size": 1})})


def _successes(config: RLConfig, adapter: RLAdapter, specs: list[EpisodeSpec], seed: int) -> list[float]:
    worker = RolloutWorker(config, adapter)
    try:
        return worker.collect(specs, seed).ep_success.tolist()
    finally:
        worker.close()


def sampler_gap(config: RLConfig, adapter: RLAdapter, episodes_per_task: int, seed: int = 1000) -> SamplerGap:
    """Run ``gate_specs`` with the recipe's sampler and with the serving sampler; count successes."""
    specs = gate_specs(config, episodes_per_task, seed)
    rollout = _successes(config, adapter, specs, seed)
    serving = _successes(serving_sampler(config), adapter, specs, seed)
    per_task: dict[str, tuple[int, int, int]] = {}
    for spec, r, s in zip(specs, rollout, serving):
        n, rr, ss = per_task.get(spec.task, (0, 0, 0))
        per_task[spec.task] = (n + 1, rr + int(r), ss + int(s))
    return SamplerGap(len(specs), int(sum(rollout)), int(sum(serving)), per_task)
