"""Admission control: how many requests, and how many bytes, each client and the server hold.

Why: without caps a flood grows memory without bound (150 x 8 MiB requests took a server from
88 MB to 2.5 GB), and one client's backlog delays everybody. ``Admission`` counts what is *in
flight* (admitted and not yet answered) per client and in total, and refuses the excess at once
with ``ServerBusy``: 429 when one client is over its share, 503 when the whole server is full.

Why apart from the batcher: this is pure bookkeeping (no event loop, no policy), shared by two
paths: ``DynamicBatcher`` holds decoded requests until their futures settle, and transports whose
peers need not wait for replies (ZMQ) ``reserve`` each raw message before decoding it, so a flood
is refused per client before any decoding work is spent on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Admission", "Limits", "ServerBusy"]


class ServerBusy(RuntimeError):
    """Admission refused: one client (``status`` 429) or the whole server (503) has too much in flight."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """Admission caps; ``None`` is unlimited. "In flight" = admitted and not yet answered."""

    max_inflight_per_client: int | None = None
    max_inflight_bytes_per_client: int | None = None
    max_queued_requests: int | None = None
    max_queued_bytes: int | None = None


class Admission:
    """Requests and bytes in flight, per client and in total, checked against ``Limits``."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._inflight: dict[str, list[int]] = {}  # client -> [requests, bytes] admitted, not yet answered
        self._total = [0, 0]  # the same over all clients
        self._reserved: dict[str, int] = {}  # client -> raw messages its transport reserved (``reserve``)

    def inflight(self, client_id: str | None = None) -> tuple[int, int]:
        """(requests, bytes) admitted and not yet answered, of one client or of all."""
        if client_id is None:
            return self._total[0], self._total[1]
        count, size = self._inflight.get(client_id, (0, 0))
        return count, size

    def reserved(self, client_id: str) -> bool:
        """Whether the client's transport holds reservations (its decoded requests are admitted)."""
        return bool(self._reserved.get(client_id))

    def admit(self, client_id: str, n: int, nbytes: int) -> None:
        """Refuse (``ServerBusy``) ``n`` more requests of ``nbytes`` if they would exceed a cap."""
        count, size = self.inflight(client_id)
        total, total_bytes = self._total
        client = f"client {client_id} has "
        sent = f" and sent {n} more" if n > 1 else ""
        wait, later = "; wait for replies before sending more", "; retry later"
        # (cap, in flight after admitting, what is in flight, status, advice), per client (429) or in total (503)
        checks = (
            ("max_inflight_per_client", count + n, f"{client}{count} requests in flight{sent}", 429, wait),
            ("max_queued_requests", total + n, f"{total} requests in flight", 503, later),
            (
                "max_inflight_bytes_per_client",
                size + nbytes,
                f"{client}{size} bytes of requests in flight and sent {nbytes} more",
                429,
                "",
            ),
            ("max_queued_bytes", total_bytes + nbytes, f"{total_bytes} bytes of requests in flight", 503, later),
        )
        for name, wanted, held, status, advice in checks:
            cap = getattr(self.limits, name)
            if cap is not None and wanted > cap:
                raise ServerBusy(f"server busy: {held} ({name}={cap}){advice}", status=status)

    def hold(self, client_id: str, count: int, nbytes: int) -> None:
        """Count ``count`` requests of ``nbytes`` in flight (admitted already, or not refused)."""
        held = self._inflight.setdefault(client_id, [0, 0])
        held[0] += count
        held[1] += nbytes
        self._total[0] += count
        self._total[1] += nbytes

    def unhold(self, client_id: str, count: int, nbytes: int) -> None:
        """Undo one ``hold``: the requests were answered, failed or cancelled."""
        held = self._inflight.get(client_id)
        if held is not None:
            held[0] -= count
            held[1] -= nbytes
            if held[0] <= 0 and held[1] <= 0:
                del self._inflight[client_id]
        self._total[0] -= count
        self._total[1] -= nbytes

    def reserve(self, client_id: str, nbytes: int) -> Callable[[], None]:
        """Admit and hold one raw message of ``nbytes``; returns its release (idempotent)."""
        self.admit(client_id, 1, nbytes)
        self.hold(client_id, 1, nbytes)
        self._reserved[client_id] = self._reserved.get(client_id, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.unhold(client_id, 1, nbytes)
                left = self._reserved.pop(client_id, 0) - 1
                if left > 0:
                    self._reserved[client_id] = left

        return release
