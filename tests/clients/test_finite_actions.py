"""The robot-side last check: a chunk or action with NaN/inf never reaches ``apply_action``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cosmos_robot_client.action_chunk_broker import ActionChunkBroker, NonFiniteActionError, non_finite_leaves
from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.runtime import Agent, Environment, PolicyAgent, Runtime


class ScriptedPolicy(BasePolicy):
    """Answers the given chunks in turn (what a server sends, after the wire codec)."""

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self.chunks = list(chunks)
        self.calls = 0

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return self.chunks.pop(0)


class RecordingEnv(Environment):
    def __init__(self, length: int = 6) -> None:
        self.length, self.applied = length, []  # type: list[dict[str, Any]]

    def reset(self) -> None:
        self.applied = []

    def is_episode_complete(self) -> bool:
        return len(self.applied) >= self.length

    def get_observation(self) -> dict[str, Any]:
        return {"observation/state": np.zeros(2, np.float32)}

    def apply_action(self, action: dict[str, Any]) -> None:
        self.applied.append(action)


def _chunk(rows: int = 4, dim: int = 3) -> dict[str, Any]:
    return {"actions": np.ones((rows, dim), np.float32), "server_timing": {"infer_ms": 2.0}}


def test_broker_refuses_a_nan_chunk_naming_key_and_count() -> None:
    nan = _chunk()
    nan["actions"][2, 1] = np.nan  # only a later step is bad: the whole chunk is refused up front
    nan["actions"][3, 0] = np.inf
    broker = ActionChunkBroker(ScriptedPolicy([nan]), action_horizon=4)
    with pytest.raises(NonFiniteActionError, match=r"'actions': 2 of 12 values"):
        broker.infer({})
    assert broker._chunk is None  # nothing cached to hand out afterwards


def test_broker_refuses_nan_in_nested_layout_keys_and_passes_finite_chunks() -> None:
    good, bad = _chunk(), {"action": {"x_y_z": np.full((4, 3), np.nan), "gripper": np.ones((4, 1))}}
    broker = ActionChunkBroker(ScriptedPolicy([good, bad]), action_horizon=2)
    assert [float(broker.infer({})["actions"][0]) for _ in range(2)] == [1.0, 1.0]
    with pytest.raises(NonFiniteActionError, match=r"'action\.x_y_z': 12 of 12 values"):
        broker.infer({})


def test_non_finite_leaves_ignores_integers_strings_and_scalars() -> None:
    tree = {"ids": np.arange(3), "note": "nan", "t": float("nan"), "a": np.array([1.0, np.nan, -np.inf])}
    assert non_finite_leaves(tree) == [("a", 2, 3)]


def test_runtime_never_applies_a_non_finite_action() -> None:
    class NanAfterTwo(Agent):
        def __init__(self) -> None:
            self.n = 0

        def get_action(self, observation: dict[str, Any]) -> dict[str, Any]:
            self.n += 1
            return {"actions": np.array([0.1, np.nan if self.n == 3 else 0.2], np.float32)}

    env = RecordingEnv()
    with pytest.raises(NonFiniteActionError, match=r"action at step 2 .*'actions': 1 of 2 values"):
        Runtime(env, NanAfterTwo()).run_episode()
    assert len(env.applied) == 2 and all(np.isfinite(a["actions"]).all() for a in env.applied)


def test_runtime_with_broker_stops_before_the_nan_chunk_moves_the_robot() -> None:
    bad = _chunk()
    bad["actions"][:] = np.nan  # what serving a checkpoint with NaN weights returns
    policy = ScriptedPolicy([_chunk(), bad])
    env = RecordingEnv(length=10)
    with pytest.raises(NonFiniteActionError, match="non-finite"):
        Runtime(env, PolicyAgent(ActionChunkBroker(policy, action_horizon=4))).run_episode()
    assert policy.calls == 2 and len(env.applied) == 4  # the first chunk ran; no step of the NaN one did
