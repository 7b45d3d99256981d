"""Server settings, validated on construction so a bad value fails before any socket is bound.

Defaults are the safe ones: bind 127.0.0.1 (serving to other machines is an explicit choice),
a 64 MiB message cap (a LIBERO request is ~0.3 MB; a GR00T batch of 5 is ~2 MB), ``kill`` off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ServerConfig"]

_TRANSPORTS = ("ws", "zmq", "http")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"  # interface to bind; "0.0.0.0" serves other machines
    port: int = 8000  # openpi websocket port (also answers GET /healthz, /readyz, /metrics); 0 = any free
    zmq_port: int = 5555  # Isaac-GR00T ZMQ port; 0 = any free
    http_port: int = 8001  # HTTP health/metrics and cosmos-framework LIBERO JSON dialect; 0 = any free
    transports: tuple[str, ...] = ("ws",)  # which endpoints to open: any of ws, zmq, http
    max_batch_size: int = 16  # most observations the policy sees in one batched call
    max_wait_ms: float = 10.0  # longest a request waits for prompt peers to join its batch
    api_key: str | None = None  # required on websocket/HTTP (Authorization: Api-Key) and ZMQ (api_token) when set
    max_message_bytes: int = 64 * 1024 * 1024  # larger requests are refused before decoding
    enable_kill: bool = False  # allow GR00T's `kill` endpoint to stop the server
    ping_interval_s: float | None = 20.0  # websocket keepalive ping period; None disables
    ping_timeout_s: float | None = 60.0  # drop a peer whose pong is this late; None disables
    request_timeout_s: float | None = None  # fail a request whose inference takes longer; None = no limit
    metadata: dict[str, Any] = field(default_factory=dict)  # extra facts announced to clients
    # batch sizes run once on the policy's example observation before the server reports ready
    # (compilation and CUDA graph captures happen then, not in a client's first requests)
    warmup_batches: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.transports = tuple(self.transports)
        unknown = [t for t in self.transports if t not in _TRANSPORTS]
        if unknown or not self.transports:
            raise ValueError(f"ServerConfig.transports: {unknown or 'empty'}; choose from {list(_TRANSPORTS)}")
        for name in ("port", "zmq_port", "http_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ValueError(f"ServerConfig.{name}: {value} is not a TCP port (0-65535)")
        if self.max_batch_size < 1:
            raise ValueError(f"ServerConfig.max_batch_size: must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ValueError(f"ServerConfig.max_wait_ms: must be >= 0, got {self.max_wait_ms}")
        if self.max_message_bytes < 1024:
            raise ValueError(f"ServerConfig.max_message_bytes: must be >= 1024, got {self.max_message_bytes}")
        self.warmup_batches = tuple(self.warmup_batches)
        bad = [n for n in self.warmup_batches if not isinstance(n, int) or not 1 <= n <= self.max_batch_size]
        if bad:
            raise ValueError(
                f"ServerConfig.warmup_batches: {bad} not batch sizes between 1 and max_batch_size={self.max_batch_size}"
            )
        if self.api_key is not None and not self.api_key:
            raise ValueError("ServerConfig.api_key: empty string; pass None to disable authentication")
