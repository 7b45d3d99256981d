"""ActionChunkBroker slicing and the runtime loop's pacing and hooks."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from cosmos_robot_client.action_chunk_broker import ActionChunkBroker
from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.runtime import Environment, PolicyAgent, Runtime, Subscriber


class CountingPolicy(BasePolicy):
    def __init__(self, chunk_size: int = 4) -> None:
        self.chunk_size = chunk_size
        self.calls = 0
        self.resets = 0

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        base = self.calls * 100
        return {
            "actions": np.arange(self.chunk_size, dtype=np.float32)[:, None] + base,
            "extra": {"chunk": np.arange(self.chunk_size)},
            "server_timing": {"infer_ms": 1.0},
        }

    def reset(self) -> None:
        self.resets += 1


def test_broker_calls_once_per_replan_and_slices_every_leaf() -> None:
    policy = CountingPolicy(chunk_size=4)
    broker = ActionChunkBroker(policy, action_horizon=3)
    steps = [broker.infer({}) for _ in range(7)]
    assert policy.calls == 3 and broker.requests == 3
    assert [float(s["actions"][0]) for s in steps] == [100, 101, 102, 200, 201, 202, 300]
    assert steps[1]["extra"]["chunk"] == 1
    assert steps[0]["server_timing"] == {"infer_ms": 1.0}
    broker.reset()
    assert policy.resets == 1
    assert float(broker.infer({})["actions"][0]) == 400


def test_broker_rejects_short_chunk_with_clear_error() -> None:
    broker = ActionChunkBroker(CountingPolicy(chunk_size=2), action_horizon=5)
    with pytest.raises(ValueError, match="chunk of 2 steps but action_horizon is 5"):
        broker.infer({})
    with pytest.raises(ValueError, match="action_horizon"):
        ActionChunkBroker(CountingPolicy(), action_horizon=0)


class CountdownEnv(Environment):
    def __init__(self, length: int, step_cost_s: float = 0.0) -> None:
        self.length = length
        self.step_cost_s = step_cost_s
        self.t = 0
        self.applied: list[float] = []

    def reset(self) -> None:
        self.t = 0

    def is_episode_complete(self) -> bool:
        return self.t >= self.length

    def get_observation(self) -> dict[str, Any]:
        return {"t": self.t}

    def apply_action(self, action: dict[str, Any]) -> None:
        time.sleep(self.step_cost_s)
        self.applied.append(float(np.ravel(action["actions"])[0]))
        self.t += 1


class Recorder(Subscriber):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_episode_start(self) -> None:
        self.events.append("start")

    def on_step(self, observation: dict[str, Any], action: dict[str, Any]) -> None:
        self.events.append(f"step{observation['t']}")

    def on_episode_end(self) -> None:
        self.events.append("end")


def test_runtime_runs_episodes_with_hooks_and_pacing() -> None:
    env = CountdownEnv(length=10)
    policy = CountingPolicy(chunk_size=5)
    rec = Recorder()
    runtime = Runtime(env, PolicyAgent(ActionChunkBroker(policy, 5)), [rec], max_hz=100.0, num_episodes=2)
    stats = runtime.run()
    assert [s.steps for s in stats] == [10, 10] and all(s.completed for s in stats)
    assert rec.events[:3] == ["start", "step0", "step1"] and rec.events.count("end") == 2
    assert policy.calls == 4 and policy.resets == 2
    # 10 steps at 100 Hz take ~0.1 s: paced, not free-running (generous bounds for a loaded CI box)
    assert 0.09 <= stats[0].wall_s < 1.0
    assert stats[0].rate_hz <= 105


def test_runtime_step_limit_and_overruns() -> None:
    env = CountdownEnv(length=100, step_cost_s=0.02)
    stats = Runtime(env, PolicyAgent(CountingPolicy()), max_hz=200.0, max_episode_steps=3).run_episode()
    assert stats.steps == 3 and not stats.completed
    assert stats.overruns == 3
