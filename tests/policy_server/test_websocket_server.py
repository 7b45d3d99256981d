"""The openpi websocket transport on real loopback sockets, spoken to with a raw websockets client.

A raw client (not our ``WebsocketClientPolicy``) is used where the test is about bytes on the wire,
so these tests pin the protocol itself: metadata frame first, binary msgpack lockstep, TEXT error
frame + close 1011, HTTP health routes and the API-key check before the upgrade.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as _connect

from cosmos_robot_client.codec import packb, unpackb
from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantBatchPolicy, ConstantPolicy, libero_input_spec

_LEGACY = {"legacy": True} if "legacy" in inspect.signature(_connect).parameters else {}


def connect(url: str, **kwargs: Any) -> ClientConnection:
    return _connect(url, **_LEGACY, **kwargs)  # a plain connection, no deprecation warning (websockets >= 17.1)


def libero_obs(**override: Any) -> dict[str, Any]:
    obs: dict[str, Any] = {
        "observation/image": np.zeros((224, 224, 3), np.uint8),
        "observation/wrist_image": np.full((224, 224, 3), 7, np.uint8),
        "observation/state": np.arange(8, dtype=np.float64),
        "prompt": "put the bowl on the plate",
    }
    obs.update(override)
    return obs


@contextlib.contextmanager
def serving(policy: Any, **config: Any) -> Iterator[PolicyServer]:
    server = PolicyServer(policy, ServerConfig(port=0, transports=("ws",), **config)).start_in_thread()
    try:
        yield server
    finally:
        server.stop()


def ws_url(server: PolicyServer, path: str = "") -> str:
    return f"ws://127.0.0.1:{server.ports['ws']}{path}"


def raw_connect(server: PolicyServer, **kwargs: Any) -> tuple[ClientConnection, dict[str, Any]]:
    ws = connect(ws_url(server), compression=None, max_size=None, open_timeout=5, **kwargs)
    first = ws.recv(timeout=5)
    assert isinstance(first, bytes), "openpi clients expect the metadata as a binary frame"
    return ws, unpackb(first)


def roundtrip(ws: ClientConnection, message: Any) -> Any:
    ws.send(packb(message))
    reply = ws.recv(timeout=5)
    return reply if isinstance(reply, str) else unpackb(reply)


def http_get(server: PolicyServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['ws']}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def libero_server() -> Iterator[PolicyServer]:
    with serving(ConstantBatchPolicy(10, 7, spec=libero_input_spec())) as server:
        yield server


def test_metadata_frame_first_and_any_path_upgrades(libero_server: PolicyServer) -> None:
    for path in ("", "/", "/some/policy/path"):
        ws = connect(ws_url(libero_server, path), compression=None, max_size=None, open_timeout=5)
        meta = unpackb(ws.recv(timeout=5, decode=False))
        ws.close()
        assert meta["action_horizon"] == 10 and meta["action_dim"] == 7
        assert meta["server"]["name"] == "cosmos-robot-server"
        assert meta["input_spec"]["observation/image"]["shape"] == [224, 224, 3]


def test_http_routes_on_the_websocket_port(libero_server: PolicyServer) -> None:
    assert http_get(libero_server, "/healthz") == (200, "OK\n")
    assert http_get(libero_server, "/readyz") == (200, "ready\n")
    ws, _ = raw_connect(libero_server)
    status, text = http_get(libero_server, "/metrics")
    assert status == 200
    assert 'cosmos_robot_connections{transport="ws"} 1' in text
    ws.close()
    deadline = time.monotonic() + 3
    while 'cosmos_robot_connections{transport="ws"} 0' not in http_get(libero_server, "/metrics")[1]:
        assert time.monotonic() < deadline, "connection gauge did not drop back to 0 after close"
        time.sleep(0.02)


def test_reply_keys_shape_dtype_and_prev_total_ms(libero_server: PolicyServer) -> None:
    ws, _ = raw_connect(libero_server)
    first = roundtrip(ws, libero_obs())
    second = roundtrip(ws, libero_obs())
    ws.close()
    for reply in (first, second):
        assert reply["actions"].shape == (10, 7) and reply["actions"].dtype == np.float32
        assert reply["policy_timing"]["infer_ms"] >= 0
        assert reply["server_timing"]["infer_ms"] >= reply["policy_timing"]["infer_ms"]
    assert "prev_total_ms" not in first["server_timing"], "openpi sends prev_total_ms only from the 2nd request"
    assert second["server_timing"]["prev_total_ms"] > 0


def test_reply_uses_openpi_bytes_keys_on_the_wire(libero_server: PolicyServer) -> None:
    ws, _ = raw_connect(libero_server)
    ws.send(packb(libero_obs()))
    raw = msgpack.unpackb(ws.recv(timeout=5), raw=False)
    ws.close()
    assert raw["actions"][b"__ndarray__"] is True  # openpi's decoder only matches bytes keys
    assert raw["actions"][b"dtype"] == "<f4" and raw["actions"][b"shape"] == [10, 7]


def test_roboarena_reset_and_envelope_keys() -> None:
    policy = ConstantBatchPolicy(10, 8, spec=libero_input_spec())
    with serving(policy) as server:
        ws, _ = raw_connect(server)
        assert roundtrip(ws, {"endpoint": "reset"}) == "reset successful"  # a TEXT frame, as RoboArena expects
        assert policy.resets == 1
        reply = roundtrip(ws, libero_obs(endpoint="infer", session_id="episode-3"))
        assert reply["actions"].shape == (10, 8)
        assert roundtrip(ws, {"endpoint": "reset", "session_id": "episode-3"}) == "reset successful"
        assert policy.resets == 2
        ws.close()


def test_batch_request_is_one_policy_call() -> None:
    policy = ConstantBatchPolicy(10, 7, spec=libero_input_spec())
    with serving(policy, max_wait_ms=20) as server:
        ws, _ = raw_connect(server)
        reply = roundtrip(ws, {"batch": [libero_obs(), libero_obs(), libero_obs()]})
        ws.close()
    assert len(reply["batch"]) == 3
    assert all(r["actions"].shape == (10, 7) for r in reply["batch"])
    assert "infer_ms" in reply["server_timing"]
    assert policy.batch_sizes == [3]


def test_mixing_batch_and_single_requests_never_waits_for_phantom_peers() -> None:
    # A vectorised evaluator sends batches of varying size and single requests on one connection,
    # with no think time. None of them may wait max_wait_ms for batch members that cannot come.
    policy = ConstantBatchPolicy(10, 7)
    obs = {"state": np.zeros(3)}
    with serving(policy, max_wait_ms=300) as server:
        ws, _ = raw_connect(server)
        timings = []
        for message in ({**obs}, {"batch": [obs] * 4}, {**obs}, {"batch": [obs] * 4}, {"batch": [obs] * 2}, {**obs}):
            for _ in range(2):
                t0 = time.perf_counter()
                assert "actions" in roundtrip(ws, message) or "batch" in message
                timings.append((list(message), (time.perf_counter() - t0) * 1000))
        ws.close()
    slow = [(keys, round(ms)) for keys, ms in timings if ms > 150]
    assert not slow, f"requests waited for batch members that could not come: {slow}"
    assert policy.batch_sizes == [1, 1, 4, 4, 1, 1, 4, 4, 2, 2, 1, 1]


def test_concurrent_clients_share_one_batched_policy_call() -> None:
    policy = ConstantBatchPolicy(10, 7, delay_ms=50)
    with serving(policy, max_wait_ms=20) as server:
        clients = [WebsocketClientPolicy("127.0.0.1", server.ports["ws"], connect_timeout_s=5) for _ in range(8)]
        barrier = threading.Barrier(len(clients))
        shapes: list[tuple[int, ...]] = []

        def run(client: WebsocketClientPolicy) -> None:
            for _ in range(2):
                barrier.wait(timeout=5)
                shapes.append(client.infer({"state": np.zeros(3)})["actions"].shape)

        threads = [threading.Thread(target=run, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for c in clients:
            c.close()
    assert shapes == [(10, 7)] * 16
    assert max(policy.batch_sizes) > 1, f"requests were never batched: {policy.batch_sizes}"
    assert sum(policy.batch_sizes) == 16


def _object_dtype_payload() -> bytes:
    obs = {k: v for k, v in libero_obs().items() if k != "observation/image"}
    body = msgpack.packb(
        obs, default=lambda a: {b"__ndarray__": True, b"data": a.tobytes(), b"dtype": a.dtype.str, b"shape": a.shape}
    )
    evil = {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}
    return msgpack.packb({**msgpack.unpackb(body, raw=False), "observation/image": evil})


# (name, message sent by the bad client, substrings the error text must contain)
BAD_REQUESTS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("truncated msgpack", packb(libero_obs())[:-100], ("malformed request",)),
    (
        "wrong dtype",
        packb(libero_obs(**{"observation/image": np.zeros((224, 224, 3), np.float32)})),
        ("observation/image", "dtype", "uint8", "float32"),
    ),
    (
        "wrong shape",
        packb(libero_obs(**{"observation/wrist_image": np.zeros((224, 224), np.uint8)})),
        ("observation/wrist_image", "shape", "(224, 224, 3)"),
    ),
    (
        "unknown key",
        packb(libero_obs(**{"observation/imag": np.zeros(3)})),
        ("observation/imag", "unknown key", "did you mean 'observation/image'"),
    ),
    ("missing key", packb({"prompt": "x"}), ("observation/image", "missing")),
    ("object dtype", _object_dtype_payload(), ("malformed request", "|O", "not allowed")),
    ("list payload", packb([1, 2, 3]), ("map", "list")),
    ("int payload", packb(7), ("map", "int")),
    ("text frame", '{"prompt": "json is not the protocol"}', ("TEXT frame", "binary msgpack")),
    ("unknown endpoint", packb({"endpoint": "explode"}), ("unknown endpoint", "explode")),
    ("batch not a list", packb({"batch": 3}), ("batch",)),
    ("bad batch member", packb({"batch": [libero_obs(), {"prompt": 1}]}), ("batch[1]",)),
]


@pytest.mark.parametrize(("message", "expected"), [case[1:] for case in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request_gets_clear_error_and_others_keep_being_served(
    libero_server: PolicyServer, message: Any, expected: tuple[str, ...]
) -> None:
    good, _ = raw_connect(libero_server)
    assert roundtrip(good, libero_obs())["actions"].shape == (10, 7)
    bad, _ = raw_connect(libero_server)
    bad.send(message)
    text = bad.recv(timeout=5)
    assert isinstance(text, str), "errors must be TEXT frames so openpi's client raises"
    for part in expected:
        assert part in text, f"{part!r} not in error text {text!r}"
    with pytest.raises(ConnectionClosed) as info:
        bad.recv(timeout=5)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1011
    for _ in range(2):
        assert roundtrip(good, libero_obs())["actions"].shape == (10, 7)
    good.close()


def test_oversize_message_closed_with_1009_and_server_survives() -> None:
    small = {"observation/image": np.zeros((32, 32, 3), np.uint8), "prompt": "x"}
    with serving(ConstantBatchPolicy(10, 7), max_message_bytes=64 * 1024) as server:
        good, meta = raw_connect(server)
        assert meta["server"]["max_message_bytes"] == 64 * 1024
        bad, _ = raw_connect(server)
        bad.send(packb(libero_obs()))  # ~300 KB against a 64 KiB cap
        with pytest.raises(ConnectionClosed) as info:
            bad.recv(timeout=5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009
        for _ in range(2):
            assert roundtrip(good, small)["actions"].shape == (10, 7)
        good.close()
        deadline = time.monotonic() + 3
        while 'kind="too_large"' not in server.metrics.render():
            assert time.monotonic() < deadline, "oversize refusal was not counted"
            time.sleep(0.02)


class RaisingPolicy(ConstantPolicy):
    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        if obs.get("explode"):
            raise ZeroDivisionError("the model divided by zero")
        return super().infer(obs)


def test_policy_exception_reaches_only_that_client_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with serving(RaisingPolicy(4, 2)) as server:
        good, _ = raw_connect(server)
        bad, _ = raw_connect(server)
        bad.send(packb({"explode": True}))
        text = bad.recv(timeout=5)
        assert isinstance(text, str)
        assert "ZeroDivisionError" in text and "the model divided by zero" in text
        assert "Traceback" not in text and "\n" not in text  # one line; the traceback is logged server-side
        assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)
        assert roundtrip(good, {"explode": False})["actions"].shape == (4, 2)
        good.close()
        bad.close()


def test_api_key_checked_before_upgrade() -> None:
    with serving(ConstantPolicy(), api_key="s3cret") as server:
        for headers in (None, {"Authorization": "Api-Key wrong"}, {"Authorization": "s3cret"}):
            with pytest.raises(InvalidStatus) as info:
                connect(ws_url(server), additional_headers=headers, open_timeout=5)
            assert info.value.response.status_code == 401
            assert b"Authorization: Api-Key" in info.value.response.body
        ws, meta = raw_connect(server, additional_headers={"Authorization": "Api-Key s3cret"})
        assert meta["server"]["auth_required"] is True
        assert roundtrip(ws, {"x": np.zeros(2)})["actions"].shape == (10, 7)
        ws.close()
        assert http_get(server, "/healthz") == (200, "OK\n")  # probes need no key
        assert 'kind="unauthorized"' in server.metrics.render()


def test_stop_closes_open_connections() -> None:
    server = PolicyServer(ConstantPolicy(), ServerConfig(port=0)).start_in_thread()
    ws, _ = raw_connect(server)
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 3
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=5)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1001  # going away
