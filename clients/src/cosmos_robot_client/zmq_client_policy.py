"""A GR00T-protocol ZMQ client whose timeouts actually fire and which recovers from them.

It speaks Isaac-GR00T's wire protocol (one msgpack frame ``{"endpoint", "data", "api_token"}`` per
request, arrays as ``__ndarray_class__`` / ``as_npy``), so it talks to GR00T's own ``PolicyServer``
as well as to ``cosmos-robot serve``. ``protocol="n1.6"`` (also N1.7) sends
``{"observation": obs, "options": ...}`` and expects ``[action, info]``; ``protocol="n1.5"`` sends
the observation itself and expects the bare action dict.

Why not GR00T's ``PolicyClient``: it stores ``timeout_ms`` but never sets it on the socket, so a dead
server blocks ``recv()`` forever, and a REQ socket that missed its reply is stuck in lockstep (every
later send fails). Here ``RCVTIMEO``/``SNDTIMEO`` are set, ``LINGER`` is 0, and after a timeout the
REQ socket is replaced before ``TimeoutError`` is raised, so the same client object works again.
Calls are serialised by a lock, so one client may be shared between threads (one request at a
time; use one client per thread for concurrency, the server batches them).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Literal

import zmq

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.codec import packb, unpackb

__all__ = ["ZmqClientPolicy"]

Protocol = Literal["n1.5", "n1.6", "n1.7"]


class ZmqClientPolicy(BasePolicy):
    """``BasePolicy`` over GR00T's ZMQ protocol: ``ZmqClientPolicy("robot-gpu", 5555).infer(obs)``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5555,
        timeout_ms: int = 15000,
        api_token: str | None = None,
        protocol: Protocol = "n1.6",
    ) -> None:
        if protocol not in ("n1.5", "n1.6", "n1.7"):
            raise ValueError(f"ZmqClientPolicy.protocol: {protocol!r}; expected 'n1.5', 'n1.6' or 'n1.7'")
        if timeout_ms <= 0:
            raise ValueError(f"ZmqClientPolicy.timeout_ms: must be > 0, got {timeout_ms}")
        self.host = host
        self.port = port
        self.timeout_ms = int(timeout_ms)
        self.api_token = api_token
        self.protocol = protocol
        self.address = f"tcp://[{host.strip('[]')}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        self._lock = threading.Lock()
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._connect()

    # -- socket ----------------------------------------------------------------------------
    def _connect(self) -> None:
        sock: zmq.Socket[bytes] = self._ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
        sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
        if ":" in self.host:
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(self.address)
        self._sock = sock

    def _reconnect(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
        self._connect()

    def call_endpoint(self, endpoint: str, data: Any = None, *, send_data: bool = True) -> Any:
        """Send one request and return the decoded reply; ``{"error": ...}`` raises ``RuntimeError``."""
        request: dict[str, Any] = {"endpoint": endpoint}
        if send_data:
            request["data"] = data
        if self.api_token:
            request["api_token"] = self.api_token
        payload = packb(request, dialect="gr00t")
        with self._lock:
            if self._sock is None:
                raise RuntimeError(f"ZmqClientPolicy to {self.address} is closed")
            try:
                self._sock.send(payload)
                raw = self._sock.recv()
            except zmq.Again:
                self._reconnect()  # a REQ socket that missed its reply cannot send again
                raise TimeoutError(
                    f"ZMQ '{endpoint}' to {self.address}: no reply within timeout_ms={self.timeout_ms}; "
                    "is the server running and reachable? (the socket was reset; the client can be reused)"
                ) from None
            except zmq.ZMQError:
                self._reconnect()
                raise
        if raw == b"ERROR":
            raise RuntimeError(f"ZMQ '{endpoint}' to {self.address}: server replied ERROR (wrong server type?)")
        reply = unpackb(raw)
        if isinstance(reply, Mapping) and "error" in reply:
            raise RuntimeError(f"ZMQ '{endpoint}' to {self.address}: server error: {reply['error']}")
        return reply

    # -- GR00T endpoints -------------------------------------------------------------------
    def ping(self) -> bool:
        """True when the server answers within the timeout; an auth error still raises."""
        try:
            self.call_endpoint("ping", send_data=False)
        except (TimeoutError, zmq.ZMQError):
            return False
        return True

    def get_action(
        self, observation: dict[str, Any], options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """GR00T's call: ``(action, info)``; ``info`` holds the server's timings (N1.6+; ``{}`` for N1.5)."""
        if self.protocol == "n1.5":
            if options is not None:
                raise ValueError("get_action(options=...) is not part of the GR00T N1.5 protocol; use protocol='n1.6'")
            reply = self.call_endpoint("get_action", observation)
        else:
            reply = self.call_endpoint("get_action", {"observation": observation, "options": options})
        if isinstance(reply, dict):  # an N1.5 server answers with the bare action dict
            return reply, {}
        if isinstance(reply, (list, tuple)) and len(reply) == 2 and all(isinstance(r, dict) for r in reply):
            return reply[0], reply[1]
        raise RuntimeError(
            f"ZMQ 'get_action' to {self.address}: expected [action, info] or an action dict, got {type(reply).__name__}"
        )

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """``BasePolicy.infer``: the action dict only (timings are in ``get_action``'s info)."""
        return self.get_action(obs)[0]

    def reset(self, options: dict[str, Any] | None = None) -> dict[str, Any]:  # type: ignore[override]
        """Episode boundary on the server (reaches the policy's ``reset``); returns the info dict."""
        reply = self.call_endpoint("reset", {"options": options})
        return reply if isinstance(reply, dict) else {}

    def get_modality_config(self) -> dict[str, Any]:
        """The server's modality configs as plain dicts (GR00T's ``ModalityConfig`` fields)."""
        reply = self.call_endpoint("get_modality_config", send_data=False)
        if not isinstance(reply, dict):
            raise RuntimeError(f"ZMQ 'get_modality_config': expected a map, got {type(reply).__name__}")
        return reply

    def kill(self) -> None:
        """Ask the server to stop (refused unless the server enables it)."""
        self.call_endpoint("kill", send_data=False)

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None
            if not self._ctx.closed:
                self._ctx.term()

    def __del__(self) -> None:  # best effort: a forgotten client must not keep a socket alive
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, half-built object
            pass

    def __enter__(self) -> ZmqClientPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ZmqClientPolicy({self.address!r}, protocol={self.protocol!r}, timeout_ms={self.timeout_ms})"
