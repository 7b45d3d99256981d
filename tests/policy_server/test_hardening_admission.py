"""Issue 15 on real loopback sockets: one client's flood, oversize batch, NaN reply or reset does not
reach the others.

Each test runs a ``PolicyServer`` (or, where the point is the core's bookkeeping, a ``ServingCore``
on its own loop) with limits scaled down so the attack is small and fast, and checks what a
well-behaved client sees: a prompt answer, a clear "server busy" / named error for the attacker,
its own episode state untouched.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
import time
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from websockets.sync.client import ClientConnection, connect

from cosmos_robot_client.codec import packb, unpackb
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.core import RequestError, ServingCore
from cosmos_robot_server.example_policies import ConstantBatchPolicy, StepCounterPolicy, libero_input_spec
from tests.policy_server.helpers import RecordingPolicy, serving

OBS = {"state": np.zeros(3, np.float32), "prompt": "p"}
_LEGACY = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


def ws(server: PolicyServer) -> ClientConnection:
    url = f"ws://127.0.0.1:{server.ports['ws']}"
    conn = connect(url, compression=None, max_size=None, open_timeout=5, **_LEGACY)
    unpackb(conn.recv(timeout=5))  # metadata frame
    return conn


def ws_call(conn: ClientConnection, message: Any, timeout: float = 5) -> Any:
    conn.send(packb(message))
    reply = conn.recv(timeout=timeout)
    return reply if isinstance(reply, str) else unpackb(reply)


def zmq_socket(ctx: zmq.Context[Any], server: PolicyServer, kind: int = zmq.REQ) -> zmq.Socket[Any]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(f"tcp://127.0.0.1:{server.ports['zmq']}")
    return sock


def get_action() -> bytes:
    return packb({"endpoint": "get_action", "data": {"observation": OBS, "options": None}})


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def test_ws_batch_over_max_client_batch_is_refused_by_name() -> None:
    with serving(ConstantBatchPolicy(4, 2), ("ws",), max_client_batch=8, max_inflight_per_client=8) as server:
        conn = ws(server)
        text, took = timed(lambda: ws_call(conn, {"batch": [OBS] * 1000}))
        assert isinstance(text, str) and "batch of 1000 observations exceeds max_client_batch=8" in text
        assert took < 2.0
        over = ws(server)  # a list longer than max_list_items is refused from its header, before decoding
        text = ws_call(over, {"batch": [OBS] * 3200})
        assert isinstance(text, str) and "3200 items, over max_list_items=1024" in text
        ok = ws(server)
        assert len(ws_call(ok, {"batch": [OBS] * 8})["batch"]) == 8
        assert server.metrics.counter_value("cosmos_robot_errors_total", transport="ws", kind="bad_request") == 2


def test_ws_batch_flood_does_not_stall_another_client() -> None:
    """A batch of 256 observations takes 64 calls of 20 ms; a single request meanwhile waits ~1 call."""
    policy = ConstantBatchPolicy(4, 2, delay_ms=20)
    with serving(policy, ("ws",), max_batch_size=4, max_wait_ms=1) as server:
        attacker, good = ws(server), ws(server)
        ws_call(good, OBS)  # connected and warm
        flood = threading.Thread(target=lambda: ws_call(attacker, {"batch": [OBS] * 256}, timeout=30))
        t0 = time.perf_counter()
        flood.start()
        time.sleep(0.1)  # the flood is queued and running
        reply, took = timed(lambda: ws_call(good, OBS))
        flood.join(30)
        flood_s = time.perf_counter() - t0
        assert reply["actions"].shape == (4, 2)
        assert flood_s > 1.0  # 64 calls of >= 20 ms: the attack really held the policy
        assert took < 0.5, f"the well-behaved client waited {took:.2f} s behind the flood"


def test_zmq_dealer_flood_is_capped_per_client_and_others_stay_prompt() -> None:
    policy = ConstantBatchPolicy(4, 2, delay_ms=10)
    cfg = {"max_batch_size": 4, "max_wait_ms": 1, "max_inflight_per_client": 16, "max_client_batch": 16}
    with serving(policy, ("zmq",), **cfg) as server:
        ctx = zmq.Context()
        try:
            dealer, good = zmq_socket(ctx, server, zmq.DEALER), zmq_socket(ctx, server)
            for _ in range(400):  # never reads its replies while sending
                dealer.send_multipart([b"", get_action()])
            time.sleep(0.05)
            good.send(get_action())
            reply, took = timed(good.recv)
            assert "actions" in msgpack.unpackb(reply)[0]
            assert took < 1.0
            errors = []
            for _ in range(400):
                body = msgpack.unpackb(dealer.recv_multipart()[-1])
                if isinstance(body, dict) and "error" in body:
                    errors.append(body["error"])
            assert len(errors) >= 300  # at most 16 in flight at any moment: most were refused at once
            assert "(max_inflight_per_client=16)" in errors[0] and errors[0].startswith("server busy: client ")
            assert server.metrics.counter_value("cosmos_robot_errors_total", transport="zmq", kind="busy") >= 300
        finally:
            ctx.destroy(linger=0)


def test_full_server_refuses_with_server_busy_over_ws() -> None:
    policy = ConstantBatchPolicy(4, 2, delay_ms=300)
    cfg = {"max_batch_size": 8, "max_queued_requests": 8, "max_inflight_per_client": 8, "max_client_batch": 8}
    with serving(policy, ("ws",), **cfg) as server:
        filler, late = ws(server), ws(server)
        busy = threading.Thread(target=lambda: ws_call(filler, {"batch": [OBS] * 8}))
        busy.start()
        time.sleep(0.1)
        text = ws_call(late, OBS)
        busy.join(5)
        assert isinstance(text, str)
        assert text == "server busy: 8 requests in flight (max_queued_requests=8); retry later"


def test_queued_bytes_per_client_are_capped() -> None:
    """150 x 8 MiB used to queue 2.5 GB; here 64 KiB requests against a 256 KiB per-client cap.

    The ZMQ transport reserves each raw message's bytes before decoding it (``core.reserve``), so
    the excess is refused without being decoded."""
    policy = ConstantBatchPolicy(4, 2, delay_ms=50)
    with serving(policy, ("zmq",), max_inflight_bytes_per_client=256 * 1024) as server:
        ctx = zmq.Context()
        try:
            dealer = zmq_socket(ctx, server, zmq.DEALER)
            big = {"endpoint": "get_action", "data": {"state": np.zeros(16384, np.float32)}}  # 64 KiB
            for _ in range(20):
                dealer.send_multipart([b"", packb(big)])
            bodies = [msgpack.unpackb(dealer.recv_multipart()[-1]) for _ in range(20)]
            errors = [b["error"] for b in bodies if isinstance(b, dict) and "error" in b]
            answered = [b for b in bodies if not (isinstance(b, dict) and "error" in b)]
            assert len(errors) >= 10  # at most 3 messages of 64 KiB (fewer once decoded copies count) fit
            assert answered and all("actions" in b for b in answered)
            assert "(max_inflight_bytes_per_client=262144)" in errors[0] and errors[0].startswith("server busy")
        finally:
            ctx.destroy(linger=0)


def test_connection_closed_drops_its_queued_requests() -> None:
    policy = RecordingPolicy()

    async def go() -> None:
        core = ServingCore(policy, ServerConfig(max_batch_size=4, max_wait_ms=1))
        await core.start()
        try:
            running = asyncio.ensure_future(core.infer({"tag": "a0"}, transport="ws", client_id="a"))
            await asyncio.sleep(0.05)  # a0 holds the policy
            gone = asyncio.ensure_future(
                core.infer_many([{"tag": f"g{i}"} for i in range(5)], transport="ws", client_id="gone")
            )
            later = asyncio.ensure_future(core.infer({"tag": "a1"}, transport="ws", client_id="a"))
            await asyncio.sleep(0.01)
            core.connection_closed("gone")
            policy.gate.set()
            await asyncio.gather(running, later)
            with pytest.raises(asyncio.CancelledError):
                await gone
            assert core.batcher.inflight() == (0, 0)
        finally:
            await core.stop()

    asyncio.run(go())
    assert policy.seen == ["a0", "a1"]


def test_reset_by_one_client_keeps_the_others_sessions() -> None:
    with serving(StepCounterPolicy(2, 2), ("ws", "zmq")) as server:
        a, b = ws(server), ws(server)
        for _ in range(3):
            ws_call(a, OBS)
            ws_call(b, OBS)
        assert ws_call(a, {"endpoint": "reset"}) == "reset successful"
        assert ws_call(a, OBS)["steps"] == 1
        assert ws_call(b, OBS)["steps"] == 4
        # RoboArena session_id: two sessions on one connection, reset one of them
        for _ in range(2):
            ws_call(a, {**OBS, "session_id": "s1"})
        ws_call(a, {**OBS, "session_id": "s2"})
        ws_call(a, {"endpoint": "reset", "session_id": "s1"})
        assert ws_call(a, {**OBS, "session_id": "s1"})["steps"] == 1
        assert ws_call(a, {**OBS, "session_id": "s2"})["steps"] == 2
        ctx = zmq.Context()
        try:
            z1, z2 = zmq_socket(ctx, server), zmq_socket(ctx, server)
            for sock in (z1, z2, z1):
                sock.send(get_action())
                sock.recv()
            z1.send(packb({"endpoint": "reset", "data": {}}))
            z1.recv()
            z2.send(get_action())
            assert msgpack.unpackb(z2.recv())[0]["steps"] == 2  # z1's reset left z2's episode alone
        finally:
            ctx.destroy(linger=0)
        assert ws_call(b, OBS)["steps"] == 5


class NaNPolicy(ConstantBatchPolicy):
    def _chunk(self) -> np.ndarray:
        return np.full((self.action_horizon, self.action_dim), np.nan, dtype=np.float32)


def test_nan_outputs_are_refused_on_ws_and_zmq_and_counted() -> None:
    expected = "policy output 'actions' has 70 non-finite values (NaN/inf); refusing to send it"
    with serving(NaNPolicy(10, 7), ("ws", "zmq")) as server:
        text = ws_call(ws(server), OBS)
        assert isinstance(text, str) and expected in text
        ctx = zmq.Context()
        try:
            sock = zmq_socket(ctx, server)
            sock.send(get_action())
            assert expected in msgpack.unpackb(sock.recv())["error"]
        finally:
            ctx.destroy(linger=0)
        for transport in ("ws", "zmq"):
            assert server.metrics.counter_value("cosmos_robot_errors_total", transport=transport, kind="policy_output")


def test_large_map_is_validated_off_the_event_loop() -> None:
    """A 600,000-key map takes ~0.3 s to validate; meanwhile the loop keeps ticking and serving."""
    policy = ConstantBatchPolicy(4, 2, spec=libero_input_spec())
    small = {
        "observation/image": np.zeros((224, 224, 3), np.uint8),
        "observation/wrist_image": np.zeros((224, 224, 3), np.uint8),
        "observation/state": np.zeros(8),
        "prompt": "p",
    }
    huge = {f"k{i}": 0 for i in range(600_000)}

    async def go() -> tuple[float, float]:
        core = ServingCore(policy, ServerConfig())
        await core.start()
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.ensure_future(ticker())
        try:
            await asyncio.sleep(0.01)
            bad = asyncio.ensure_future(core.infer(huge, transport="ws", client_id="bad"))
            await asyncio.sleep(0.01)  # bad is being validated now
            reply, good = await _timed_async(core.infer(small, transport="ws", client_id="good"))
            assert reply["actions"].shape == (4, 2)
            with pytest.raises(RequestError, match="invalid observation"):
                await bad
            return good, max(gaps)
        finally:
            tick.cancel()
            await core.stop()

    sync_s = timed(lambda: pytest.raises(RequestError, ServingCore(policy, ServerConfig()).validate, huge))[1]
    good, stall = asyncio.run(go())
    bound = max(0.5 * sync_s, 0.05)
    assert stall < bound, f"the event loop stalled {stall:.3f} s; validating the map takes {sync_s:.3f} s"
    assert good < bound


async def _timed_async(coro: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - t0


def test_reserved_wire_messages_count_against_every_cap() -> None:
    """``core.reserve``: what the ZMQ transport calls per raw message, before decoding it."""

    async def go() -> None:
        config = ServerConfig(
            max_inflight_per_client=2, max_client_batch=2, max_inflight_bytes_per_client=1000, max_queued_bytes=1500
        )
        core = ServingCore(ConstantBatchPolicy(4, 2), config)
        await core.start()
        try:
            first = core.reserve("a", 900, transport="zmq")
            with pytest.raises(RequestError, match=r"client a has 900 bytes .* \(max_inflight_bytes_per_client=1000\)"):
                core.reserve("a", 200, transport="zmq")
            with pytest.raises(RequestError, match=r"max_queued_bytes=1500") as busy:
                core.reserve("b", 700, transport="zmq")
            assert busy.value.status == 503
            # the decoded request of a reserved message was admitted with it: not refused again
            reply = await core.infer({"x": np.zeros(125, np.float32)}, transport="zmq", client_id="a")
            assert reply["actions"].shape == (4, 2)
            second = core.reserve("a", 50, transport="zmq")
            with pytest.raises(RequestError, match=r"client a has 2 requests in flight \(max_inflight_per_client=2\)"):
                core.reserve("a", 10, transport="zmq")
            first()
            first()  # idempotent
            second()
            assert core.batcher.inflight() == (0, 0)
            assert core.metrics.counter_value("cosmos_robot_errors_total", transport="zmq", kind="busy") == 3
        finally:
            await core.stop()

    asyncio.run(go())


def test_gil_switch_interval_is_shortened_while_serving_and_restored() -> None:
    before = sys.getswitchinterval()

    async def go() -> list[float]:
        one = ServingCore(ConstantBatchPolicy(4, 2), ServerConfig(gil_switch_interval_ms=0.5))
        two = ServingCore(ConstantBatchPolicy(4, 2), ServerConfig(gil_switch_interval_ms=0.5))
        await one.start()
        await two.start()
        seen = [sys.getswitchinterval()]
        await one.stop()
        seen.append(sys.getswitchinterval())  # the other server still serves
        await two.stop()
        return seen

    assert asyncio.run(go()) == [pytest.approx(0.0005), pytest.approx(0.0005)]
    assert sys.getswitchinterval() == before
