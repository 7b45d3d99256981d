"""Rate-limited logging: a flood of identical warnings must not become the outage.

Why: under file-descriptor exhaustion asyncio logged 275,913 lines in 35 s (one per failed
accept), and a hostile client can make a transport warn once per request. Writing those lines
costs the CPU and disk the well-behaved clients need, and buries the one line that explains it.

``RateLimiter`` lets the first ``burst`` messages of each *kind* through per ``interval_s``; the
rest are counted, and the next message of that kind after the interval carries the summary
"suppressed K similar messages". ``RateLimitedLog`` applies it to our own warnings (the kind is
named by the caller, e.g. ``"bad_request"``); ``RateLimitFilter`` applies it to library loggers we
do not call ourselves (asyncio's accept errors, websockets' handshake failures), keyed by the
message template, and ``install_library_filters`` attaches it once per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RateLimitFilter", "RateLimitedLog", "RateLimiter", "install_library_filters"]

LIBRARY_LOGGERS = ("asyncio", "websockets", "websockets.server", "websockets.asyncio.server")


class RateLimiter:
    """Per-kind budget of ``burst`` events per ``interval_s``; thread-safe (HTTP threads share it)."""

    def __init__(self, burst: int = 10, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if burst < 1 or interval_s <= 0:
            raise ValueError(f"RateLimiter: burst must be >= 1 and interval_s > 0, got {burst}, {interval_s}")
        self.burst = burst
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[Any, list[float]] = {}  # kind -> [window start, passed, suppressed]

    def allow(self, kind: Any) -> tuple[bool, int]:
        """(whether to log this one, how many of this kind were suppressed since the last one logged)."""
        now = self._clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is None or now - window[0] >= self.interval_s:
                suppressed = int(window[2]) if window is not None else 0
                if len(self._windows) > 1024:  # kinds from library message templates: keep the table small
                    self._windows.clear()
                self._windows[kind] = [now, 1, 0]
                return True, suppressed
            if window[1] < self.burst:
                window[1] += 1
                return True, 0
            window[2] += 1
            return False, 0


class RateLimitedLog:
    """``log.warning(kind, msg, *args)``: a logger whose messages of one kind are rate-limited."""

    def __init__(self, logger: logging.Logger, burst: int = 10, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.limiter = RateLimiter(burst, interval_s)

    def log(self, level: int, kind: str, msg: str, *args: Any) -> bool:
        """Log unless over budget; returns whether it was logged."""
        allowed, suppressed = self.limiter.allow(kind)
        if not allowed:
            return False
        if suppressed:
            self.logger.log(
                level,
                "suppressed %d similar messages (%s) in the last %g s",
                suppressed,
                kind,
                self.limiter.interval_s,
            )
        self.logger.log(level, msg, *args)
        return True

    def warning(self, kind: str, msg: str, *args: Any) -> bool:
        return self.log(logging.WARNING, kind, msg, *args)

    def info(self, kind: str, msg: str, *args: Any) -> bool:
        return self.log(logging.INFO, kind, msg, *args)


class RateLimitFilter(logging.Filter):
    """A logging filter with the same budget, keyed by (logger name, message template)."""

    def __init__(self, burst: int = 10, interval_s: float = 10.0) -> None:
        super().__init__()
        self.limiter = RateLimiter(burst, interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        allowed, suppressed = self.limiter.allow((record.name, str(record.msg)))
        if allowed and suppressed:
            window = f"{self.limiter.interval_s:g} s"
            record.msg = f"{record.msg} [suppressed {suppressed} similar messages in the last {window}]"
        return allowed


_install_lock = threading.Lock()


def install_library_filters(burst: int = 10, interval_s: float = 10.0) -> None:
    """Attach one ``RateLimitFilter`` to asyncio's and websockets' loggers (idempotent)."""
    with _install_lock:
        for name in LIBRARY_LOGGERS:
            logger = logging.getLogger(name)
            if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
                logger.addFilter(RateLimitFilter(burst, interval_s))
