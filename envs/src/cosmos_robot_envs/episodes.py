"""One episode scheduler: scheduled episodes on N vector-env slots, action chunks, failure accounting.

Why one: evaluation, demonstration recording and RL rollouts all hand a queue of episodes to N env
slots, reset a finished slot onto the next episode (the vector layer's masked partial reset), execute
action chunks with replanning, and turn a crashed or hung simulator worker into a failed episode
instead of a crashed run. Three copies of that loop drifted apart (a crash counted as a step in one,
not in another; one refilled a slot after a failed reset, another waited). Here the loop is written
once; what differs between the users (who decides the actions, what is kept per step, what a
finished episode becomes) are :class:`EpisodeHooks`.

How a run goes (``EpisodeScheduler(venv, replan_steps=R).episodes(specs, hooks)``):

1. free slots take the next specs: one partial ``reset(seeds=, options=, mask=)`` for all of them,
   options from ``reset_options(spec)`` (default ``{"task": spec.task}``). A reset that failed even
   after the vector layer's retry ends that episode at once (``reason`` = the vector layer's
   ``truncated_reason``, ``error`` = its ``worker_error``) and the slot takes the next spec;
2. every env whose action queue is empty is decided together: ``hooks.decide(episodes, obs)`` returns
   one chunk ``(H >= R, *action_shape)`` per episode, of which the first ``R`` actions are queued;
3. every live env takes one step (a masked ``step``) with the head of its queue;
4. an episode ends when its env terminates or truncates; a step whose worker crashed, hung or raised
   is not counted as a step and ends the episode as an *infrastructure* failure
   (``outcome.infra_failure``: not the policy's fault; RL drops it, eval reports it apart and runs
   the episode again with its seed).

Aligned starts (``align_starts=True``, the default): a freed slot waits for the next replan boundary
(control steps since the envs were last all idle, modulo ``R``) before it takes a new episode. An env
idles fewer than ``R`` steps, and in exchange every env asks for its chunk on the same control steps,
so one ``decide`` carries all the envs instead of the ~N/R that staggered starts would leave (one
forward pass per replan instead of one per control step). Each episode still replans every ``R``
steps from its own reset, so its outcome does not depend on the alignment.

Affinity (``affinity=key``, optional): a freed slot prefers the next pending spec whose key equals
the key of the slot's previous episode, then one whose key no other slot holds, then simply the next.
Why: an env can cache work per initial state, and GRPO runs a group of episodes from one state. The
driving suite replays its expert once per (scenario, seed) and env; in order, a group of 8 spread
over 4 slots paid 4 replays, with affinity it pays 1. Which slot runs an episode does not change
the episode, only the order in which episodes end.

Hook order for one episode: ``started`` -> (``decide`` -> ``stepped`` x k -> ``chunk_done``) x m ->
``ended``; ``decide`` and ``ended`` are batched (all episodes deciding / ending at that vector call).
Observation rows handed to hooks are views into the vector layer's batch (a fresh copy per call):
copy what you keep for long, or you keep the whole batch alive.

This module is torch-free and knows nothing of policies, datasets or trainers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from cosmos_robot_envs.vector import BatchedEnv

__all__ = [
    "EPISODE_METRICS",
    "episode_metrics",
    "EpisodeHooks",
    "EpisodeOutcome",
    "EpisodeScheduler",
    "EpisodeSpec",
    "EpisodeSpecLike",
    "LiveEpisode",
    "Step",
    "obs_row",
]

ERROR_CHARS = 2000  # a worker's error message is cut to its last ERROR_CHARS characters
EPISODE_METRICS = "episode_metrics"  # the info key under which an env reports its end-of-episode numbers


class EpisodeSpecLike(Protocol):
    """What the scheduler needs of a scheduled episode: its task and its reset seed."""

    @property
    def task(self) -> str: ...

    @property
    def seed(self) -> int: ...


S = TypeVar("S", bound=EpisodeSpecLike)
_NO_KEY: Hashable = object()  # a slot that has run no episode yet holds no affinity key


@dataclass(frozen=True)
class EpisodeSpec:
    """A plain scheduled episode; users with more fields (eval's video flag, RL's group) bring their own."""

    task: str
    seed: int
    options: Mapping[str, Any] | None = None  # extra reset options beside {"task": task}

    def reset_options(self) -> dict[str, Any]:
        return {"task": self.task, **(self.options or {})}


def default_reset_options(spec: EpisodeSpecLike) -> Mapping[str, Any]:
    """``spec.reset_options()`` when the spec has one, else ``{"task": spec.task}``."""
    method = getattr(spec, "reset_options", None)
    return method() if callable(method) else {"task": spec.task}


def obs_row(obs: Any, i: int) -> dict[str, Any]:
    """Row ``i`` of a vector-layer observation batch (dict of ``(num_envs, ...)`` arrays / lists of text)."""
    if isinstance(obs, Mapping):
        return {key: value[i] for key, value in obs.items()}
    return {"": obs[i]}


@dataclass(frozen=True)
class Step:
    """One env step of one episode, as ``EpisodeHooks.stepped`` sees it."""

    action: np.ndarray  # the action the env executed
    reward: float  # the env's reward for it
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    obs: dict[str, Any]  # the observation row after the step (a view: copy what you keep)


@dataclass
class LiveEpisode(Generic[S]):
    """An episode running on env ``row``; hooks read it, the scheduler owns it."""

    spec: S
    position: int  # index of the spec in the order it was handed to the scheduler
    row: int  # env slot
    t0: float  # time.perf_counter() when its reset returned
    steps: int = 0  # env steps taken (a step whose worker failed is not one)
    episode_return: float = 0.0  # sum of the env's rewards
    decisions: int = 0  # chunks decided so far (the index of the next one)
    queue: deque[np.ndarray] = field(default_factory=deque)  # actions left of the current chunk


@dataclass(frozen=True)
class EpisodeOutcome(Generic[S]):
    """How one episode ended: what every user records (eval's JSONL, the dataset sidecar, RL's stats)."""

    spec: S
    position: int  # index of the spec in the order it was handed to the scheduler
    row: int  # env slot that ran it
    success: bool  # info["is_success"] at the end, and no infrastructure failure
    steps: int
    episode_return: float
    reason: str | None  # None: terminated; "max_steps": time limit; else the vector layer's reason
    error: str | None  # the failed worker's message (last ERROR_CHARS characters)
    infra_failure: bool  # a worker crashed / hung / raised (in reset or step): not a policy failure
    decisions: int
    wall_s: float  # from its reset to its end
    # the env's own end-of-episode numbers (``info["episode_metrics"]``, e.g. the driving suite's progress,
    # collision, off-road, distance to the ground truth), numbers only
    metrics: Mapping[str, float | bool] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def seed(self) -> int:
        return self.spec.seed


class EpisodeHooks(Generic[S]):
    """What a user of the scheduler plugs in; every method but ``decide`` defaults to doing nothing."""

    def decide(self, episodes: Sequence[LiveEpisode[S]], obs: Any) -> Sequence[np.ndarray] | np.ndarray:
        """One chunk ``(H >= replan_steps, *action_shape)`` per episode (rows ``ep.row`` of ``obs``)."""
        raise NotImplementedError

    def started(self, ep: LiveEpisode[S], obs: dict[str, Any], info: dict[str, Any]) -> None:
        """``ep`` was reset; ``obs`` is its first observation row, ``info`` the reset info."""

    def stepped(self, ep: LiveEpisode[S], step: Step) -> None:
        """``ep``'s env took a step that ran (not called when the worker failed)."""

    def chunk_done(self, ep: LiveEpisode[S], obs: dict[str, Any], *, done: bool, truncated: bool) -> None:
        """``ep``'s current chunk is over: its queue emptied, or its episode ended (``done``).

        ``truncated``: the episode was cut, not terminated (time limit or a failed worker); ``obs`` is
        then the observation to bootstrap from (the last good one when the worker failed).
        """

    def ended(self, outcomes: Sequence[EpisodeOutcome[S]], obs: Any) -> None:
        """These episodes ended at the same vector call (``obs`` is that call's batch)."""


class EpisodeScheduler(Generic[S]):
    """Runs scheduled episodes on ``venv``'s envs; see the module docstring for the semantics.

    ``timing`` accumulates seconds spent in the vector env (``"env"``) and in ``hooks.decide``
    (``"decide"``); ``env_steps`` counts env steps that ran.
    """

    def __init__(
        self,
        venv: BatchedEnv,
        *,
        replan_steps: int = 1,
        align_starts: bool = True,
        reset_options: Callable[[S], Mapping[str, Any]] = default_reset_options,
        affinity: Callable[[S], Hashable] | None = None,
    ) -> None:
        if replan_steps < 1:
            raise ValueError(f"replan_steps: expected >= 1, got {replan_steps}")
        shape = venv.single_action_space.shape
        if shape is None:
            raise ValueError(f"the env's action space {venv.single_action_space} has no fixed shape")
        self.venv, self.replan_steps, self.align_starts = venv, replan_steps, align_starts
        self.reset_options, self.affinity = reset_options, affinity
        self._slot_key: list[Hashable] = [_NO_KEY] * venv.num_envs  # affinity key of each slot's last episode
        self.action_shape: tuple[int, ...] = tuple(shape)
        self.action_dtype = venv.single_action_space.dtype or np.float32
        self.live: list[LiveEpisode[S] | None] = [None] * venv.num_envs
        self.obs: Any = {}
        self.timing = {"env": 0.0, "decide": 0.0}
        self.env_steps = 0

    def run(self, specs: Iterable[S], hooks: EpisodeHooks[S]) -> list[EpisodeOutcome[S]]:
        """Every episode of ``specs`` to its end; the outcomes in the order they ended."""
        return list(self.episodes(specs, hooks))

    def episodes(self, specs: Iterable[S], hooks: EpisodeHooks[S]) -> Iterator[EpisodeOutcome[S]]:
        """Like :meth:`run`, yielding each outcome as soon as its episode ended (after ``hooks.ended``).

        Leaving the loop early (``break``, an exception in a hook) abandons the running episodes; the
        next call resets their envs like any other.
        """
        pending: deque[tuple[int, S]] = deque(enumerate(specs))
        n = self.venv.num_envs
        self.live = [None] * n
        self._slot_key = [_NO_KEY] * n
        phase = 0  # control steps since the envs were last all idle, modulo replan_steps
        while pending or any(ep is not None for ep in self.live):
            free = [i for i in range(n) if self.live[i] is None]
            if free and pending:
                if len(free) == n:
                    phase = 0
                if phase == 0 or not self.align_starts:
                    yield from self._end(self._fill(free, pending, hooks), hooks)
            active = [ep for ep in self.live if ep is not None]
            if not active:
                continue  # every reset failed; the next pending episodes get the slots
            need = [ep for ep in active if not ep.queue]
            if need:
                self._decide(need, hooks)
            yield from self._end(self._step(active, hooks), hooks)
            phase = (phase + 1) % self.replan_steps

    def _end(self, outcomes: list[EpisodeOutcome[S]], hooks: EpisodeHooks[S]) -> list[EpisodeOutcome[S]]:
        if outcomes:
            hooks.ended(outcomes, self.obs)
        return outcomes

    def _fill(self, free: list[int], pending: deque[tuple[int, S]], hooks: EpisodeHooks[S]) -> list[EpisodeOutcome[S]]:
        """Start pending episodes on the ``free`` envs (one partial reset per attempt)."""
        failed: list[EpisodeOutcome[S]] = []
        while free and pending:
            assigned = [(row, self._take(row, pending)) for row in free[: len(pending)]]
            mask = np.zeros(self.venv.num_envs, dtype=bool)
            mask[[row for row, _ in assigned]] = True
            specs = [spec for _, (_, spec) in assigned]
            t0 = time.perf_counter()
            self.obs, infos = self.venv.reset(
                seeds=[int(s.seed) for s in specs], options=[dict(self.reset_options(s)) for s in specs], mask=mask
            )
            now = time.perf_counter()
            self.timing["env"] += now - t0
            free = []
            for row, (position, spec) in assigned:
                ep = LiveEpisode(spec, position, row, now)
                if _failed(infos[row]):  # the reset failed twice: the episode ends, the slot takes the next
                    failed.append(self._outcome(ep, infos[row], terminated=False))
                    free.append(row)
                else:
                    self.live[row] = ep
                    hooks.started(ep, obs_row(self.obs, row), infos[row])
        return failed

    def _take(self, row: int, pending: deque[tuple[int, S]]) -> tuple[int, S]:
        """The pending spec slot ``row`` starts next (see "Affinity" in the module docstring)."""
        if self.affinity is None:
            return pending.popleft()
        keys = [self.affinity(spec) for _, spec in pending]
        held = {k for i, k in enumerate(self._slot_key) if i != row}
        pick = next((i for i, k in enumerate(keys) if k == self._slot_key[row]), None)
        if pick is None:
            pick = next((i for i, k in enumerate(keys) if k not in held), 0)
        item = pending[pick]
        del pending[pick]
        self._slot_key[row] = keys[pick]
        return item

    def _decide(self, need: list[LiveEpisode[S]], hooks: EpisodeHooks[S]) -> None:
        t0 = time.perf_counter()
        chunks = hooks.decide(need, self.obs)
        self.timing["decide"] += time.perf_counter() - t0
        if len(chunks) != len(need):
            raise ValueError(f"decide returned {len(chunks)} chunks for {len(need)} episodes")
        want = (self.replan_steps, *self.action_shape)
        for ep, chunk in zip(need, chunks):
            arr = np.asarray(chunk)
            if arr.ndim != len(want) or arr.shape[0] < self.replan_steps or arr.shape[1:] != want[1:]:
                raise ValueError(
                    f"decide returned a chunk of shape {arr.shape} for env {ep.row}; need (>= {want[0]}, ...{want[1:]})"
                )
            ep.queue.extend(arr[: self.replan_steps])
            ep.decisions += 1

    def _step(self, active: list[LiveEpisode[S]], hooks: EpisodeHooks[S]) -> list[EpisodeOutcome[S]]:
        """One masked step of every live env; returns the episodes that ended."""
        n = self.venv.num_envs
        actions = np.zeros((n, *self.action_shape), dtype=self.action_dtype)
        mask = np.zeros(n, dtype=bool)
        for ep in active:
            actions[ep.row] = ep.queue.popleft()
            mask[ep.row] = True
        t0 = time.perf_counter()
        self.obs, rewards, terminated, truncated, infos = self.venv.step(actions, mask=mask)
        self.timing["env"] += time.perf_counter() - t0
        ended: list[EpisodeOutcome[S]] = []
        for ep in active:
            i, info = ep.row, infos[ep.row]
            term, trunc = bool(terminated[i]), bool(truncated[i])
            row = obs_row(self.obs, i)
            if not _failed(info):
                ep.steps += 1
                ep.episode_return += float(rewards[i])
                self.env_steps += 1
                hooks.stepped(ep, Step(actions[i], float(rewards[i]), term, trunc, info, row))
            done = term or trunc
            if done or not ep.queue:
                hooks.chunk_done(ep, row, done=done, truncated=trunc and not term)
            if done:
                ep.queue.clear()
                self.live[i] = None
                ended.append(self._outcome(ep, info, terminated=term))
        return ended

    @staticmethod
    def _outcome(ep: LiveEpisode[S], info: Mapping[str, Any], *, terminated: bool) -> EpisodeOutcome[S]:
        infra = _failed(info)
        error = info.get("worker_error")
        reason = info.get("truncated_reason") or (None if terminated else "max_steps")
        return EpisodeOutcome(
            spec=ep.spec,
            position=ep.position,
            row=ep.row,
            success=bool(info.get("is_success", False)) and not infra,
            steps=ep.steps,
            episode_return=ep.episode_return,
            reason=None if reason is None else str(reason),
            error=None if error is None else str(error)[-ERROR_CHARS:],
            infra_failure=infra,
            decisions=ep.decisions,
            wall_s=time.perf_counter() - ep.t0,
            metrics=episode_metrics(info),
        )


def episode_metrics(info: Mapping[str, Any]) -> dict[str, float | bool]:
    """``info["episode_metrics"]`` as ``{name: number}``: an env reports its own end-of-episode numbers
    there; flags (bools: collision, off-road) stay bools so summaries report them as rates, anything
    that is not a finite number is left out."""
    raw = info.get(EPISODE_METRICS)
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, float | bool] = {}
    for key, value in raw.items():
        if isinstance(value, (bool, np.bool_)):
            out[str(key)] = bool(value)
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if np.isfinite(number):
            out[str(key)] = number
    return out


def _failed(info: Mapping[str, Any]) -> bool:
    """The vector layer's mark of a crashed, hung or raising worker (in reset or step)."""
    return "worker_error" in info or "truncated_reason" in info
