"""Infrastructure failures in evaluation: real env workers SIGKILLed mid-episode or hung in ``reset``.

What is proved here: an episode whose worker dies is run again with its own seed and the run scores
100 %, not 3/4 (the lost attempt is in ``infra_failures.jsonl`` and the results, never a failure);
with no retry left the episode is *missing* (``complete: false``) and rerunning the same command
runs exactly the missing episodes; a worker that hangs in ``reset`` is timed out after the
configured ``reset_timeout_s``, reported (JSONL, results, console line) and the run goes on.
"""

from __future__ import annotations

import functools
import io
import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from rich.console import Console

from cosmos_robot_envs.eval import EpisodeRecord, EvalCallbacks, EvalConfig, episode_seed, load_events, run_eval
from cosmos_robot_envs.eval import suites as suites_module
from cosmos_robot_envs.eval.progress import RichProgress
from cosmos_robot_envs.eval.suites import Suite
from cosmos_robot_envs.eval.wire import TABLETOP_KEYS
from cosmos_robot_envs.tabletop import ExpertPolicy
from cosmos_robot_envs.vector import EnvFactory

EXPERT = "cosmos_robot_envs.tabletop:ExpertPolicy"
TASKS = ("reach", "push")


def _config(**kw: Any) -> EvalConfig:
    base: dict[str, Any] = {
        "tasks": TASKS,
        "episodes_per_task": 2,
        "num_envs": 2,
        "image_size": 16,
        "vector_mode": "async",
        "video_episodes": 0,
    }
    return EvalConfig(policy=EXPERT, **{**base, **kw})


class _KillingExpert(ExpertPolicy):
    """The scripted expert that SIGKILLs every env worker on its ``kill_at``-th query (once).

    Each env asks on its first step and every ``replan_steps`` after, so on the third query both
    envs are mid-episode: both episodes lose their worker at the next step.
    """

    def __init__(self, kill_at: int = 3) -> None:
        super().__init__()
        self.calls, self.kill_at, self.killed = 0, kill_at, [0]

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.kill_at:
            for child in mp.active_children():
                if child.name.startswith("cosmos-env-") and child.pid is not None:
                    os.kill(child.pid, signal.SIGKILL)
                    self.killed[0] += 1
        return super().infer(obs)


class _Seen(EvalCallbacks):
    def __init__(self) -> None:
        self.keys: list[tuple[str, int]] = []

    def episode(self, record: EpisodeRecord) -> None:
        self.keys.append(record.key)


def test_killed_workers_mid_episode_are_retried_with_the_same_seed(tmp_path: Path) -> None:
    reference = run_eval(_config(vector_mode="sync"), ExpertPolicy(), tmp_path / "sync")
    policy = _KillingExpert()
    results = run_eval(_config(infra_retries=1), policy, tmp_path / "killed")
    assert policy.killed[0] == 2
    totals = results["totals"]
    assert totals["episodes"] == 4 and totals["successes"] == 4 and totals["success_rate"] == 1.0  # not 2/4
    assert results["complete"] and totals["missing"] == 0 and results["episodes_missing"] == []
    assert totals["infra_failures"] == 2 and totals["infra_reasons"] == {"worker_crashed": 2}
    assert totals["truncated_reasons"] == {}
    events = load_events(tmp_path / "killed" / "infra_failures.jsonl")
    assert [(e.phase, e.reason, e.action, e.attempt) for e in events] == [("step", "worker_crashed", "retried", 1)] * 2
    assert all(e.seed == episode_seed(0, e.task, e.episode) and "SIGKILL" in e.error for e in events)
    retried = {e.key for e in events}
    # the reruns replayed the same scenes: every episode is step for step the uninterrupted one
    assert [(e["task"], e["episode"], e["seed"], e["steps"]) for e in results["episodes"]] == [
        (e["task"], e["episode"], e["seed"], e["steps"]) for e in reference["episodes"]
    ]
    assert {(e["task"], e["episode"]) for e in results["episodes"] if e["infra_failures"] == 1} == retried
    saved = json.loads((tmp_path / "killed" / "results.json").read_text())
    assert saved["totals"]["infra_failures"] == 2 and len(saved["infra_failures"]) == 2


def test_episodes_out_of_retries_are_missing_and_a_rerun_runs_exactly_them(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = run_eval(_config(infra_retries=0), _KillingExpert(), out)
    assert not first["complete"]
    missing = {(m["task"], m["episode"]) for m in first["episodes_missing"]}
    assert len(missing) == 2 and all(m["reason"] == "worker_crashed" for m in first["episodes_missing"])
    assert all(m["seed"] == episode_seed(0, m["task"], m["episode"]) for m in first["episodes_missing"])
    assert first["totals"]["episodes"] == 2 and first["totals"]["success_rate"] == 1.0  # scored episodes only
    assert first["totals"]["missing"] == 2 and first["totals"]["infra_failures"] == 2
    assert "incomplete: 2 of 4 episodes recorded" in (out / "report.html").read_text()
    assert [e.action for e in load_events(out / "infra_failures.jsonl")] == ["missing", "missing"]

    seen = _Seen()
    second = run_eval(_config(infra_retries=0), ExpertPolicy(), out, callbacks=seen)
    assert set(seen.keys) == missing and len(seen.keys) == 2  # exactly the missing episodes, once each
    assert second["complete"] and second["totals"]["episodes"] == 4 and second["totals"]["successes"] == 4
    assert second["throughput"]["episodes_this_run"] == 2 and second["throughput"]["episodes_resumed"] == 2
    assert second["totals"]["infra_failures"] == 2  # the history stays visible
    third = run_eval(_config(), ExpertPolicy(), out, callbacks=(again := _Seen()))  # complete: runs nothing
    assert again.keys == [] and third["complete"]


def test_legacy_records_of_crashed_workers_count_as_missing(tmp_path: Path) -> None:
    """Runs recorded before the split kept a crashed worker's episode as a failure: a rerun redoes it."""
    out = tmp_path / "old"
    full = run_eval(_config(vector_mode="sync", tasks=("reach",)), ExpertPolicy(), out)
    lines = (out / "episodes.jsonl").read_text().splitlines()
    old = json.loads(lines[1])
    old.update(success=False, truncated_reason="worker_crashed", worker_error="env 1: worker 7 died (signal SIGKILL)")
    (out / "episodes.jsonl").write_text(lines[0] + "\n" + json.dumps(old) + "\n")
    seen = _Seen()
    redone = run_eval(_config(vector_mode="sync", tasks=("reach",)), ExpertPolicy(), out, callbacks=seen)
    assert seen.keys == [("reach", old["episode"])]
    assert redone["totals"]["successes"] == full["totals"]["successes"] == 2 and redone["complete"]


# -- a worker that hangs in reset ------------------------------------------------------------------
class _HangOnceInReset(gym.Wrapper[Any, Any, Any, Any]):
    """The tabletop env, except that the first reset with ``hang_seed`` (across processes) never returns."""

    def __init__(self, marker: str, hang_seed: int, **kwargs: Any) -> None:
        super().__init__(EnvFactory("CosmosRobot/Tabletop-v0", kwargs)())
        self.marker, self.hang_seed = marker, hang_seed

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed == self.hang_seed and not os.path.exists(self.marker):
            Path(self.marker).touch()
            time.sleep(60)
        return self.env.reset(seed=seed, options=options)


def _hang_suite(marker: Path, hang_seed: int) -> Suite:
    def make_env(tasks: tuple[str, ...], image_size: int, max_steps: int | None, cameras: bool = True) -> Any:
        kwargs = {"tasks": list(tasks), "obs_mode": "all", "image_size": image_size, "max_steps": max_steps}
        return functools.partial(_HangOnceInReset, str(marker), hang_seed, **kwargs)

    return Suite("hang_test", TASKS, make_env, TABLETOP_KEYS, fps=20, video_key="image")


def test_a_reset_hang_is_timed_out_reported_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hang_seed = episode_seed(0, "push", 1)  # the last episode: the other env is idle by then
    monkeypatch.setitem(suites_module._SUITES, "hang_test", lambda: _hang_suite(tmp_path / "hung", hang_seed))
    console = Console(file=io.StringIO(), width=200)
    t0 = time.monotonic()
    with RichProgress(console, plain=True) as progress:
        results = run_eval(
            _config(suite="hang_test", reset_timeout_s=1.5), ExpertPolicy(), tmp_path / "out", callbacks=progress
        )
    assert (tmp_path / "hung").exists() and time.monotonic() - t0 < 30
    assert results["complete"] and results["totals"]["successes"] == 4
    assert results["totals"]["infra_reasons"] == {"reset_timeout": 1}
    (event,) = load_events(tmp_path / "out" / "infra_failures.jsonl")
    assert (event.task, event.episode, event.seed, event.phase, event.action) == (
        "push",
        1,
        hang_seed,
        "reset",
        "recovered",
    )
    assert "gave no reply to 'reset' within 1.5 s" in event.error
    assert results["tasks"]["push"]["infra_failures"] == 1
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "infra failure (reset_timeout, in reset) on push #1" in printed


def test_bad_retry_and_timeout_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="infra_retries"):
        _config(infra_retries=-1)
    with pytest.raises(ValueError, match="reset_timeout_s"):
        _config(reset_timeout_s=0)
