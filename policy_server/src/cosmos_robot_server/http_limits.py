"""What one HTTP connection may cost: a connection cap, total read deadlines, polite refusals.

Why: the HTTP transport spends a thread and a file descriptor per connection. Idle connections
(one byte every 5 s defeats a per-recv idle timeout) once held enough descriptors that new
websocket, HTTP and ZMQ clients were refused. So:

- ``DeadlineReader`` is the connection's raw reader. A request head must arrive in full within
  ``header_timeout_s`` of its first byte and a body within ``body_timeout_s``: total deadlines
  that a trickle cannot extend; between keep-alive requests the idle timeout applies.
- ``ConnectionGate`` admits at most ``max_connections`` connections. One more gets
  ``503 {"error": "server busy: ..."}`` from the accept thread itself (no thread is spent on it),
  then a lingering close: the socket stops writing and what the client still sends is discarded
  for a moment, because closing a socket with unread input sends RST, which can destroy the reply
  before the client reads it.
"""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["ConnectionGate", "DeadlineReader", "refusal_bytes"]

REFUSAL_LINGER_S = 0.5  # how long a refused connection is kept to discard the client's request
MAX_LINGERING = 256  # refused sockets kept lingering at once; beyond this the oldest is closed


class DeadlineReader(io.RawIOBase):
    """A socket reader whose waits end at a total deadline (or after ``idle_s`` between requests)."""

    def __init__(self, sock: socket.socket, idle_s: float, on_timeout: Callable[[str], None]) -> None:
        super().__init__()
        self.sock = sock
        self.idle_s = idle_s
        self._on_timeout = on_timeout
        self._deadline: float | None = None
        self._phase = "idle"
        self._head_s: float | None = None  # armed: the head deadline starts with the next byte

    def expect_request(self, header_timeout_s: float) -> None:
        """Between requests: wait up to ``idle_s`` for a first byte, then the head has ``header_timeout_s``."""
        self._deadline, self._phase, self._head_s = None, "idle", header_timeout_s

    def expect_body(self, body_timeout_s: float) -> None:
        self._deadline, self._phase, self._head_s = time.monotonic() + body_timeout_s, "body", None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._deadline is None:
            timeout = self.idle_s
        else:
            timeout = self._deadline - time.monotonic()
            if timeout <= 0:
                self._on_timeout(self._phase)
                raise TimeoutError(f"request {self._phase} not received within its deadline")
        self.sock.settimeout(timeout)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            if self._deadline is not None:
                self._on_timeout(self._phase)
            raise
        if n and self._head_s is not None:
            self._deadline, self._phase, self._head_s = time.monotonic() + self._head_s, "head", None
        return n


def refusal_bytes(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 response with a JSON ``{"error": message}`` body and ``Connection: close``."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class ConnectionGate:
    """Counts open connections; refuses those over ``limit`` from the accept thread.

    ``admit()`` / ``release()`` bracket a served connection (from any thread). ``refuse(sock)``
    answers 503 without blocking and parks the socket; ``service()`` (called by the accept loop
    every poll interval) discards what parked sockets received and closes them after the linger.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self._lock = threading.Lock()
        self._lingering: list[tuple[float, socket.socket]] = []

    def admit(self) -> bool:
        with self._lock:
            if self.open >= self.limit:
                return False
            self.open += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.open -= 1

    def refuse(self, sock: socket.socket) -> None:
        message = f"server busy: {self.open} connections open (max_connections={self.limit}); retry later"
        try:
            sock.setblocking(False)
            _discard(sock)
            sock.send(refusal_bytes(503, "Service Unavailable", message))  # a few hundred bytes: never blocks
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        self._lingering.append((time.monotonic() + REFUSAL_LINGER_S, sock))
        while len(self._lingering) > MAX_LINGERING:
            self._lingering.pop(0)[1].close()

    def service(self) -> None:
        now = time.monotonic()
        keep = []
        for deadline, sock in self._lingering:
            if _discard(sock) or now >= deadline:
                sock.close()
            else:
                keep.append((deadline, sock))
        self._lingering = keep

    def close_all(self) -> None:
        for _, sock in self._lingering:
            sock.close()
        self._lingering = []


def _discard(sock: socket.socket) -> bool:
    """Read and drop what a non-blocking socket holds; True once the peer closed (or it failed)."""
    try:
        for _ in range(64):  # at most 4 MiB per call
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    return False
