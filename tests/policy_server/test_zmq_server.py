"""The GR00T-compatible ZMQ transport, checked on the wire with hand-built REQ requests.

Requests are encoded here the way Isaac-GR00T's client does it (plain msgpack, arrays as str-keyed
``{"__ndarray_class__": True, "as_npy": <np.save bytes>}``) and replies are decoded with plain
msgpack, so these tests pin the exact wire format rather than our own codec's round trip.
"""

from __future__ import annotations

import io
import threading
from typing import Any

import msgpack
import numpy as np
import pytest

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.zmq_client_policy import ZmqClientPolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantBatchPolicy, ConstantPolicy, libero_input_spec
from tests.policy_server.helpers import TIMEOUT_MS, zmq_req, zmq_serving


class Gr00tLikePolicy(BasePolicy):
    """Records what reached it and answers GR00T-style ``action.*`` chunks with a batch axis."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.resets = 0

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(obs)
        return {
            "action.x": np.full((1, 16, 1), 0.5, dtype=np.float32),
            "action.gripper": np.ones((1, 16, 1), dtype=np.float32),
        }

    def reset(self) -> None:
        self.resets += 1


def _npy(arr: np.ndarray, allow_pickle: bool = False) -> dict[str, Any]:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=allow_pickle)
    return {"__ndarray_class__": True, "as_npy": buf.getvalue()}


def _npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros(3))
    return buf.getvalue()


def _gr00t_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _npy(obj)
    return obj


def _gr00t_hook(obj: dict[Any, Any]) -> Any:
    if "__ndarray_class__" in obj:
        return np.load(io.BytesIO(obj["as_npy"]), allow_pickle=False)
    return obj


def gr00t_obs() -> dict[str, Any]:
    return {
        "video.image": np.zeros((1, 1, 64, 64, 3), dtype=np.uint8),
        "state.x": np.full((1, 1, 1), 0.25, dtype=np.float32),
        "annotation.human.action.task_description": ["pick up the bowl"],
    }


def roundtrip(port: int, payload: bytes | list[bytes]) -> Any:
    """Send raw bytes (or a multipart message) on a fresh REQ socket; decode the reply GR00T's way."""
    with zmq_req(port) as sock:
        if isinstance(payload, list):
            sock.send_multipart(payload)
        else:
            sock.send(payload)
        return msgpack.unpackb(sock.recv(), object_hook=_gr00t_hook)


def request(port: int, req: dict[str, Any]) -> Any:
    return roundtrip(port, msgpack.packb(req, default=_gr00t_default))


def test_ping() -> None:
    with zmq_serving(ConstantPolicy()) as port:
        assert request(port, {"endpoint": "ping"}) == {"status": "ok", "message": "Server is running"}


def test_n16_get_action_reply_is_action_info_pair_with_npy_arrays() -> None:
    policy = Gr00tLikePolicy()
    with zmq_serving(policy) as port:
        req = {"endpoint": "get_action", "data": {"observation": gr00t_obs(), "options": None}}
        with zmq_req(port) as sock:
            sock.send(msgpack.packb(req, default=_gr00t_default))
            raw = msgpack.unpackb(sock.recv())  # no hook: inspect the wire layout itself
    assert isinstance(raw, list) and len(raw) == 2
    action, info = raw
    assert set(action) == {"action.x", "action.gripper"}  # timings are not action keys
    wire = action["action.x"]
    assert set(wire) == {"__ndarray_class__", "as_npy"} and all(isinstance(k, str) for k in wire)
    arr = np.load(io.BytesIO(wire["as_npy"]), allow_pickle=False)
    assert arr.shape == (1, 16, 1) and arr.dtype == np.float32 and np.all(arr == 0.5)
    assert "infer_ms" in info["server_timing"] and "infer_ms" in info["policy_timing"]
    seen = policy.seen[0]
    assert seen["video.image"].shape == (1, 1, 64, 64, 3) and seen["video.image"].dtype == np.uint8
    assert seen["state.x"].shape == (1, 1, 1) and seen["state.x"].dtype == np.float32
    assert seen["annotation.human.action.task_description"] == ["pick up the bowl"]


def test_n15_flat_data_gets_bare_action_dict() -> None:
    policy = Gr00tLikePolicy()
    with zmq_serving(policy) as port:
        reply = request(port, {"data": gr00t_obs()})  # endpoint defaults to get_action
    assert isinstance(reply, dict) and set(reply) == {"action.x", "action.gripper"}
    assert reply["action.gripper"].shape == (1, 16, 1)
    assert set(policy.seen[0]) == set(gr00t_obs())


def test_nested_gr00t_observation_passes_through() -> None:
    policy = Gr00tLikePolicy()
    obs = {
        "video": {"ego_view": np.zeros((2, 1, 8, 8, 3), dtype=np.uint8)},
        "state": {"arm": np.zeros((2, 1, 7), dtype=np.float32)},
        "language": {"task": [["wave"], ["wave"]]},
    }
    with zmq_serving(policy) as port:
        action, _ = request(port, {"endpoint": "get_action", "data": {"observation": obs, "options": {"a": 1}}})
    assert action["action.x"].shape == (1, 16, 1)
    assert policy.seen[0]["video"]["ego_view"].shape == (2, 1, 8, 8, 3)
    assert policy.seen[0]["language"]["task"] == [["wave"], ["wave"]]


def test_reset_reaches_policy_and_returns_info_dict() -> None:
    policy = Gr00tLikePolicy()
    with zmq_serving(policy) as port:
        assert request(port, {"endpoint": "reset", "data": {"options": None}}) == {}
    assert policy.resets == 1


def test_get_modality_config_is_wrapped_as_gr00t_modality_configs() -> None:
    modality = {"video": {"delta_indices": [0], "modality_keys": ["video.image"]}}
    with zmq_serving(ConstantPolicy(), metadata={"modality_config": modality}) as port:
        raw = request(port, {"endpoint": "get_modality_config"})
        with ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
            assert client.get_modality_config() == modality
    assert raw == {"video": {"__ModalityConfig_class__": True, "as_json": modality["video"]}}


def test_get_modality_config_defaults_to_empty() -> None:
    with zmq_serving(ConstantPolicy()) as port:
        assert request(port, {"endpoint": "get_modality_config"}) == {}


def test_kill_is_disabled_by_default() -> None:
    with zmq_serving(ConstantPolicy()) as port:
        reply = request(port, {"endpoint": "kill"})
        assert "disabled" in reply["error"] and "enable_kill=True" in reply["error"]
        assert request(port, {"endpoint": "ping"})["status"] == "ok"  # still serving


def test_kill_when_enabled_answers_then_stops_serving() -> None:
    with zmq_serving(ConstantPolicy(), enable_kill=True) as port:
        assert request(port, {"endpoint": "kill"})["status"] == "ok"
        with ZmqClientPolicy(port=port, timeout_ms=300) as client:
            assert client.ping() is False


def test_api_token_rejected_and_accepted() -> None:
    with zmq_serving(ConstantPolicy(), api_key="s3cret") as port:
        assert request(port, {"endpoint": "ping"}) == {"error": "Unauthorized: Invalid API token"}
        bad = request(port, {"endpoint": "get_action", "data": {}, "api_token": "nope"})
        assert bad == {"error": "Unauthorized: Invalid API token"}
        assert request(port, {"endpoint": "ping", "api_token": "s3cret"})["status"] == "ok"
        good = request(
            port, {"endpoint": "get_action", "data": {"observation": {}, "options": None}, "api_token": "s3cret"}
        )
        assert good[0]["actions"].shape == (10, 7)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"\xc1not msgpack at all", "cannot decode request"),
        (msgpack.packb([1, 2, 3]), "request must be a msgpack map"),
        (msgpack.packb({"endpoint": "teleport"}), "unknown endpoint 'teleport'; expected one of ['ping'"),
        (msgpack.packb({"endpoint": 7}), "unknown endpoint 7"),
        (msgpack.packb({"endpoint": "get_action", "data": [1]}), "get_action needs 'data'"),
        (msgpack.packb({"endpoint": "get_action"}), "got NoneType"),
        (
            msgpack.packb({"data": {"x": _npy(np.array([1, "a"], dtype=object), allow_pickle=True)}}),
            "GR00T array refused",
        ),
        (msgpack.packb({"data": {"x": {"__ndarray_class__": True, "as_npy": b"garbage"}}}), "not a valid .npy"),
        (msgpack.packb({"data": {"x": {"__ndarray_class__": True, "as_npy": _npz()}}}), "not a valid .npy"),
        ([msgpack.packb({"endpoint": "ping"}), b"extra"], "expected exactly one message frame"),
    ],
)
def test_bad_requests_get_clear_errors_and_server_keeps_serving(payload: Any, expected: str) -> None:
    with zmq_serving(ConstantPolicy()) as port:
        reply = roundtrip(port, payload)
        assert expected in reply["error"]
        with ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
            assert client.ping()
            assert client.infer({"anything": np.zeros(3)})["actions"].shape == (10, 7)


def test_spec_violation_names_the_field() -> None:
    with zmq_serving(ConstantPolicy(spec=libero_input_spec())) as port:
        obs = {"observation/image": np.zeros((224, 224), dtype=np.uint8)}
        reply = request(port, {"endpoint": "get_action", "data": {"observation": obs, "options": None}})
    assert "observation/image" in reply["error"] and "(224, 224, 3)" in reply["error"]


def test_policy_exception_becomes_error_reply() -> None:
    class Broken(BasePolicy):
        def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
            raise KeyError("state.missing")

    with zmq_serving(Broken()) as port:
        reply = request(port, {"data": {"observation": {}, "options": None}})
        assert "KeyError" in reply["error"] and "state.missing" in reply["error"]
        assert request(port, {"endpoint": "ping"})["status"] == "ok"


def test_oversize_request_is_dropped_without_hurting_the_server() -> None:
    with zmq_serving(ConstantPolicy(), max_message_bytes=4096) as port:
        with ZmqClientPolicy(port=port, timeout_ms=300) as big:
            with pytest.raises(TimeoutError):
                big.infer({"blob": np.zeros(10_000, dtype=np.uint8)})
        assert request(port, {"endpoint": "ping"})["status"] == "ok"


def test_concurrent_req_clients_are_batched_together() -> None:
    policy = ConstantBatchPolicy(delay_ms=50)
    n = 8
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def worker(i: int) -> None:
        with ZmqClientPolicy(port=port, timeout_ms=TIMEOUT_MS) as client:
            barrier.wait()
            results[i] = client.get_action({"state": np.full(3, i, dtype=np.float32)})

    with zmq_serving(policy, max_wait_ms=20) as port:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert all(r is not None and r[0]["actions"].shape == (10, 7) for r in results)
    assert sum(policy.batch_sizes) == n
    assert max(policy.batch_sizes) > 1, policy.batch_sizes
    assert any(r[1]["server_timing"]["batch_size"] > 1 for r in results)


def test_metrics_count_zmq_requests_and_errors() -> None:
    server = PolicyServer(ConstantPolicy(), ServerConfig(port=0, zmq_port=0, transports=("zmq",))).start_in_thread()
    try:
        port = server.ports["zmq"]
        request(port, {"data": {"observation": {}, "options": None}})
        roundtrip(port, b"\xc1")
        text = server.metrics.render()
    finally:
        server.stop()
    assert 'cosmos_robot_requests_total{outcome="ok",transport="zmq"} 1' in text
    assert 'cosmos_robot_errors_total{kind="bad_request",transport="zmq"} 1' in text


def test_binds_all_interfaces_and_reports_a_busy_port() -> None:
    with zmq_serving(ConstantPolicy(), host="0.0.0.0") as port:
        assert request(port, {"endpoint": "ping"})["status"] == "ok"  # reachable through loopback
        busy = PolicyServer(ConstantPolicy(), ServerConfig(port=0, zmq_port=port, transports=("zmq",)))
        with pytest.raises(RuntimeError, match=f"ZMQ transport cannot bind tcp://127.0.0.1:{port}"):
            busy.start_in_thread(timeout_s=5)
