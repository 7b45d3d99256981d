"""mode="ray": envs in Ray actors on a local Ray instance behave like the local backends.

One test (Ray start-up dominates its time): same trajectories as "sync" for the same seeds, and an
actor whose process is killed mid-run is replaced with its episode reported as truncated.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from cosmos_robot_envs.vector import WORKER_CRASHED, make_vector_env
from cosmos_robot_envs.vector.ray_env import RayBatchedEnv
from tests.envs.test_vector import STATE, TabletopLikeEnv, _assert_same, _rollout

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # before Ray is imported: no token file, no warning
ray = pytest.importorskip("ray")


@pytest.mark.slow
def test_ray_mode_matches_sync_and_recovers_a_killed_actor() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        seeds = [4, 9]
        with make_vector_env(TabletopLikeEnv, 2, "ray", ray_actor_options={"num_cpus": 0.5}) as venv:
            with make_vector_env(TabletopLikeEnv, 2, "sync") as ref:
                _assert_same(_rollout(venv, seeds, 3), _rollout(ref, seeds, 3))
            obs, _ = venv.reset(seeds=seeds, options=[{}, {"task": "push"}])
            assert obs["prompt"] == ["reach", "push"]
            assert isinstance(venv, RayBatchedEnv)
            # SIGKILL the actor's process (ray.kill is asynchronous: a step could still slip through)
            os.kill(ray.get(venv.actors[0].__ray_call__.remote(lambda _: os.getpid())), signal.SIGKILL)
            _, _, _, trunc, infos = venv.step(np.zeros((2, 2), np.float32))
            assert trunc.tolist() == [True, False] and infos[0]["truncated_reason"] == WORKER_CRASHED
            obs, _ = venv.reset(seeds=[1], mask=np.array([True, False]))
            assert obs[STATE].shape == (2, 4)
            _, _, _, trunc, _ = venv.step(np.zeros((2, 2), np.float32))
            assert not trunc.any()
    finally:
        ray.shutdown()
