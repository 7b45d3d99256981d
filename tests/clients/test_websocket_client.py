"""``WebsocketClientPolicy`` against a real loopback server: handshake, deadlines, reconnects, keepalive."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.server import ServerConnection, serve

from cosmos_robot_client.batching import split_batch
from cosmos_robot_client.codec import packb, unpackb
from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy, build_url
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantBatchPolicy, ConstantPolicy, libero_input_spec


def libero_obs() -> dict[str, Any]:
    return {
        "observation/image": np.zeros((224, 224, 3), np.uint8),
        "observation/wrist_image": np.zeros((224, 224, 3), np.uint8),
        "observation/state": np.zeros(8),
        "prompt": "open the drawer",
    }


@contextlib.contextmanager
def serving(policy: Any, port: int = 0, **config: Any) -> Iterator[PolicyServer]:
    server = PolicyServer(policy, ServerConfig(port=port, transports=("ws",), **config)).start_in_thread()
    try:
        yield server
    finally:
        server.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SlowWhenAsked(ConstantPolicy):
    """Sleeps ``obs["sleep_s"]`` seconds; stands in for a slow (e.g. cold) model call."""

    @property
    def cheap_inference(self) -> bool:
        return False  # a model stand-in: must run on the worker thread

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        time.sleep(float(obs.get("sleep_s", 0.0)))
        return super().infer(obs)


def test_build_url() -> None:
    assert build_url("10.0.0.2", 9000) == "ws://10.0.0.2:9000"
    assert build_url("robot-server") == "ws://robot-server:8000"
    assert build_url("::1", 8000) == "ws://[::1]:8000"
    assert build_url("wss://policy.example.com/pi05") == "wss://policy.example.com/pi05"
    assert build_url("wss://policy.example.com/pi05", 443) == "wss://policy.example.com:443/pi05"
    assert build_url("ws://h:7000", 8000) == "ws://h:7000"  # the URL's own port wins
    with pytest.raises(ValueError, match="ws:// or wss://"):
        build_url("http://h:8000")


def test_metadata_infer_batch_and_context_manager() -> None:
    policy = ConstantBatchPolicy(10, 7, spec=libero_input_spec())
    with serving(policy) as server, WebsocketClientPolicy("127.0.0.1", server.ports["ws"]) as client:
        meta = client.get_server_metadata()
        assert meta is client.metadata and meta["action_horizon"] == 10
        reply = client.infer(libero_obs())
        assert reply["actions"].shape == (10, 7) and reply["actions"].dtype == np.float32
        assert reply["actions"].flags.writeable
        replies = client.infer_batch([libero_obs() for _ in range(5)])
        assert [r["actions"].shape for r in replies] == [(10, 7)] * 5
        assert 5 in policy.batch_sizes  # one request, one policy call
        assert client.infer_batch([]) == []


def test_reset_is_local_unless_send_reset() -> None:
    policy = ConstantPolicy()
    with serving(policy) as server:
        port = server.ports["ws"]
        with WebsocketClientPolicy("127.0.0.1", port) as client:
            client.reset()
        assert policy.resets == 0  # openpi semantics: nothing on the wire
        with WebsocketClientPolicy(f"ws://127.0.0.1:{port}", send_reset=True) as client:
            client.reset()
            assert policy.resets == 1
            assert client.infer({"x": np.zeros(1)})["actions"].shape == (10, 7)  # still usable after reset


def test_server_error_raises_runtime_error_then_reconnects() -> None:
    with serving(ConstantPolicy(spec=libero_input_spec())) as server:
        client = WebsocketClientPolicy("127.0.0.1", server.ports["ws"])
        obs = libero_obs()
        obs["observation/state"] = np.zeros((8, 2))
        with pytest.raises(RuntimeError, match=r"(?s)Error in inference server:\n.*observation/state.*shape"):
            client.infer(obs)
        assert client.infer(libero_obs())["actions"].shape == (10, 7)  # fresh connection
        client.close()


def test_connect_deadline_against_closed_port() -> None:
    port = closed_port()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=rf"ws://127.0.0.1:{port}.*connect_timeout_s=0.5.*last error"):
        WebsocketClientPolicy("127.0.0.1", port, connect_timeout_s=0.5)
    assert time.monotonic() - t0 < 2.0


def test_connect_retries_until_server_comes_up() -> None:
    port = closed_port()
    client = WebsocketClientPolicy("127.0.0.1", port, connect_timeout_s=5, connect=False)
    with pytest.raises(ConnectionError):
        WebsocketClientPolicy("127.0.0.1", port, connect_timeout_s=0.2)
    with serving(ConstantPolicy(), port=port):
        assert client.infer({"x": np.zeros(1)})["actions"].shape == (10, 7)
        client.close()


def test_request_timeout_discards_connection() -> None:
    with serving(SlowWhenAsked(4, 2)) as server:
        client = WebsocketClientPolicy("127.0.0.1", server.ports["ws"], request_timeout_s=0.2)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"ws://127.0.0.1:{server.ports['ws']}.*request_timeout_s=0.2"):
            client.infer({"sleep_s": 0.6})
        assert time.monotonic() - t0 < 0.5
        client.request_timeout_s = 5.0  # the slow call still occupies the policy for a moment
        assert client.infer({"sleep_s": 0.0})["actions"].shape == (4, 2)  # no stale reply: new connection
        client.close()


def test_reconnects_after_server_restart_on_same_port() -> None:
    with serving(ConstantPolicy(4, 2)) as server:
        port = server.ports["ws"]
        client = WebsocketClientPolicy("127.0.0.1", port, connect_timeout_s=5)
        assert client.infer({"x": np.zeros(1)})["actions"].shape == (4, 2)
    with serving(ConstantPolicy(6, 3), port=port):
        reply = client.infer({"x": np.zeros(1)})  # transparent reconnect + one retry
        assert reply["actions"].shape == (6, 3)
        assert client.metadata["action_horizon"] == 6  # metadata of the new server
    client.close()


def test_dropped_connection_without_retry_raises_connection_error() -> None:
    with serving(ConstantPolicy(4, 2)) as server:
        port = server.ports["ws"]
        client = WebsocketClientPolicy("127.0.0.1", port, connect_timeout_s=0.3, retry_on_disconnect=False)
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        client.infer({"x": np.zeros(1)})
    client.close()


def test_api_key() -> None:
    with serving(ConstantPolicy(), api_key="s3cret") as server:
        port = server.ports["ws"]
        t0 = time.monotonic()
        for key in (None, "wrong"):
            with pytest.raises(PermissionError, match=r"HTTP 401.*API key"):
                WebsocketClientPolicy("127.0.0.1", port, api_key=key, connect_timeout_s=5)
        assert time.monotonic() - t0 < 2.0, "an auth failure must not be retried until the deadline"
        with WebsocketClientPolicy("127.0.0.1", port, api_key="s3cret") as client:
            assert client.infer({"x": np.zeros(1)})["actions"].shape == (10, 7)


def test_oversize_request_refused_client_side() -> None:
    with serving(ConstantPolicy(), max_message_bytes=64 * 1024) as server:
        with WebsocketClientPolicy("127.0.0.1", server.ports["ws"]) as client:
            with pytest.raises(ValueError, match="max_message_bytes"):
                client.infer(libero_obs())
            assert client.infer({"x": np.zeros(4)})["actions"].shape == (10, 7)  # connection untouched


def test_batches_are_split_to_fit_the_caps_the_server_announces() -> None:
    policy = ConstantBatchPolicy(4, 2)
    obs = {"x": np.zeros(4096, np.float32)}  # ~16 KB each: 5 fit in 80 % of a 100 kB cap
    with serving(policy, max_message_bytes=100_000, max_client_batch=8, max_inflight_per_client=8) as server:
        with WebsocketClientPolicy("127.0.0.1", server.ports["ws"]) as client:
            replies = client.infer_batch([obs] * 23)
    assert len(replies) == 23 and all(r["actions"].shape == (4, 2) for r in replies)
    server_meta = {"max_message_bytes": 100_000, "limits": {"max_client_batch": 8}}
    assert [len(p) for p in split_batch([obs] * 23, server_meta)] == [4, 4, 4, 4, 4, 3]  # bytes bind
    assert [len(p) for p in split_batch([{"x": 1}] * 19, server_meta)] == [8, 8, 3]  # the count binds
    assert server.metrics.counter_value("cosmos_robot_requests_total", transport="ws", outcome="ok") == 23
    assert server.metrics.counter_value("cosmos_robot_errors_total", transport="ws", kind="bad_request") == 0


def test_keepalive_survives_long_inference() -> None:
    # Pings every 0.2 s must be answered within 0.2 s by both sides while a 2 s inference runs:
    # the server's event loop stays free (policy in a worker thread), the client pongs from its thread.
    with serving(SlowWhenAsked(4, 2), ping_interval_s=0.2, ping_timeout_s=0.2) as server:
        with WebsocketClientPolicy("127.0.0.1", server.ports["ws"], ping_interval_s=0.2, ping_timeout_s=0.2) as client:
            t0 = time.monotonic()
            reply = client.infer({"sleep_s": 2.0})
            assert time.monotonic() - t0 >= 2.0
            assert reply["actions"].shape == (4, 2)
            assert reply["policy_timing"]["infer_ms"] >= 2000


def test_wss_with_ssl_context(tmp_path: Path) -> None:
    # Our server leaves TLS to a proxy (as openpi's does); a tiny TLS websocket peer stands in for it here.
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not found (needed to make a throwaway certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    ready: queue.Queue[int] = queue.Queue()
    stop = threading.Event()

    async def handler(ws: ServerConnection) -> None:
        await ws.send(packb({"tls": True}))
        async for message in ws:
            obs = unpackb(message)  # type: ignore[arg-type]
            await ws.send(packb({"actions": np.zeros((2, obs["dim"]), np.float32)}))

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, ssl=server_ctx, compression=None) as server:
            ready.put(server.sockets[0].getsockname()[1])
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    port = ready.get(timeout=10)
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert))
        with pytest.raises(ValueError, match="not a wss://"):
            WebsocketClientPolicy("127.0.0.1", port, ssl_context=client_ctx)
        with WebsocketClientPolicy(f"wss://localhost:{port}", ssl_context=client_ctx) as client:
            assert client.metadata == {"tls": True}
            assert client.infer({"dim": 3})["actions"].shape == (2, 3)
    finally:
        stop.set()
        thread.join(5)
