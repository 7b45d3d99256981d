"""Running the AlpaSim driver service: ``AlpasimDriverServer`` (start/stop, for tests and embedding) and
``serve_alpasim`` (foreground until SIGINT/SIGTERM, for the command line).

A synchronous gRPC server on a thread pool: policies (a websocket client, a model) block in ``infer``;
state changes are serialised per session and ``infer`` per policy object, so one pool thread per
concurrent call is the simple, sufficient model. A policy stuck in ``infer`` holds its pool thread until
it returns: give remote policies a request timeout (the launcher does).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from concurrent import futures

from cosmos_robot_server.alpasim.config import AlpasimDriverConfig
from cosmos_robot_server.alpasim.servicer import INSTALL_HINT, AlpasimDriverServicer, PolicyOrFactory

try:
    import grpc

    from cosmos_robot_server.alpasim.proto import egodriver_pb2_grpc
except ImportError as _exc:  # pragma: no cover - the servicer import above fails first
    raise ImportError(f"{INSTALL_HINT} ({_exc})") from _exc

__all__ = ["DEFAULT_PORT", "AlpasimDriverServer", "serve_alpasim"]

log = logging.getLogger(__name__)
DEFAULT_PORT = 6789  # AlpaSim's manual driver listens here; the wizard assigns its own


class AlpasimDriverServer:
    """``with AlpasimDriverServer(policy, port=0) as srv: ...`` runs the service on ``srv.port``."""

    def __init__(
        self,
        policy: PolicyOrFactory,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        config: AlpasimDriverConfig | None = None,
        max_workers: int = 16,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port: {port} is not a TCP port (0-65535)")
        if max_workers < 1:
            raise ValueError(f"max_workers: must be >= 1, got {max_workers}")
        self.servicer = AlpasimDriverServicer(policy, config)
        self.host = host
        self.port = port
        limit = self.servicer.config.max_message_bytes
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="alpasim-driver"),
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)],
        )
        egodriver_pb2_grpc.add_EgodriverServiceServicer_to_server(self.servicer, self._server)
        self._started = False

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    def start(self) -> int:
        """Bind and serve in background threads; returns the bound port (useful with ``port=0``)."""
        try:
            bound = self._server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise OSError(f"cannot bind the AlpaSim driver to {self.address}: {exc}") from None
        if not bound:
            raise OSError(f"cannot bind the AlpaSim driver to {self.address}")
        self.port = bound
        self._server.start()
        self._started = True
        log.info("alpasim driver listening on %s (policy %s)", self.address, self.servicer.policy_name)
        return bound

    def stop(self, grace_s: float | None = 2.0) -> None:
        if self._started:
            self._server.stop(grace_s).wait()
            self._started = False
        self.servicer.close_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the server stops (True) or ``timeout_s`` passes (False)."""
        return bool(self._server.wait_for_termination(timeout_s))

    def __enter__(self) -> AlpasimDriverServer:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_alpasim(
    policy: PolicyOrFactory,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    config: AlpasimDriverConfig | None = None,
    max_workers: int = 16,
    block: bool = True,
    on_ready: Callable[[AlpasimDriverServer], None] | None = None,
) -> AlpasimDriverServer:
    """Serve ``policy`` (or a per-session factory) to AlpaSim on ``host:port``.

    With ``block=True`` (the command-line case) this returns only after SIGINT/SIGTERM, having stopped
    the server; with ``block=False`` it returns the running server for the caller to ``stop()``.
    """
    server = AlpasimDriverServer(policy, host, port, config=config, max_workers=max_workers)
    server.start()
    if on_ready is not None:
        on_ready(server)
    if not block:
        return server
    if threading.current_thread() is not threading.main_thread():
        server.wait()  # no signal handlers off the main thread: runs until someone calls server.stop()
        return server
    stopping = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stopping.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()
    return server
