"""The ``cosmos-robot`` CLI: help on every command, clear start-up errors, and a real serve + probe."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cosmos_robot.cli import app
from cosmos_robot.policy_loading import PolicyLoadError, load_policy_factory, parse_policy_args
from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

runner = CliRunner()
CLI = [sys.executable, "-m", "cosmos_robot.cli"]


# what each command's help shows besides its usage and an example
HELP_SHOWS: dict[str, tuple[str, ...]] = {
    "serve": (),
    "probe": (),
    "eval": ("--policy", "--episodes-per-task", "--num-envs", "--replan-steps", "--overwrite"),
    "train": ("--set", "--resume", "--no-resume", "--overwrite", "sft_flow_tabletop"),
    "record": ("--out", "--episodes-per-task", "--num-envs", "--only-success", "--overwrite", "--videos"),
    "version": (),
}


@pytest.mark.parametrize("command", ["", *HELP_SHOWS])
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = runner.invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
    for text in ("Example", *HELP_SHOWS[command]) if command else ():
        assert text in result.output, text


def test_parse_policy_args() -> None:
    got = parse_policy_args(["action_horizon=10", "name=abc", "flag=true", "delay_ms=2.5", "shape=(1, 2)"])
    assert got == {"action_horizon": 10, "name": "abc", "flag": True, "delay_ms": 2.5, "shape": (1, 2)}
    with pytest.raises(PolicyLoadError, match="KEY=VALUE"):
        parse_policy_args(["novalue"])


@pytest.mark.parametrize(
    ("ref", "kwargs", "message"),
    [
        ("no_colon", {}, "expected MODULE:FACTORY"),
        ("not_a_module_xyz:f", {}, "cannot import module 'not_a_module_xyz'"),
        ("cosmos_robot_server.example_policies:constnt", {}, "did you mean 'constant'"),
        ("cosmos_robot_server.example_policies:constant", {"horizon": 3}, "bad --policy-arg"),
        ("cosmos_robot_server.example_policies:__doc__", {}, "not a callable factory"),
        ("builtins:dict", {}, "has no infer"),
    ],
)
def test_policy_loading_errors(ref: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyLoadError, match=message):
        load_policy_factory(ref, kwargs)


def test_serve_bad_policy_exits_with_message() -> None:
    result = runner.invoke(app, ["serve", "--policy", "cosmos_robot_server.example_policies:constnt"])
    assert result.exit_code == 2
    assert "did you mean 'constant'" in result.output
    result = runner.invoke(app, ["serve", "--policy", "x:y", "--transport", "grpc"])
    assert result.exit_code != 0 and "grpc" in result.output


def test_serve_warmup_errors_name_the_problem() -> None:
    """A policy without an example observation cannot be warmed up: exit 1 with the reason; a bad
    --warmup value or a batch size above --max-batch: exit 2 naming the option."""
    result = runner.invoke(
        app, ["serve", "--policy", "cosmos_robot_server.example_policies:constant", "--port", "0", "--warmup", "1"]
    )
    assert result.exit_code == 1 and "offers no example observation" in result.output
    result = runner.invoke(app, ["serve", "--policy", "cosmos_robot_server.example_policies:constant", "--warmup", "x"])
    assert result.exit_code == 2 and "--warmup 'x'" in result.output
    result = runner.invoke(
        app, ["serve", "--policy", "x:y", "--warmup", "1,32", "--max-batch", "16"]
    )  # fmt: skip
    assert result.exit_code == 2 and "warmup_batches: [32]" in result.output


def read_ready_line(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> dict[str, int]:
    """Wait for ``serve``'s ``ready:`` line; returns {transport: port}."""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail(f"serve exited early with {proc.returncode}")
        if line.startswith("ready:"):
            return {name: int(port) for name, port in re.findall(r"(\w+) \w+://[\d.]+:(\d+)", line)}
    proc.kill()
    pytest.fail(f"serve did not print a ready line within {timeout_s:.0f} s")


def _start_serve(*extra: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*CLI, "serve", "--policy", "cosmos_robot_server.example_policies:constant", "-a", "action_horizon=5",
         "--port", "0", "--zmq-port", "0", "--http-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    return proc, read_ready_line(proc)


def test_serve_answers_clients_and_probe_reports_latency() -> None:
    proc, ports = _start_serve("--transport", "all")
    try:
        assert set(ports) == {"ws", "zmq", "http"}
        with WebsocketClientPolicy("127.0.0.1", ports["ws"], connect_timeout_s=10) as client:
            reply = client.infer({"observation/state": np.zeros(8)})
            assert reply["actions"].shape == (5, 7)
        probe = subprocess.run(
            [*CLI, "probe", f"ws://127.0.0.1:{ports['ws']}", "-n", "5"], capture_output=True, text=True, timeout=60
        )
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert "p50" in probe.stdout and "(5, 7)" in probe.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_probe_unreachable_server_is_a_clear_error() -> None:
    result = subprocess.run(
        [*CLI, "probe", "ws://127.0.0.1:9", "--timeout-s", "1"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert "cannot reach ws://127.0.0.1:9" in result.stdout
