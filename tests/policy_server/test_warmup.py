"""Warm-up: the server runs the policy on its example observation before it reports ready."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from cosmos_robot_client.base_policy import BasePolicy, BatchPolicy
from cosmos_robot_client.spec import InputSpec
from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.example_policies import libero_input_spec
from cosmos_robot_server.server import PolicyServer


class SlowToWarmPolicy(BatchPolicy):
    """Records batch sizes; the first call blocks until the test releases it (a compile, say)."""

    def __init__(self, spec: InputSpec | None = None, fail: bool = False) -> None:
        self.spec, self.fail = spec, fail
        self.batch_sizes: list[int] = []
        self.release = threading.Event()

    @property
    def input_spec(self) -> InputSpec | None:
        return self.spec

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("CUDA graph capture refused")
        if self.spec is not None:
            for obs in obs_batch:
                self.spec.validate(obs)
        self.batch_sizes.append(len(obs_batch))
        return [{"actions": np.zeros((4, 7), np.float32)} for _ in obs_batch]


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_not_ready_until_every_warmup_batch_ran() -> None:
    policy = SlowToWarmPolicy(libero_input_spec())
    config = ServerConfig(port=0, http_port=0, transports=("ws", "http"), max_batch_size=8, warmup_batches=(4, 1, 2))
    server = PolicyServer(policy, config)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (server.start_in_thread(timeout_s=30), done.set()), daemon=True)
    thread.start()
    try:
        deadline = threading.Event()
        while "http" not in server.ports and not deadline.wait(0.05):
            pass
        assert not done.is_set() and _readyz(server.ports["http"]) == 503  # listening, warming up
        policy.release.set()
        assert done.wait(20)
        assert policy.batch_sizes == [1, 2, 4] and _readyz(server.ports["http"]) == 200
        with WebsocketClientPolicy("127.0.0.1", server.ports["ws"]) as client:
            assert client.infer(libero_input_spec().example())["actions"].shape == (4, 7)
    finally:
        policy.release.set()
        server.stop()


def test_a_failing_warmup_stops_the_start_with_the_batch_named() -> None:
    policy = SlowToWarmPolicy(libero_input_spec(), fail=True)
    policy.release.set()
    server = PolicyServer(policy, ServerConfig(port=0, warmup_batches=(2,)))
    with pytest.raises(RuntimeError, match="warm-up with a batch of 2 failed: RuntimeError: CUDA graph capture"):
        server.start_in_thread(timeout_s=20)


def test_a_policy_without_an_example_cannot_be_warmed_up() -> None:
    class Anything(BasePolicy):
        def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
            return {"actions": np.zeros((1, 1), np.float32)}

    assert Anything().example_observation() is None  # no input spec: nothing to build from
    with pytest.raises(RuntimeError, match="offers no example observation"):
        PolicyServer(Anything(), ServerConfig(port=0, warmup_batches=(1,))).start_in_thread(timeout_s=20)


def test_warmup_batches_are_checked_against_max_batch() -> None:
    with pytest.raises(ValueError, match=r"warmup_batches: \[32\] not batch sizes between 1 and max_batch_size=16"):
        ServerConfig(warmup_batches=(1, 32))


def test_cold_batch_buckets_are_named() -> None:
    """A warm-up that skips a power-of-two bucket the batcher can form is named (the server logs it)."""
    assert ServerConfig(max_batch_size=16, warmup_batches=(16,)).cold_buckets() == [1, 2, 4, 8]
    assert ServerConfig(max_batch_size=16, warmup_batches=(1, 2, 4, 8, 16)).cold_buckets() == []
    assert ServerConfig(max_batch_size=6, warmup_batches=(1, 2, 3, 6)).cold_buckets() == []  # 3 -> 4, 6 -> 8
    assert ServerConfig(max_batch_size=6, warmup_batches=(1, 2, 4)).cold_buckets() == [8]  # 5, 6 pad to 8
    assert ServerConfig(max_batch_size=16).cold_buckets() == []  # no warm-up asked: nothing to warn about


def test_a_cold_bucket_is_logged_at_start(caplog: pytest.LogCaptureFixture) -> None:
    policy = SlowToWarmPolicy(libero_input_spec())
    policy.release.set()
    config = ServerConfig(port=0, transports=("ws",), max_batch_size=4, warmup_batches=(4,))
    with caplog.at_level("WARNING", logger="cosmos_robot_server.server"):
        server = PolicyServer(policy, config).start_in_thread(timeout_s=30)
        server.stop()
    assert any("not the batch buckets [1, 2]" in r.getMessage() for r in caplog.records), caplog.text
