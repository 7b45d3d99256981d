"""``cosmos-robot eval``: a tiny real run and its resume, and clear exits on errors (help: tests/cli/test_cli.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from typer.testing import CliRunner

from cosmos_robot.cli import app

runner = CliRunner()
TINY = [
    "eval",
    "--policy",
    "cosmos_robot_envs.tabletop:ExpertPolicy",
    "-a",
    "action_horizon=8",
    "--tasks",
    "reach",
    "--episodes-per-task",
    "2",
    "--num-envs",
    "2",
    "--image-size",
    "32",
    "--vector-mode",
    "sync",
]


def test_tiny_eval_run_then_resume_then_config_mismatch(tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    result = runner.invoke(app, [*TINY, "--out", out])
    assert result.exit_code == 0, result.output
    assert "reach" in result.output and "2/2" in result.output
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["totals"]["successes"] == 2
    assert saved["config"]["policy_args"] == {"action_horizon": 8}
    assert (tmp_path / "run" / "videos" / "reach_ep000.mp4").exists()  # --video-episodes defaults to 1

    again = runner.invoke(app, [*TINY, "--out", out])  # everything recorded: nothing to run
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "run" / "results.json").read_text())["throughput"]["episodes_resumed"] == 2

    other = runner.invoke(app, [*TINY, "--out", out, "--seed", "3"])
    assert other.exit_code == 2
    assert "seed: saved 0, now 3" in other.output and "--overwrite" in other.output


def test_unreachable_server_exits_nonzero_naming_the_url(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"ws://127.0.0.1:{port}"
    result = runner.invoke(
        app, ["eval", "--policy", url, "--out", str(tmp_path), "--connect-timeout-s", "0.3", "--tasks", "reach"]
    )
    assert result.exit_code == 1
    assert "cannot reach the policy server" in result.output and f"could not connect to {url}" in result.output


def test_wrong_action_shape_exits_nonzero_naming_the_shapes(tmp_path: Path) -> None:
    args = ["--policy", "cosmos_robot_server.example_policies:constant", "-a", "action_dim=6", "--out", str(tmp_path)]
    result = runner.invoke(app, [*TINY[:1], *args, *TINY[5:]])
    assert result.exit_code == 1
    assert "policy returned actions of shape (10, 6)" in result.output and "(H, 7)" in result.output


def test_unknown_task_exits_with_the_known_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval", "--policy", "x:y", "--out", str(tmp_path), "--tasks", "reach,fly"])
    assert result.exit_code == 2
    assert "'fly' not in suite 'tabletop'" in result.output and "pick_place" in result.output


def test_driving_suite_from_the_cli_prints_its_episode_metrics(tmp_path: Path) -> None:
    """``cosmos-robot eval --suite driving``: the served-style expert in-process, AlpaGym's episode metrics
    in the printed table and in results.json (highway-env installed by the Makefile)."""
    import pytest

    pytest.importorskip("highway_env")
    out = tmp_path / "drive"
    args = [
        "eval", "--policy", "cosmos_robot_envs.driving:DrivingExpertPolicy", "--suite", "driving",
        "--tasks", "highway", "--episodes-per-task", "2", "--num-envs", "1", "--replan-steps", "1",
        "--max-steps", "15", "--video-episodes", "0", "--out", str(out),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "episode metrics" in result.output and "collision" in result.output
    totals = json.loads((out / "results.json").read_text())["totals"]
    assert totals["episodes"] == 2 and set(totals["metrics"]) == {"progress", "collision", "offroad", "mean_dist_to_gt"}
    bad = runner.invoke(app, [*args[:9], "--replan-steps", "5", *args[13:]])
    assert bad.exit_code != 0 and "replan" in bad.output.lower()


def test_eval_replans_at_the_horizon_the_checkpoint_announces(tmp_path: Path) -> None:
    """A flow checkpoint's ``replan_steps`` reaches clients as metadata; ``eval`` without --replan-steps uses
    it, an explicit --replan-steps wins, and a horizon longer than the chunk is refused at load."""
    import pytest

    from cosmos_robot.policies.flow import FlowPolicy
    from tests.policies._flow_helpers import scrambled_model, tiny_config, tiny_stats

    config = tiny_config(chunk_size=6, replan_steps=2)
    ckpt = tmp_path / "flow"
    policy = FlowPolicy(scrambled_model(config), tiny_stats(config))
    assert policy.metadata["replan_steps"] == 2
    policy.save_pretrained(ckpt)
    args = ["eval", "--ckpt", str(ckpt), "--tasks", "reach", "--episodes-per-task", "1", "--num-envs", "1",
            "--image-size", "32", "--max-steps", "4", "--vector-mode", "sync", "--video-episodes", "0"]  # fmt: skip
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "announced")])
    assert result.exit_code == 0, result.output
    assert "replanning every 2 steps" in result.output
    saved = json.loads((tmp_path / "announced" / "results.json").read_text())
    assert saved["config"]["replan_steps"] == 2
    result = runner.invoke(app, [*args, "--replan-steps", "4", "--out", str(tmp_path / "given")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "given" / "results.json").read_text())["config"]["replan_steps"] == 4
    assert "replan_steps" not in FlowPolicy(scrambled_model(tiny_config()), tiny_stats(tiny_config())).metadata
    with pytest.raises(ValueError, match="replan_steps=7: a client cannot execute more actions than a chunk holds"):
        tiny_config(chunk_size=6, replan_steps=7)


def test_the_committed_grpo_planner_drives_through_eval_ckpt(tmp_path: Path) -> None:
    """``checkpoints/driving_planner_grpo`` (issue 20's GRPO planner) loads, is served and drives the suite
    from ``eval --ckpt``, camera-free, with AlpaGym's metrics in the results."""
    import pytest

    pytest.importorskip("highway_env")
    ckpt = Path(__file__).resolve().parents[2] / "checkpoints" / "driving_planner_grpo"
    out = tmp_path / "grpo"
    args = [
        "eval", "--ckpt", str(ckpt), "--suite", "driving", "--tasks", "highway_dense", "--episodes-per-task", "2",
        "--num-envs", "1", "--replan-steps", "1", "--max-steps", "10", "--video-episodes", "0", "--out", str(out),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    totals = json.loads((out / "results.json").read_text())["totals"]
    assert totals["episodes"] == 2 and "progress" in totals["metrics"]


def test_fp8_precision_from_the_cli_names_what_it_needs(tmp_path: Path) -> None:
    """``-a precision=fp8`` reaches pi05's loader from the command line; on this float32 checkpoint (and on a
    machine without a Hopper GPU) the user gets the reason, not a traceback."""
    ckpt = Path(__file__).resolve().parents[2] / "checkpoints" / "pi05_tiny"
    base = ["eval", "--ckpt", str(ckpt), "--episodes-per-task", "1", "--out", str(tmp_path / "o")]
    result = runner.invoke(app, [*base, "-a", "precision=fp8"])
    assert result.exit_code == 2, result.output
    assert "precision 'fp8' serves a bfloat16 model" in result.output
    import torch

    if torch.cuda.is_available():  # the second refusal is this machine's (no CUDA GPU); a GPU box would load it
        return
    result = runner.invoke(app, [*base, "-a", "precision=fp8", "-a", "dtype=bfloat16"])
    assert result.exit_code == 2, result.output
    assert "precision 'fp8' needs a CUDA GPU" in result.output
