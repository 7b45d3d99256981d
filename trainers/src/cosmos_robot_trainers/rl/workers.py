"""Rollout workers in this process (default) or as Ray actors (``rollout.num_workers > 1``).

Why two shapes behind one interface (``collect(specs, seed)``, ``sync(model)``, ``close()``): the
driver loop must not care where episodes run. In-process, the rollout worker shares the learner's
model object, so the weight-sync phase is free. With Ray, each actor owns its own envs and a copy of
the policy (rebuilt from the starting checkpoint folder), the episode schedule is dealt out across
actors, and the sync phase ships the learner's weights as numpy arrays through Ray's object store
once per iteration (``ray.put`` once, every actor reads the same object). Ray is an optional extra
(``pip install 'cosmos-robot-trainers[ray]'``); asking for it without it installed names the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.init_source import resolve_init
from cosmos_robot_trainers.rl.config import RLConfig
from cosmos_robot_trainers.rl.policies import RLAdapter, RLModel, load_rl_adapter
from cosmos_robot_trainers.rl.rollout import EpisodeSpec, Rollout, RolloutWorker, concat_rollouts

__all__ = ["LocalRollouts", "RayRollouts", "make_rollouts"]


class LocalRollouts:
    """One ``RolloutWorker`` in this process, sharing the learner's policy object."""

    def __init__(self, config: RLConfig, policy: RLAdapter) -> None:
        self.worker = RolloutWorker(config, policy)

    def collect(self, specs: Sequence[EpisodeSpec], seed: int) -> Rollout:
        return self.worker.collect(specs, seed)

    def sync(self, model: RLModel) -> None:
        """Nothing to do: the worker samples from the learner's own model."""

    def close(self) -> None:
        self.worker.close()


class _RayWorker:
    """The body of one Ray actor: a ``RolloutWorker`` over its own envs and policy copy."""

    def __init__(self, config_data: dict[str, Any], num_envs: int, threads: int) -> None:
        torch.set_num_threads(threads)
        config = RLConfig.model_validate(config_data)
        policy = load_rl_adapter(
            resolve_init(config.init), noise_level=config.rollout.noise_level, freeze_vlm=config.optim.freeze_vlm
        )
        if config.rollout.num_flow_steps is not None:
            policy.set_num_flow_steps(config.rollout.num_flow_steps)
        self.worker = RolloutWorker(config, policy, num_envs=num_envs)

    def set_weights(self, state: dict[str, np.ndarray]) -> None:
        self.worker.set_weights(state)

    def collect(self, specs: list[tuple[int, str, int, int]], seed: int) -> Rollout:
        return self.worker.collect([EpisodeSpec(*s) for s in specs], seed)

    def close(self) -> None:
        self.worker.close()


class RayRollouts:
    """``num_workers`` Ray actors, the envs split between them; episodes dealt out round-robin by group."""

    def __init__(self, config: RLConfig) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ImportError(
                "rollout.num_workers > 1 runs rollout workers as Ray actors, but ray is not installed: "
                "pip install 'cosmos-robot-trainers[ray]' (or set rollout.num_workers = 1)"
            ) from exc
        self.ray = ray
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        n = config.rollout.num_workers
        share = [config.env.num_envs // n + (1 if w < config.env.num_envs % n else 0) for w in range(n)]
        actor = ray.remote(num_cpus=0)(_RayWorker)
        data = config.model_dump(mode="json")
        self.actors: list[Any] = [actor.remote(data, share[w], 1) for w in range(n)]

    def collect(self, specs: Sequence[EpisodeSpec], seed: int) -> Rollout:
        groups = sorted({s.group for s in specs})
        n = len(self.actors)
        parts: list[list[EpisodeSpec]] = [[] for _ in range(n)]
        for s in specs:
            parts[groups.index(s.group) % n].append(s)
        futures = [
            a.collect.remote([(s.index, s.task, s.seed, s.group) for s in part], seed + 7919 * w)
            for w, (a, part) in enumerate(zip(self.actors, parts))
            if part
        ]
        return concat_rollouts(self.ray.get(futures))

    def sync(self, model: RLModel) -> None:
        state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        ref = self.ray.put(state)
        self.ray.get([a.set_weights.remote(ref) for a in self.actors])

    def close(self) -> None:
        try:
            self.ray.get([a.close.remote() for a in self.actors])
        finally:
            for a in self.actors:
                self.ray.kill(a)


def make_rollouts(config: RLConfig, policy: RLAdapter) -> LocalRollouts | RayRollouts:
    """In-process rollouts for one worker, Ray actors for more."""
    if config.rollout.num_workers == 1:
        return LocalRollouts(config, policy)
    return RayRollouts(config)
