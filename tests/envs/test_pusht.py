"""gym-pusht (an external CPU simulator people know) through the vector layer, sync and async.

Why: the layer must drive envs we did not write, with their own flat Dict observations
(``pixels`` uint8 image + ``agent_pos``) and rich info dicts (numpy arrays) that cross the worker pipe.
"""

from __future__ import annotations

import numpy as np
import pytest

from cosmos_robot_envs.vector import make_vector_env
from tests.envs.test_vector import _assert_same

pytest.importorskip("gym_pusht")

ENV_ID = "gym_pusht/PushT-v0"
KWARGS = {"obs_type": "pixels_agent_pos"}


def test_pusht_runs_sync_and_async_identically() -> None:
    actions = np.random.default_rng(0).uniform(100, 400, (5, 2, 2)).astype(np.float32)
    traces = []
    for mode in ("sync", "async"):
        with make_vector_env(ENV_ID, 2, mode, env_kwargs=KWARGS) as venv:
            obs, infos = venv.reset(seeds=[0, 1])
            assert obs["pixels"].shape == (2, 96, 96, 3) and obs["pixels"].dtype == np.uint8
            assert obs["agent_pos"].shape == (2, 2)
            trace = [obs]
            for act in actions:
                obs, rew, term, trunc, infos = venv.step(act)
                trace.append((obs, rew, term, trunc))
            assert "coverage" in infos[0] and isinstance(infos[0]["block_pose"], np.ndarray)
            traces.append(trace)
    _assert_same(*traces)


def test_pusht_partial_reset_keeps_other_env_running() -> None:
    with make_vector_env(ENV_ID, 2, "async", env_kwargs=KWARGS) as venv:
        venv.reset(seeds=[0, 1])
        act = np.full((2, 2), 256.0, np.float32)
        venv.step(act)
        obs, infos = venv.reset(seeds=[5], mask=np.array([True, False]))
        assert infos[1] == {} and "block_pose" in infos[0]
        _, _, _, trunc, _ = venv.step(act)
        assert not trunc.any()
