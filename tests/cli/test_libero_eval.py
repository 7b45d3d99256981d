"""``cosmos-robot eval --suite libero_*``: the real LIBERO in its venv, one batched request per step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import libero_python


@pytest.mark.slow
def test_eval_cli_runs_a_libero_suite(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cosmos_robot.cli import app

    libero_python()
    args = ["eval", "--policy", "cosmos_robot_server.example_policies:constant", "-a", "action_dim=7"]
    args += ["--suite", "libero_goal", "--tasks", "put_the_bowl_on_the_stove", "--episodes-per-task", "2"]
    args += ["--num-envs", "2", "--max-steps", "4", "--image-size", "32", "--video-episodes", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["suite"] == "libero_goal"
    episodes = results["episodes"]
    assert [(e["task"], e["episode"], e["success"]) for e in episodes] == [
        ("put_the_bowl_on_the_stove", 0, False),
        ("put_the_bowl_on_the_stove", 1, False),
    ]
    assert all(e["steps"] == 4 for e in episodes)
    assert results["throughput"]["mean_request_batch"] == 2.0  # both envs in one request
    assert list((tmp_path / "videos").glob("*.mp4"))
