"""What a person reads from an eval: a complete rerun leaves the report alone, the report names what
was evaluated, failed episodes are filmed and their seeds listed, logs get plain progress lines, and
tasks can be picked by index. Real tabletop envs and the scripted expert, tiny images."""

from __future__ import annotations

import importlib.metadata
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cosmos_robot_envs.eval import EvalConfig, build_schedule, get_suite, load_records, run_eval
from cosmos_robot_envs.eval.config import config_mismatch
from cosmos_robot_envs.eval.progress import RichProgress
from cosmos_robot_envs.tabletop import ExpertPolicy
from tests.helpers import libero_python

EXPERT = "cosmos_robot_envs.tabletop:ExpertPolicy"


class ServedExpert(ExpertPolicy):
    """The expert announcing what a policy server announces about its checkpoint."""

    @property
    def metadata(self) -> dict[str, Any]:
        return {**super().metadata, "checkpoint": "checkpoints/flow_tabletop", "family": "flow"}


def _config(**kw: Any) -> EvalConfig:
    base: dict[str, Any] = {"tasks": ("reach",), "episodes_per_task": 2, "num_envs": 2, "image_size": 16}
    base.update(vector_mode="sync", video_episodes=0)
    return EvalConfig(policy=EXPERT, **{**base, **kw})


def test_rerunning_a_complete_eval_keeps_its_report_and_throughput(tmp_path: Path) -> None:
    first = run_eval(_config(video_episodes=1), ServedExpert(), tmp_path)
    assert first["complete"] and first["throughput"]["episodes_per_min"] > 0
    report = (tmp_path / "report.html").read_bytes()
    stamps = {name: (tmp_path / name).stat().st_mtime_ns for name in ("report.html", "success_rate.png")}

    again = run_eval(_config(video_episodes=1), ServedExpert(), tmp_path)
    assert again["complete"]
    thr = again["throughput"]
    assert (thr["episodes_this_run"], thr["episodes_resumed"]) == (0, 2)
    for key in ("episodes_per_min", "requests", "observations", "loop_s", "measured_at"):
        assert thr[key] == first["throughput"][key], key  # what the working run measured, not zeros
    assert thr["measured_at"] == first["created_at"] == again["created_at"]
    assert (tmp_path / "report.html").read_bytes() == report
    assert {name: (tmp_path / name).stat().st_mtime_ns for name in stamps} == stamps
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["complete"] and saved["throughput"] == thr and saved["totals"] == first["totals"]
    # a zero rate, not a rate that merely ends in "0.0" (1210.0 episodes/min failed a CI run)
    assert not re.search(r"(?<![\d.])0\.0 episodes/min", report.decode())


def test_report_names_the_checkpoint_time_and_version(tmp_path: Path) -> None:
    results = run_eval(_config(), ServedExpert(), tmp_path, policy_kind="websocket")
    policy = results["policy"]
    assert (policy["checkpoint"], policy["family"], policy["source"]) == ("checkpoints/flow_tabletop", "flow", EXPERT)
    version = importlib.metadata.version("cosmos-robot-envs")
    assert results["versions"] == {"cosmos-robot-envs": version}
    html = (tmp_path / "report.html").read_text()
    for text in ("checkpoints/flow_tabletop", "(flow)", results["created_at"], f"cosmos-robot-envs {version}"):
        assert text in html, text
    assert "<b id='status'>complete</b>" in html
    # a policy announcing nothing is named by its source
    plain = run_eval(_config(), ExpertPolicy(), tmp_path / "plain")
    assert plain["policy"]["checkpoint"] == EXPERT and plain["policy"]["family"] == "ExpertPolicy"


def test_failed_episodes_are_filmed_and_their_seeds_listed(tmp_path: Path) -> None:
    # 4 steps are too few to reach anything: every episode fails by the time limit
    config = _config(episodes_per_task=6, max_steps=4, video_episodes=1)
    results = run_eval(config, ExpertPolicy(), tmp_path)
    seeds = [s.seed for s in build_schedule(config, ("reach",))]
    stats = results["tasks"]["reach"]
    assert stats["successes"] == 0 and stats["failed_seeds"] == seeds and stats["infra_failures"] == 0
    videos = sorted(p.name for p in (tmp_path / "videos").iterdir())
    # episode 0 as scheduled, then the first 3 failures (FAILURE_VIDEOS_PER_TASK); the rest not
    assert videos == [f"reach_ep{i:03d}.mp4" for i in range(4)]
    html = (tmp_path / "report.html").read_text()
    assert f"seeds {', '.join(str(s) for s in seeds)}" in html
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["tasks"]["reach"]["failed_seeds"] == seeds

    off = run_eval(EvalConfig(**{**config.to_dict(), "video_failures": False}), ExpertPolicy(), tmp_path / "off")
    assert [r["video"] for r in off["episodes"]] == ["videos/reach_ep000.mp4"] + [None] * 5
    none = run_eval(EvalConfig(**{**config.to_dict(), "video_episodes": 0}), ExpertPolicy(), tmp_path / "none")
    assert not (tmp_path / "none" / "videos").exists() and all(r["video"] is None for r in none["episodes"])


def test_successful_episodes_are_not_filmed_beyond_video_episodes(tmp_path: Path) -> None:
    run_eval(_config(episodes_per_task=3, video_episodes=1), ExpertPolicy(), tmp_path)
    records = load_records(tmp_path / "episodes.jsonl")
    assert all(r.success for r in records.values())
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["reach_ep000.mp4"]


def test_plain_progress_lines_when_the_console_is_not_a_terminal(tmp_path: Path) -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    with RichProgress(console, every=2) as progress:
        assert progress.plain
        run_eval(_config(episodes_per_task=4, num_envs=2), ExpertPolicy(), tmp_path, callbacks=progress)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("eval: 0/4 episodes, success 0/0 (-), 0.0 episodes/min")
    assert any(line.startswith("eval: 2/4 episodes, success 2/2 (100.0%)") for line in lines)
    assert lines[-1].startswith("eval: 4/4 episodes, success 4/4 (100.0%)") and "ETA 0:00:00" in lines[-1]
    assert all("episodes/min" in line for line in lines) and "\x1b[" not in buf.getvalue()

    buf = io.StringIO()
    with RichProgress(Console(file=buf, force_terminal=False), every=100, interval_s=0.0) as progress:
        run_eval(_config(episodes_per_task=4), ExpertPolicy(), tmp_path, callbacks=progress)  # all resumed
    assert buf.getvalue().splitlines()[:2] == [
        "resuming: 4 of 4 episodes already recorded",
        "eval: 4/4 episodes, success 4/4 (100.0%), 0.0 episodes/min, elapsed 0:00:00, ETA 0:00:00",
    ]


def test_tasks_can_be_picked_by_index() -> None:
    suite = get_suite("tabletop")
    names = suite.task_names
    assert suite.resolve_tasks("0,3") == (names[0], names[3])
    assert suite.resolve_tasks(["0-2"]) == names[:3]
    assert suite.resolve_tasks(["push", "1", "3"]) == ("push", names[3])  # a name and its index are one task
    assert suite.resolve_tasks([]) == names
    for bad in ("fly", "9", "1-7", "3-1"):
        with pytest.raises(ValueError, match=rf"'{bad}' not in suite 'tabletop'.*\[2\] pick_place.*index 0-3"):
            suite.resolve_tasks([bad])


def test_libero_tasks_can_be_picked_by_index() -> None:
    libero_python()  # skips without the LIBERO venv
    suite = get_suite("libero_spatial")
    assert suite.resolve_tasks("0,3") == (suite.task_names[0], suite.task_names[3])
    assert suite.resolve_tasks("0-4") == suite.task_names[:5]
    with pytest.raises(ValueError, match=r"'10' not in suite 'libero_spatial'.*\[9\] .*index 0-9"):
        suite.resolve_tasks("10")


def test_a_run_saved_before_a_config_field_existed_still_resumes() -> None:
    saved = json.loads(json.dumps(_config().to_dict()))
    del saved["video_failures"]
    assert config_mismatch(saved, _config()) == []
    assert config_mismatch({**saved, "seed": 3}, _config()) == ["seed: saved 3, now 0"]
