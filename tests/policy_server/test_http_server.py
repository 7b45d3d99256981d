"""The HTTP transport on real loopback sockets: probes, metrics, and cosmos-framework's LIBERO dialect."""

from __future__ import annotations

import base64
import http.client
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from PIL import Image

from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_client.spec import ArraySpec, InputSpec
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.example_policies import ConstantBatchPolicy, libero_input_spec
from cosmos_robot_server.server import PolicyServer

HORIZON, DIM = 16, 10  # cosmos LIBERO: 16-step chunks of 10-D rot6d deltas


class RecordingPolicy(BatchPolicy):
    """Remembers what it was given; answers chunk ``i`` with values ``i + arange``; fails on prompt "boom"."""

    def __init__(self, spec: InputSpec | None = None, delay_s: float = 0.0) -> None:
        self.spec = spec
        self.delay_s = delay_s
        self.seen: list[dict[str, Any]] = []
        self.batch_sizes: list[int] = []
        self.resets = 0
        self._lock = threading.Lock()

    @property
    def metadata(self) -> dict[str, Any]:
        return {"action_horizon": HORIZON, "action_dim": DIM, "policy": "recording"}

    @property
    def input_spec(self) -> InputSpec | None:
        return self.spec

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._lock:
            self.seen.extend(obs_batch)
            self.batch_sizes.append(len(obs_batch))
        if self.delay_s:
            time.sleep(self.delay_s)
        if any(obs.get("prompt") == "boom" for obs in obs_batch):
            raise ValueError("the model exploded on purpose")
        base = np.arange(HORIZON * DIM, dtype=np.float32).reshape(HORIZON, DIM) / 8
        return [{"actions": base + float(obs["prompt"].count("!"))} for obs in obs_batch]

    def reset(self) -> None:
        self.resets += 1


def libero_spec_without_state() -> InputSpec:
    """openpi's LIBERO spec; state made optional because cosmos's dialect carries none."""
    fields = dict(libero_input_spec(224).fields)
    fields["observation/state"] = ArraySpec((8,), "floating", optional=True)
    return InputSpec(fields)


@contextmanager
def serve(policy: Any, **config: Any) -> Iterator[PolicyServer]:
    cfg = ServerConfig(host="127.0.0.1", port=0, http_port=0, transports=("http",), **config)
    with PolicyServer(policy, cfg) as server:
        yield server


def png_b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def two_view(height: int = 256) -> np.ndarray:
    img = np.zeros((height, 2 * height, 3), np.uint8)
    img[:, :height] = (200, 10, 10)  # agentview
    img[:, height:] = (10, 10, 200)  # wrist
    return img


def item(image: np.ndarray | str | None = None, **over: Any) -> dict[str, Any]:
    payload = {
        "image": png_b64(two_view(16)) if image is None else image if isinstance(image, str) else png_b64(image),
        "prompt": "put the bowl on the plate",
        "domain_name": "libero",
        "image_size": 256,
    }
    payload.update(over)
    return payload


def call(
    port: int,
    method: str,
    path: str,
    payload: Any = None,
    headers: dict[str, str] | None = None,
    conn: http.client.HTTPConnection | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One request; returns (status, headers, parsed JSON or text)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    body = payload if isinstance(payload, bytes) or payload is None else json.dumps(payload).encode()
    hdrs = {"Content-Type": "application/json"} if body is not None else {}
    hdrs.update(headers or {})
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
        content = json.loads(raw) if resp.getheader("Content-Type", "").startswith("application/json") else raw
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, content
    finally:
        if own:
            conn.close()


# -- a client written from cosmos-framework's closed_loop_eval.py behaviour --------------------
def cosmos_eval_step(base: str, frames: list[np.ndarray], prompt: str, wait_s: float = 5.0) -> dict[str, Any]:
    """Wait for GET / == 200, read /info, POST /predict_batch of base64 PNGs, parse "actions"."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(base + "/", timeout=1) as resp:
                if resp.status == 200:
                    break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with urllib.request.urlopen(base + "/info", timeout=5) as resp:
        info = json.loads(resp.read())
    items = [{"image": png_b64(f), "prompt": prompt, "domain_name": "libero", "image_size": 256} for f in frames]
    req = urllib.request.Request(
        base + "/predict_batch",
        data=json.dumps({"items": items}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        result = json.loads(resp.read())
    return {"info": info, "actions": np.asarray(result["actions"], dtype=np.float32)}


def test_cosmos_closed_loop_client_gets_batched_actions_and_policy_gets_split_resized_views() -> None:
    policy = RecordingPolicy(libero_spec_without_state())
    with serve(policy) as server:
        out = cosmos_eval_step(f"http://127.0.0.1:{server.ports['http']}", [two_view(256)] * 3, "pick it up")
    assert out["info"]["action_chunk_size"] == HORIZON and out["info"]["raw_action_dim"] == DIM
    assert out["info"]["policy"] == "recording" and "max_action_dim" not in out["info"]
    assert out["actions"].shape == (3, HORIZON, DIM)
    np.testing.assert_allclose(out["actions"][2], np.arange(HORIZON * DIM).reshape(HORIZON, DIM) / 8)
    assert policy.batch_sizes == [3]  # one batched policy call for the whole /predict_batch
    for obs in policy.seen:
        assert set(obs) == {"observation/image", "observation/wrist_image", "prompt"}
        for key, colour in (("observation/image", (200, 10, 10)), ("observation/wrist_image", (10, 10, 200))):
            assert obs[key].shape == (224, 224, 3) and obs[key].dtype == np.uint8
            assert (obs[key] == colour).all()  # left half -> agentview, right half -> wrist
        assert obs["prompt"] == "pick it up"


def test_predict_routes_answer_single_chunks() -> None:
    policy = RecordingPolicy()  # no spec: one image, every field passed through
    img = np.random.default_rng(0).integers(0, 256, (12, 24, 3), dtype=np.uint8)
    with serve(policy) as server:
        port = server.ports["http"]
        for path in ("/", "/predict", "/predict/"):
            status, headers, body = call(port, "POST", path, item(img, prompt="go!", request_id=7, extra=[1]))
            assert status == 200, body
            assert set(body) == {"action", "server_timing"}  # no "video": we do not decode one
            assert np.asarray(body["action"]).shape == (HORIZON, DIM) and body["action"][0][0] == 1.0
            assert headers["cache-control"] == "no-store"
    obs = policy.seen[0]
    assert "request_id" not in obs and "extra" not in obs  # unknown fields are ignored, as cosmos does
    np.testing.assert_array_equal(obs["observation/image"], img)
    assert (obs["prompt"], obs["domain_name"], obs["image_size"]) == ("go!", "libero", 256)


def test_constant_batch_policy_serves_the_dialect() -> None:
    with serve(ConstantBatchPolicy(action_horizon=4, action_dim=7, value=0.5)) as server:
        status, _, body = call(server.ports["http"], "POST", "/predict_batch", {"items": [item(), item()]})
    assert status == 200 and body["actions"] == [[[0.5] * 7] * 4] * 2
    assert body["server_timing"]["batch_size"] == 2


def test_get_routes_and_method_errors() -> None:
    with serve(RecordingPolicy(), metadata={"checkpoint": "ckpt/step_100", "fps": 20}) as server:
        port = server.ports["http"]
        assert call(port, "GET", "/")[::2] == (200, {"status": "ok"})
        assert call(port, "GET", "/healthz")[::2] == (200, b"OK\n")
        assert call(port, "GET", "/readyz")[::2] == (200, b"ready\n")
        status, headers, text = call(port, "GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain") and b"# TYPE" in text
        status, _, info = call(port, "GET", "/info")
        assert status == 200 and info["checkpoint"] == "ckpt/step_100" and info["fps"] == 20
        assert info["server"]["name"] == "cosmos-robot-server" and info["input_spec"] is None
        status, headers, body = call(port, "HEAD", "/healthz")
        assert status == 200 and headers["content-length"] == "3" and body == b""
        assert call(port, "GET", "/nope")[::2] == (404, {"error": "Not found"})
        assert call(port, "POST", "/nope", item())[::2] == (404, {"error": "Not found"})
        status, headers, body = call(port, "GET", "/predict_batch")
        assert status == 405 and headers["allow"] == "POST" and "GET not allowed on /predict_batch" in body["error"]
        status, headers, body = call(port, "POST", "/healthz", {})
        assert status == 405 and headers["allow"] == "GET, HEAD"
        assert call(port, "DELETE", "/predict")[0] == 405


@pytest.mark.parametrize(
    ("path", "payload", "headers", "status", "expected"),
    [
        ("/predict", b"{not json", None, 400, "invalid JSON body"),
        ("/predict", [1, 2], None, 400, "request body: must be a JSON object, got array"),
        ("/predict", item(prompt=None), None, 400, "prompt: expected a string, got null"),
        ("/predict", {k: v for k, v in item().items() if k != "domain_name"}, None, 400, "domain_name: missing"),
        ("/predict", item(image_size="256"), None, 400, "image_size: expected an integer, got string"),
        ("/predict", item(image_size=0), None, 400, "image_size: must be > 0"),
        ("/predict", item(base64.b64encode(b"GIF89a junk").decode()), None, 400, "image: not a decodable image"),
        ("/predict", item("!!!!"), None, 400, "image: not valid base64"),
        ("/predict", item(), {"Content-Type": "text/plain"}, 415, "Content-Type must be application/json"),
        ("/predict_batch", {"items": []}, None, 400, "items: must not be empty"),
        ("/predict_batch", {"items": [item(), item(prompt=3)]}, None, 400, "items[1].prompt: expected a string"),
        ("/predict_batch", item(), None, 400, "items: missing required field"),
    ],
)
def test_client_faults_are_4xx_json_naming_the_field(
    path: str, payload: Any, headers: dict[str, str] | None, status: int, expected: str
) -> None:
    policy = RecordingPolicy()
    with serve(policy) as server:
        got_status, got_headers, body = call(server.ports["http"], "POST", path, payload, headers)
    assert got_status == status and got_headers["content-type"] == "application/json"
    assert expected in body["error"] and set(body) == {"error"}
    assert policy.seen == []  # never reached the model


def test_spec_violation_is_400_naming_the_key() -> None:
    with serve(RecordingPolicy(libero_input_spec(224))) as server:
        status, _, body = call(server.ports["http"], "POST", "/predict", item(two_view(224)))
    assert status == 400 and body["error"].startswith("observation/state: required by the policy's input spec")


def test_oversize_body_is_refused_before_it_is_read() -> None:
    with serve(RecordingPolicy(), max_message_bytes=4096) as server:
        with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5) as sock:
            # Headers only: a server that tried to read the 10 MB body would hang here, not answer.
            sock.sendall(
                b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 10000000\r\n\r\n"
            )
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            body = json.loads(resp.read())
        assert resp.status == 413 and resp.getheader("Connection") == "close"
        assert body["error"] == "request body of 10000000 bytes exceeds the limit of max_message_bytes=4096"
        status, _, body = call(server.ports["http"], "POST", "/predict", item(prompt="x" * 5000))
        assert status == 413 and "max_message_bytes=4096" in body["error"]


def test_policy_exception_is_500_while_a_concurrent_request_succeeds() -> None:
    policy = RecordingPolicy(delay_s=0.05)
    results: dict[str, tuple[int, Any]] = {}
    with serve(policy, max_wait_ms=50) as server:
        port = server.ports["http"]

        def send(prompt: str) -> None:
            status, _, body = call(port, "POST", "/predict", item(prompt=prompt))
            results[prompt] = (status, body)

        threads = [threading.Thread(target=send, args=(p,)) for p in ("boom", "fine")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        status, body = results["boom"]
        assert status == 500 and "ValueError: the model exploded on purpose" in body["error"]
        assert set(body) == {"error"}  # never a 200 with an empty action
        assert results["fine"][0] == 200 and len(results["fine"][1]["action"]) == HORIZON
        status, _, body = call(port, "POST", "/predict_batch", {"items": [item(), item(prompt="boom")]})
        assert status == 500 and "batch[1]" in body["error"] and "exploded" in body["error"]
        assert call(port, "GET", "/healthz")[0] == 200  # the server survived


def test_api_key_guards_post_routes_only() -> None:
    policy = RecordingPolicy()
    with serve(policy, api_key="s3cret") as server:
        port = server.ports["http"]
        for headers in ({}, {"X-Api-Key": "wrong"}, {"Authorization": "Api-Key wrong"}, {"Authorization": "s3cret"}):
            status, got, body = call(port, "POST", "/predict", item(), headers)
            assert status == 401 and "X-Api-Key" in body["error"] and got["www-authenticate"] == "Api-Key"
        assert policy.seen == []
        assert call(port, "POST", "/predict", item(), {"X-Api-Key": "s3cret"})[0] == 200
        assert call(port, "POST", "/predict", item(), {"Authorization": "Api-Key s3cret"})[0] == 200
        for path in ("/", "/healthz", "/readyz", "/metrics", "/info"):
            assert call(port, "GET", path)[0] == 200, path
        metrics = call(port, "GET", "/metrics")[2].decode()
    assert 'cosmos_robot_requests_total{outcome="unauthorized",transport="http"} 4' in metrics


def test_metrics_count_requests_errors_and_latency() -> None:
    with serve(RecordingPolicy()) as server:
        port = server.ports["http"]
        for _ in range(3):
            assert call(port, "POST", "/predict", item())[0] == 200
        assert call(port, "POST", "/predict_batch", {"items": [item(), item()]})[0] == 200
        assert call(port, "POST", "/predict", item(image_size=-1))[0] == 400
        assert call(port, "POST", "/predict", item(prompt="boom"))[0] == 500
        deadline = time.monotonic() + 3  # closed connections are counted down by their own threads
        while True:
            text = call(port, "GET", "/metrics")[2].decode()
            if 'cosmos_robot_connections{transport="http"} 1' in text or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    lines = set(text.splitlines())
    for expected in (
        'cosmos_robot_requests_total{outcome="ok",transport="http"} 5',
        'cosmos_robot_requests_total{outcome="bad_request",transport="http"} 1',
        'cosmos_robot_requests_total{outcome="policy_error",transport="http"} 1',
        'cosmos_robot_errors_total{kind="policy_error",transport="http"} 1',
        'cosmos_robot_request_latency_seconds_count{transport="http"} 4',  # 3 singles + 1 batch request
        'cosmos_robot_batch_size_bucket{le="2"} 5',  # 3 + 1 (batch of 2) + 1 failed call of 1
        "cosmos_robot_batch_size_count 5",
        "cosmos_robot_policy_latency_seconds_count 5",
        'cosmos_robot_connections{transport="http"} 1',  # only the /metrics request's connection is open
    ):
        assert expected in lines, f"{expected!r} not in metrics:\n{text}"


def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    with serve(RecordingPolicy()) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=5)
        try:
            assert call(server.ports["http"], "GET", "/", conn=conn)[0] == 200
            sock = conn.sock
            assert sock is not None
            assert call(server.ports["http"], "POST", "/predict", item(), conn=conn)[0] == 200
            assert call(server.ports["http"], "POST", "/predict", item(image_size=0), conn=conn)[0] == 400
            status, headers, _ = call(server.ports["http"], "GET", "/healthz", conn=conn)
            assert status == 200 and "connection" not in headers
            assert conn.sock is sock  # http.client would have reconnected if the server had closed
        finally:
            conn.close()


def test_next_episode_resets_the_policy() -> None:
    policy = RecordingPolicy()
    with serve(policy) as server:
        status, _, body = call(server.ports["http"], "POST", "/next_episode", b"", {"Content-Length": "0"})
        assert (status, body) == (200, {"status": "ok"})
        assert call(server.ports["http"], "POST", "/reset", {})[0] == 200
    assert policy.resets == 2


def test_stop_closes_idle_keep_alive_connections() -> None:
    server = PolicyServer(RecordingPolicy(), ServerConfig(port=0, http_port=0, transports=("http",)))
    server.start_in_thread()
    sock = socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while not reply.endswith(b"OK\n"):
            reply += sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        server.stop()
        assert time.monotonic() - t0 < 3
        assert sock.recv(4096) == b""  # the server closed the idle connection
    finally:
        sock.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.ports['http']}/", timeout=1)


class BadOutputPolicy(RecordingPolicy):
    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"actions": np.zeros(7)} for _ in obs_batch]


def test_unusable_policy_output_is_500_not_an_empty_action() -> None:
    with serve(BadOutputPolicy()) as server:
        port = server.ports["http"]
        status, _, body = call(port, "POST", "/predict", item())
        assert status == 500 and body == {"error": "policy 'actions' must have shape (T, D), got (7,)"}
        assert call(port, "POST", "/predict_batch", {"items": [item()]})[0] == 500
        text = call(port, "GET", "/metrics")[2].decode()
    assert 'cosmos_robot_errors_total{kind="policy_output",transport="http"} 2' in text


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"FOO /predict HTTP/1.1\r\nHost: x\r\n\r\n", 501),
        (b"this is not http\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431),
        (b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
        (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n", 411),
        (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{", 400),
    ],
)
def test_malformed_http_is_answered_in_json_and_the_server_survives(raw: bytes, status: int) -> None:
    with serve(RecordingPolicy()) as server:
        with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5) as sock:
            sock.sendall(raw)
            if raw.endswith(b"{"):
                sock.shutdown(socket.SHUT_WR)  # the body ends early
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            body = json.loads(resp.read())
        assert resp.status == status and set(body) == {"error"}, body
        assert call(server.ports["http"], "POST", "/predict", item())[0] == 200
