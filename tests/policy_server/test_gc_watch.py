"""Garbage-collector pauses: timed while serving (``/metrics``), and the warm heap frozen once ready."""

from __future__ import annotations

import gc
import re
import urllib.request

import pytest

from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.example_policies import constant
from cosmos_robot_server.gc_watch import GCWatch, freeze_heap
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
