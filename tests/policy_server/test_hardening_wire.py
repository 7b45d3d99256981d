"""Wire-level hardening (issue 15), reproduced on real loopback sockets against a real server.

Each test replays one attack from the issue, scaled down through small ``ServerConfig`` limits so
it stays fast: a crafted map under the size cap, decoder bombs, a client that leaves mid-request,
connection floods, trickled headers and bodies, an oversized HTTP body. The attacker must get a
named error (or a clear refusal) and everybody else must keep being served.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import msgpack
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from cosmos_robot_client.codec import packb, unpackb
from cosmos_robot_server.example_policies import ConstantPolicy
from cosmos_robot_server.ratelog import RateLimitedLog, RateLimiter, RateLimitFilter, install_library_filters
from tests.policy_server.helpers import serving, zmq_req
from tests.policy_server.test_websocket_server import connect, raw_connect, roundtrip

ERRORS = "cosmos_robot_errors_total"


class GatedPolicy(ConstantPolicy):
    """Blocks in ``infer`` until ``gate`` is set; records which requests reached it."""

    def __init__(self) -> None:
        super().__init__(2, 2)
        self.gate = threading.Event()
        self.running = threading.Event()
        self.seen: list[str] = []

    @property
    def cheap_inference(self) -> bool:
        return False

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(str(obs.get("who")))
        self.running.set()
        self.gate.wait(10)
        return super().infer(obs)


def zmq_call(port: int, body: bytes) -> Any:
    with zmq_req(port) as sock:
        sock.send(body)
        return unpackb(sock.recv())


def post_json(port: int, body: bytes, timeout: float = 5) -> tuple[int, Any]:
    """POST ``body`` to ``/predict`` as JSON; the reply's status and decoded body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def wait_for(predicate: Any, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def npy_claiming(shape: tuple[int, ...]) -> bytes:
    """A .npy file whose header claims ``shape`` of float32 but which holds 16 bytes."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + bytes(16)


BOMBS = {  # the three payloads from the issue, and what the error must say
    "npgeneric_overflow": ({"__npgeneric__": True, "data": 1000, "dtype": "|i1"}, "does not fit dtype '|i1'"),
    "npy_huge_shape": ({"__ndarray_class__": True, "as_npy": npy_claiming((2199023255552,))}, "needs 8796093022208"),
    "modality_recursion": ({"__ModalityConfig_class__": True, "as_json": "[" * 100000}, "nests too deeply"),
}


# -- decoding: bounded, off the loop, every failure named ------------------------------------------
def test_huge_map_is_refused_at_once_while_other_clients_are_served() -> None:
    bomb = msgpack.packb({f"k{i}": 1 for i in range(300_000)})  # ~3 MB, far under the 64 MiB cap
    many_maps = msgpack.packb([{f"k{i}": 1 for i in range(1000)} for _ in range(40)])  # 40k objects
    with serving(ConstantPolicy(2, 2), max_elements=20_000) as server:
        good, _ = raw_connect(server)
        latencies: list[float] = []
        stop = threading.Event()

        def well_behaved() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                assert roundtrip(good, {"prompt": "x"})["actions"].shape == (2, 2)
                latencies.append(time.perf_counter() - t0)

        thread = threading.Thread(target=well_behaved)
        thread.start()
        try:
            for payload, named in ((bomb, "max_map_keys=1024"), (many_maps, "max_elements=20000")):
                attacker, _ = raw_connect(server)
                t0 = time.perf_counter()
                attacker.send(payload)
                text = attacker.recv(timeout=5)
                assert isinstance(text, str) and text.startswith("request too complex") and named in text
                with pytest.raises(ConnectionClosed) as closed:
                    attacker.recv(timeout=5)
                assert closed.value.rcvd is not None and closed.value.rcvd.reason == "request too complex"
                reply = zmq_call(server.ports["zmq"], payload)
                assert "request too complex" in reply["error"] and named in reply["error"]
                assert time.perf_counter() - t0 < 1.5
        finally:
            stop.set()
            thread.join(5)
        assert len(latencies) >= 5 and max(latencies) < 1.0, latencies
        assert server.metrics.counter_value(ERRORS, transport="ws", kind="bad_request") == 2
        assert server.metrics.counter_value(ERRORS, transport="zmq", kind="bad_request") == 2


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_decoder_bombs_get_a_named_error_on_ws_and_zmq(name: str) -> None:
    bomb, expected = BOMBS[name]
    with serving(ConstantPolicy(2, 2)) as server:
        ws, _ = raw_connect(server)
        ws.send(msgpack.packb({"prompt": "x", "x": bomb}))
        text = ws.recv(timeout=5)
        assert isinstance(text, str) and expected in text and "['x']" in text, text
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011 and closed.value.rcvd.reason
        reply = zmq_call(server.ports["zmq"], msgpack.packb({"endpoint": "get_action", "data": {"x": bomb}}))
        assert expected in reply["error"] and "['data']['x']" in reply["error"], reply
        for transport in ("ws", "zmq"):
            assert server.metrics.counter_value(ERRORS, transport=transport, kind="bad_request") == 1
        ok, _ = raw_connect(server)  # the server survived
        assert roundtrip(ok, {"prompt": "x"})["actions"].shape == (2, 2)


def test_http_json_body_with_too_many_elements_is_refused_before_parsing() -> None:
    body = json.dumps({f"k{i}": i for i in range(30_000)}).encode()  # json.loads would hold the GIL
    with serving(ConstantPolicy(2, 2), max_elements=10_000) as server:
        status, reply = post_json(server.ports["http"], body)
        assert status == 400
        assert "more than max_elements=10000 elements" in reply["error"]


# -- departed clients ------------------------------------------------------------------------------
def test_ws_client_leaving_mid_request_has_its_queued_request_cancelled() -> None:
    policy = GatedPolicy()
    with serving(policy) as server:
        a, _ = raw_connect(server)
        b, _ = raw_connect(server)
        a.send(packb({"who": "a"}))
        assert policy.running.wait(5)  # the policy thread is busy with a's request
        b.send(packb({"who": "b"}))  # queued behind it
        time.sleep(0.2)
        b.close()
        assert wait_for(
            lambda: (
                server.metrics.counter_value("cosmos_robot_requests_total", transport="ws", outcome="cancelled") == 1
            )
        )
        policy.gate.set()
        assert unpackb(a.recv(timeout=5))["actions"].shape == (2, 2)
        assert roundtrip(a, {"who": "a2"})["actions"].shape == (2, 2)  # served after b's slot would have run
        assert policy.seen == ["a", "a2"]  # b's request never reached the policy


def test_zmq_client_leaving_mid_request_has_its_queued_request_cancelled() -> None:
    policy = GatedPolicy()
    with serving(policy) as server:
        port = server.ports["zmq"]
        with zmq_req(port) as a:
            a.send(msgpack.packb({"endpoint": "get_action", "data": {"who": "a"}}))
            assert policy.running.wait(5)
            with zmq_req(port) as b:  # a GR00T client that gives up closes its REQ socket like this
                b.send(msgpack.packb({"endpoint": "get_action", "data": {"who": "b"}}))
                time.sleep(0.2)
            assert wait_for(
                lambda: (
                    server.metrics.counter_value("cosmos_robot_requests_total", transport="zmq", outcome="cancelled")
                    == 1
                )
            )
            policy.gate.set()
            assert "actions" in unpackb(a.recv())
            a.send(msgpack.packb({"endpoint": "get_action", "data": {"who": "a2"}}))
            assert "actions" in unpackb(a.recv())
        assert policy.seen == ["a", "a2"]  # b's request never reached the policy


# -- connection caps -------------------------------------------------------------------------------
def test_ws_connection_cap_refuses_with_503_before_the_upgrade() -> None:
    with serving(ConstantPolicy(2, 2), max_connections=2) as server:
        first, _ = raw_connect(server)
        second, _ = raw_connect(server)
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://127.0.0.1:{server.ports['ws']}", open_timeout=5)
        assert refused.value.response.status_code == 503
        assert b"server busy" in refused.value.response.body and b"max_connections=2" in refused.value.response.body
        assert roundtrip(first, {"prompt": "x"})["actions"].shape == (2, 2)
        second.close()
        assert wait_for(lambda: server.metrics.render().count('connections{transport="ws"} 1') == 1)
        third, _ = raw_connect(server)  # a slot freed: admitted again
        assert roundtrip(third, {"prompt": "x"})["actions"].shape == (2, 2)
        assert server.metrics.counter_value(ERRORS, transport="ws", kind="too_many_connections") == 1


def test_zmq_peers_over_the_connection_cap_get_server_busy() -> None:
    policy = GatedPolicy()
    with serving(policy, max_connections=1) as server:
        port = server.ports["zmq"]
        with zmq_req(port) as slow:
            slow.send(msgpack.packb({"endpoint": "get_action", "data": {"who": "slow"}}))
            assert policy.running.wait(5)
            t0 = time.perf_counter()
            reply = zmq_call(port, msgpack.packb({"endpoint": "ping"}))  # a second peer
            assert time.perf_counter() - t0 < 1.0
            assert reply["error"].startswith("server busy") and "max_connections=1" in reply["error"]
            policy.gate.set()
            assert "action" not in unpackb(slow.recv())  # N1.5 shape: the bare action dict
        deadline = time.monotonic() + 5  # the departed peer's disconnect event frees its slot
        while (reply := zmq_call(port, msgpack.packb({"endpoint": "ping"}))).get("status") != "ok":
            assert time.monotonic() < deadline, reply
            time.sleep(0.05)
        assert server.metrics.counter_value(ERRORS, transport="zmq", kind="busy") >= 1


def test_http_connection_cap_answers_503_json_and_frees_slots() -> None:
    with serving(ConstantPolicy(2, 2), max_connections=2) as server:
        port = server.ports["http"]
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            assert resp.status == 503 and resp.getheader("Content-Type") == "application/json"
            error = json.loads(resp.read())["error"]
            assert error.startswith("server busy") and "max_connections=2" in error
            conn.close()
        finally:
            idle[0].close()
        assert wait_for(lambda: _http_status(port, "/healthz") == 200)
        idle[1].close()
        assert server.metrics.counter_value(ERRORS, transport="http", kind="too_many_connections") >= 1


def _http_status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


_FD_SERVER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantPolicy
cfg = ServerConfig(port=0, zmq_port=0, http_port=0, transports=("ws", "zmq", "http"), max_connections=16)
server = PolicyServer(ConstantPolicy(2, 2), cfg).start_in_thread()
print(json.dumps(server.ports), flush=True)
sys.stdin.read()
server.stop()
"""


def test_idle_http_flood_under_a_small_fd_limit_does_not_lock_out_other_clients() -> None:
    """The issue's repro, scaled down: 128 descriptors, 100 idle HTTP connections."""
    proc = subprocess.Popen([sys.executable, "-c", _FD_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    flood: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        ports = json.loads(proc.stdout.readline())
        for _ in range(100):
            flood.append(socket.create_connection(("127.0.0.1", ports["http"]), timeout=5))
        ws = connect(f"ws://127.0.0.1:{ports['ws']}", open_timeout=5, max_size=None)
        ws.recv(timeout=5)  # metadata
        assert roundtrip(ws, {"prompt": "x"})["actions"].shape == (2, 2)
        ws.close()
        assert zmq_call(ports["zmq"], msgpack.packb({"endpoint": "ping"}))["status"] == "ok"
        assert _http_status(ports["http"], "/healthz") == 503  # refused at once, not left hanging
        for sock in flood[:50]:
            sock.close()
        assert wait_for(lambda: _http_status(ports["http"], "/healthz") == 200)
    finally:
        for sock in flood:
            sock.close()
        proc.communicate(b"", timeout=10)


# -- slow clients ----------------------------------------------------------------------------------
def test_http_header_trickle_is_closed_by_the_head_deadline() -> None:
    with serving(ConstantPolicy(2, 2), header_timeout_s=0.5) as server:
        sock = socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5)
        t0 = time.perf_counter()
        closed_after = None
        for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            try:
                sock.send(bytes([byte]))
                sock.settimeout(0.1)  # one byte every 0.1 s: each recv of the server sees progress
                if sock.recv(1) == b"":
                    closed_after = time.perf_counter() - t0
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.perf_counter() - t0
                break
        sock.close()
        assert closed_after is not None and 0.4 < closed_after < 2.5, closed_after
        assert server.metrics.counter_value(ERRORS, transport="http", kind="head_timeout") == 1
        assert _http_status(server.ports["http"], "/healthz") == 200


def test_http_slow_body_gets_408_within_the_body_deadline() -> None:
    with serving(ConstantPolicy(2, 2), body_timeout_s=0.5) as server:
        with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5) as sock:
            sock.sendall(
                b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )
            t0 = time.perf_counter()
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            body = json.loads(resp.read())
        assert resp.status == 408 and "body_timeout_s=0.5" in body["error"]
        assert time.perf_counter() - t0 < 2.5


def test_http_oversize_body_413_reaches_a_client_that_sends_it_all() -> None:
    with serving(ConstantPolicy(2, 2), max_message_bytes=64 * 1024) as server:
        body = b"[" + b"0," * (8 * 1024 * 1024) + b"0]"  # 16 MiB: http.client sends it all before reading
        status, reply = post_json(server.ports["http"], body, timeout=10)
        assert status == 413
        assert "max_message_bytes=65536" in reply["error"]


# -- rate-limited logging --------------------------------------------------------------------------
def test_rate_limiter_passes_a_burst_then_reports_what_it_suppressed() -> None:
    now = [0.0]
    limiter = RateLimiter(burst=3, interval_s=10.0, clock=lambda: now[0])
    assert [limiter.allow("emfile")[0] for _ in range(10)] == [True] * 3 + [False] * 7
    assert limiter.allow("other") == (True, 0)  # kinds have separate budgets
    now[0] = 10.0
    assert limiter.allow("emfile") == (True, 7)
    assert limiter.allow("emfile") == (True, 0)


def test_library_accept_error_flood_is_summarised(caplog: pytest.LogCaptureFixture) -> None:
    install_library_filters()
    install_library_filters()  # idempotent: one filter per logger
    logger = logging.getLogger("asyncio")
    assert sum(isinstance(f, RateLimitFilter) for f in logger.filters) == 1
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for _ in range(1000):
            logger.error("socket.accept() out of system resource", exc_info=OSError(24, "Too many open files"))
    assert 1 <= len([r for r in caplog.records if r.name == "asyncio"]) <= 10


def test_rate_limited_log_writes_the_summary_line(caplog: pytest.LogCaptureFixture) -> None:
    rlog = RateLimitedLog(logging.getLogger("cosmos_robot_server.test_ratelog"), burst=2, interval_s=0.2)
    with caplog.at_level(logging.WARNING, logger="cosmos_robot_server.test_ratelog"):
        logged = [rlog.warning("bad_request", "client %d sent garbage", i) for i in range(50)]
        time.sleep(0.25)
        rlog.warning("bad_request", "client %d sent garbage", 50)
    assert logged.count(True) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert "suppressed 48 similar messages (bad_request) in the last 0.2 s" in messages
    assert messages[-1] == "client 50 sent garbage"


# -- the departure's cancel, step by step ------------------------------------------------------------
# The handler awaits each answer itself and a done-callback on the connection's `closed` future cancels
# the handler task when the client leaves. These drive `_answer_unless_closed` with `_answer` replaced
# by a coroutine the test controls (the real core and metrics otherwise), in each order the loop allows.
def _transport_with_answer(answer: Any) -> Any:
    from cosmos_robot_server.config import ServerConfig
    from cosmos_robot_server.core import ServingCore
    from cosmos_robot_server.websocket_server import WebsocketTransport

    config = ServerConfig(port=0, transports=("ws",))
    transport = WebsocketTransport(ServingCore(ConstantPolicy(2, 2), config, None), config)
    transport._answer = answer  # the test's answer instead of decode + policy
    return transport


def _cancelled_count(transport: Any) -> float:
    return transport.core.metrics.counter_value("cosmos_robot_requests_total", transport="ws", outcome="cancelled")


def test_a_departure_mid_answer_returns_none_and_leaves_the_handler_uncancelled() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed, release = loop.create_future(), loop.create_future()

        async def answer(message: bytes, client_id: str) -> dict[str, Any]:
            await release  # the request is queued or running
            return {"actions": 1}

        transport = _transport_with_answer(answer)
        loop.call_later(0.01, closed.set_result, None)
        assert await transport._answer_unless_closed(b"x", "ws-1", closed) is None
        assert _cancelled_count(transport) == 1
        assert release.cancelled()  # what the answer awaited was cancelled: the batcher skips it
        me = asyncio.current_task()
        assert me is not None and getattr(me, "cancelling", lambda: 0)() == 0
        await asyncio.sleep(0)  # no cancel pending for the handler's next await

    asyncio.run(main())


def test_an_answer_done_in_the_same_tick_as_the_departure_is_returned_and_nothing_leaks() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()

        async def answer(message: bytes, client_id: str) -> dict[str, Any]:
            closed.set_result(None)  # the close callback is scheduled while the answer finishes
            return {"actions": 2}

        transport = _transport_with_answer(answer)
        assert await transport._answer_unless_closed(b"x", "ws-1", closed) == {"actions": 2}
        await asyncio.sleep(0.01)  # the late callback runs now and must not cancel the handler
        assert _cancelled_count(transport) == 0

    asyncio.run(main())


def test_a_client_gone_before_its_answer_starts_is_not_answered() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()
        closed.set_result(None)
        calls: list[bytes] = []

        async def answer(message: bytes, client_id: str) -> dict[str, Any]:
            calls.append(message)
            return {}

        transport = _transport_with_answer(answer)
        assert await transport._answer_unless_closed(b"x", "ws-1", closed) is None
        assert calls == [] and _cancelled_count(transport) == 1

    asyncio.run(main())


@pytest.mark.parametrize("client_leaves_too", [False, True])
def test_a_server_stop_mid_answer_still_cancels_the_handler(client_leaves_too: bool) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed, release, entered = loop.create_future(), loop.create_future(), asyncio.Event()

        async def answer(message: bytes, client_id: str) -> dict[str, Any]:
            entered.set()
            await release
            return {}

        transport = _transport_with_answer(answer)
        handler = loop.create_task(transport._answer_unless_closed(b"x", "ws-1", closed))
        await entered.wait()
        if client_leaves_too:  # the departure's callback cancels first, then the stop lands on top
            closed.set_result(None)
            await asyncio.sleep(0)
            if hasattr(handler, "cancelling"):  # Python 3.11+
                assert handler.cancelling() == 1
        handler.cancel()  # what stop() does to every handler
        if client_leaves_too and sys.version_info < (3, 11):
            # no Task.cancelling before 3.11: the two cancels look like one departure, and the handler
            # ends all the same (it returns on None)
            assert await handler is None
            return
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert _cancelled_count(transport) == 0  # a stop, not a departure
        assert release.cancelled()

    asyncio.run(main())
