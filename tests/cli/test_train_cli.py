"""``cosmos-robot train``: the debug recipe end to end (record, train, resume), clear exits for bad
recipes and overrides, and a real SIGKILL mid-run followed by an exact resume (its help: tests/cli/test_cli.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cosmos_robot.cli import app
from cosmos_robot_trainers.common import checkpoint_dirs, read_metrics

runner = CliRunner()


def debug_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "train",
        "debug",
        "--set",
        f"data.root={json.dumps(str(tmp_path / 'demos'))}",
        "--set",
        f"output.dir={json.dumps(str(tmp_path / 'run'))}",
        "--set",
        "train.progress=false",
        *extra,
    ]


def test_debug_recipe_records_trains_and_resumes(tmp_path: Path) -> None:
    result = runner.invoke(app, debug_args(tmp_path))
    assert result.exit_code == 0, result.output
    assert "recording 2 expert episodes per task" in result.output
    final = tmp_path / "run" / "final"
    assert (final / "model.safetensors").exists() and f"policy: {final}" in result.output
    again = runner.invoke(app, debug_args(tmp_path))
    assert again.exit_code == 0, again.output
    assert "resuming from" in again.output and "step_000020" in again.output
    changed = runner.invoke(app, debug_args(tmp_path, "--set", "optim.lr=0.5"))
    assert changed.exit_code == 2
    assert "optim.lr: saved 0.001, now 0.5" in changed.output and "--overwrite" in changed.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "debgu"], "did you mean 'debug'"),
        (["train", "debug", "--set", "train.lr=1"], "train.lr: unknown field"),
        (["train", "debug", "--set", "optim.lr=abc"], "optim.lr: Input should be a valid number"),
        (["train", "debug", "--set", "novalue"], "expected KEY=VALUE"),
    ],
)
def test_bad_recipes_exit_2_naming_the_problem(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_gives_the_uninterrupted_curve(tmp_path: Path) -> None:
    """A real ``kill -9`` of ``cosmos-robot train`` between checkpoints, then the same command again."""
    steps = ["--set", "train.steps=600", "--set", "train.ckpt_every=100", "--set", "train.log_every=20"]
    cli = [sys.executable, "-m", "cosmos_robot.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    whole = subprocess.run(
        [*cli, *debug_args(tmp_path / "a", *steps)], env=env, capture_output=True, text=True, timeout=240
    )
    assert whole.returncode == 0, whole.stderr
    b = tmp_path / "b"
    proc = subprocess.Popen([*cli, *debug_args(b, *steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while not [s for s, _ in checkpoint_dirs(b / "run" / "checkpoints") if s >= 100]:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # ~500 steps before the end: seconds of margin
    proc.wait(timeout=30)
    assert not (b / "run" / "final").exists(), "the run finished before it was killed"
    resumed = subprocess.run([*cli, *debug_args(b, *steps)], env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    ra, rb = read_metrics(tmp_path / "a" / "run"), read_metrics(b / "run")
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == list(range(20, 601, 20))
    assert [(r["loss"], r["grad_norm"], r["lr"]) for r in ra] == [(r["loss"], r["grad_norm"], r["lr"]) for r in rb]
