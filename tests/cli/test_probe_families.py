"""``cosmos-robot probe`` against served pi05 and GR00T checkpoints: it sends the observation the server
warms up with (one name per input, real-sized images), so the server answers it without a traceback.

Before, the probe filled every announced alias (``observation.images.image`` and ``observation/image``)
with 1x1x1 images, and every LeRobot-family server refused it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cosmos_robot.cli import app
from cosmos_robot.probe import example_observation
from tests.cli.test_cli import CLI, read_ready_line

REPO = Path(__file__).resolve().parents[2]
HORIZON = {"pi05": 5, "groot": 8}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from cosmos_robot.policies.groot.tiny import build_tiny_groot

    return {"pi05": REPO / "checkpoints" / "pi05_tiny", "groot": build_tiny_groot(tmp_path_factory.mktemp("groot"))}


@contextmanager
def serving(folder: Path) -> Iterator[tuple[int, list[str]]]:
    """``serve --ckpt folder`` in a subprocess; yields its websocket port and, after exit, its output lines."""
    proc = subprocess.Popen(
        [*CLI, "serve", "--ckpt", str(folder), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    log: list[str] = []
    try:
        yield read_ready_line(proc, timeout_s=120)["ws"], log
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        log.extend(out.splitlines())


@pytest.mark.parametrize("family", ["pi05", "groot"])
def test_probe_is_answered_by_a_served_checkpoint(family: str, folders: dict[str, Path]) -> None:
    with serving(folders[family]) as (port, log):
        result = CliRunner().invoke(app, ["probe", f"ws://127.0.0.1:{port}", "-n", "3"])
    assert result.exit_code == 0, result.output
    assert f"actions: shape ({HORIZON[family]}, 7), dtype float32" in result.output
    assert "p50" in result.output
    server_log = "\n".join(log)
    assert "Traceback" not in server_log and "are the same input" not in server_log, server_log


@pytest.mark.parametrize("family", ["pi05", "groot"])
def test_probe_sends_the_warmup_observation(family: str, folders: dict[str, Path]) -> None:
    """Rebuilt from the announced metadata alone, the probe's observation is the policy's own example."""
    from cosmos_robot.policies import load_policy_folder

    policy = load_policy_folder(folders[family])
    announced = {**policy.metadata, "input_spec": policy.input_spec.to_dict()}  # what the server sends
    got, want = example_observation(announced), policy.example_observation()
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, str):
            assert got[key] == value
        else:
            assert got[key].shape == value.shape and got[key].dtype == value.dtype
            np.testing.assert_array_equal(got[key], value)
