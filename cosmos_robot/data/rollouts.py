"""Scripted-expert rollouts on N parallel envs, handed back one finished episode at a time, in schedule order.

Why a separate module: stepping envs in lockstep and writing a dataset are two jobs with different
failure modes (a crashed simulator worker vs. a full disk). This module only produces episodes.

Why schedule order: the N envs finish episodes in an order that depends on N (a 12-step reach
episode overtakes a 50-step pick-and-place). Finished episodes wait in memory until every episode
scheduled before them is done, so the dataset lists episodes in the same order, with the same
contents, whatever ``num_envs`` or vector mode recorded it. The wait is short: at most a few episodes
per env (a few MB at 128 px).

Episode ends: the env terminates on success (and truncates at the task's horizon); the recording stops
there, with no extra "hold" frames. Frame ``t`` is (observation before step ``t``, action at ``t``).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos_robot_envs.tabletop.experts import ScriptedExpert, scripted_expert
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
    images: dict[str, list[np.ndarray]] = field(default_factory=dict)
    states: list[np.ndarray] = field(default_factory=list)
    object_states: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    success: bool = False
    reason: str | None = None  # None on success; "max_steps", "worker_crashed", ... otherwise
    error: str | None = None  # a worker's error message, when it crashed

    @property
    def frames(self) -> int:
        return len(self.actions)

    def drop_last_frame(self) -> None:
        for seq in (self.states, self.object_states, self.actions, *self.images.values()):
            if seq:
                seq.pop()


@dataclass
class _Slot:
    episode: Episode
    expert: ScriptedExpert


def run_rollouts(venv: BatchedEnv, schedule: Sequence[EpisodeSpec], cameras: Sequence[str]) -> Iterator[Episode]:
    """Roll the scripted expert out for every ``schedule`` entry; yield episodes in schedule order.

    ``venv`` must hold multi-task envs with ``obs_mode="all"`` (cameras plus ``object_state``).
    """
    pending: deque[int] = deque(range(len(schedule)))  # positions in the schedule
    slots: list[_Slot | None] = [None] * venv.num_envs
    position: dict[int, int] = {}  # env slot -> schedule position
    done: dict[int, Episode] = {}
    next_out = 0
    obs: dict[str, Any] = {}
    shape = venv.single_action_space.shape
    assert shape is not None

    while pending or any(slots):
        free = [i for i, s in enumerate(slots) if s is None]
        if free and pending:
            obs = _start(venv, schedule, pending, free, slots, position, done, obs)
        active = [i for i, s in enumerate(slots) if s is not None]
        if active:
            actions = np.zeros((venv.num_envs, *shape), dtype=np.float32)
            mask = np.zeros(venv.num_envs, dtype=bool)
            for i in active:
                slot = slots[i]
                assert slot is not None
                actions[i] = slot.expert.act({"state": obs["state"][i], "object_state": obs["object_state"][i]})
                _append(slot.episode, obs, i, actions[i], cameras)
                mask[i] = True
            obs, _rewards, terminated, truncated, infos = venv.step(actions, mask=mask)
            for i in active:
                if not (terminated[i] or truncated[i]):
                    continue
                slot = slots[i]
                assert slot is not None
                ep, info = slot.episode, infos[i]
                ep.success = bool(info.get("is_success", False)) and "worker_error" not in info
                if "worker_error" in info:
                    ep.drop_last_frame()  # that action never ran to completion
                    ep.error = str(info["worker_error"])[-2000:]
                ep.reason = None if ep.success else str(info.get("truncated_reason") or "max_steps")
                done[position.pop(i)] = ep
                slots[i] = None
        while next_out in done:
            yield done.pop(next_out)
            next_out += 1


def _start(
    venv: BatchedEnv,
    schedule: Sequence[EpisodeSpec],
    pending: deque[int],
    free: list[int],
    slots: list[_Slot | None],
    position: dict[int, int],
    done: dict[int, Episode],
    obs: dict[str, Any],
) -> dict[str, Any]:
    """Reset the ``free`` envs onto the next pending episodes (one partial reset per attempt)."""
    while free and pending:
        assigned = {i: pending.popleft() for i in free[: len(pending)]}
        mask = np.zeros(venv.num_envs, dtype=bool)
        mask[list(assigned)] = True
        specs = [schedule[p] for p in assigned.values()]
        obs, infos = venv.reset(seeds=[s.seed for s in specs], options=[{"task": s.task} for s in specs], mask=mask)
        free = []
        for i, pos in assigned.items():
            spec = schedule[pos]
            ep = Episode(spec, prompt=str(obs["prompt"][i]))
            if "truncated_reason" in infos[i]:  # the reset failed twice: a failed episode, try the next one
                ep.reason = str(infos[i]["truncated_reason"])
                ep.error = str(infos[i].get("worker_error", ""))[-2000:]
                done[pos] = ep
                free.append(i)
                continue
            expert = scripted_expert(spec.task)
            expert.reset()
            slots[i] = _Slot(ep, expert)
            position[i] = pos
    return obs


def _append(ep: Episode, obs: dict[str, Any], i: int, action: np.ndarray, cameras: Sequence[str]) -> None:
    for cam in cameras:
        ep.images.setdefault(cam, []).append(np.array(obs[cam][i], dtype=np.uint8))
    ep.states.append(np.array(obs["state"][i], dtype=np.float32))
    ep.object_states.append(np.array(obs["object_state"][i], dtype=np.float32))
    ep.actions.append(np.array(action, dtype=np.float32))
