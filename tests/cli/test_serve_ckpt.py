"""``cosmos-robot serve --ckpt`` answers the real openpi client; ``eval --ckpt`` runs in-process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cosmos_robot.cli import app
from cosmos_robot.policies.flow import FlowPolicy
from tests.cli.test_cli import read_ready_line
from tests.helpers import openpi_python
from tests.policies._flow_helpers import scrambled_model, tiny_config, tiny_stats

CLI = [sys.executable, "-m", "cosmos_robot.cli"]

# the start of every openpi client script below (run in .venv-openpi, port in argv[1])
CLIENT_HEAD = """
import json, sys, numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy
client = WebsocketClientPolicy("127.0.0.1", int(sys.argv[1]))
meta = client.get_server_metadata()
rng = np.random.default_rng(0)
"""

OPENPI_CLIENT = (
    CLIENT_HEAD
    + """
obs = {"observation/image": rng.integers(0, 256, (128, 128, 3), dtype=np.uint8),
       "observation/wrist_image": rng.integers(0, 256, (128, 128, 3), dtype=np.uint8),
       "observation/state": rng.standard_normal(8), "prompt": "open the drawer"}
a = client.infer(obs)["actions"]
print(json.dumps({"shape": list(a.shape), "dtype": str(a.dtype), "type": meta.get("type"),
                  "action_horizon": meta.get("action_horizon"), "finite": bool(np.isfinite(a).all())}))
"""
)


def serve_and_ask(folder: Path, client_code: str, *extra: str) -> dict:
    """`cosmos-robot serve --ckpt folder` in a subprocess, one request from openpi's own client in .venv-openpi."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*CLI, "serve", "--ckpt", str(folder), "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        ports = read_ready_line(proc)
        out = subprocess.run([str(openpi_python()), "-c", client_code, str(ports["ws"])], capture_output=True,
                             text=True, timeout=120, check=True)  # fmt: skip
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def flow_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tiny_config(chunk_size=6)
    path = tmp_path_factory.mktemp("ckpt") / "flow"
    FlowPolicy(scrambled_model(config), tiny_stats(config)).save_pretrained(path)
    return path


def test_serve_ckpt_answers_real_openpi_client(flow_ckpt: Path) -> None:
    got = serve_and_ask(flow_ckpt, OPENPI_CLIENT)
    assert got == {"shape": [6, 7], "dtype": "float32", "type": "flow", "action_horizon": 6, "finite": True}


@pytest.fixture(scope="module")
def pi05_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.policies._pi05_helpers import tiny_pi05

    return tiny_pi05(seed=1).save_pretrained(tmp_path_factory.mktemp("ckpt") / "pi05")


def test_serve_pi05_ckpt_answers_real_openpi_client(pi05_ckpt: Path) -> None:
    """A LeRobot pi05 folder behind `serve --ckpt`: openpi's LIBERO keys in, a (5, 7) chunk out."""
    got = serve_and_ask(pi05_ckpt, OPENPI_CLIENT)
    assert got == {"shape": [5, 7], "dtype": "float32", "type": "pi05", "action_horizon": 5, "finite": True}


def test_serve_warms_up_before_ready(pi05_ckpt: Path) -> None:
    got = serve_and_ask(pi05_ckpt, OPENPI_CLIENT, "--warmup", "1,2", "--max-batch", "4")
    assert got["shape"] == [got["action_horizon"], 7] and got["finite"]


def test_warmup_option() -> None:
    from cosmos_robot.cli import warmup_batches

    assert warmup_batches("auto", 16, "cuda:0") == (1, 2, 4, 8, 16)
    assert warmup_batches("auto", 6, "cuda") == (1, 2, 4, 6)
    assert warmup_batches("auto", 16, "cpu") == () and warmup_batches("auto", 16, None) == ()
    assert warmup_batches("none", 16, "cuda") == () and warmup_batches("1,4", 16, "cpu") == (1, 4)
    with pytest.raises(ValueError, match="--warmup 'fast': expected auto, none or batch sizes"):
        warmup_batches("fast", 16, "cpu")


def test_serve_ckpt_bad_folder_is_a_clear_error(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--ckpt", str(tmp_path)])
    assert result.exit_code == 2 and "missing config.json" in result.output
    (tmp_path / "config.json").write_text(json.dumps({"type": "pi5"}))
    result = runner.invoke(app, ["serve", "--ckpt", str(tmp_path)])
    assert result.exit_code == 2 and "unknown policy type 'pi5'" in result.output
    result = runner.invoke(app, ["serve"])
    assert result.exit_code != 0 and "exactly one of --ckpt" in result.output


def test_ckpt_options_are_checked_against_the_family(pi05_ckpt: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--ckpt", str(pi05_ckpt), "-a", "compiled=true"])
    assert result.exit_code == 2
    assert "pi05 family does not take option(s) ['compiled']" in result.output and "'compile'" in result.output


def test_bad_device_is_a_clear_error(flow_ckpt: Path) -> None:
    import torch

    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--ckpt", str(flow_ckpt), "--device", "tpu9"])
    assert result.exit_code == 2 and "--device" in result.output
    if not torch.cuda.is_available():
        result = runner.invoke(app, ["serve", "--ckpt", str(flow_ckpt), "--device", "cuda"])
        assert result.exit_code == 2 and "CUDA is not available" in result.output


def test_eval_ckpt_in_process(flow_ckpt: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["eval", "--ckpt", str(flow_ckpt), "--tasks", "reach", "--episodes-per-task", "2", "--num-envs", "2",
            "--image-size", "32", "--max-steps", "10", "--vector-mode", "sync", "--video-episodes", "0",
            "--out", str(tmp_path / "ev")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert results["totals"]["episodes"] == 2
    assert results["policy"]["kind"] == "checkpoint" and results["policy"]["metadata"]["type"] == "flow"


STATE_PPO = Path(__file__).resolve().parents[2] / "checkpoints" / "flow_tabletop_state_ppo"
STATE_CLIENT = (
    CLIENT_HEAD
    + """
obs = {"observation/state": rng.standard_normal(8), "observation/object_state": rng.standard_normal(15),
       "prompt": "reach the red target"}
a = client.infer(obs)["actions"]
print(json.dumps({"shape": list(a.shape), "cameras": meta.get("cameras"), "finite": bool(np.isfinite(a).all())}))
"""
)


def test_committed_state_ppo_checkpoint_serves_and_evaluates_without_cameras(tmp_path: Path) -> None:
    """The camera-free checkpoint answers openpi's client with state + object_state, and ``eval --ckpt``
    runs it on unrendered envs (no camera in its input spec: obs_mode "state")."""
    got = serve_and_ask(STATE_PPO, STATE_CLIENT)
    assert got == {"shape": [10, 7], "cameras": [], "finite": True}
    args = ["eval", "--ckpt", str(STATE_PPO), "--tasks", "reach,open_drawer", "--episodes-per-task", "5",
            "--num-envs", "2", "--vector-mode", "sync", "--video-episodes", "0", "--seed", "1000",
            "--out", str(tmp_path / "ev")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert results["totals"]["episodes"] == 10 and results["totals"]["successes"] >= 7  # a trained policy
    assert not (tmp_path / "ev" / "videos").exists()


def test_eval_pi05_ckpt_in_process(pi05_ckpt: Path, tmp_path: Path) -> None:
    args = ["eval", "--ckpt", str(pi05_ckpt), "--tasks", "reach", "--episodes-per-task", "2", "--num-envs", "2",
            "--image-size", "32", "--max-steps", "10", "--vector-mode", "sync", "--video-episodes", "0",
            "--out", str(tmp_path / "ev")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert results["totals"]["episodes"] == 2 and results["policy"]["metadata"]["type"] == "pi05"


def test_serve_groot_ckpt_answers_real_openpi_client(tmp_path: Path) -> None:
    """A LeRobot GR00T N1.7 folder behind `serve --ckpt`: openpi's LIBERO keys in, an (8, 7) chunk out."""
    from cosmos_robot.policies.groot.tiny import build_tiny_groot

    folder = build_tiny_groot(tmp_path / "groot")
    got = serve_and_ask(folder, OPENPI_CLIENT)
    assert got == {"shape": [8, 7], "dtype": "float32", "type": "groot", "action_horizon": 8, "finite": True}


OPENPI_DROID_CLIENT = (
    CLIENT_HEAD
    + """
obs = {"observation/exterior_image_1_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
       "observation/exterior_image_2_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
       "observation/wrist_image_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
       "observation/joint_position": rng.standard_normal(7), "observation/gripper_position": np.array([0.0]),
       "prompt": "put the marker in the cup"}
a = client.infer(obs)["actions"]
print(json.dumps({"shape": list(a.shape), "dtype": str(a.dtype), "type": meta.get("type"),
                  "space": meta.get("action_space"), "finite": bool(np.isfinite(a).all())}))
"""
)


def test_serve_cosmos3_droid_ckpt_answers_real_openpi_droid_client(tmp_path: Path) -> None:
    """A Cosmos3 diffusers folder with DROID conventions: openpi's DROID keys in, (32, 8) joint positions out."""
    from cosmos_robot.policies.cosmos3.tiny import build_tiny_cosmos3

    folder = build_tiny_cosmos3(tmp_path / "c3", "droid", {"resolution_tier": 256})
    got = serve_and_ask(folder, OPENPI_DROID_CLIENT)
    assert got == {"shape": [32, 8], "dtype": "float32", "type": "cosmos3", "space": "joint_position",
                       "finite": True}  # fmt: skip


@pytest.mark.gpu
def test_serve_compiled_bf16_pi05_on_cuda_warms_then_answers(pi05_ckpt: Path) -> None:
    """The fast GPU setting end to end: `serve --ckpt` compiles and captures every batch bucket
    (`--warmup auto`) before it prints ready, then answers our websocket client."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
    from tests.policies._pi05_helpers import libero_obs

    args = [
        "--device",
        "cuda",
        "--max-batch",
        "2",
        "-a",
        "compile=true",
        "-a",
        "dtype=bfloat16",
        "-a",
        "precision=bf16",
    ]
    proc = subprocess.Popen(
        [*CLI, "serve", "--ckpt", str(pi05_ckpt), "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        before_ready: list[str] = []
        while not (line := proc.stdout.readline()).startswith("ready:"):
            assert line or proc.poll() is None, "serve exited early:\n" + "".join(before_ready)
            before_ready.append(line)
        ports = {name: int(port) for name, port in re.findall(r"(\w+) \w+://[\d.]+:(\d+)", line)}
        warm = [x for x in before_ready if "warm-up:" in x]
        assert warm and "batch 1 in" in warm[0] and "batch 2 in" in warm[0], "".join(before_ready)
        client = WebsocketClientPolicy("127.0.0.1", ports["ws"])
        actions = client.infer(libero_obs(0))["actions"]
        client.close()
        assert actions.shape == (5, 7) and actions.dtype == np.float32 and np.isfinite(actions).all()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
