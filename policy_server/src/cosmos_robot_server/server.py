"""``PolicyServer``: one asyncio loop running the chosen transports around one ``ServingCore``.

Transports are small classes with ``start() -> bound port`` and ``stop()``; the server opens the
ones named in ``ServerConfig.transports`` and marks itself ready once all are listening. It can
run in the foreground (``serve_forever``, what the CLI does) or in a background thread
(``start_in_thread``, what tests, benchmarks and embedding applications do).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import threading
from typing import Any

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.core import ServingCore
from cosmos_robot_server.metrics import Metrics
from cosmos_robot_server.transport import TRANSPORTS, Transport

__all__ = ["PolicyServer", "Transport"]

log = logging.getLogger(__name__)


def _make_transport(name: str, core: ServingCore, config: ServerConfig) -> Transport:
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r} (known: {', '.join(sorted(TRANSPORTS))})")
    module, _, attr = TRANSPORTS[name].partition(":")
    cls = getattr(importlib.import_module(module), attr)
    transport: Transport = cls(core, config)
    return transport


class PolicyServer:
    """Serve ``policy`` over the transports of ``config``."""

    def __init__(self, policy: BasePolicy, config: ServerConfig | None = None, metrics: Metrics | None = None) -> None:
        self.config = config or ServerConfig()
        self.core = ServingCore(policy, self.config, metrics)
        self.ports: dict[str, int] = {}
        self._transports: list[Transport] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None

    @property
    def metrics(self) -> Metrics:
        return self.core.metrics

    async def _open(self) -> None:
        await self.core.start()
        for name in self.config.transports:
            transport = _make_transport(name, self.core, self.config)
            if hasattr(transport, "on_kill"):  # GR00T's `kill` (when enabled) stops the whole server
                transport.on_kill = self.stop
            self.ports[name] = await transport.start()
            self._transports.append(transport)
        if self.config.warmup_batches:  # listening (/healthz answers) but not ready until warm
            seconds = await self.core.warm_up(self.config.warmup_batches)
            log.info("warm-up: %s", ", ".join(f"batch {n} in {s:.1f} s" for n, s in seconds.items()))
            cold = self.config.cold_buckets()
            if cold:
                log.warning(
                    "warm-up ran batch sizes %s but not the batch buckets %s that batches of up to %d requests pad "
                    "to (CUDA-graph policies): the first batch in each compiles or captures after /readyz, "
                    "stalling every request waiting meanwhile; --warmup auto warms them all",
                    list(self.config.warmup_batches),
                    cold,
                    self.config.max_batch_size,
                )
        self.core.mark_ready()
        log.info("serving on %s", ", ".join(f"{n}={self.config.host}:{p}" for n, p in self.ports.items()))

    async def _close(self) -> None:
        self.core.ready = False
        for transport in reversed(self._transports):
            try:
                await transport.stop()
            except Exception:
                log.exception("error while stopping %s transport", transport.name)
        self._transports.clear()
        await self.core.stop()

    async def serve(self, *, on_ready: Any = None) -> None:
        """Run until ``stop()`` (or a signal, in the foreground)."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        try:
            await self._open()
        except BaseException:
            await self._close()
            raise
        if on_ready is not None:
            on_ready()
        try:
            await self._stop_event.wait()
        finally:
            await self._close()

    def serve_forever(self, on_ready: Any = None) -> None:
        """Foreground mode: Ctrl-C or SIGTERM stops cleanly; ``on_ready()`` runs once all ports listen."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, self.stop)
                except (NotImplementedError, RuntimeError):  # not the main thread / platform
                    pass
            await self.serve(on_ready=on_ready)

        asyncio.run(main())

    def start_in_thread(self, timeout_s: float = 30.0) -> PolicyServer:
        """Background mode: returns once every transport listens (``self.ports`` filled)."""

        def target() -> None:
            try:
                asyncio.run(self.serve(on_ready=self._started.set))
            except BaseException as exc:  # noqa: BLE001 - surfaced to the caller below
                self._start_error = exc
                self._started.set()

        self._thread = threading.Thread(target=target, name="policy-server", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"policy server did not start within {timeout_s} s")
        if self._start_error is not None:
            raise RuntimeError(f"policy server failed to start: {self._start_error}") from self._start_error
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        loop, event = self._loop, self._stop_event
        if loop is not None and event is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def __enter__(self) -> PolicyServer:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop()
