"""``cosmos-robot record``: a tiny in-process run, a rerun that finds it complete, clear exits for a folder
holding another recording or an unknown task, and
(slow) the real command with async workers and with MP4 videos (its help: tests/cli/test_cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from typer.testing import CliRunner

from cosmos_robot.cli import app
from cosmos_robot.data.loader import load_demonstrations
from cosmos_robot.data.record import load_sidecar

runner = CliRunner()
TINY = ["record", "--tasks", "reach", "--episodes-per-task", "2", "--num-envs", "2", "--image-size", "32"]


def test_tiny_record_run_then_refuse_then_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "demos"
    result = runner.invoke(app, [*TINY, "--vector-mode", "sync", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "kept 2/2 episodes" in result.output
    assert LeRobotDataset("local/demos", root=out).num_episodes == 2

    again = runner.invoke(app, [*TINY, "--vector-mode", "sync", "--out", str(out)])  # the same recording: done
    assert again.exit_code == 0, again.output
    assert "already holds this recording, complete" in again.output

    other = runner.invoke(app, [*TINY, "--vector-mode", "sync", "--seed", "3", "--out", str(out)])
    assert other.exit_code == 2
    assert "another config (seed: saved 0, now 3)" in other.output and "--overwrite" in other.output

    forced = runner.invoke(app, [*TINY, "--vector-mode", "sync", "--seed", "3", "--overwrite", "--out", str(out)])
    assert forced.exit_code == 0, forced.output
    assert load_sidecar(out)["config"]["seed"] == 3


def test_unknown_task_and_bad_mode_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["record", "--tasks", "reach,fly", "--out", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert "'fly' not in suite 'tabletop'" in result.output and "pick_place" in result.output
    result = runner.invoke(app, ["record", "--vector-mode", "threads", "--out", str(tmp_path / "d")])
    assert result.exit_code == 2 and "vector_mode" in result.output
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_real_command_with_async_workers_matches_sync(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    args = ["--tasks", "reach,push", "--episodes-per-task", "2", "--num-envs", "3", "--image-size", "32"]
    cmd = [sys.executable, "-m", "cosmos_robot.cli", "record", *args, "--out", str(tmp_path / "async")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    side = load_sidecar(tmp_path / "async")
    assert side["command"][:2] == ["cosmos-robot", "record"] and "--num-envs" in side["command"]
    assert side["config"]["vector_mode"] == "async"
    sync = runner.invoke(app, ["record", *args, "--vector-mode", "sync", "--out", str(tmp_path / "sync")])
    assert sync.exit_code == 0, sync.output
    a = load_demonstrations(tmp_path / "async", chunk_size=4, image_size=32)
    b = load_demonstrations(tmp_path / "sync", chunk_size=4, image_size=32)
    assert np.array_equal(a.actions.numpy(), b.actions.numpy()) and np.array_equal(a.images.numpy(), b.images.numpy())


def test_videos_store_mp4_that_load_back_close_to_the_png_frames(tmp_path: Path) -> None:
    args = [*TINY, "--image-size", "64", "--vector-mode", "sync"]
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "png")]).exit_code == 0
    result = runner.invoke(app, [*args, "--videos", "--out", str(tmp_path / "mp4")])
    assert result.exit_code == 0, result.output
    assert list((tmp_path / "mp4" / "videos").rglob("*.mp4"))
    png = load_demonstrations(tmp_path / "png", chunk_size=4, image_size=64)
    mp4 = load_demonstrations(tmp_path / "mp4", chunk_size=4, image_size=64)
    assert np.array_equal(png.actions.numpy(), mp4.actions.numpy())
    error = np.abs(png.images.numpy().astype(np.int16) - mp4.images.numpy().astype(np.int16)).mean()
    assert error < 8.0, f"mean abs pixel error {error:.2f} after lossy video coding"
