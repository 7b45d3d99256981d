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
  ``{"__ModalityConfig_class__": True, "as_json": {...}}`` (N1.6+ layout);
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
exceeds it (memory stays bounded, the client sees a timeout rather than an error reply). ZMQ gives
no disconnect events, so connections are not counted in metrics; requests and errors are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import zmq
import zmq.asyncio

from cosmos_robot_client.codec import CodecError, packb, unpackb
from cosmos_robot_server.batcher import PolicyError
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.core import RequestError, ServingCore
from cosmos_robot_server.transport import Transport

__all__ = ["ENDPOINTS", "ZmqTransport"]

log = logging.getLogger(__name__)

ENDPOINTS = ("ping", "get_action", "reset", "get_modality_config", "kill")
TIMING_KEYS = ("server_timing", "policy_timing")
_N16_KEYS = ({"observation", "options"}, {"observation"})
_KILL_FLUSH_MS = 1000  # how long the kill reply may take to leave before the socket is dropped


def split_envelope(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """Split a ROUTER message into the routing envelope (to echo back) and the payload frames.

    REQ peers send ``[identity, b"", body]``; proxies add identities before the empty delimiter;
    a DEALER peer may omit the delimiter (then the envelope is just its identity).
    """
    for i in range(1, len(frames)):
        if frames[i] == b"":
            return frames[: i + 1], frames[i + 1 :]
    return frames[:1], frames[1:]


def _wrap_modality_config(config: Any) -> dict[str, Any]:
    if not isinstance(config, Mapping):
        raise RequestError(f"server metadata 'modality_config' must be a map, got {type(config).__name__}")
    return {
        str(k): {"__ModalityConfig_class__": True, "as_json": v} if isinstance(v, Mapping) else v
        for k, v in config.items()
    }


class ZmqTransport(Transport):
    """GR00T-style ZMQ endpoint on ``tcp://{host}:{zmq_port}`` in front of the shared core."""

    name = "zmq"

    def __init__(self, core: ServingCore, config: ServerConfig) -> None:
        super().__init__(core, config)
        self.on_kill: Callable[[], Any] | None = None  # called after an accepted ``kill``
        self.killed = False
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._recv_task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._kill_task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> int:
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
        if self._sock is not None:
            self._sock.close(linger=linger_ms)
        if self._ctx is not None:
            # term() waits for queued replies up to the linger time: keep the loop free meanwhile.
            await asyncio.get_running_loop().run_in_executor(None, self._ctx.term)

    # -- receive loop ----------------------------------------------------------------------
    async def _serve(self) -> None:
        assert self._sock is not None
        while True:
            try:
                frames = await self._sock.recv_multipart()
            except zmq.ZMQError as exc:
                if self._closed:
                    return
                log.warning("zmq receive failed: %s", exc)
                continue
            task = asyncio.get_running_loop().create_task(self._handle(frames))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _handle(self, frames: list[bytes]) -> None:
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
            reply = {"error": f"internal server error in {endpoint!r}: {type(exc).__name__}: {exc}"}
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
    async def _dispatch(self, body: bytes, client_id: str) -> tuple[str, Any]:
        try:
            request = unpackb(body)
        except CodecError as exc:
            self._count("bad_request")
            raise RequestError(f"cannot decode request: {exc}") from exc
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
        if endpoint == "ping":
            return endpoint, {"status": "ok", "message": "Server is running"}
        if endpoint == "get_action":
            return endpoint, await self._get_action(data, client_id)
        if endpoint == "reset":
            await self.core.reset()
            return endpoint, {}
        if endpoint == "get_modality_config":
            return endpoint, _wrap_modality_config(self.core.metadata.get("modality_config", {}))
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

    def _count(self, kind: str) -> None:
        metrics = self.core.metrics
        metrics.inc("cosmos_robot_requests_total", transport="zmq", outcome=kind)
        metrics.inc("cosmos_robot_errors_total", transport="zmq", kind=kind)
