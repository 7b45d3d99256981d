"""``cosmos-robot train`` output: the debug recipe records into its run folder (wherever output.dir points),
and progress reaches a log file as plain lines when stderr is not a terminal."""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

from rich.console import Console

from cosmos_robot_trainers.common.progress import TrainProgress, format_duration
from cosmos_robot_trainers.launch import load_train_recipe
from tests.cli.test_cli import CLI


def test_debug_recipe_data_follows_output_dir() -> None:
    assert load_train_recipe("debug", ["output.dir=elsewhere/run"])[1].data.root == "elsewhere/run/demos"
    assert load_train_recipe("debug", [])[1].data.root == "runs/debug/demos"
    assert load_train_recipe("debug", ["output.dir=x", "data.root=mine"])[1].data.root == "mine"  # explicit wins
    # a recipe that names its data keeps it (shared recordings)
    assert load_train_recipe("sft_flow_tabletop", ["output.dir=x"])[1].data.root.startswith("runs/demos/")


def test_train_debug_records_under_output_dir_and_logs_progress_lines(tmp_path: Path) -> None:
    """The real command, stderr to a pipe: demos land in output.dir/demos (nothing under ./runs), and
    the progress comes as plain `step N/T` lines instead of an invisible bar."""
    cwd, out = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    args = ["train", "debug", "--set", f"output.dir={out}", "--set", "train.steps=10"]
    proc = subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "demos" / "meta" / "info.json").exists()
    assert not (cwd / "runs").exists()
    assert f"into {out / 'demos'}" in proc.stderr  # the recording message names where
    lines = [line for line in proc.stderr.splitlines() if line.startswith("debug: step ")]
    assert lines and lines[-1].startswith("debug: step 10/10 (100%)"), proc.stderr[-3000:]
    assert re.search(r"steps/s, elapsed \d+:\d\d.*loss=", lines[-1])


def test_plain_lines_every_n_steps_and_at_the_end() -> None:
    buf = io.StringIO()
    with TrainProgress(100, 0, "sft", console=Console(file=buf, width=200), every_steps=25, every_s=1e9) as bar:
        assert not bar.console.is_terminal
        for step in range(1, 91):
            bar.update(step, {"loss": 0.5 / step}, rate=10.0)
    lines = buf.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "sft: step 25/100 (25%)", "sft: step 50/100 (50%)", "sft: step 75/100 (75%)", "sft: step 90/100 (90%)"
    ]  # fmt: skip
    assert lines[1] == "sft: step 50/100 (50%), 10.00 steps/s, elapsed 0:00, eta 0:05, loss=0.01"


def test_plain_lines_every_interval_and_none_when_disabled_or_on_a_terminal() -> None:
    buf = io.StringIO()
    with TrainProgress(1000, 10, "rl", console=Console(file=buf), every_steps=1000, every_s=0.0) as bar:
        bar.update(11)
        bar.update(12)
    assert [line.split(",")[0] for line in buf.getvalue().splitlines()] == [
        "rl: step 11/1000 (1%)",
        "rl: step 12/1000 (1%)",
    ]
    quiet = io.StringIO()
    with TrainProgress(10, console=Console(file=quiet), enabled=False) as bar:
        bar.update(10, {"loss": 1.0})
    assert quiet.getvalue() == ""
    tty = io.StringIO()
    with TrainProgress(10, console=Console(file=tty, force_terminal=True), every_s=0.0) as bar:
        bar.update(5, {"loss": 1.0})
    assert "step 5/10" not in tty.getvalue()  # a terminal gets the bar, not lines


def test_format_duration() -> None:
    assert (format_duration(65), format_duration(3725), format_duration(-1)) == ("1:05", "1:02:05", "0:00")
