"""Server settings, validated on construction so a bad value fails before any socket is bound.

Defaults are the safe ones: bind 127.0.0.1 (serving to other machines is an explicit choice),
a 16 MiB message cap (a LIBERO request is ~0.3 MB; a GR00T batch of 5 is ~2 MB; our clients split
bigger batches to fit the cap the server announces; receiving a frame costs the event loop ~1.5 ms
per MiB inside the websockets library, so the cap bounds what one hostile frame can stall),
``kill`` off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cosmos_robot_client.codec import DecodeLimits

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
    wait_call_fraction: float = 0.25  # batch window: this share of a typical call if above max_wait (<=100 ms; 0: off)
    paced_peers: bool = True  # also wait (within the window) for clients due at their own cadence (robots)
    replicas: int = 1  # policy copies serving at once (shared weights, own thread and CUDA stream); needs replica()
    api_key: str | None = None  # required on websocket/HTTP (Authorization: Api-Key) and ZMQ (api_token) when set
    max_message_bytes: int = 16 * 1024 * 1024  # larger requests are refused before decoding
    enable_kill: bool = False  # allow GR00T's `kill` endpoint to stop the server
    # GR00T client generation for get_modality_config replies (N1.5 reads a JSON string, N1.6+ a map):
    # auto = learn it from each ZMQ peer's other requests, else from the last peer seen, else n1.6
    groot_generation: str = "auto"
    # cosmos-framework dialect errors: "http" = a 4xx/5xx status; "in_body" = 200 with {"action": [], "error"}
    cosmos_errors: str = "http"
    ping_interval_s: float | None = 20.0  # websocket keepalive ping period; None disables
    ping_timeout_s: float | None = 60.0  # drop a peer whose pong is this late; None disables
    request_timeout_s: float | None = None  # fail a request whose inference takes longer; None = no limit
    metadata: dict[str, Any] = field(default_factory=dict)  # extra facts announced to clients
    # batch sizes run once on the policy's example observation before the server reports ready
    # (compilation and CUDA graph captures happen then, not in a client's first requests)
    warmup_batches: tuple[int, ...] = ()
    # -- admission, fairness and sessions (issue 15, core/batcher side): one client cannot stall
    # or exhaust the others; "in flight" = admitted and not yet answered (queued or running)
    max_inflight_per_client: int = 256  # requests one connection may have in flight; more get "server busy" (429)
    max_inflight_bytes_per_client: int = 256 * 1024 * 1024  # their observation bytes; more get "server busy" (429)
    max_queued_requests: int = 4096  # requests in flight across all clients; more get "server busy" (503)
    max_queued_bytes: int = 1024 * 1024 * 1024  # their observation bytes; more get "server busy" (503)
    max_client_batch: int = 256  # observations in one client-side batch request ({"batch": [...]})
    max_sessions: int = 4096  # per-client states of a session-aware policy kept; least recently used go first
    # CPython's GIL hand-off period while serving, in ms (CPython's default is 5): a thread decoding a
    # big request then delays the event loop at most this long per hand-off; None leaves it alone
    gil_switch_interval_ms: float | None = 0.5
    # once warm, move the heap into the collector's permanent generation (gc.freeze): a full collection
    # then walks only what serving allocated, not the ~500k objects of a loaded model (gc_watch.py)
    gc_freeze: bool = True

    # -- wire limits (issue 15, transport side): what one connection may cost before its request is
    # decoded; a request over a decode bound is refused with a CodecLimitError naming it
    max_connections: int = 256  # open connections per transport (ZMQ: connected peers); more get "server busy"
    max_map_keys: int = 1024  # keys in one msgpack map of a request (a LIBERO request has ~5, a GR00T batch ~20)
    max_list_items: int = 1024  # items in one msgpack list (>= max_client_batch: a batch is one list)
    max_elements: int = 100_000  # msgpack objects in one request (an array is one); HTTP JSON: its commas
    max_nesting_depth: int = 32  # nesting of maps/lists in one request
    header_timeout_s: float = 10.0  # whole HTTP request head / websocket handshake must arrive within this
    body_timeout_s: float = 60.0  # whole HTTP request body must arrive within this (a trickle cannot hold a thread)

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
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"ServerConfig.replicas: must be an int >= 1, got {self.replicas!r}")
        if not 0.0 <= self.wait_call_fraction <= 1.0:
            raise ValueError(f"ServerConfig.wait_call_fraction: must be in [0, 1], got {self.wait_call_fraction!r}")
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
        self._check_admission()
        for name, choices in (("groot_generation", ("auto", "n1.5", "n1.6")), ("cosmos_errors", ("http", "in_body"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"ServerConfig.{name}: {getattr(self, name)!r}; choose from {list(choices)}")
        self._check_wire_limits()
        if self.api_key is not None and not self.api_key:
            raise ValueError("ServerConfig.api_key: empty string; pass None to disable authentication")

    def cold_buckets(self) -> list[int]:
        """The power-of-two batch buckets up to ``max_batch_size``'s that ``warmup_batches`` leaves cold.

        The CUDA-graph families pad a batch to the next power of two (``cosmos_robot.policies.cuda_graphs
        .bucket_size``), and the batcher forms batches of every size from 1 up when fewer clients wait.
        A bucket the warm-up did not run compiles or captures at its first batch after ``/readyz``: with
        ``--warmup 16`` alone, 16 clients of a compiled pi0.5 on an H100 met 4 compiles there and no
        request was answered within 7 s (docs/benchmarks.md, issue 19)."""
        if not self.warmup_batches:
            return []

        def bucket(n: int) -> int:
            return 1 << (n - 1).bit_length()

        need = {bucket(n) for n in range(1, self.max_batch_size + 1)}
        return sorted(need - {bucket(n) for n in self.warmup_batches})

    def _check_admission(self) -> None:
        for name in (
            "max_inflight_per_client",
            "max_inflight_bytes_per_client",
            "max_queued_requests",
            "max_queued_bytes",
            "max_client_batch",
            "max_sessions",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServerConfig.{name}: must be an integer >= 1, got {value!r}")
        if self.max_client_batch > self.max_inflight_per_client:
            raise ValueError(
                f"ServerConfig.max_client_batch={self.max_client_batch} exceeds "
                f"max_inflight_per_client={self.max_inflight_per_client}: such a batch could never be admitted"
            )
        switch = self.gil_switch_interval_ms
        if switch is not None and not 0 < switch <= 100:
            raise ValueError(f"ServerConfig.gil_switch_interval_ms: must be in (0, 100] ms or None, got {switch}")
        if self.max_inflight_per_client > self.max_queued_requests:
            raise ValueError(
                f"ServerConfig.max_inflight_per_client={self.max_inflight_per_client} exceeds "
                f"max_queued_requests={self.max_queued_requests}"
            )

    def _check_wire_limits(self) -> None:
        for name in ("max_connections", "max_map_keys", "max_list_items", "max_elements", "max_nesting_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServerConfig.{name}: must be an integer >= 1, got {value!r}")
        if self.max_list_items < self.max_client_batch:
            raise ValueError(
                f"ServerConfig.max_list_items={self.max_list_items} is below max_client_batch="
                f"{self.max_client_batch}: a full client-side batch (one list) could never be decoded"
            )
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"ServerConfig.{name}: must be a number of seconds > 0, got {value!r}")

    @property
    def decode_limits(self) -> DecodeLimits:
        """The codec bounds every transport decodes requests with."""
        return DecodeLimits(
            max_map_keys=self.max_map_keys,
            max_list_items=self.max_list_items,
            max_elements=self.max_elements,
            max_depth=self.max_nesting_depth,
        )
