"""Which TCP connection a ZMQ request came from, so a departed client's requests can be cancelled.

Why: a GR00T client that times out closes its REQ socket and opens a new one, but a ROUTER
socket tells the application nothing, so the old request still ran (a full 60 s policy call
once served a client that had left). ``ROUTER_NOTIFY`` would report disconnects, but it is a draft
API that release builds of libzmq lack.

How: libzmq's socket monitor reports ``ACCEPTED`` and ``DISCONNECTED`` with the connection's file
descriptor, and every received message carries the descriptor it was read from (``SRCFD``). A
descriptor is reused after a close, so each connection is named ``(fd, generation)``, the
generation counting the ``ACCEPTED`` events seen for that fd. Pending monitor events are drained
before a request is tagged: libzmq emits ``ACCEPTED`` before the connection's first message can
arrive, so a tag never names the previous owner of a reused fd. Between a ``DISCONNECTED`` and the
next ``ACCEPTED`` of an fd, a message read from it can only be a leftover of the departed client:
``tag`` returns ``None`` for it and the transport drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

__all__ = ["PeerTracker"]

log = logging.getLogger(__name__)

Connection = tuple[int, int]  # (file descriptor, generation)
UNKNOWN: Connection = (-1, 0)  # SRCFD unavailable: requests are served but cannot be cancelled


class PeerTracker:
    """``tag(frame)`` names a request's connection; ``track(conn, task)`` cancels ``task`` if it goes."""

    def __init__(self, sock: zmq.asyncio.Socket, on_cancelled: Callable[[int], None]) -> None:
        self._sock = sock
        self._monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(self._monitor.underlying)  # non-blocking drains
        self._on_cancelled = on_cancelled
        self._generation: dict[int, int] = {}
        self._dead: set[int] = set()
        self._live: set[int] = set()  # fds of connections accepted and not yet disconnected
        self._tasks: dict[Connection, set[asyncio.Task[None]]] = {}
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="zmq-peers")

    def tag(self, frame: zmq.Frame) -> Connection | None:
        """The connection ``frame`` was read from; ``None`` when that connection is already gone."""
        self._drain()
        try:
            fd = int(frame.get(zmq.SRCFD))
        except (zmq.ZMQError, AttributeError, TypeError, ValueError):
            return UNKNOWN
        if fd < 0:
            return UNKNOWN
        if fd in self._dead:
            return None
        return fd, self._generation.get(fd, 0)

    @property
    def live(self) -> int:
        """Connections accepted and not yet disconnected (as of the last drained monitor event)."""
        return len(self._live)

    def track(self, conn: Connection, task: asyncio.Task[None]) -> None:
        if conn == UNKNOWN:
            return
        tasks = self._tasks.setdefault(conn, set())
        tasks.add(task)
        task.add_done_callback(lambda t: self._untrack(conn, t))

    def _untrack(self, conn: Connection, task: asyncio.Task[None]) -> None:
        tasks = self._tasks.get(conn)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._tasks[conn]

    async def _watch(self) -> None:
        while True:
            await self._monitor.poll()  # POLLIN: an event is waiting
            self._drain()

    def _drain(self) -> None:
        while True:
            try:
                event = parse_monitor_message(self._sync.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            except zmq.ZMQError:  # closing
                return
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._generation[fd] = self._generation.get(fd, 0) + 1
                self._dead.discard(fd)
                self._live.add(fd)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._dead.add(fd)
                self._live.discard(fd)
                self._cancel((fd, self._generation.get(fd, 0)))

    def _cancel(self, conn: Connection) -> None:
        pending = [t for t in self._tasks.pop(conn, set()) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self._on_cancelled(len(pending))

    async def close(self) -> None:
        """Stop watching; call before the socket and context close (a live monitor blocks ``term``)."""
        self._watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watcher
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
