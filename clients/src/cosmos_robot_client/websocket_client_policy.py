"""A robot-side policy that calls a websocket policy server (ours or openpi's) in openpi's protocol.

Drop-in for openpi's ``WebsocketClientPolicy`` (same constructor head, ``infer``, ``reset``,
``get_server_metadata``), with what a robot computer on a real network needs and openpi's client
lacks:

- a connect deadline with exponential backoff (the server may still be loading a checkpoint),
  ending in a ``ConnectionError`` that names the URL and the last error; ``refused_timeout_s``
  gives up sooner when the first connection is refused (nothing listens there: a wrong port, or no
  server started), which a person at a command line wants to hear at once (reconnects after a
  dropped connection keep the full deadline: that server may be restarting);
- a per-request timeout: the protocol is strict lockstep without request ids, so after a timeout
  the connection is discarded (a late reply would otherwise answer the next request);
- reconnect after a dropped connection, transparently retrying an ``infer`` once (inference is
  idempotent), so a server restart costs one slow step instead of a dead client;
- ``wss://`` with an optional ``ssl.SSLContext``, and the ``Authorization: Api-Key`` header;
- ``infer_batch`` as one ``{"batch": [...]}`` request when the server is cosmos-robot-server
  (falls back to one request per observation against other servers).

It is synchronous on purpose, like openpi's: a control loop calls ``infer`` and waits. The sync
websockets connection answers keepalive pings from its own background thread while we wait.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Sequence
from ssl import SSLContext
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import websockets
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.batching import split_batch
from cosmos_robot_client.codec import Packer, unpackb

__all__ = ["WebsocketClientPolicy", "build_url"]

_DEFAULT_PORT = 8000
_SYNC_KEEPALIVE = int(websockets.__version__.split(".")[0]) >= 15  # the sync client pings since websockets 15
_RESET_ACK = "reset successful"
# websockets >= 17.1 deprecates calling connect() outside a ``with``; legacy=True keeps a plain connection.
_LEGACY = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


def build_url(host: str, port: int | None = None) -> str:
    """``"10.0.0.2", 8000`` -> ``ws://10.0.0.2:8000``; a ``ws://``/``wss://`` URL keeps its own port and path."""
    if "://" not in host:
        bare = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"ws://{bare}:{port if port is not None else _DEFAULT_PORT}"
    parts = urlsplit(host)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"host URL must start with ws:// or wss://, got {host!r}")
    if not parts.hostname:
        raise ValueError(f"host URL has no host name: {host!r}")
    if parts.port is None and port is not None:
        parts = parts._replace(netloc=f"{parts.netloc}:{port}")
    return urlunsplit(parts)


class WebsocketClientPolicy(BasePolicy):
    """``policy = WebsocketClientPolicy("127.0.0.1", 8000); policy.infer(obs)["actions"]``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        api_key: str | None = None,
        *,
        connect_timeout_s: float = 60.0,  # keep retrying the first connection this long
        request_timeout_s: float
        | None = None,  # longest wait for one reply; None = wait (keepalive still detects a dead peer)
        ping_interval_s: float | None = 20.0,  # keepalive ping period; None disables
        ping_timeout_s: float | None = 20.0,  # drop the connection when a pong is this late; None disables
        send_reset: bool = False,  # send {"endpoint": "reset"} on reset() (RoboArena); openpi's reset is local
        retry_on_disconnect: bool = True,  # resend an infer once over a fresh connection after a drop
        ssl_context: SSLContext | None = None,  # for wss:// (None = system defaults)
        connect: bool = True,  # connect now (like openpi) rather than on the first call
        refused_timeout_s: float | None = None,  # first connection: give up this soon when refused; None: deadline
    ) -> None:
        if connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s must be > 0, got {connect_timeout_s}")
        if refused_timeout_s is not None and refused_timeout_s < 0:
            raise ValueError(f"refused_timeout_s must be >= 0 or None, got {refused_timeout_s}")
        if request_timeout_s is not None and request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {request_timeout_s}")
        self.url = build_url(host, port)
        if ssl_context is not None and not self.url.startswith("wss://"):
            raise ValueError(f"ssl_context given but {self.url} is not a wss:// URL")
        self._api_key = api_key
        self.connect_timeout_s = connect_timeout_s
        self.refused_timeout_s = refused_timeout_s
        self.request_timeout_s = request_timeout_s
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self.send_reset = send_reset
        self.retry_on_disconnect = retry_on_disconnect
        self._ssl = ssl_context
        self._packer = Packer()
        self._lock = threading.Lock()  # one request in flight per connection (lockstep protocol)
        self._ws: ClientConnection | None = None
        self._metadata: dict[str, Any] = {}
        self._ever_connected = False
        if connect:
            with self._lock:
                self._connect()

    # -- openpi API ------------------------------------------------------------------------
    def get_server_metadata(self) -> dict[str, Any]:
        """The map the server sent on connect (openpi: ``policy_metadata``; ours adds ``server``)."""
        if self._ws is None:
            with self._lock:
                self._ensure_connected()
        return self._metadata

    @property
    def metadata(self) -> dict[str, Any]:
        return self.get_server_metadata()

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        reply = self._request(obs)
        if not isinstance(reply, dict):
            raise RuntimeError(f"{self.url}: expected a map reply, got {type(reply).__name__}")
        return reply

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """One request for many observations (cosmos-robot-server; split to fit the caps it announces,
        ``batching.split_batch``); one request each against other servers."""
        obs_list = list(obs_batch)
        if not obs_list:
            return []
        self.get_server_metadata()
        server = self._metadata.get("server")
        if not (isinstance(server, dict) and server.get("name") == "cosmos-robot-server"):
            return [self.infer(obs) for obs in obs_list]
        results: list[dict[str, Any]] = []
        for part in split_batch(obs_list, server):
            reply = self._request({"batch": part})
            batch = reply.get("batch") if isinstance(reply, dict) else None
            if not isinstance(batch, list) or len(batch) != len(part):
                raise RuntimeError(f"{self.url}: batch reply does not hold {len(part)} results")
            results.extend(batch)
        return results

    def reset(self) -> None:
        """Local no-op like openpi's, unless ``send_reset=True`` (RoboArena-style servers)."""
        if not self.send_reset:
            return
        with self._lock:
            ws = self._ensure_connected()
            try:
                ws.send(self._packer.pack({"endpoint": "reset"}))
                reply = ws.recv(timeout=self.request_timeout_s)
            except TimeoutError:
                self._discard()
                raise TimeoutError(f"{self.url}: no reset reply within {self.request_timeout_s} s") from None
            except ConnectionClosed as exc:
                self._discard()
                raise ConnectionError(f"{self.url}: connection closed during reset ({exc})") from exc
        if isinstance(reply, str) and reply != _RESET_ACK:
            self.close()
            raise RuntimeError(f"Error in inference server:\n{reply}")

    def close(self) -> None:
        with self._lock:
            self._discard()

    def __enter__(self) -> WebsocketClientPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------
    def _request(self, message: dict[str, Any]) -> Any:
        payload = self._packer.pack(message)
        with self._lock:
            attempts = 2 if self.retry_on_disconnect else 1
            for attempt in range(attempts):
                ws = self._ensure_connected()
                self._check_size(len(payload))
                try:
                    ws.send(payload)
                    reply = ws.recv(timeout=self.request_timeout_s)
                except TimeoutError:
                    self._discard()  # a late reply would answer the next request
                    raise TimeoutError(
                        f"{self.url}: no reply within request_timeout_s={self.request_timeout_s}; "
                        "the connection was dropped and the next call reconnects"
                    ) from None
                except ConnectionClosed as exc:
                    self._discard()
                    code = exc.rcvd.code if exc.rcvd is not None else None
                    if code == 1009:
                        raise ValueError(f"{self.url}: server refused the request as too large (close 1009)") from exc
                    if attempt + 1 < attempts:
                        continue  # the server restarted or dropped us: one fresh try
                    raise ConnectionError(f"{self.url}: connection closed while waiting for a reply ({exc})") from exc
                if isinstance(reply, str):
                    self._discard()  # the server closes after an error frame
                    raise RuntimeError(f"Error in inference server:\n{reply}")
                return unpackb(reply)
        raise AssertionError("unreachable")

    def _check_size(self, size: int) -> None:
        server = self._metadata.get("server")
        limit = server.get("max_message_bytes") if isinstance(server, dict) else None
        if isinstance(limit, int) and size > limit:
            raise ValueError(
                f"{self.url}: request is {size} bytes but the server accepts at most {limit} "
                "(max_message_bytes); resize images client-side"
            )

    def _ensure_connected(self) -> ClientConnection:
        if self._ws is None:
            self._connect()
        assert self._ws is not None
        return self._ws

    def _discard(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 - already broken; nothing to report
                pass

    def _connect(self) -> None:
        """Connect and read the metadata frame, retrying with backoff until the deadline."""
        headers = {"Authorization": f"Api-Key {self._api_key}"} if self._api_key else None
        kwargs: dict[str, Any] = dict(_LEGACY)
        if _SYNC_KEEPALIVE:
            kwargs.update(ping_interval=self.ping_interval_s, ping_timeout=self.ping_timeout_s)
        if self._ssl is not None:
            kwargs["ssl"] = self._ssl
        start = time.monotonic()
        deadline = start + self.connect_timeout_s
        delay = 0.05
        attempts = 0
        while True:
            attempts += 1
            remaining = deadline - time.monotonic()
            try:
                ws = connect(
                    self.url,
                    compression=None,
                    max_size=None,
                    additional_headers=headers,
                    open_timeout=max(0.1, min(10.0, remaining)),
                    **kwargs,
                )
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (401, 403):
                    body = bytes(exc.response.body).decode("utf-8", "replace").strip()
                    raise PermissionError(
                        f"{self.url}: server rejected the connection (HTTP {status}): {body}"
                    ) from exc
                last: BaseException = exc
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                last = exc
            else:
                try:
                    first = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
                except (ConnectionClosed, TimeoutError) as exc:
                    ws.close()
                    last = exc
                else:
                    self._ws, self._metadata = ws, self._parse_metadata(ws, first)
                    self._ever_connected = True
                    return
            now = time.monotonic()
            if (
                isinstance(last, ConnectionRefusedError)
                and self.refused_timeout_s is not None
                and not self._ever_connected
                and now - start >= self.refused_timeout_s
            ):
                raise ConnectionError(
                    f"could not connect to {self.url}: connection refused (nothing is listening there; "
                    "is the server running, and on this port?)"
                ) from last
            remaining = deadline - now
            if remaining <= 0:
                raise ConnectionError(
                    f"could not connect to {self.url} within connect_timeout_s={self.connect_timeout_s} "
                    f"({attempts} attempts); last error: {type(last).__name__}: {last}"
                ) from last
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 2.0)

    def _parse_metadata(self, ws: ClientConnection, first: str | bytes) -> dict[str, Any]:
        try:
            if isinstance(first, str):
                raise ConnectionError(f"{self.url}: server sent text instead of the metadata frame: {first[:500]}")
            metadata = unpackb(first)
            if not isinstance(metadata, dict):
                raise ConnectionError(f"{self.url}: metadata frame is {type(metadata).__name__}, expected a map")
            return metadata
        except BaseException:
            ws.close()
            raise
