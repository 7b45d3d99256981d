"""The headless evaluator: real tabletop envs, the scripted expert served over a real websocket server.

What is proved here: the expert solves the suite through the evaluator (so observation mapping,
chunk execution and success bookkeeping are right); a control step costs ONE websocket request
holding every env that needs a chunk (counted by the server's own metrics); the same seeds give the
same per-episode outcomes in-process and remote; an interrupted run resumes to identical totals; the
report files hold the numbers; bad servers and bad replies fail with messages naming the URL and
the shapes; a killed env worker costs an attempt that runs again, never a failed episode or a crash.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from cosmos_robot_envs.eval import (
    ConfigMismatchError,
    EpisodeRecord,
    EvalCallbacks,
    EvalConfig,
    PolicyOutputError,
    WireMapping,
    build_schedule,
    connect_websocket,
    episode_seed,
    load_records,
    run_eval,
    wilson_interval,
)
from cosmos_robot_envs.eval.wire import TABLETOP_KEYS
from cosmos_robot_envs.tabletop import ExpertPolicy, expert_input_spec
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantPolicy, libero_input_spec

EXPERT = "cosmos_robot_envs.tabletop:ExpertPolicy"
ALL_TASKS = ("reach", "push", "pick_place", "open_drawer")


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in metrics"
    return float(match.group(1))


def _outcomes(results: dict[str, Any]) -> list[tuple[str, int, int, bool, int]]:
    return [(e["task"], e["episode"], e["seed"], e["success"], e["steps"]) for e in results["episodes"]]


def _config(policy: str, **kw: Any) -> EvalConfig:
    base: dict[str, Any] = {"tasks": ALL_TASKS, "episodes_per_task": 3, "num_envs": 4, "image_size": 64}
    base.update(kw)
    return EvalConfig(policy=policy, **base)


@pytest.fixture(scope="module")
def ws_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    """All four tasks x 3 episodes on 4 envs against a served expert; returns results, folder, metrics."""
    out = tmp_path_factory.mktemp("ws_eval")
    with PolicyServer(ExpertPolicy(), ServerConfig(port=0)) as server:
        url = f"ws://127.0.0.1:{server.ports['ws']}"
        with connect_websocket(url) as policy:
            results = run_eval(_config(url, video_episodes=1), policy, out, policy_kind="websocket")
        metrics = server.metrics.render()
    return results, out, metrics


def test_websocket_eval_solves_the_suite_with_one_request_per_control_step(
    ws_run: tuple[dict[str, Any], Path, str],
) -> None:
    results, _, metrics = ws_run
    assert results["totals"]["episodes"] == 12
    assert results["totals"]["success_rate"] >= 0.9
    thr = results["throughput"]
    # the server saw exactly the evaluator's requests, and each carried several observations
    ws_requests = _metric(metrics, 'cosmos_robot_request_latency_seconds_count{transport="ws"}')
    observations = _metric(metrics, 'cosmos_robot_requests_total{outcome="ok",transport="ws"}')
    assert ws_requests == thr["requests"]
    assert observations == thr["observations"]
    assert thr["observations"] == sum(e["latency"]["n"] for e in results["episodes"])
    # episode starts are aligned to replan boundaries, so the 4 envs mostly replan in the same request
    assert thr["mean_request_batch"] > 2.5
    assert thr["requests"] < thr["observations"] / 2.5
    assert results["policy"]["kind"] == "websocket"
    assert results["policy"]["metadata"]["server"]["name"] == "cosmos-robot-server"


def test_in_process_policy_gives_the_same_episodes_as_the_server(
    ws_run: tuple[dict[str, Any], Path, str], tmp_path: Path
) -> None:
    remote, _, _ = ws_run
    # fewer episodes per task, another env count, staggered starts: an episode's outcome depends on its seed only
    local = run_eval(_config(EXPERT, episodes_per_task=2, num_envs=3, align_starts=False), ExpertPolicy(), tmp_path)
    assert _outcomes(local) == [o for o in _outcomes(remote) if o[1] < 2]
    assert local["policy"]["kind"] == "in_process"
    assert local["throughput"]["requests"] == local["throughput"]["observations"]  # no infer_batch: one call each


def test_report_files_hold_the_numbers(ws_run: tuple[dict[str, Any], Path, str]) -> None:
    results, out, _ = ws_run
    for name in (
        "config.json",
        "episodes.jsonl",
        "results.json",
        "report.html",
        "success_rate.png",
        "latency_hist.png",
    ):
        assert (out / name).stat().st_size > 0, name
    saved = json.loads((out / "results.json").read_text())
    assert saved["totals"] == results["totals"]
    assert set(saved["tasks"]) == set(ALL_TASKS)
    assert saved["latency_ms"]["n"] == results["throughput"]["observations"]
    assert saved["latency_ms"]["p50_ms"] > 0
    assert saved["config"]["episodes_per_task"] == 3
    records = load_records(out / "episodes.jsonl")
    assert len(records) == 12
    html = (out / "report.html").read_text()
    for task, stats in saved["tasks"].items():
        assert f"<td>{task}</td><td>{stats['successes']}/{stats['episodes']}</td>" in html
        assert f"{100 * stats['ci95_low']:.1f}%" in html
    videos = sorted(p.name for p in (out / "videos").iterdir())
    assert videos == sorted(f"{t}_ep000.mp4" for t in ALL_TASKS)
    for name in videos:
        assert (out / "videos" / name).read_bytes()[4:8] == b"ftyp"  # an MP4 container
        assert f"src='videos/{name}'" in html
    assert html.count("data:image/png;base64,") == 2


class _StopAfter(EvalCallbacks):
    def __init__(self, n: int) -> None:
        self.n = n

    def episode(self, record: EpisodeRecord) -> None:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt


def test_resume_after_interrupt_gives_the_same_totals(tmp_path: Path) -> None:
    config = _config(EXPERT, tasks=("reach", "open_drawer"), episodes_per_task=2, num_envs=2, image_size=32)
    full = run_eval(config, ExpertPolicy(), tmp_path / "full")

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run_eval(config, ExpertPolicy(), out, callbacks=_StopAfter(2))
    assert len(load_records(out / "episodes.jsonl")) == 2
    with open(out / "episodes.jsonl", "a") as f:
        f.write('{"task": "reach", "epis')  # a line cut short by the interruption
    # a different env count is allowed on resume (it cannot change outcomes)
    resumed = run_eval(EvalConfig(**{**config.to_dict(), "num_envs": 1}), ExpertPolicy(), out)
    assert resumed["throughput"]["episodes_resumed"] == 2
    assert resumed["throughput"]["episodes_this_run"] == 2
    assert resumed["totals"] == full["totals"]
    assert resumed["tasks"] == full["tasks"]
    assert _outcomes(resumed) == _outcomes(full)
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 4

    other_seed = EvalConfig(**{**config.to_dict(), "seed": 7})
    with pytest.raises(ConfigMismatchError, match=r"seed: saved 0, now 7.*--overwrite"):
        run_eval(other_seed, ExpertPolicy(), out)
    with pytest.raises(KeyboardInterrupt):
        run_eval(other_seed, ExpertPolicy(), out, overwrite=True, callbacks=_StopAfter(1))
    (record,) = load_records(out / "episodes.jsonl").values()
    assert record.seed == episode_seed(7, record.task, record.episode)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_error_names_the_url() -> None:
    url = f"ws://127.0.0.1:{_free_port()}"
    with pytest.raises(ConnectionError, match=re.escape(url)):
        connect_websocket(url, connect_timeout_s=0.3)


def test_wrong_action_shape_errors_name_the_shapes(tmp_path: Path) -> None:
    with PolicyServer(ConstantPolicy(action_horizon=10, action_dim=6), ServerConfig(port=0)) as server:
        url = f"ws://127.0.0.1:{server.ports['ws']}"
        with connect_websocket(url) as policy:
            config = _config(url, tasks=("reach",), episodes_per_task=1, num_envs=1, image_size=16)
            with pytest.raises(PolicyOutputError, match=re.escape(f"{url}: policy returned actions of shape (10, 6)")):
                run_eval(config, policy, tmp_path / "dim")
    short = ConstantPolicy(action_horizon=3, action_dim=7)
    config = _config("short", tasks=("reach",), episodes_per_task=1, num_envs=1, image_size=16, replan_steps=5)
    with pytest.raises(PolicyOutputError, match=r"shape \(3, 7\).*H >= replan_steps=5"):
        run_eval(config, short, tmp_path / "horizon")


class _KillWorkers(EvalCallbacks):
    """SIGKILL every env worker when the first episode ends: the episode still running loses its worker."""

    killed = False

    def episode(self, record: EpisodeRecord) -> None:
        if not self.killed:
            self.killed = True
            for child in mp.active_children():
                os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]


@pytest.mark.slow
def test_killed_env_worker_is_retried_not_a_policy_failure(tmp_path: Path) -> None:
    config = _config(
        EXPERT, tasks=("reach", "push"), episodes_per_task=2, num_envs=2, image_size=16, vector_mode="async"
    )
    results = run_eval(config, ExpertPolicy(), tmp_path, callbacks=_KillWorkers())
    assert results["totals"]["episodes"] == 4 and results["complete"]
    assert results["totals"]["successes"] == 4  # the lost attempt ran again with its seed on a fresh worker
    assert results["totals"]["truncated_reasons"] == {}
    assert sum(results["totals"]["infra_reasons"].values()) == results["totals"]["infra_failures"] >= 1
    assert all(e["action"] in ("retried", "recovered") for e in results["infra_failures"])


# -- units ------------------------------------------------------------------------------------------
def test_wilson_interval_matches_hand_computed_values() -> None:
    lo, hi = wilson_interval(10, 10)
    assert lo == pytest.approx(0.72247, abs=1e-5) and hi == 1.0
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(3, 2)


def test_episode_seeds_do_not_depend_on_the_schedule_size() -> None:
    small = build_schedule(_config(EXPERT, episodes_per_task=2, tasks=("push",)), ("push",))
    big = build_schedule(_config(EXPERT, episodes_per_task=5, tasks=("reach", "push")), ("reach", "push"))
    by_key = {s.key: s.seed for s in big}
    assert all(by_key[s.key] == s.seed for s in small)
    assert small[0].seed == episode_seed(0, "push", 0) != episode_seed(1, "push", 0)
    assert len({s.seed for s in big}) == len(big)


def test_wire_mapping_keeps_object_state_only_for_policies_that_accept_it() -> None:
    import numpy as np

    obs = {
        "image": np.zeros((8, 8, 3), np.uint8),
        "wrist_image": np.zeros((8, 8, 3), np.uint8),
        "state": np.zeros(8, np.float32),
        "object_state": np.zeros(15, np.float32),
        "prompt": "reach the red target",
    }
    everything = WireMapping(TABLETOP_KEYS)(obs)
    assert sorted(everything) == sorted(TABLETOP_KEYS.values())
    assert "observation/object_state" in WireMapping(TABLETOP_KEYS, expert_input_spec())(obs)
    libero = WireMapping(TABLETOP_KEYS, libero_input_spec(8))(obs)
    assert sorted(libero) == ["observation/image", "observation/state", "observation/wrist_image", "prompt"]
    libero_input_spec(8).validate(libero)
