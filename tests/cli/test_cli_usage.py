"""What a newcomer meets first: URLs checked up front, a missing server reported at once, help that lists
the choices and never cuts an option name, errors that blame the right argument, a complete version."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cosmos_robot.cli import COMMANDS, app
from tests.cli.test_cli import CLI, read_ready_line

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- server URLs -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--policy", "http://127.0.0.1:8000"],
         "--policy takes ws://HOST:PORT or MODULE:FACTORY; got http://127.0.0.1:8000; did you mean ws://127.0.0.1:8000?"),
        (["eval", "--policy", "https://gpu-box:9000/"], "did you mean wss://gpu-box:9000/?"),
        (["eval", "--policy", "localhost:8000"], "got localhost:8000; did you mean ws://localhost:8000?"),
        (["eval", "--policy", "ws://host:port"], "--policy takes ws://HOST:PORT"),
        (["eval", "--policy", str(REPO / "checkpoints" / "flow_tabletop")], "evaluate a checkpoint folder with --ckpt"),
        (["probe", "http://127.0.0.1:8000"], "probe takes a server URL ws://HOST:PORT; got http://127.0.0.1:8000; "
                                             "did you mean ws://127.0.0.1:8000?"),
    ],
)  # fmt: skip
def test_bad_server_urls_say_what_is_expected(args: list[str], message: str, tmp_path: Path) -> None:
    extra = ["--out", str(tmp_path)] if args[0] == "eval" else []
    result = CliRunner().invoke(app, [*args, *extra], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and "has no attribute" not in result.output


def test_eval_against_no_server_fails_at_once(tmp_path: Path) -> None:
    url = f"ws://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    result = runner.invoke(app, ["eval", "--policy", url, "--out", str(tmp_path), "--tasks", "reach"])
    elapsed = time.monotonic() - t0
    assert result.exit_code == 1, result.output
    assert f"connecting to {url} ..." in result.output
    assert f"could not connect to {url}: connection refused" in result.output and "--wait-s" in result.output
    assert elapsed < 2.0  # was the whole 10 s connect deadline


def test_probe_against_no_server_fails_at_once() -> None:
    url = f"ws://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    result = subprocess.run([*CLI, "probe", url], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"connecting to {url} ..." in result.stderr
    assert f"cannot reach {url}" in result.stdout and "connection refused" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert time.monotonic() - t0 < 10.0  # the interpreter's start-up included; the connect itself is immediate


def test_wait_s_waits_for_a_server_that_is_still_starting() -> None:
    """`serve` started a moment before `probe --wait-s`: refused at first, then served."""
    port = free_port()
    serve = subprocess.Popen(
        [*CLI, "serve", "--policy", "cosmos_robot_server.example_policies:constant", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        probe = subprocess.run(
            [*CLI, "probe", f"ws://127.0.0.1:{port}", "-n", "2", "--wait-s", "60"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert probe.returncode == 0, probe.stdout + probe.stderr
        read_ready_line(serve)
    finally:
        serve.terminate()
        serve.wait(timeout=20)


def test_client_refused_timeout_only_shortens_a_refused_first_connection() -> None:
    from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

    url = f"ws://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="connection refused"):
        WebsocketClientPolicy(url, connect_timeout_s=30, refused_timeout_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 2.0
    with pytest.raises(ConnectionError, match="within connect_timeout_s=0.3"):  # default: the whole deadline
        WebsocketClientPolicy(url, connect_timeout_s=0.3)


# -- help --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_option_name_whole_at_80_columns(command: str) -> None:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    click_command = get_command(app).commands[command]  # type: ignore[attr-defined]
    names = ["--help", *(n for p in click_command.params for n in (*p.opts, *p.secondary_opts) if n.startswith("--"))]
    words = set(result.output.replace("/", " ").replace(",", " ").split())
    missing = [n for n in names if n not in words]
    assert not missing, result.output


def test_help_lists_suites_and_recipes() -> None:
    from cosmos_robot.config.recipes import RECIPES_DIR
    from cosmos_robot_envs.eval.suites import SUITE_NAMES

    text = " ".join(runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "120"}).output.split())
    assert "Env suite: " + ", ".join(SUITE_NAMES) + "." in text
    text = " ".join(runner.invoke(app, ["train", "--help"], env={"COLUMNS": "120"}).output.split())
    recipes = sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))
    assert len(recipes) > 5 and "Recipes: " + ", ".join(recipes) + "." in text


def test_help_shows_the_new_eval_switches() -> None:
    out = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "120"}).output
    for name in ("--batch-requests", "--no-batch-requests", "--align-starts", "--no-align-starts", "--wait-s"):
        assert name in out


# -- errors name the argument ------------------------------------------------------------------------
def test_set_errors_blame_the_set_argument(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "debug", "--set", "optim.lr=abc"])
    assert result.exit_code == 2
    assert "--set optim.lr=abc: optim.lr: Input should be a valid number" in result.output
    assert "debug.toml" not in result.output  # the recipe file is fine
    result = runner.invoke(app, ["train", "debug", "--set", "train.ckpt_every=7"])  # a table's validator
    assert result.exit_code == 2 and "--set train.ckpt_every=7: train: Value error" in result.output

    bad = tmp_path / "bad.toml"
    bad.write_text((REPO / "recipes" / "debug.toml").read_text().replace("lr = 1e-3", 'lr = "fast"'))
    result = runner.invoke(app, ["train", str(bad), "--set", "train.steps=3"])
    assert result.exit_code == 2
    assert f"{bad}: invalid config:\n  optim.lr: Input should be a valid number" in result.output  # the file
    assert "--set train.steps=3:" not in result.output


def test_eval_ckpt_passes_policy_args_to_the_family_like_serve(tmp_path: Path) -> None:
    ckpt = str(REPO / "checkpoints" / "pi05_tiny")
    result = runner.invoke(app, ["eval", "--ckpt", ckpt, "-a", "compiled=true", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "pi05 family does not take option(s) ['compiled']" in result.output and "'compile'" in result.output
    args = ["eval", "--ckpt", ckpt, "-a", "cuda_graphs=false", "--tasks", "reach", "--episodes-per-task", "1",
            "--num-envs", "1", "--image-size", "32", "--max-steps", "5", "--vector-mode", "sync",
            "--video-episodes", "0", "--out", str(tmp_path / "ev")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert results["config"]["policy_args"] == {"cuda_graphs": False}  # part of the run's identity (resume)


def test_version_lists_every_component() -> None:
    from importlib.metadata import PackageNotFoundError, version

    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.output.splitlines()]
    for dist in ("cosmos-robot-client", "cosmos-robot-server", "cosmos-robot-envs", "cosmos-robot",
                 "cosmos-robot-trainers", "python"):  # fmt: skip
        assert dist in names
    try:
        assert f"cosmos-robot-exporters {version('cosmos-robot-exporters')}" in result.output
    except PackageNotFoundError:
        assert "cosmos-robot-exporters" not in result.output  # optional: listed only when installed


def test_console_script_and_module_entry_points() -> None:
    exe = Path(sys.executable).with_name("cosmos-robot")
    for cmd in ([str(exe)], CLI):
        out = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "cosmos-robot-client" in out.stdout, out.stderr
