"""Isaac-GR00T compatible ZMQ endpoint, so GR00T's ``PolicyClient`` and eval scripts work unchanged.

Wire protocol (GR00T N1.5-N1.7): one msgpack frame per request, ``{"endpoint": str, "data": ...,
"api_token": str?}``, answered by one msgpack frame. Arrays travel as GR00T's str-keyed
``{"__ndarray_class__": True, "as_npy": <.npy bytes>}`` (replies are written in that dialect; requests
may use any dialect ``unpackb`` knows). Endpoints:

- ``ping`` -> ``{"status": "ok", "message": "Server is running"}``;
- ``get_action``: N1.6/N1.7 send ``data = {"observation": obs, "options": ...}`` and get the pair
  ``[action, info]``; N1.5 sends the observation itself as ``data`` and gets the bare action dict.
  The server tells them apart by the keys of ``data``. ``options`` is accepted and not used. Timings
  (``server_timing``, ``policy_timing``) go into ``info`` (dropped for N1.5), never into the action
  dict, because GR00T clients iterate over every action key;
- ``reset`` -> the policy's ``reset()``, answered with the (empty) info dict;
- ``get_modality_config`` -> ``metadata["modality_config"]``, each value wrapped as GR00T's
  ``{"__ModalityConfig_class__": True, "as_json": ...}``: a map for N1.6+, a JSON string for N1.5
  (``groot_dialect.GenerationTracker`` tells the peer's generation from its other requests);
- ``kill``: refused unless ``ServerConfig.enable_kill`` (GR00T leaves it open, so anybody who can
  reach the port can stop a robot's policy). When enabled it answers, then closes this transport
  and calls ``on_kill`` if set (``PolicyServer`` may point it at its own ``stop``).
Every failure is a ``{"error": message}`` reply, which GR00T's client raises as ``RuntimeError``.

Why ROUTER and not GR00T's REP: a REP socket serves one request at a time in lockstep, so N
environments wait in line and a slow request blocks everybody. A ROUTER socket talks to the same REQ
clients (each message arrives as ``[identity, b"", body]`` and the reply goes back with the same
envelope), but lets every request run in its own task, so concurrent clients' ``get_action`` calls
meet in the shared batcher and run as one policy call.

Limits: ``MAXMSGSIZE`` is the configured message cap; libzmq drops the connection of a peer that
exceeds it (memory stays bounded, the client sees a timeout rather than an error reply). Every
request is decoded in the transport's decode pool within the server's ``DecodeLimits`` (the
receive loop only reads frames), so a crafted payload costs one bounded decode off the loop, never
the loop itself. A ROUTER socket has no accept to refuse, so over ``max_connections`` connected
peers every request is answered ``{"error": "server busy: ..."}`` without being decoded; one
peer's flood is bounded by the core's per-client admission (``max_inflight_per_client``), which
counts each raw message before it is decoded.
A ROUTER socket reports no disconnects (``ROUTER_NOTIFY`` is a draft API that release builds of
libzmq lack), so ``zmq_peers.PeerTracker`` learns them from libzmq's socket monitor and cancels
the requests of a client that left (a GR00T client that timed out reconnects on a new socket);
a policy call already running finishes and its reply is dropped. Connections are not counted in
metrics; requests (``outcome="cancelled"`` included) and errors are.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import zmq
import zmq.asyncio

from cosmos_robot_client.codec import CodecError, CodecLimitError, packb
from cosmos_robot_server.batcher import PolicyError
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.core import RequestError, ServingCore
from cosmos_robot_server.groot_dialect import GenerationTracker, refused_encoding
from cosmos_robot_server.ratelog import RateLimitedLog, install_library_filters
from cosmos_robot_server.transport import Transport
from cosmos_robot_server.wire import RequestDecoder
from cosmos_robot_server.zmq_peers import PeerTracker

__all__ = ["ENDPOINTS", "ZmqTransport"]

log = logging.getLogger(__name__)
rlog = RateLimitedLog(log)

ENDPOINTS = ("ping", "get_action", "reset", "get_modality_config", "kill")
TIMING_KEYS = ("server_timing", "policy_timing")
_N16_KEYS = ({"observation", "options"}, {"observation"})
_KILL_FLUSH_MS = 1000  # how long the kill reply may take to leave before the socket is dropped
_COPY_BELOW = 64 * 1024  # frames up to this size are copied to bytes; larger ones stay memoryviews
Frame = bytes | memoryview  # a received frame: bytes, or a view of libzmq's buffer when large


def _call_release(release: Callable[[], None], _task: Any) -> None:
    release()


def split_envelope(frames: list[Frame]) -> tuple[list[Frame], list[Frame]]:
    """Split a ROUTER message into the routing envelope (to echo back) and the payload frames.

    REQ peers send ``[identity, b"", body]``; proxies add identities before the empty delimiter;
    a DEALER peer may omit the delimiter (then the envelope is just its identity).
    """
    for i in range(1, len(frames)):
        if frames[i] == b"":
            return frames[: i + 1], frames[i + 1 :]
    return frames[:1], frames[1:]


class ZmqTransport(Transport):
    """GR00T-style ZMQ endpoint on ``tcp://{host}:{zmq_port}`` in front of the shared core."""

    name = "zmq"

    def __init__(self, core: ServingCore, config: ServerConfig) -> None:
        super().__init__(core, config)
        self.on_kill: Callable[[], Any] | None = None  # called after an accepted ``kill``
        self.killed = False
        self.generations = GenerationTracker(config.groot_generation)  # which GR00T release each peer runs
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._peers: PeerTracker | None = None
        self._recv_task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._kill_task: asyncio.Task[None] | None = None
        self._closed = False
        self._decoder = RequestDecoder(config, self.name)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> int:
        install_library_filters()  # asyncio's accept errors, for example, come in floods
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        host = self.config.host
        if ":" in host:  # IPv6 literal
            sock.setsockopt(zmq.IPV6, 1)
            host = f"[{host.strip('[]')}]"
        try:
            sock.bind(f"tcp://{host}:{self.config.zmq_port}")
        except zmq.ZMQError as exc:
            sock.close(0)
            self._ctx.term()
            raise OSError(f"ZMQ transport cannot bind tcp://{host}:{self.config.zmq_port}: {exc}") from exc
        self._sock = sock
        port = int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        self._peers = PeerTracker(sock, self._count_cancelled)
        self._recv_task = asyncio.get_running_loop().create_task(self._serve(), name="zmq-recv")
        return port

    async def stop(self) -> None:
        await self._shutdown(linger_ms=0)
        if self._kill_task is not None and self._kill_task is not asyncio.current_task():
            await asyncio.gather(self._kill_task, return_exceptions=True)

    async def _shutdown(self, linger_ms: int) -> None:
        if self._closed:
            return
        self._closed = True
        current = asyncio.current_task()
        tasks = [t for t in (self._recv_task, *self._handlers) if t is not None and t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._peers is not None:
            await self._peers.close()  # before the socket: a live monitor would block term()
        if self._sock is not None:
            self._sock.close(linger=linger_ms)
        if self._ctx is not None:
            # term() waits for queued replies up to the linger time: keep the loop free meanwhile.
            await asyncio.get_running_loop().run_in_executor(None, self._ctx.term)
        self._decoder.close()

    # -- receive loop ----------------------------------------------------------------------
    async def _serve(self) -> None:
        assert self._sock is not None and self._peers is not None
        while True:
            try:
                parts = await self._sock.recv_multipart(copy=False)
            except zmq.ZMQError as exc:
                if self._closed:
                    return
                rlog.warning("recv", "zmq receive failed: %s", exc)
                continue
            conn = self._peers.tag(parts[-1])
            if conn is None:  # read after its client disconnected: nobody to answer
                self._count_cancelled(1)
                continue
            # big frames stay zero-copy views of libzmq's buffers: a copy of an 8 MiB request on the
            # loop cost ~3 ms, and one refused by admission below is never copied at all
            frames: list[Frame] = [part.bytes if len(part) <= _COPY_BELOW else part.buffer for part in parts]
            if self._peers.live > self.config.max_connections:
                await self._refuse_busy(frames)
                continue
            release = await self._reserve_bytes(frames)
            if release is None:
                continue
            task = asyncio.get_running_loop().create_task(self._handle(frames))
            self._peers.track(conn, task)  # cancelled if its client disconnects (see zmq_peers)
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
            task.add_done_callback(functools.partial(_call_release, release))

    async def _reserve_bytes(self, frames: list[Frame]) -> Callable[[], None] | None:
        """Count the raw message against the peer's and the server's byte caps until it is answered
        (``core.reserve``); over them, answer "server busy" without decoding and return ``None``."""
        assert self._sock is not None
        envelope, _ = split_envelope(frames)
        client_id = envelope[0].hex() if envelope and envelope[0] else "zmq-anon"
        try:
            return self.core.reserve(client_id, sum(len(f) for f in frames), transport="zmq")
        except RequestError as exc:
            try:
                await self._sock.send_multipart([*envelope, packb({"error": str(exc)}, dialect="gr00t")])
            except zmq.ZMQError as send_exc:
                log.debug("zmq busy reply dropped: %s", send_exc)
            return None

    async def _refuse_busy(self, frames: list[Frame]) -> None:
        """Over ``max_connections`` connected peers: answer at once, without decoding the request."""
        assert self._sock is not None and self._peers is not None
        envelope, _ = split_envelope(frames)
        self._count("busy")
        limit, n = self.config.max_connections, self._peers.live
        rlog.warning("busy", "zmq: refused a request, %d peers connected (max_connections=%d)", n, limit)
        reply = {"error": f"server busy: {n} peers connected (max_connections={limit}); retry later"}
        try:
            await self._sock.send_multipart([*envelope, packb(reply, dialect="gr00t")])
        except zmq.ZMQError as exc:
            log.debug("zmq busy reply dropped: %s", exc)

    async def _handle(self, frames: list[Frame]) -> None:
        envelope, payload = split_envelope(frames)
        client_id = envelope[0].hex() if envelope and envelope[0] else "zmq-anon"
        endpoint = "?"
        try:
            if len(payload) != 1:
                raise RequestError(
                    f"expected exactly one message frame after the routing envelope, got {len(payload)}; "
                    "send one msgpack map per request like a zmq.REQ socket does"
                )
            endpoint, reply = await self._dispatch(payload[0], client_id)
        except (RequestError, PolicyError, CodecError) as exc:
            reply = {"error": str(exc)}
        except Exception as exc:
            log.exception("zmq endpoint %r failed", endpoint)
            one_line = " ".join(str(exc).split())  # the traceback stays in the server log
            reply = {"error": f"internal server error in {endpoint!r}: {type(exc).__name__}: {one_line}"}
        try:
            body = packb(reply, dialect="gr00t")
        except CodecError as exc:
            self._count("policy_error")
            body = packb({"error": f"cannot encode the {endpoint!r} reply: {exc}"}, dialect="gr00t")
        if self._sock is None or self._closed:
            return
        try:
            await self._sock.send_multipart([*envelope, body])
        except zmq.ZMQError as exc:  # peer vanished or socket closing: nothing to answer
            log.debug("zmq reply to %s dropped: %s", client_id, exc)
            return
        if endpoint == "kill" and self.killed and self._kill_task is None:
            self._kill_task = asyncio.get_running_loop().create_task(self._after_kill(), name="zmq-kill")

    # -- request handling ------------------------------------------------------------------
    async def _dispatch(self, body: Frame, client_id: str) -> tuple[str, Any]:
        try:
            request = await self._decoder.decode(body)  # never on the loop: see wire.py
        except CodecLimitError as exc:
            self._count("bad_request")
            raise RequestError(f"request too complex: {exc}") from exc
        except CodecError as exc:
            self._count("bad_request")
            raise RequestError(refused_encoding(body) or f"cannot decode request: {exc}") from exc
        if not isinstance(request, Mapping):
            self._count("bad_request")
            raise RequestError(
                f"request must be a msgpack map {{'endpoint': str, 'data': ..., 'api_token': str}}, "
                f"got {type(request).__name__}"
            )
        token = request.get("api_token")
        if not self.core.check_api_key(token if isinstance(token, str) else None):
            self._count("unauthorized")
            raise RequestError("Unauthorized: Invalid API token", status=401)
        endpoint = request.get("endpoint", "get_action")
        if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
            self._count("bad_request")
            raise RequestError(f"unknown endpoint {endpoint!r}; expected one of {list(ENDPOINTS)}")
        data = request.get("data")
        self.generations.observe(client_id, endpoint, data)
        if endpoint == "ping":
            return endpoint, {"status": "ok", "message": "Server is running"}
        if endpoint == "get_action":
            return endpoint, await self._get_action(data, client_id)
        if endpoint == "reset":
            await self.core.reset(client_id=client_id)
            return endpoint, {}
        if endpoint == "get_modality_config":
            config = self.core.metadata.get("modality_config", {})
            return endpoint, self.generations.modality_config_reply(config, client_id)
        return endpoint, self._kill()

    async def _get_action(self, data: Any, client_id: str) -> Any:
        if not isinstance(data, Mapping):
            self._count("bad_request")
            raise RequestError(
                "get_action needs 'data': a map {'observation': {...}, 'options': ...} (GR00T N1.6+) "
                f"or the observation map itself (N1.5), got {type(data).__name__}"
            )
        n16 = set(data) in _N16_KEYS and isinstance(data["observation"], Mapping)
        obs = data["observation"] if n16 else data
        result = await self.core.infer(obs, transport="zmq", client_id=client_id)
        action = {k: v for k, v in result.items() if k not in TIMING_KEYS}
        if not n16:
            return action
        info = {k: result[k] for k in TIMING_KEYS if k in result}
        return [action, info]

    def _kill(self) -> dict[str, Any]:
        if not self.config.enable_kill:
            self._count("bad_request")
            raise RequestError(
                "the 'kill' endpoint is disabled on this server; start it with ServerConfig(enable_kill=True) "
                "to let clients stop it"
            )
        self.killed = True
        return {"status": "ok", "message": "Server is shutting down"}

    async def _after_kill(self) -> None:
        log.warning("zmq 'kill' received: closing the ZMQ transport")
        await self._shutdown(linger_ms=_KILL_FLUSH_MS)
        if self.on_kill is not None:
            self.on_kill()

    def _count_cancelled(self, n: int) -> None:
        self.core.metrics.inc("cosmos_robot_requests_total", n, transport="zmq", outcome="cancelled")
        rlog.info("cancelled", "zmq: %d request(s) of a client that disconnected cancelled", n)

    def _count(self, kind: str) -> None:
        metrics = self.core.metrics
        metrics.inc("cosmos_robot_requests_total", transport="zmq", outcome=kind)
        metrics.inc("cosmos_robot_errors_total", transport="zmq", kind=kind)
