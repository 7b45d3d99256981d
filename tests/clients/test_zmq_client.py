"""``ZmqClientPolicy`` against our ZMQ server (and tiny raw REP peers) on loopback.

The timeout tests are the point of this client: GR00T's own client blocks forever on a dead server
and its REQ socket stays stuck after a missed reply; ours must raise ``TimeoutError`` on time and
keep working afterwards.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.zmq_client_policy import ZmqClientPolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantPolicy, libero_input_spec

TIMEOUT_MS = 3000


class RecordingPolicy(BasePolicy):
    """Sleeps ``obs["delay_s"]`` if given; records observations; GR00T-style action keys."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.resets = 0
        self.finished = threading.Event()

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(obs)
        delay = float(obs.get("delay_s", 0.0))
        if delay:
            time.sleep(delay)
            self.finished.set()
        return {"action.x": np.arange(16, dtype=np.float32).reshape(1, 16, 1)}

    def reset(self) -> None:
        self.resets += 1


@contextmanager
def serve(policy: BasePolicy, **config: Any) -> Iterator[int]:
    server = PolicyServer(policy, ServerConfig(port=0, zmq_port=0, transports=("zmq",), **config)).start_in_thread()
    try:
        yield server.ports["zmq"]
    finally:
        server.stop()


@contextmanager
def raw_rep_server(reply: bytes) -> Iterator[int]:
    """A one-shot plain REP peer that answers any request with ``reply`` (e.g. GR00T's b"ERROR")."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    port = sock.bind_to_random_port("tcp://127.0.0.1")

    def answer() -> None:
        try:
            sock.recv()
            sock.send(reply)
        except zmq.ZMQError:
            pass

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        thread.join(TIMEOUT_MS / 1000)
        sock.close(0)
        ctx.term()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ping_and_n16_get_action_returns_action_and_info() -> None:
    policy = RecordingPolicy()
    obs = {"video.image": np.zeros((1, 1, 8, 8, 3), dtype=np.uint8), "task": ["stack"]}
    with serve(policy) as port, ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
        assert client.ping() is True
        action, info = client.get_action(obs, options={"seed": 1})
        assert client.infer(obs).keys() == {"action.x"}  # BasePolicy view: the action dict only
    assert action["action.x"].shape == (1, 16, 1) and action["action.x"].dtype == np.float32
    assert set(info) == {"server_timing", "policy_timing"}
    assert policy.seen[0]["video.image"].shape == (1, 1, 8, 8, 3) and policy.seen[0]["task"] == ["stack"]


def test_n15_protocol_sends_flat_observation() -> None:
    policy = RecordingPolicy()
    with serve(policy) as port, ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS, protocol="n1.5") as client:
        action, info = client.get_action({"state.x": np.ones((1, 1, 1), dtype=np.float32)})
        with pytest.raises(ValueError, match="N1.5"):
            client.get_action({}, options={"a": 1})
    assert set(action) == {"action.x"} and info == {}
    assert set(policy.seen[0]) == {"state.x"}


def test_reset_and_modality_config() -> None:
    policy = RecordingPolicy()
    modality = {"state": {"delta_indices": [0], "modality_keys": ["state.x"]}}
    with serve(policy, metadata={"modality_config": modality}) as port:
        with ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
            assert client.reset() == {}
            assert client.get_modality_config() == modality
    assert policy.resets == 1


def test_server_errors_raise_runtime_error_with_the_message() -> None:
    with serve(ConstantPolicy(spec=libero_input_spec())) as port:
        with ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
            with pytest.raises(RuntimeError, match=r"'get_action'.*observation/image"):
                client.infer({"prompt": "x"})
            with pytest.raises(RuntimeError, match="disabled"):
                client.kill()
            assert client.ping()  # the REQ socket is still in step after error replies


def test_api_token() -> None:
    with serve(ConstantPolicy(), api_key="tok") as port:
        with ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS, api_token="wrong") as bad:
            with pytest.raises(RuntimeError, match="Unauthorized: Invalid API token"):
                bad.ping()
        with ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS, api_token="tok") as good:
            assert good.ping()
            assert good.infer({})["actions"].shape == (10, 7)


def test_kill_when_enabled() -> None:
    with serve(ConstantPolicy(), enable_kill=True) as port:
        with ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
            client.kill()
        with ZmqClientPolicy(port=port, timeout_ms=200) as after:
            assert after.ping() is False


def test_timeout_against_slow_policy_then_client_recovers() -> None:
    policy = RecordingPolicy()
    with serve(policy) as port, ZmqClientPolicy(port=port, timeout_ms=200) as client:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match=r"'get_action'.*timeout_ms=200"):
            client.get_action({"delay_s": np.float64(0.6)})
        elapsed = time.perf_counter() - t0
        assert 0.15 < elapsed < 1.0, elapsed
        assert policy.finished.wait(2.0)
        action, _ = client.get_action({})  # same object: the stuck REQ socket was replaced
        assert action["action.x"].shape == (1, 16, 1)
        assert client.ping()


def test_no_server_times_out_cleanly() -> None:
    with ZmqClientPolicy(port=free_port(), timeout_ms=200) as client:
        t0 = time.perf_counter()
        assert client.ping() is False
        with pytest.raises(TimeoutError, match="is the server running"):
            client.infer({"x": np.zeros(2)})
        assert time.perf_counter() - t0 < 1.5


def test_raw_error_bytes_and_n15_server_reply() -> None:
    with raw_rep_server(b"ERROR") as port, ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
        with pytest.raises(RuntimeError, match="ERROR"):
            client.ping()
    bare = msgpack.packb({"action.x": [1.0, 2.0]})
    with raw_rep_server(bare) as port, ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
        assert client.get_action({}) == ({"action.x": [1.0, 2.0]}, {})


def test_closed_client_and_bad_arguments() -> None:
    client = ZmqClientPolicy(port=free_port(), timeout_ms=100)
    client.close()
    client.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        client.ping()
    with pytest.raises(ValueError, match="protocol"):
        ZmqClientPolicy(protocol="n2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_ms"):
        ZmqClientPolicy(timeout_ms=0)
