"""The env side of every backend: one env, its reset/step, and the messages that describe the results.

Why one class for all backends: the in-process, subprocess and Ray backends must behave identically
(same seeds give the same trajectories, the same validation errors), so the code that touches the env
lives here once and the backends only move its results around. The wire form of a reply is a plain
dict for msgpack (:mod:`cosmos_robot_envs.vector.wire`): never pickle, numpy arrays as raw bytes.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from cosmos_robot_envs.vector.spaces import ActionLayout, ObsLayout, space_to_data

__all__ = ["EnvFn", "EnvReply", "EnvRunner", "Failure", "Outcome", "describe_exception"]

EnvFn = Callable[[], gym.Env[Any, Any]]

# the reasons a vector env reports in ``info["truncated_reason"]`` when a worker fails
WORKER_CRASHED = "worker_crashed"
WORKER_TIMEOUT = "worker_timeout"
ENV_ERROR = "env_error"


@dataclass
class EnvReply:
    """What one env returned; ``arrays`` is empty when the worker already wrote them to shared memory."""

    info: dict[str, Any]
    texts: dict[str, str]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "ok": True,
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "info": self.info,
            "texts": self.texts,
            "arrays": self.arrays,
        }

    @classmethod
    def from_wire(cls, msg: dict[str, Any]) -> EnvReply:
        return cls(
            info=msg["info"],
            texts=msg["texts"],
            arrays=msg["arrays"],
            reward=msg["reward"],
            terminated=msg["terminated"],
            truncated=msg["truncated"],
        )


@dataclass(frozen=True)
class Failure:
    """A worker that could not answer: ``reason`` is one of the WORKER_* / ENV_ERROR constants."""

    reason: str
    message: str


Outcome = EnvReply | Failure


def describe_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


class EnvRunner:
    """Builds one env from its factory and runs reset/step on it, checking observations."""

    def __init__(self, env_fn: EnvFn, index: int) -> None:
        self.index = index
        self.env = env_fn()
        self.obs_layout = ObsLayout.from_space(self.env.observation_space)
        self.action_layout = ActionLayout.from_space(self.env.action_space)

    def spaces_message(self) -> dict[str, Any]:
        return {
            "observation_space": space_to_data(self.env.observation_space),
            "action_space": space_to_data(self.env.action_space),
        }

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> EnvReply:
        obs, info = self.env.reset(seed=seed, options=options)
        arrays, texts = self.obs_layout.split(obs, self.index)
        return EnvReply(info=dict(info), texts=texts, arrays=arrays)

    def step(self, action: np.ndarray) -> EnvReply:
        obs, reward, terminated, truncated, info = self.env.step(action)
        arrays, texts = self.obs_layout.split(obs, self.index)
        return EnvReply(
            info=dict(info),
            texts=texts,
            arrays=arrays,
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
        )

    def close(self) -> None:
        self.env.close()
