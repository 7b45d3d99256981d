"""The control loop a robot computer runs: observe -> act -> apply, at ``max_hz``.

Shaped like openpi's runtime (so its environments and agents port over by renaming imports) with
what it lacks: drift-free pacing (the next tick is scheduled from the loop start, so a slow step
is caught up instead of shifting every later tick), per-episode statistics returned to the
caller (steps, wall time, achieved rate, overruns), and subscribers that see every step.

Every action is checked for NaN/inf before ``apply_action`` (``NonFiniteActionError`` naming the key
and count): whatever agent produced it, a non-finite command never reaches the robot.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Any

from cosmos_robot_client.action_chunk_broker import check_finite
from cosmos_robot_client.base_policy import BasePolicy

__all__ = ["Agent", "EpisodeStats", "Environment", "PolicyAgent", "Runtime", "Subscriber"]


class Environment(abc.ABC):
    """A robot or simulator as the loop sees it."""

    @abc.abstractmethod
    def reset(self) -> None: ...

    @abc.abstractmethod
    def is_episode_complete(self) -> bool: ...

    @abc.abstractmethod
    def get_observation(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def apply_action(self, action: dict[str, Any]) -> None: ...


class Agent(abc.ABC):
    """Chooses the action for an observation."""

    @abc.abstractmethod
    def get_action(self, observation: dict[str, Any]) -> dict[str, Any]: ...

    def reset(self) -> None:  # noqa: B027 - optional hook
        """Episode boundary."""


class PolicyAgent(Agent):
    """An agent that asks a policy (a client policy, usually wrapped in an ``ActionChunkBroker``)."""

    def __init__(self, policy: BasePolicy) -> None:
        self.policy = policy

    def get_action(self, observation: dict[str, Any]) -> dict[str, Any]:
        return self.policy.infer(observation)

    def reset(self) -> None:
        self.policy.reset()


class Subscriber:
    """Observes the loop (loggers, video writers, safety monitors); all hooks are optional."""

    def on_episode_start(self) -> None:
        """Called after the environment and agent were reset."""

    def on_step(self, observation: dict[str, Any], action: dict[str, Any]) -> None:
        """Called after each applied action."""

    def on_episode_end(self) -> None:
        """Called when the episode completed or hit ``max_episode_steps``."""


@dataclass
class EpisodeStats:
    steps: int = 0
    wall_s: float = 0.0
    overruns: int = 0  # ticks whose work took longer than the period
    completed: bool = False  # the environment said so (vs. the step limit)

    @property
    def rate_hz(self) -> float:
        return self.steps / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class Runtime:
    environment: Environment
    agent: Agent
    subscribers: list[Subscriber] = field(default_factory=list)
    max_hz: float = 0.0  # 0 = as fast as possible
    num_episodes: int = 1
    max_episode_steps: int = 0  # 0 = until the environment says complete

    def run(self) -> list[EpisodeStats]:
        return [self.run_episode() for _ in range(self.num_episodes)]

    def run_episode(self) -> EpisodeStats:
        self.environment.reset()
        self.agent.reset()
        for sub in self.subscribers:
            sub.on_episode_start()
        stats = EpisodeStats()
        period = 1.0 / self.max_hz if self.max_hz > 0 else 0.0
        start = time.perf_counter()
        while True:
            if self.environment.is_episode_complete():
                stats.completed = True
                break
            if self.max_episode_steps and stats.steps >= self.max_episode_steps:
                break
            observation = self.environment.get_observation()
            action = self.agent.get_action(observation)
            check_finite(action, f"action at step {stats.steps}")  # never apply NaN/inf to the robot
            self.environment.apply_action(action)
            for sub in self.subscribers:
                sub.on_step(observation, action)
            stats.steps += 1
            if period:
                next_tick = start + stats.steps * period
                delay = next_tick - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                else:
                    stats.overruns += 1
        stats.wall_s = time.perf_counter() - start
        for sub in self.subscribers:
            sub.on_episode_end()
        return stats
