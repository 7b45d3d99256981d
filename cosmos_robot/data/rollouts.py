"""Scripted-expert rollouts on N parallel envs, handed back one finished episode at a time, in schedule order.

Why a separate module: stepping envs in lockstep and writing a dataset are two jobs with different
failure modes (a crashed simulator worker vs. a full disk). This module only produces episodes; the
loop itself (slots, partial resets, failed workers) is the shared episode scheduler
(``cosmos_robot_envs.episodes``), on which the expert decides a chunk of one action every step.

Why schedule order: the N envs finish episodes in an order that depends on N (a 12-step reach
episode overtakes a 50-step pick-and-place). Finished episodes wait in memory until every episode
scheduled before them is done, so the dataset lists episodes in the same order, with the same
contents, whatever ``num_envs`` or vector mode recorded it. The wait is short: at most a few episodes
per env (a few MB at 128 px).

Episode ends: the env terminates on success (and truncates at the task's ``max_steps``); the recording stops
there, with no extra "hold" frames. Frame ``t`` is (observation before step ``t``, action at ``t``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos_robot.data.schema import TABLETOP, DemoExpert, DemoLayout, Perturb
from cosmos_robot_envs.episodes import EpisodeHooks, EpisodeOutcome, EpisodeScheduler, LiveEpisode, obs_row
from cosmos_robot_envs.vector import BatchedEnv

__all__ = ["Episode", "EpisodeSpec", "build_schedule", "demo_seed", "run_rollouts"]


def demo_seed(seed: int, task: str, index: int) -> int:
    """Reset seed of demonstration ``index`` of ``task``: first 4 bytes (big-endian) of
    ``sha256(f"demo/{seed}/{task}/{index}")``, masked to 31 bits.

    The ``demo/`` prefix keeps recorded scenes apart from ``cosmos-robot eval``'s episodes (its seeds
    hash ``f"{seed}/{task}/{index}"``), so a policy is never evaluated on the exact layouts it was
    trained on, even when both commands use ``--seed 0``.
    """
    digest = hashlib.sha256(f"demo/{seed}/{task}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class EpisodeSpec:
    """One scheduled demonstration: its task, index within the task and reset seed."""

    task: str
    index: int
    seed: int


def build_schedule(tasks: Sequence[str], episodes_per_task: int, seed: int) -> list[EpisodeSpec]:
    """Episode 0 of every task, then episode 1, ...: a prefix of the dataset covers every task."""
    return [EpisodeSpec(t, i, demo_seed(seed, t, i)) for i in range(episodes_per_task) for t in tasks]


@dataclass
class Episode:
    """A finished rollout: per-frame arrays (``frames`` long) and how it ended."""

    spec: EpisodeSpec
    prompt: str = ""
    images: dict[str, list[np.ndarray]] = field(default_factory=dict)  # camera -> frames
    vectors: dict[str, list[np.ndarray]] = field(default_factory=dict)  # observation key (state, ...) -> frames
    actions: list[np.ndarray] = field(default_factory=list)
    success: bool = False
    reason: str | None = None  # None on success; "max_steps", "worker_crashed", ... otherwise
    error: str | None = None  # a worker's error message, when it crashed

    @property
    def frames(self) -> int:
        return len(self.actions)

    def drop_last_frame(self) -> None:
        for seq in (self.actions, *self.vectors.values(), *self.images.values()):
            if seq:
                seq.pop()


class _ExpertHooks(EpisodeHooks[EpisodeSpec]):
    """The scripted expert decides one action per step; every (observation, action) pair is a frame."""

    def __init__(
        self, layout: DemoLayout, cameras: Sequence[str], expert_noise: float = 0.0, noise_tasks: Sequence[str] = ()
    ) -> None:
        self.layout, self.cameras, self.expert_noise = layout, list(cameras), float(expert_noise)
        self.noise_tasks = set(noise_tasks)  # empty: every task
        self.running: dict[int, tuple[Episode, DemoExpert]] = {}  # by schedule position
        self.perturb: dict[int, tuple[Perturb, np.random.Generator]] = {}  # by schedule position (expert_noise > 0)
        self.done: dict[int, Episode] = {}  # finished, by schedule position, until handed out

    def started(self, ep: LiveEpisode[EpisodeSpec], obs: dict[str, Any], info: dict[str, Any]) -> None:
        expert = self.layout.expert(ep.spec.task)
        expert.reset()
        self.running[ep.position] = (Episode(ep.spec, prompt=_prompt(obs, ep.spec)), expert)
        noisy = not self.noise_tasks or ep.spec.task in self.noise_tasks
        if self.expert_noise > 0 and noisy and self.layout.perturb_factory is not None:
            # the episode's own stream: the same seed perturbs the same way whatever env runs it
            self.perturb[ep.position] = (self.layout.perturb_factory(), np.random.default_rng(ep.spec.seed))

    def decide(self, episodes: Sequence[LiveEpisode[EpisodeSpec]], obs: Any) -> np.ndarray:
        actions = []
        for ep in episodes:
            episode, expert = self.running[ep.position]
            row = obs_row(obs, ep.row)
            action = np.asarray(expert.act(row), dtype=np.float32)
            _append(episode, row, action, self.layout.vectors, self.cameras)  # the clean label
            if ep.position in self.perturb:
                perturb, rng = self.perturb[ep.position]
                action = np.asarray(perturb(action, self.expert_noise, rng), dtype=np.float32)
            actions.append(action[None])
        return np.stack(actions).astype(np.float32)

    def ended(self, outcomes: Sequence[EpisodeOutcome[EpisodeSpec]], obs: Any) -> None:
        for outcome in outcomes:
            self.perturb.pop(outcome.position, None)
            started = self.running.pop(outcome.position, None)
            # a failed reset never started: an empty failed episode (its prompt row is stale)
            ep = started[0] if started else Episode(outcome.spec, prompt=_prompt(obs, outcome.spec, outcome.row))
            ep.success = outcome.success
            if outcome.infra_failure and started:
                ep.drop_last_frame()  # that action never ran to completion
            ep.error = outcome.error if outcome.infra_failure else None
            ep.reason = None if ep.success else outcome.reason or "max_steps"
            self.done[outcome.position] = ep


def run_rollouts(
    venv: BatchedEnv,
    schedule: Sequence[EpisodeSpec],
    cameras: Sequence[str],
    layout: DemoLayout = TABLETOP,
    expert_noise: float = 0.0,
    noise_tasks: Sequence[str] = (),
) -> Iterator[Episode]:
    """Roll the scripted expert out for every ``schedule`` entry; yield episodes in schedule order.

    ``venv`` must hold the layout's multi-task envs, observing what its expert reads (tabletop:
    ``object_state``) and ``cameras``. ``expert_noise`` > 0 executes perturbed actions (the layout's
    ``perturb_factory``) while recording the expert's clean ones, in the episodes of ``noise_tasks``
    (empty: every task).
    """
    hooks = _ExpertHooks(layout, cameras, expert_noise, noise_tasks)
    next_out = 0
    for _ in EpisodeScheduler[EpisodeSpec](venv, replan_steps=1).episodes(schedule, hooks):
        while next_out in hooks.done:
            yield hooks.done.pop(next_out)
            next_out += 1


def _prompt(obs: Any, spec: EpisodeSpec, row: int | None = None) -> str:
    """The episode's instruction: the env's ``prompt``, or the task name for a suite without one (driving)."""
    if "prompt" not in obs:
        return spec.task
    return str(obs["prompt"] if row is None else obs["prompt"][row])


def _append(
    ep: Episode, obs: dict[str, Any], action: np.ndarray, vectors: Sequence[str], cameras: Sequence[str]
) -> None:
    for cam in cameras:
        ep.images.setdefault(cam, []).append(np.array(obs[cam], dtype=np.uint8))
    for key in vectors:
        ep.vectors.setdefault(key, []).append(np.array(obs[key], dtype=np.float32).reshape(-1))  # arrays row-major
    ep.actions.append(np.array(action, dtype=np.float32))
