"""Garbage-collector pauses: timed while serving (``/metrics``), and the warm heap frozen once ready."""

from __future__ import annotations

import gc
import logging
import re
import urllib.request

import pytest

from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.example_policies import constant
from cosmos_robot_server.gc_watch import HEAP_FREEZE, GCWatch, freeze_heap
from cosmos_robot_server.server import PolicyServer


@pytest.fixture(autouse=True)
def _thawed() -> None:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_watch_times_each_collection_by_generation() -> None:
    with GCWatch() as watch:
        gc.collect()
        gc.collect(0)
    assert watch.generations[2].count >= 1 and watch.generations[0].count >= 1
    assert watch.generations[2].max_s > 0 and watch.generations[2].total_s >= watch.generations[2].max_s
    assert sum(watch.generations[2].buckets) == watch.generations[2].count
    summary = watch.summary()
    assert summary["gen2"]["count"] == watch.generations[2].count and summary["gen2"]["max_ms"] > 0
    count = watch.generations[2].count
    gc.collect()  # removed: no longer counted
    assert watch.generations[2].count == count
    watch.reset()
    assert watch.summary()["gen2"] == {"count": 0, "total_ms": 0.0, "max_ms": 0.0}


def test_freeze_moves_the_heap_out_of_full_collections() -> None:
    frozen = freeze_heap()
    # the interpreter, pytest and the server modules at least; frozen objects can still be freed (threads
    # left by earlier tests drop theirs), so the count may only have fallen since
    assert frozen > 1000 and frozen - 1000 < gc.get_freeze_count() <= frozen
    with GCWatch() as watch:
        gc.collect()
    assert watch.generations[2].count == 1


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


@pytest.mark.parametrize("freeze", [True, False])
def test_server_freezes_once_warm_and_reports_pauses(freeze: bool) -> None:
    config = ServerConfig(port=0, transports=("ws",), gc_freeze=freeze)  # frozen when ready, warm-up or not
    server = PolicyServer(constant(action_horizon=4), config).start_in_thread(timeout_s=30)
    try:
        assert (gc.get_freeze_count() > 1000) is freeze
        client = WebsocketClientPolicy("127.0.0.1", server.ports["ws"])
        client.infer({"observation/state": [0.0] * 8, "prompt": "x"})
        gc.collect()  # a full collection while serving: /metrics shows it
        text = _metrics(server.ports["ws"])
        client.close()
    finally:
        server.stop()
    # the last server out unfreezes (CPython 3.12 itself keeps a few hundred objects there: not 0)
    assert gc.get_freeze_count() < 1000
    assert "# TYPE cosmos_robot_gc_pause_seconds histogram" in text
    full = re.search(r'^cosmos_robot_gc_pause_seconds_count\{generation="2"\} (\d+)$', text, re.M)
    assert full is not None and int(full.group(1)) >= 1
    assert re.search(r'^cosmos_robot_gc_pause_seconds_bucket\{generation="0",le="\+Inf"\} \d+$', text, re.M)


def test_ready_logs_the_warm_up_pauses_and_counts_afresh(caplog: pytest.LogCaptureFixture) -> None:
    """Loading and compiling a model cost seconds of full collections before ``/readyz`` (a compiled pi0.5
    on the H200: 10 of them, 9.3 s): they are logged at ready, and ``/metrics`` counts serving's pauses."""
    server = PolicyServer(constant(action_horizon=4), ServerConfig(port=0, transports=("ws",), gc_freeze=True))
    core = server.core
    core.gc_watch.install()
    try:
        gc.collect()  # a pause while warming up
        assert core.gc_watch.generations[2].count >= 1
        with caplog.at_level(logging.INFO, logger="cosmos_robot_server.core"):
            core.mark_ready()
        assert core.gc_watch.generations[2].count == 0
        assert re.search(r"gc pauses before ready: gen0 \d+ x, .* gen2 [1-9]\d* x", caplog.text), caplog.text
        gc.collect()
        assert core.gc_watch.generations[2].count == 1
    finally:
        core.gc_watch.remove()
        HEAP_FREEZE.release()
