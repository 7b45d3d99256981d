"""Rollout workers in this process (default) or as Ray actors (``rollout.num_workers > 1``), and the
share of each data-parallel learner rank.

Why two shapes behind one interface (``collect(specs, seed)``, ``sync(model)``, ``close()``): the
driver loop must not care where episodes run. In-process, the rollout worker shares the learner's
model object, so the weight-sync phase is free. With Ray, each actor owns its own envs and a copy of
the policy (rebuilt from the starting checkpoint folder), the episode schedule is dealt out across
actors, and the sync phase ships the learner's weights as numpy arrays through Ray's object store
once per iteration (``ray.put`` once, every actor reads the same object), or with
``rollout.weight_sync = "collective"`` broadcasts them in a process group of the learner and its
actors (common/weight_sync.py: NCCL between GPUs, gloo otherwise). Ray is an optional extra
(``pip install 'cosmos-robot-trainers[ray]'``); asking for it without it installed names the fix.

Data-parallel learners (``DataParallelRollouts``, under ``torchrun`` / ``train --nproc N``): the
iteration's episode groups are dealt out to the ranks exactly as ``RayRollouts`` deals them to its
actors (``deal_specs``, ``worker_seed``), each rank collects its part on its share of ``env.num_envs``
(in process, or through its own Ray actors), and the parts are joined on every rank
(``gather_rollout``). So N learner ranks with one worker each collect what one learner with N Ray
workers collects, and every rank computes the same advantages. All ranks join one Ray instance
(``connect_ray``): rank 0 starts it, or joins ``RAY_ADDRESS``, and tells the others where it is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from cosmos_robot.config import ConfigError
from cosmos_robot.distributed import World, broadcast_text
from cosmos_robot.policies.init_source import resolve_init
from cosmos_robot_trainers.rl.config import RLConfig
from cosmos_robot_trainers.rl.policies import RLAdapter, RLModel, load_rl_adapter
from cosmos_robot_trainers.rl.rollout import EpisodeSpec, Rollout, RolloutWorker, concat_rollouts, gather_rollout

__all__ = [
    "DataParallelRollouts",
    "LocalRollouts",
    "RayRollouts",
    "connect_ray",
    "deal_specs",
    "check_learner_world",
    "env_shares",
    "make_rollouts",
    "worker_seed",
]


_RAY_AUTH_MODE = "RAY_AUTH_MODE"


def deal_specs(specs: Sequence[EpisodeSpec], n: int) -> list[list[EpisodeSpec]]:
    """``specs`` dealt to ``n`` workers round-robin by group (a group's episodes stay together: GRPO,
    NFT and DPO compare them)."""
    groups = sorted({s.group for s in specs})
    where = {g: i % n for i, g in enumerate(groups)}
    parts: list[list[EpisodeSpec]] = [[] for _ in range(n)]
    for s in specs:
        parts[where[s.group]].append(s)
    return parts


def worker_seed(seed: int, worker: int) -> int:
    """The sampling seed of worker ``worker``'s part of an iteration."""
    return seed + 7919 * worker


def env_shares(num_envs: int, n: int, what: str = "rollout workers") -> list[int]:
    """``num_envs`` split over ``n`` workers as evenly as possible (every worker needs one)."""
    if num_envs < n:
        raise ConfigError(f"env.num_envs={num_envs} is fewer than the {n} {what}: each needs at least one env")
    return [num_envs // n + (1 if w < num_envs % n else 0) for w in range(n)]


def check_learner_world(config: RLConfig, world: World) -> None:
    """Refuse, before any folder is made, a learner world the iteration cannot be split over: every
    process needs at least one env and one episode group."""
    if not world.distributed:
        return
    env_shares(config.env.num_envs, world.world_size, "learner processes")
    groups = config.rollout.episodes_per_iter // config.algo.group_size
    if groups < world.world_size:
        raise ConfigError(
            f"rollout.episodes_per_iter / algo.group_size = {groups} episode groups per iteration for "
            f"{world.world_size} learner processes: each needs at least one"
        )


def connect_ray(world: World) -> Any:
    """Ray, initialised once for the run: rank 0 starts a local instance (or joins ``RAY_ADDRESS``, a
    cluster started with ``ray start``) and the other learner ranks join the instance rank 0 is on."""
    opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if world.is_main:
        ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, **opts)
        # where the instance is, and its authentication mode: a local instance that Ray 2.5x starts turns
        # token authentication on in rank 0's process only (the token itself is in ~/.ray/auth_token or
        # RAY_AUTH_TOKEN, which the other ranks read as Ray does; it does not travel here)
        where = f"{ray.get_runtime_context().gcs_address}\n{os.environ.get(_RAY_AUTH_MODE, '')}"
        broadcast_text(where, world)
        return ray
    address, _, mode = (broadcast_text(None, world) or "").partition("\n")
    if mode:  # before Ray is imported: it reads the mode once
        os.environ.setdefault(_RAY_AUTH_MODE, mode)
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address, **opts)
    return ray


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "rollout.num_workers > 1 and env.vector_mode = 'ray' run on Ray, but ray is not installed: "
            "pip install 'cosmos-robot-trainers[ray]'"
        ) from exc
    return ray


class LocalRollouts:
    """One ``RolloutWorker`` in this process, sharing the learner's policy object."""

    def __init__(self, config: RLConfig, policy: RLAdapter, num_envs: int | None = None) -> None:
        self.worker = RolloutWorker(config, policy, num_envs=num_envs)

    def collect(self, specs: Sequence[EpisodeSpec], seed: int) -> Rollout:
        return self.worker.collect(specs, seed)

    def sync(self, model: RLModel) -> None:
        """Nothing to do: the worker samples from the learner's own model."""

    def close(self) -> None:
        self.worker.close()


class _RayWorker:
    """The body of one Ray actor: a ``RolloutWorker`` over its own envs and policy copy (on the GPU Ray
    gave it, when its bundle has a GPU share)."""

    def __init__(self, config_data: dict[str, Any], num_envs: int, threads: int) -> None:
        torch.set_num_threads(threads)
        config = RLConfig.model_validate(config_data)
        device = torch.device("cuda" if config.rollout.worker_gpus > 0 else "cpu")
        policy = load_rl_adapter(
            resolve_init(config.init),
            device,
            noise_level=config.rollout.noise_level,
            freeze_vlm=config.optim.freeze_vlm,
        )
        if config.rollout.num_flow_steps is not None:
            policy.set_num_flow_steps(config.rollout.num_flow_steps)
        self.worker = RolloutWorker(config, policy, num_envs=num_envs)

    def set_weights(self, state: dict[str, np.ndarray]) -> None:
        self.worker.set_weights(state)

    def join_sync(self, host: str, port: int, rank: int, size: int, backend: str) -> list[Any]:
        """Join the learner's broadcast group (``rollout.weight_sync = "collective"``); this model's manifest."""
        from cosmos_robot_trainers.common.weight_sync import SyncGroup, state_manifest

        self.sync_group = SyncGroup(host, port, rank, size, backend)
        return state_manifest(self.worker.policy.model.state_dict())

    def device_id(self) -> str | None:
        from cosmos_robot_trainers.common.weight_sync import device_id

        return device_id(next(iter(self.worker.policy.model.state_dict().values())))

    def receive_weights(self) -> None:
        """The learner's broadcast, written in place into this model's parameters and buffers."""
        self.sync_group.broadcast(list(self.worker.policy.model.state_dict().values()))

    def collect(self, specs: list[tuple[int, str, int, int]], seed: int) -> Rollout:
        return self.worker.collect([EpisodeSpec(*s) for s in specs], seed)

    def close(self) -> None:
        self.worker.close()


class RayRollouts:
    """``num_workers`` Ray actors, the envs split between them; episodes dealt out round-robin by group."""

    def __init__(self, config: RLConfig, num_envs: int | None = None, world: World | None = None) -> None:
        ray = connect_ray(world or World())
        self.ray = ray
        n = config.rollout.num_workers
        share = env_shares(config.env.num_envs if num_envs is None else num_envs, n)
        self.group: Any = None
        placements = self._place(config, n)
        threads = max(1, int(config.rollout.worker_cpus))
        data = config.model_dump(mode="json")
        self.actors: list[Any] = [
            ray.remote(_RayWorker).options(**placements[w]).remote(data, share[w], threads) for w in range(n)
        ]
        self.weight_sync, self.worker_gpus = config.rollout.weight_sync, config.rollout.worker_gpus
        self.sync_group: Any = None  # "collective": built at the first sync

    def _place(self, config: RLConfig, n: int) -> list[dict[str, Any]]:
        """Each worker's actor options: a bundle of one placement group when ``rollout.worker_cpus`` or
        ``worker_gpus`` asks for resources (``rollout.placement`` the strategy), else none (0 CPUs)."""
        r = config.rollout
        if not (r.worker_cpus or r.worker_gpus):
            return [{"num_cpus": 0}] * n
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": r.worker_cpus, **({"GPU": r.worker_gpus} if r.worker_gpus else {})}
        self.group = placement_group([dict(bundle) for _ in range(n)], strategy=r.placement.upper())
        ready, _ = self.ray.wait([self.group.ready()], timeout=r.placement_timeout_s)
        if not ready:
            self.ray.util.remove_placement_group(self.group)
            raise RuntimeError(
                f"Ray could not place {n} rollout workers of {bundle} ({r.placement}) within "
                f"rollout.placement_timeout_s={r.placement_timeout_s:g}; the cluster has "
                f"{self.ray.available_resources()} available: lower rollout.worker_cpus / worker_gpus or add nodes"
            )
        return [
            {
                "num_cpus": r.worker_cpus,
                "num_gpus": r.worker_gpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=w),
            }
            for w in range(n)
        ]

    def collect(self, specs: Sequence[EpisodeSpec], seed: int) -> Rollout:
        parts = deal_specs(specs, len(self.actors))
        futures = [
            a.collect.remote([(s.index, s.task, s.seed, s.group) for s in part], worker_seed(seed, w))
            for w, (a, part) in enumerate(zip(self.actors, parts))
            if part
        ]
        return concat_rollouts(self.ray.get(futures))

    def sync(self, model: RLModel) -> None:
        if self.weight_sync == "collective":
            self._broadcast(model)
            return
        state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        ref = self.ray.put(state)
        self.ray.get([a.set_weights.remote(ref) for a in self.actors])

    def _broadcast(self, model: RLModel) -> None:
        """``rollout.weight_sync = "collective"``: the state broadcast to every actor in place (the group
        is formed at the first call, after the actors' manifests are checked against the learner's)."""
        from cosmos_robot_trainers.common.weight_sync import broadcast_to, form_group

        state = model.state_dict()
        if self.sync_group is None:
            self.sync_group = form_group(self.ray, state, self.actors)
        broadcast_to(self.ray, self.sync_group, state, self.actors)

    def close(self) -> None:
        if self.sync_group is not None:
            self.sync_group.close()
        try:
            self.ray.get([a.close.remote() for a in self.actors])
        finally:
            for a in self.actors:
                self.ray.kill(a)
            if self.group is not None:
                self.ray.util.remove_placement_group(self.group)


class DataParallelRollouts:
    """This learner rank's part of every iteration, collected by its own workers (``inner``) and
    joined with the other ranks' parts (module docstring)."""

    def __init__(self, inner: LocalRollouts | RayRollouts, world: World) -> None:
        self.inner, self.world = inner, world

    def collect(self, specs: Sequence[EpisodeSpec], seed: int) -> Rollout:
        parts = deal_specs(specs, self.world.world_size)  # every part holds a group: check_learner_world
        rank = self.world.rank
        return gather_rollout(self.inner.collect(parts[rank], worker_seed(seed, rank)), self.world)

    def sync(self, model: RLModel) -> None:
        self.inner.sync(model)

    def close(self) -> None:
        self.inner.close()


Rollouts = LocalRollouts | RayRollouts | DataParallelRollouts


def make_rollouts(config: RLConfig, policy: RLAdapter, world: World | None = None) -> Rollouts:
    """In-process rollouts for one worker, Ray actors for more; under data parallelism, this rank's share."""
    world = world or World()
    if config.env.vector_mode == "ray" or config.rollout.num_workers > 1:
        connect_ray(world)  # every rank on one Ray instance
    num_envs = env_shares(config.env.num_envs, world.world_size, "learner processes")[world.rank]
    inner: LocalRollouts | RayRollouts
    if config.rollout.num_workers == 1:
        inner = LocalRollouts(config, policy, num_envs)
    else:
        inner = RayRollouts(config, num_envs, world)
    return DataParallelRollouts(inner, world) if world.distributed else inner
