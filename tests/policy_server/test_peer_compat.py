"""Peers we claim to serve unchanged, each reproduced by a named test double on loopback sockets.

The upstream clients cannot be installed here (Isaac-GR00T pins torch and its model stack;
cosmos-framework's LIBERO client needs LIBERO), so each double re-creates the one code path that
matters from the peer's public interface, and says which:

- ``Gr00tN15ClientDouble``: GR00T N1.5's ``BaseInferenceClient`` (``gr00t/eval/service.py``): msgpack
  requests ``{"endpoint", "data"?}``, ``get_action`` sends the observation as ``data``; its decoder
  builds ``ModalityConfig(**json.loads(obj["as_json"]))``.
- ``Gr00tN16ClientDouble``: GR00T N1.6/N1.7's ``PolicyClient`` (``gr00t/policy/server_client.py``):
  ``get_action`` sends ``{"observation", "options"}`` and reads ``(action, info)``; ``reset`` sends
  ``{"options"}``; its decoder builds ``ModalityConfig(**obj["as_json"])``.
- ``CosmosLiberoClientDouble``: cosmos-framework's ``closed_loop_eval.py`` HTTP calls as our research
  notes describe them: POST JSON, ``raise_for_status()``, then ``result["error"]`` raised if present.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import pickle
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from PIL import Image

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantPolicy
from cosmos_robot_server.groot_dialect import GenerationTracker, refused_encoding, request_generation
from tests.policy_server.helpers import TIMEOUT_MS, zmq_serving

MODALITY = {
    "video": {"delta_indices": [0], "modality_keys": ["image", "wrist_image"]},
    "state": {"delta_indices": [0], "modality_keys": ["x", "gripper"]},
    "action": {"delta_indices": list(range(16)), "modality_keys": ["x", "gripper"]},
    "language": {"delta_indices": [0], "modality_keys": ["annotation.human.action.task_description"]},
}


@dataclass
class ModalityConfigDouble:
    """GR00T's ``ModalityConfig``: the two fields both generations require (N1.6 adds optional ones)."""

    delta_indices: list[int]
    modality_keys: list[str]


def _npy(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        buf = io.BytesIO()
        np.save(buf, obj, allow_pickle=False)
        return {"__ndarray_class__": True, "as_npy": buf.getvalue()}
    return obj


class _ReqClient:
    """A GR00T-style ``zmq.REQ`` client; subclasses differ in request shape and reply decoding."""

    def __init__(self, port: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.REQ)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    @staticmethod
    def hook(obj: dict[Any, Any]) -> Any:
        raise NotImplementedError

    def call(self, endpoint: str, data: Any = None, requires_input: bool = True) -> Any:
        request: dict[str, Any] = {"endpoint": endpoint}
        if requires_input:
            request["data"] = data
        self.sock.send(msgpack.packb(request, default=_npy))
        response = msgpack.unpackb(self.sock.recv(), object_hook=self.hook)
        if isinstance(response, dict) and "error" in response:
            raise RuntimeError(f"Server error: {response['error']}")
        return response

    def get_modality_config(self) -> Any:
        return self.call("get_modality_config", requires_input=False)


class Gr00tN15ClientDouble(_ReqClient):
    """GR00T N1.5's client (see the module docstring): ``json.loads`` on ``as_json``."""

    @staticmethod
    def hook(obj: dict[Any, Any]) -> Any:
        if "__ModalityConfig_class__" in obj:
            obj = ModalityConfigDouble(**json.loads(obj["as_json"]))
        elif "__ndarray_class__" in obj:
            obj = np.load(io.BytesIO(obj["as_npy"]), allow_pickle=False)
        return obj

    def get_action(self, observation: dict[str, Any]) -> Any:
        return self.call("get_action", observation)


class Gr00tN16ClientDouble(_ReqClient):
    """GR00T N1.6/N1.7's ``PolicyClient`` (see the module docstring): ``**`` on ``as_json``."""

    @staticmethod
    def hook(obj: dict[Any, Any]) -> Any:
        if "__ModalityConfig_class__" in obj:
            return ModalityConfigDouble(**obj["as_json"])
        if "__ndarray_class__" in obj:
            return np.load(io.BytesIO(obj["as_npy"]), allow_pickle=False)
        return obj

    def get_action(self, observation: dict[str, Any]) -> tuple[Any, Any]:
        return tuple(self.call("get_action", {"observation": observation, "options": None}))

    def reset(self) -> Any:
        return self.call("reset", {"options": None})


@contextmanager
def clients(port: int, *kinds: type[_ReqClient]) -> Iterator[list[Any]]:
    made = [kind(port) for kind in kinds]
    try:
        yield made
    finally:
        for client in made:
            client.close()


def flat_obs() -> dict[str, Any]:
    return {"video.image": np.zeros((1, 1, 8, 8, 3), np.uint8), "annotation.human.action.task_description": ["go"]}


def keys_of(config: Any) -> dict[str, list[str]]:
    return {name: list(table.modality_keys) for name, table in config.items()}


EXPECTED_KEYS = {name: table["modality_keys"] for name, table in MODALITY.items()}


# -- GR00T get_modality_config: one encoding per client generation ------------------------------
def test_the_two_generations_decoders_exclude_each_other() -> None:
    """Pinned to N1.6, an N1.5 client fails exactly as the issue reports, and the reverse: no shared form."""
    for pinned, loser in (("n1.6", Gr00tN15ClientDouble), ("n1.5", Gr00tN16ClientDouble)):
        with zmq_serving(ConstantPolicy(), metadata={"modality_config": MODALITY}, groot_generation=pinned) as port:
            with clients(port, loser) as (client,), pytest.raises(TypeError):
                client.get_modality_config()


def test_pinned_generation_serves_a_fresh_n15_client_asking_first() -> None:
    """N1.5's ``inference_service.py --client`` asks for the modality config before anything else."""
    with zmq_serving(ConstantPolicy(), metadata={"modality_config": MODALITY}, groot_generation="n1.5") as port:
        with clients(port, Gr00tN15ClientDouble) as (client,):
            assert keys_of(client.get_modality_config()) == EXPECTED_KEYS


def test_auto_learns_each_peers_generation_from_its_requests() -> None:
    with zmq_serving(ConstantPolicy(), metadata={"modality_config": MODALITY}) as port:
        with clients(port, Gr00tN16ClientDouble, Gr00tN15ClientDouble, Gr00tN15ClientDouble) as (n16, n15, late):
            assert keys_of(n16.get_modality_config()) == EXPECTED_KEYS  # nothing seen yet: N1.6
            n15.get_action(flat_obs())  # flat data: N1.5
            assert keys_of(n15.get_modality_config()) == EXPECTED_KEYS
            assert keys_of(late.get_modality_config()) == EXPECTED_KEYS  # a fresh peer: the last one seen
            n16.reset()  # only N1.6+ have reset
            assert keys_of(n16.get_modality_config()) == EXPECTED_KEYS
            action, info = n16.get_action(flat_obs())
            assert action["actions"].shape == (10, 7) and "server_timing" in info


def test_tracker_rules_without_sockets() -> None:
    assert request_generation("get_action", {"observation": {}, "options": None}) == "n1.6"
    assert request_generation("get_action", {"video.image": 0}) == "n1.5"
    assert request_generation("reset", {"options": None}) == "n1.6"
    assert request_generation("get_modality_config", None) is None
    tracker = GenerationTracker(max_peers=2)
    assert tracker.generation("a") == "n1.6"
    tracker.observe("a", "get_action", {"video.image": 0})
    tracker.observe("b", "reset", {"options": None})
    tracker.observe("c", "reset", {"options": None})  # "a" is forgotten (max_peers=2)
    assert (tracker.generation("a"), tracker.generation("b")) == ("n1.6", "n1.6")
    tracker.observe("b", "get_action", {"video.image": 0})
    assert tracker.generation("b") == "n1.5" and tracker.generation("new") == "n1.5"
    reply = tracker.modality_config_reply({"video": {"delta_indices": (0,), "modality_keys": ["a"]}}, "b")
    assert json.loads(reply["video"]["as_json"]) == {"delta_indices": [0], "modality_keys": ["a"]}
    with pytest.raises(ValueError, match="groot_generation"):
        GenerationTracker("n2")
    with pytest.raises(ValueError, match="groot_generation"):
        ServerConfig(groot_generation="n1.7")


# -- pre-msgpack GR00T (torch.save / pickle on the wire) -----------------------------------------
def _zip_stream() -> bytes:
    """The container ``torch.save`` writes since torch 1.6 (a zip archive holding a pickle)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"endpoint": "ping"}, protocol=2))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (_zip_stream(), "torch.save archive"),
        *((pickle.dumps({"endpoint": "ping"}, protocol=p), "pickle") for p in (2, 5)),
    ],
)
def test_pickle_and_torch_save_requests_are_refused_by_name(
    body: bytes, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    with zmq_serving(ConstantPolicy()) as port, clients(port, Gr00tN16ClientDouble) as (client,):
        client.sock.send(body)
        error = msgpack.unpackb(client.sock.recv())["error"]
        assert what in error and "never unpickles" in error and "cannot decode" not in error
        assert client.call("ping", requires_input=False)["status"] == "ok"  # still serving
    assert any("never unpickles" in r.getMessage() for r in caplog.records)


def test_ordinary_garbage_keeps_the_generic_decode_error() -> None:
    assert refused_encoding(b"\xc1") is None and refused_encoding(b"\x80") is None
    with zmq_serving(ConstantPolicy()) as port, clients(port, Gr00tN16ClientDouble) as (client,):
        client.sock.send(b"\xc1garbage")
        assert msgpack.unpackb(client.sock.recv())["error"].startswith("cannot decode request")


# -- no server tracebacks to clients ------------------------------------------------------------
class ExplodingPolicy(ConstantPolicy):
    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        raise ZeroDivisionError("the model\ndivided by zero")


def test_zmq_policy_failure_is_one_line_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with zmq_serving(ExplodingPolicy()) as port, clients(port, Gr00tN16ClientDouble) as (client,):
        with pytest.raises(RuntimeError) as info:
            client.get_action(flat_obs())
    message = str(info.value)
    assert "ZeroDivisionError: the model divided by zero" in message
    assert "Traceback" not in message and "\n" not in message
    assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)  # logged server-side


# -- cosmos-framework's LIBERO client: errors in the body on request ------------------------------
class CosmosLiberoClientDouble:
    """cosmos-framework's LIBERO eval HTTP calls (see the module docstring), with urllib for requests."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def predict(self, payload: dict[str, Any], route: str = "/predict") -> Any:
        req = urllib.request.Request(
            self.base + route, json.dumps(payload).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as resp:  # raise_for_status(): a 4xx/5xx raises HTTPError
            result = json.load(resp)
        if "error" in result:
            raise RuntimeError(f"server error: {result['error']}")
        return result["actions" if route == "/predict_batch" else "action"]


def cosmos_request(**over: Any) -> dict[str, Any]:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(buf, format="PNG")
    body = {"image": base64.b64encode(buf.getvalue()).decode(), "prompt": "go", "domain_name": "libero"}
    body["image_size"] = 16
    body.update(over)
    return body


@contextmanager
def http_server(policy: BasePolicy, **config: Any) -> Iterator[int]:
    cfg = ServerConfig(port=0, http_port=0, transports=("http",), **config)
    with PolicyServer(policy, cfg) as server:
        yield server.ports["http"]


def test_cosmos_errors_default_to_http_statuses() -> None:
    with http_server(ConstantPolicy()) as port:
        with pytest.raises(urllib.error.HTTPError) as info:
            CosmosLiberoClientDouble(port).predict(cosmos_request(prompt=3))
        assert info.value.code == 400  # the double's log shows only "HTTP Error 400: Bad Request"
        assert "prompt" in json.load(info.value)["error"]


def test_cosmos_errors_in_body_reach_the_client_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    with http_server(ConstantPolicy(), cosmos_errors="in_body") as port:
        client = CosmosLiberoClientDouble(port)
        assert np.asarray(client.predict(cosmos_request())).shape == (10, 7)  # success unchanged
        with pytest.raises(RuntimeError, match="prompt: expected a string"):
            client.predict(cosmos_request(prompt=3))
        with pytest.raises(RuntimeError, match=r"items\[0\]\.image_size: missing"):
            item = {k: v for k, v in cosmos_request().items() if k != "image_size"}
            client.predict({"items": [item]}, "/predict_batch")
    with http_server(ExplodingPolicy(), cosmos_errors="in_body", api_key="k") as port:
        raw = urllib.request.Request(
            f"http://127.0.0.1:{port}/predict",
            json.dumps(cosmos_request()).encode(),
            {"Content-Type": "application/json", "X-Api-Key": "k"},
        )
        with urllib.request.urlopen(raw, timeout=5) as resp:
            assert resp.status == 200
            body = json.load(resp)
        assert body["action"] == [] and "ZeroDivisionError" in body["error"] and "Traceback" not in body["error"]
        with pytest.raises(urllib.error.HTTPError) as info:  # auth failures stay HTTP statuses
            CosmosLiberoClientDouble(port).predict(cosmos_request())
        assert info.value.code == 401


def test_error_reply_rules() -> None:
    from cosmos_robot_server.cosmos_dialect import error_reply

    assert error_reply("http", "/predict", 400, "m") == (400, {"error": "m"})
    assert error_reply("in_body", "/predict", 400, "m") == (200, {"action": [], "error": "m"})
    assert error_reply("in_body", "/predict_batch", 500, "m") == (200, {"actions": [], "error": "m"})
    assert error_reply("in_body", "/predict", 413, "m") == (413, {"error": "m"})
    assert error_reply("in_body", "/reset", 400, "m") == (400, {"error": "m"})
    with pytest.raises(ValueError, match="cosmos_errors"):
        ServerConfig(cosmos_errors="body")
