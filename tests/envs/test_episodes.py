"""The episode scheduler on the real tabletop env: aligned starts, replanning, failures, hook order.

The env is the real MuJoCo tabletop (state observations, nothing rendered) behind the vector layer;
a thin wrapper defined here (workers import it by reference) can cut an episode at a given step
(``stop_at``, to make episodes of chosen lengths) or kill its worker process inside ``step``
(``exit_at``). A reset with an unknown task is a real env error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from cosmos_robot_envs.episodes import EpisodeHooks, EpisodeOutcome, EpisodeScheduler, EpisodeSpec, LiveEpisode, Step
from cosmos_robot_envs.tabletop import TabletopEnv
from cosmos_robot_envs.vector import ENV_ERROR, WORKER_CRASHED, make_vector_env

TASKS = ["reach", "push"]
MAX_STEPS = 12
FAULTS = ("stop_at", "exit_at")


class FaultyTabletop(gym.Wrapper[dict[str, Any], np.ndarray, dict[str, Any], np.ndarray]):
    """The tabletop env; reset options ``stop_at`` (truncate at that step) and ``exit_at`` (die there)."""

    def __init__(self) -> None:
        super().__init__(TabletopEnv(tasks=TASKS, obs_mode="state", max_steps=MAX_STEPS))
        self._faults: dict[str, int] = {}
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        opts = dict(options or {})
        self._faults = {k: int(opts.pop(k)) for k in FAULTS if k in opts}
        self._t = 0
        return self.env.reset(seed=seed, options=opts)

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._t += 1
        if self._t == self._faults.get("exit_at"):
            os._exit(3)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, float(reward), terminated, truncated or self._t == self._faults.get("stop_at"), info


class Recorder(EpisodeHooks[EpisodeSpec]):
    """Constant small actions; logs every hook call and how many episodes were live at each decision."""

    def __init__(self, chunk_size: int = 8) -> None:
        self.chunk_size = chunk_size
        self.events: list[tuple[Any, ...]] = []
        self.live: set[int] = set()  # positions of started episodes that have not ended
        self.decisions: list[tuple[int, int]] = []  # (episodes decided, episodes live)

    def decide(self, episodes: Sequence[LiveEpisode[EpisodeSpec]], obs: Any) -> np.ndarray:
        self.events.append(("decide", tuple(ep.position for ep in episodes)))
        self.decisions.append((len(episodes), len(self.live)))
        assert obs["state"].shape[1:] == (8,)
        return np.full((len(episodes), self.chunk_size, 7), 0.05, dtype=np.float32)

    def started(self, ep: LiveEpisode[EpisodeSpec], obs: dict[str, Any], info: dict[str, Any]) -> None:
        self.live.add(ep.position)
        self.events.append(("started", ep.position, ep.row))
        assert obs["object_state"].shape == (15,) and info["task"] == ep.spec.task

    def stepped(self, ep: LiveEpisode[EpisodeSpec], step: Step) -> None:
        self.events.append(("stepped", ep.position, ep.steps))

    def chunk_done(self, ep: LiveEpisode[EpisodeSpec], obs: dict[str, Any], *, done: bool, truncated: bool) -> None:
        self.events.append(("chunk_done", ep.position, done, truncated))

    def ended(self, outcomes: Sequence[EpisodeOutcome[EpisodeSpec]], obs: Any) -> None:
        self.live -= {o.position for o in outcomes}
        self.events.append(("ended", tuple(o.position for o in outcomes)))


def _specs(lengths: Sequence[int], **extra: int) -> list[EpisodeSpec]:
    return [
        EpisodeSpec(TASKS[k % 2], 100 + k, {"stop_at": n, **extra}) if n else EpisodeSpec(TASKS[k % 2], 100 + k)
        for k, n in enumerate(lengths)
    ]


LENGTHS = [5, 9, 3, 6, 11, 2, 7, 4]


@pytest.mark.parametrize("align", [True, False])
def test_replans_every_r_steps_and_aligned_starts_batch_every_live_env(align: bool) -> None:
    r = 3
    hooks = Recorder()
    with make_vector_env(FaultyTabletop, 3, "sync") as venv:
        scheduler = EpisodeScheduler[EpisodeSpec](venv, replan_steps=r, align_starts=align)
        outcomes = scheduler.run(_specs(LENGTHS), hooks)
    by_position = sorted(outcomes, key=lambda o: o.position)
    assert [o.steps for o in by_position] == LENGTHS  # each episode ran to its own end
    assert all(o.reason == "max_steps" and not o.infra_failure and not o.success for o in by_position)
    assert [o.decisions for o in by_position] == [math.ceil(n / r) for n in LENGTHS]  # one chunk per R steps
    assert scheduler.env_steps == sum(LENGTHS)
    full = [decided == live for decided, live in hooks.decisions]
    if align:
        assert all(full)  # new episodes wait for the boundary: every decision covers every live env
    else:
        assert not all(full)  # staggered starts split the decisions
    assert len(hooks.decisions) == len([e for e in hooks.events if e[0] == "decide"])


class ClosedLoop(Recorder):
    """Actions from the observation and the chunk index (a replan at another step would show), final states kept."""

    def __init__(self) -> None:
        super().__init__()
        self.final_state: dict[int, np.ndarray] = {}

    def decide(self, episodes: Sequence[LiveEpisode[EpisodeSpec]], obs: Any) -> np.ndarray:
        super().decide(episodes, obs)
        rows = np.stack([obs["state"][ep.row][:7] for ep in episodes])
        phase = np.array([0.3 * (ep.decisions % 3) for ep in episodes])[:, None]
        return np.repeat(np.clip(-0.5 * rows + phase, -1, 1)[:, None], self.chunk_size, axis=1).astype(np.float32)

    def stepped(self, ep: LiveEpisode[EpisodeSpec], step: Step) -> None:
        self.final_state[ep.position] = np.array(step.obs["state"])


def test_aligned_and_staggered_runs_give_the_same_episodes() -> None:
    """An episode replans every R steps from its own reset, so alignment cannot change what it does."""
    results, finals = [], []
    for align in (True, False):
        hooks = ClosedLoop()
        with make_vector_env(FaultyTabletop, 2, "sync") as venv:
            scheduler = EpisodeScheduler[EpisodeSpec](venv, replan_steps=4, align_starts=align)
            done = scheduler.run(_specs([0, 0, 3, 0]), hooks)
        results.append(sorted((o.position, o.steps, o.episode_return, o.success, o.decisions) for o in done))
        finals.append(hooks.final_state)
    assert results[0] == results[1]
    for position in finals[0]:
        np.testing.assert_array_equal(finals[0][position], finals[1][position])
    assert len({tuple(np.round(s, 6)) for s in finals[0].values()}) == 4  # the actions did depend on the episode


def test_hooks_are_called_in_order() -> None:
    hooks = Recorder()
    with make_vector_env(FaultyTabletop, 1, "sync") as venv:
        (outcome,) = EpisodeScheduler[EpisodeSpec](venv, replan_steps=3).run(_specs([7]), hooks)
    chunk = [("decide", (0,)), ("stepped", 0, 1), ("stepped", 0, 2), ("stepped", 0, 3)]
    assert hooks.events == [
        ("started", 0, 0),
        *chunk,
        ("chunk_done", 0, False, False),
        ("decide", (0,)),
        ("stepped", 0, 4),
        ("stepped", 0, 5),
        ("stepped", 0, 6),
        ("chunk_done", 0, False, False),
        ("decide", (0,)),
        ("stepped", 0, 7),
        ("chunk_done", 0, True, True),  # cut by the time limit: truncated (bootstrap from obs)
        ("ended", (0,)),
    ]
    assert (outcome.steps, outcome.decisions, outcome.reason, outcome.error) == (7, 3, "max_steps", None)
    assert outcome.wall_s > 0 and outcome.task == "reach" and outcome.seed == 100


def test_failed_reset_is_recorded_and_its_slot_takes_the_next_episode() -> None:
    specs = [EpisodeSpec("reach", 1, {"stop_at": 4}), EpisodeSpec("fly", 2), EpisodeSpec("push", 3, {"stop_at": 2})]
    hooks = Recorder()
    with make_vector_env(FaultyTabletop, 2, "sync") as venv:
        outcomes = {o.position: o for o in EpisodeScheduler[EpisodeSpec](venv, replan_steps=2).run(specs, hooks)}
    failed = outcomes[1]
    assert failed.infra_failure and not failed.success and failed.steps == 0 and failed.decisions == 0
    assert failed.reason == ENV_ERROR and failed.error is not None and "'fly'" in failed.error
    assert ("started", 1, 1) not in hooks.events and ("ended", (1,)) in hooks.events
    assert ("started", 2, 1) in hooks.events  # env 1 took the next episode in the same fill
    assert hooks.events.index(("ended", (1,))) < hooks.events.index(("decide", (0, 2)))  # before any step
    assert (outcomes[0].steps, outcomes[2].steps) == (4, 2)
    assert not outcomes[0].infra_failure and not outcomes[2].infra_failure


@pytest.mark.slow
def test_worker_crash_in_step_is_an_infrastructure_failure() -> None:
    """A worker dying mid-episode ends that episode as the infrastructure's failure, not the policy's."""
    specs = [EpisodeSpec("reach", 1, {"exit_at": 3}), EpisodeSpec("push", 2, {"stop_at": 5}), EpisodeSpec("reach", 3)]
    hooks = Recorder()
    with make_vector_env(FaultyTabletop, 2, "async") as venv:
        outcomes = {o.position: o for o in EpisodeScheduler[EpisodeSpec](venv, replan_steps=2).run(specs, hooks)}
    crashed = outcomes[0]
    assert crashed.infra_failure and not crashed.success and crashed.reason == WORKER_CRASHED
    assert crashed.error is not None and "exit code 3" in crashed.error
    assert crashed.steps == 2  # the step that crashed is not a step
    assert ("stepped", 0, 3) not in hooks.events and ("chunk_done", 0, True, True) in hooks.events
    policy_failure = outcomes[1]
    assert not policy_failure.infra_failure and policy_failure.reason == "max_steps" and policy_failure.error is None
    assert outcomes[2].steps == MAX_STEPS and not outcomes[2].infra_failure  # ran on the restarted worker


def test_a_chunk_of_the_wrong_shape_is_refused() -> None:
    class Short(Recorder):
        def decide(self, episodes: Sequence[LiveEpisode[EpisodeSpec]], obs: Any) -> np.ndarray:
            return np.zeros((len(episodes), 2, 7), np.float32)

    with make_vector_env(FaultyTabletop, 1, "sync") as venv:
        with pytest.raises(ValueError, match=r"chunk of shape \(2, 7\) for env 0; need \(>= 3"):
            EpisodeScheduler[EpisodeSpec](venv, replan_steps=3).run(_specs([4]), Short())


def test_outcomes_come_out_as_episodes_end() -> None:
    with make_vector_env(FaultyTabletop, 2, "sync") as venv:
        stream = EpisodeScheduler[EpisodeSpec](venv, replan_steps=2).episodes(_specs([6, 2, 3]), Recorder())
        first = next(stream)
        assert (first.position, first.steps) == (1, 2)  # the short episode, while the long one runs
        rest = list(stream)
    assert sorted(o.position for o in rest) == [0, 2]


def test_affinity_keeps_a_group_on_one_env_and_changes_no_episode() -> None:
    """Episodes with one key (a GRPO group: one seed) stay on the env that ran the key's last episode,
    so an env's per-seed cache (the driving suite's expert replay) is filled once per group."""
    specs = [EpisodeSpec(TASKS[0], 100, {"stop_at": n}) for n in (4, 6, 3, 5)]
    specs += [EpisodeSpec(TASKS[1], 200, {"stop_at": n}) for n in (5, 2, 6, 4)]
    rows: list[dict[int, int]] = []
    results = []
    for affinity in (None, lambda spec: (spec.task, spec.seed)):
        hooks = ClosedLoop()
        with make_vector_env(FaultyTabletop, 2, "sync") as venv:
            scheduler = EpisodeScheduler[EpisodeSpec](venv, replan_steps=2, affinity=affinity)
            done = scheduler.run(specs, hooks)
        rows.append({e[1]: e[2] for e in hooks.events if e[0] == "started"})
        finals = {o.position: tuple(hooks.final_state[o.position]) for o in done}
        results.append(sorted((o.position, o.steps, o.episode_return, finals[o.position]) for o in done))
    plain, grouped = rows
    assert {plain[p] for p in range(4)} == {0, 1}  # in order, the first group spreads over both envs
    assert {grouped[p] for p in range(4)} == {grouped[0]} and {grouped[p] for p in range(4, 8)} == {1 - grouped[0]}
    assert results[0] == results[1]  # the same episodes, only run in another order
