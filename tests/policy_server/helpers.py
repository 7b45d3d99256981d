"""Helpers shared by the policy-server tests: a real server on loopback ports, a raw ZMQ REQ socket,
and a policy that records what reached it.

Why here and not in ``tests/helpers.py``: these need the server package and pyzmq, which the suite's
general helpers (interpreters of other venvs, subprocess runs) do not; and each test module used to
carry its own copy of them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import zmq

from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.batcher import DynamicBatcher

ALL_TRANSPORTS = ("ws", "zmq", "http")
TIMEOUT_MS = 3000


@contextmanager
def serving(policy: Any, transports: tuple[str, ...] = ALL_TRANSPORTS, **config: Any) -> Iterator[PolicyServer]:
    """A ``PolicyServer`` on free ports (``server.ports``) in a thread, stopped on exit."""
    cfg = ServerConfig(port=0, zmq_port=0, http_port=0, transports=transports, **config)
    server = PolicyServer(policy, cfg).start_in_thread()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def zmq_serving(policy: Any, **config: Any) -> Iterator[int]:
    """A ZMQ-only server, as GR00T clients see it; yields its port."""
    with serving(policy, ("zmq",), **config) as server:
        yield server.ports["zmq"]


@contextmanager
def zmq_req(port: int, timeout_ms: int = TIMEOUT_MS) -> Iterator[zmq.Socket[bytes]]:
    """A REQ socket on its own context connected to ``port``; receives time out after ``timeout_ms``."""
    ctx = zmq.Context()
    sock: zmq.Socket[bytes] = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        yield sock
    finally:
        sock.close(0)
        ctx.term()


class RecordingPolicy(BatchPolicy):
    """Records the tag of every observation it runs; blocks while ``gate`` is closed."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.gate = threading.Event()

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        self.gate.wait(5)
        self.seen.extend(str(o["tag"]) for o in obs_batch)
        return [{"actions": np.zeros((2, 2), np.float32)} for _ in obs_batch]


async def with_batcher(policy: Any, fn: Any, **kw: Any) -> Any:
    """``await fn(batcher)`` on a started ``DynamicBatcher(policy, **kw)``, stopped afterwards."""
    batcher = DynamicBatcher(policy, **kw)
    batcher.start()
    try:
        return await fn(batcher)
    finally:
        await batcher.stop()
