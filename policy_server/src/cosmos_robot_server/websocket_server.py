"""openpi-compatible websocket transport: existing openpi, RoboArena and DreamZero clients work unchanged.

The wire protocol is openpi's, kept byte for byte because those clients cannot be changed:
on connect the server sends ONE binary msgpack frame with the metadata; then, in strict lockstep,
each binary msgpack request gets one binary msgpack reply (``actions`` + ``policy_timing`` +
``server_timing``). An error is a TEXT frame (openpi clients raise ``RuntimeError`` with it)
followed by close code 1011. Plain HTTP ``GET /healthz`` (and ``/readyz``, ``/metrics``) are answered
on the same port before the upgrade; any other path upgrades.

What differs from openpi's server, and why:

- Inference never runs on the event loop (the core runs the policy in a worker thread), so
  keepalive pings are answered during a long first call and other connections keep flowing;
  openpi's server blocks its loop and drops clients with "keepalive ping timeout" after ~40 s.
- The API key a client sends (``Authorization: Api-Key <key>``) is checked when one is
  configured (openpi sends it but never checks it); a wrong key gets HTTP 401 before the upgrade.
- Requests are checked against the policy's input spec, so a bad request is answered with a
  message naming the key / shape / dtype, and only that connection is closed.
- Envelope extensions used by other speakers of the protocol: ``endpoint: "reset"`` (RoboArena,
  answered with the text frame ``"reset successful"``, which RoboArena and DreamZero clients
  accept), ``session_id`` (names the client's session of a session-aware policy; a reset with
  it resets only that session, see ``core``), and ``{"batch": [obs, ...]}`` (ours, one
  request for N environments of a vectorised evaluator).
- ``server_timing.prev_total_ms`` measures decode + infer + send of the previous request only;
  openpi's also counts the time the server sat waiting for the client.

Hardening (issue 15): every request is decoded within the server's ``DecodeLimits`` (a crafted 40 MB
map once froze every client for 5.5 s), in the transport's decode pool unless it is small (``wire.py``); connections
over ``max_connections`` get HTTP 503 before the upgrade; the handshake must finish within
``header_timeout_s``; a client that disconnects while its request is in flight has that request
cancelled (the batcher skips it), so a departed client costs no inference; per-connection
warnings are rate-limited.
"""

from __future__ import annotations

import asyncio
import http
import itertools
import logging
import time
from collections.abc import Mapping
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from cosmos_robot_client.codec import CodecError, CodecLimitError, Packer
from cosmos_robot_server.core import PolicyError, RequestError
from cosmos_robot_server.ratelog import RateLimitedLog, install_library_filters
from cosmos_robot_server.transport import Transport
from cosmos_robot_server.wire import RequestDecoder

__all__ = ["WebsocketTransport"]

log = logging.getLogger(__name__)
rlog = RateLimitedLog(log)  # per-connection warnings: a hostile client must not flood the log

_STOP_GRACE_S = 5.0  # how long stop() lets in-flight requests finish before cancelling them
_ids = itertools.count(1)


class _ClientError(Exception):
    """A request this connection cannot be served for; ``text`` goes to the client as a TEXT frame."""

    def __init__(self, text: str, reason: str, kind: str) -> None:
        super().__init__(text)
        self.text = text
        self.reason = reason  # close reason, at most 123 bytes
        self.kind = kind  # metrics label


class WebsocketTransport(Transport):
    """The ``ws`` transport: openpi's protocol on ``config.host:config.port``."""

    name = "ws"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._server: Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._decoder: RequestDecoder | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> int:
        cfg = self.config
        install_library_filters()
        self._decoder = RequestDecoder(cfg, self.name)
        self._server = await serve(
            self._handle,
            cfg.host,
            cfg.port,
            compression=None,
            max_size=cfg.max_message_bytes,
            ping_interval=cfg.ping_interval_s,
            ping_timeout=cfg.ping_timeout_s,
            open_timeout=cfg.header_timeout_s,
            process_request=self._process_request,
        )
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()  # closes every connection with 1001 (going away)
        try:
            await asyncio.wait_for(asyncio.shield(self._server.wait_closed()), _STOP_GRACE_S)
        except asyncio.TimeoutError:
            log.warning(
                "websocket: %d request(s) still running after %.0f s; cancelling", len(self._handlers), _STOP_GRACE_S
            )
            for task in list(self._handlers):
                task.cancel()
            await self._server.wait_closed()
        self._server = None
        if self._decoder is not None:
            self._decoder.close()

    # -- HTTP before the upgrade -----------------------------------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        routed = self.core.http_get(request.path)
        if routed is not None:  # health / readiness / metrics stay open to probes without a key
            status, content_type, body = routed
            headers = Headers(
                [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Connection", "close")]
            )
            return Response(status, http.HTTPStatus(status).phrase, headers, body)
        open_now = len(self._handlers)  # upgraded connections (a handshake in progress is bounded by open_timeout)
        if open_now >= self.config.max_connections:
            self.core.metrics.inc("cosmos_robot_errors_total", transport=self.name, kind="too_many_connections")
            rlog.warning(
                "too_many_connections",
                "websocket: refused a connection, max_connections=%d",
                self.config.max_connections,
            )
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"server busy: {open_now} connections open (max_connections={self.config.max_connections}); "
                "retry later\n",
            )
        if self.config.api_key is not None:
            provided = _api_key_from(request.headers.get("Authorization"))
            if not self.core.check_api_key(provided):
                self.core.metrics.inc("cosmos_robot_errors_total", transport=self.name, kind="unauthorized")
                what = "missing" if provided is None else "wrong"
                return connection.respond(
                    http.HTTPStatus.UNAUTHORIZED,
                    f"{what} API key: send the header 'Authorization: Api-Key <key>' "
                    "(openpi's WebsocketClientPolicy(api_key=...) does)\n",
                )
        return None  # upgrade to websocket, whatever the path

    # -- one connection --------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        client_id = f"ws-{next(_ids)}"
        peer = ws.remote_address
        metrics = self.core.metrics
        metrics.gauge_add("cosmos_robot_connections", 1, transport=self.name)
        log.info("websocket %s: connected from %s", client_id, peer)
        packer = Packer()
        closed = asyncio.ensure_future(ws.wait_closed())  # resolves when the client goes, even mid-request
        try:
            await ws.send(packer.pack(self.core.metadata))
            prev_total_ms: float | None = None
            while True:
                message = await ws.recv()
                t0 = time.perf_counter()
                try:
                    reply = await self._answer_unless_closed(message, client_id, closed)
                except _ClientError as err:
                    await self._fail(ws, client_id, err)
                    return
                if reply is None:  # the client left; its request was cancelled
                    return
                if isinstance(reply, str):  # reset acknowledgement: a TEXT frame, as RoboArena expects
                    await ws.send(reply)
                    continue
                timing = reply.setdefault("server_timing", {})
                if prev_total_ms is not None:
                    timing["prev_total_ms"] = prev_total_ms
                try:
                    payload = packer.pack(reply)
                except CodecError as exc:
                    await self._fail(
                        ws,
                        client_id,
                        _ClientError(
                            f"policy output cannot be encoded: {exc}", "policy output not encodable", "policy_error"
                        ),
                    )
                    return
                await ws.send(payload)
                prev_total_ms = (time.perf_counter() - t0) * 1000
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else exc.sent.code if exc.sent is not None else None
            if code == CloseCode.MESSAGE_TOO_BIG:
                metrics.inc("cosmos_robot_errors_total", transport=self.name, kind="too_large")
                rlog.warning(
                    "too_large",
                    "websocket %s: message over max_message_bytes=%d; closed with 1009",
                    client_id,
                    self.config.max_message_bytes,
                )
            else:
                log.info("websocket %s: closed (%s)", client_id, code)
        finally:
            closed.cancel()
            self.core.connection_closed(client_id)
            metrics.gauge_add("cosmos_robot_connections", -1, transport=self.name)
            if task is not None:
                self._handlers.discard(task)

    async def _answer_unless_closed(
        self, message: str | bytes, client_id: str, closed: asyncio.Future[None]
    ) -> dict[str, Any] | str | None:
        """``_answer``, cancelled when ``closed`` resolves first (then ``None``): a client that left
        must not keep its request queued or running (H2's batcher skips cancelled requests). The
        close cancels this handler task itself through a done-callback, live only while the answer
        runs: 0.5 us a request, against 10 us for answering in a task of its own and 19 us for
        ``asyncio.wait`` on both (a tenth of the transport's overhead for one client)."""
        me = asyncio.current_task()
        assert me is not None
        cancelling = getattr(me, "cancelling", lambda: 0)  # Task.cancelling / uncancel: Python 3.11+
        base = cancelling()
        state = {"active": True, "by_close": False}

        def on_close(_: asyncio.Future[None]) -> None:
            if state["active"] and not state["by_close"]:  # the callback may run after the answer is done
                state["by_close"] = True
                me.cancel()

        if not closed.done():  # gone already: nothing is queued for it
            closed.add_done_callback(on_close)
            try:
                return await self._answer(message, client_id)  # raises the _ClientError, if any
            except asyncio.CancelledError:
                if not state["by_close"] or cancelling() > base + 1:
                    raise  # the handler itself is being cancelled (server stop): not the client's departure
            finally:
                state["active"] = False
                closed.remove_done_callback(on_close)
                if state["by_close"] and cancelling() == base + 1:  # the departure's cancel alone: settled
                    me.uncancel()  # here, whether it raised or something below us swallowed it
        self.core.metrics.inc("cosmos_robot_requests_total", transport=self.name, outcome="cancelled")
        rlog.info("cancelled", "websocket %s: client left with a request in flight; request cancelled", client_id)
        return None

    async def _answer(self, message: str | bytes, client_id: str) -> dict[str, Any] | str:
        """Decode and serve one request; raises ``_ClientError`` with the text for the client."""
        if isinstance(message, str):
            raise _ClientError(
                "malformed request: got a TEXT frame; send the observation as a binary msgpack frame",
                "text frame not accepted",
                "bad_request",
            )
        assert self._decoder is not None
        try:
            request = await self._decoder.decode(message)  # on the loop only when small: see wire.py
        except CodecLimitError as exc:
            raise _ClientError(f"request too complex: {exc}", "request too complex", "bad_request") from exc
        except CodecError as exc:
            raise _ClientError(f"malformed request: {exc}", "malformed request", "bad_request") from exc
        try:
            return await self._dispatch(request, client_id)
        except _ClientError:
            raise
        except RequestError as exc:  # counted by the core
            raise _ClientError(str(exc), "bad request; details in the previous frame", "") from exc
        except PolicyError as exc:
            raise _ClientError(str(exc), "policy error; details in the previous frame", "") from exc
        except Exception as exc:  # a bug on our side: still answer this client only
            log.exception("websocket %s: unexpected error", client_id)  # the traceback stays in the server log
            message = f"internal server error: {type(exc).__name__}: {' '.join(str(exc).split())}"
            raise _ClientError(message, "internal server error", "internal") from exc

    async def _dispatch(self, request: Any, client_id: str) -> dict[str, Any] | str:
        if not isinstance(request, Mapping):
            raise _bad_request(f"request must be a map of observation fields, got {type(request).__name__}")
        endpoint = request.get("endpoint", "infer")
        if endpoint == "reset":
            await self.core.reset(client_id=client_id, session=request.get("session_id"))
            return "reset successful"
        if endpoint != "infer":
            raise _bad_request(f"unknown endpoint {endpoint!r}; expected 'infer' or 'reset'")
        if "batch" in request:
            extra = sorted(str(k) for k in request if k not in ("batch", "endpoint", "session_id"))
            if extra:
                raise _bad_request(f"a batch request holds only 'batch' (a list of observations), got also {extra}")
            t0 = time.perf_counter()
            replies = await self.core.infer_many(request["batch"], transport=self.name, client_id=client_id)
            return {"batch": replies, "server_timing": {"infer_ms": (time.perf_counter() - t0) * 1000}}
        return await self.core.infer(request, transport=self.name, client_id=client_id)

    async def _fail(self, ws: ServerConnection, client_id: str, err: _ClientError) -> None:
        if err.kind:  # errors raised before the core are counted here
            self.core.metrics.inc("cosmos_robot_requests_total", transport=self.name, outcome=err.kind)
            self.core.metrics.inc("cosmos_robot_errors_total", transport=self.name, kind=err.kind)
        first_line = err.text.splitlines()[0] if err.text else err.reason
        rlog.warning(err.kind or "error", "websocket %s: %s", client_id, first_line)
        try:
            await ws.send(err.text)
            await ws.close(CloseCode.INTERNAL_ERROR, err.reason[:123])
        except ConnectionClosed:
            pass


def _bad_request(text: str) -> _ClientError:
    return _ClientError(text, "bad request; details in the previous frame", "bad_request")


def _api_key_from(header: str | None) -> str | None:
    """The key from ``Authorization: Api-Key <key>`` (openpi) or ``Bearer <key>``."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() in ("api-key", "bearer") and value.strip():
        return value.strip()
    return None
