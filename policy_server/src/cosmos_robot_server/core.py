"""What every transport shares: validation, batching, timing, auth, metadata and metrics.

Transports (websocket, ZMQ, HTTP) only translate their wire format to a plain observation dict
and back; the rules live here once, so a request is checked the same way whichever door it
came through, and one client's bad payload is answered with an error that names the field
without ever reaching the model (and so without disturbing anybody else's batch).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from cosmos_robot_client.base_policy import BasePolicy, supports_batch
from cosmos_robot_client.spec import ObservationError
from cosmos_robot_server.batcher import DynamicBatcher, PolicyError, Timing
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.metrics import Metrics

__all__ = ["PROTOCOL_KEYS", "PolicyError", "RequestError", "ServingCore"]

T = TypeVar("T")
PROTOCOL_KEYS = frozenset({"endpoint", "session_id"})  # RoboArena / vllm-omni request envelope fields
PROTOCOL_VERSION = 1


class RequestError(ValueError):
    """The client sent something we cannot serve (HTTP 4xx); the message names the problem."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ServingCore:
    """Shared request path: ``await core.infer(obs, transport="ws", client_id=...)``."""

    def __init__(self, policy: BasePolicy, config: ServerConfig, metrics: Metrics | None = None) -> None:
        if not callable(getattr(policy, "infer", None)):
            raise TypeError(f"policy must implement infer(obs) -> dict, got {type(policy).__name__}")
        self.policy = policy
        self.config = config
        self.metrics = metrics or Metrics()
        self.batcher = DynamicBatcher(
            policy,
            max_batch_size=config.max_batch_size,
            max_wait_ms=config.max_wait_ms,
            metrics=self.metrics,
        )
        self.ready = False
        self.started_at = time.time()

    async def start(self) -> None:
        self.batcher.start()

    async def stop(self) -> None:
        self.ready = False
        await self.batcher.stop()

    async def warm_up(self, batch_sizes: Sequence[int]) -> dict[int, float]:
        """Run the policy once per batch size on its example observation, on the thread that serves
        it; returns seconds per size. A policy that cannot make an example, or fails on it, is an
        error (better than serving one that fails on the first robot)."""
        make_example = getattr(self.policy, "example_observation", None)
        example = make_example() if callable(make_example) else None
        if example is None:
            raise ValueError(
                f"{type(self.policy).__name__} offers no example observation (example_observation() is None), "
                "so it cannot be warmed up; serve without warm-up"
            )
        seconds: dict[int, float] = {}
        for n in sorted(set(batch_sizes)):
            batch = [dict(example) for _ in range(n)]
            if supports_batch(self.policy):
                fn = lambda b=batch: self.policy.infer_batch(b)  # type: ignore[attr-defined]  # noqa: E731
            else:
                fn = lambda b=batch: [self.policy.infer(o) for o in b]  # noqa: E731
            t0 = time.perf_counter()
            try:
                await self.batcher.call(fn)
            except Exception as exc:
                raise RuntimeError(f"warm-up with a batch of {n} failed: {type(exc).__name__}: {exc}") from exc
            seconds[n] = time.perf_counter() - t0
        return seconds

    # -- facts -----------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        """Sent to every websocket client on connect and returned by ZMQ/HTTP info endpoints."""
        meta: dict[str, Any] = {}
        meta.update(self.policy.metadata or {})
        meta.update(self.config.metadata)
        spec = self.policy.input_spec
        server: dict[str, Any] = {
            "name": "cosmos-robot-server",
            "protocol_version": PROTOCOL_VERSION,
            "batching": {
                "policy_batched": supports_batch(self.policy),
                "max_batch_size": self.config.max_batch_size,
                "max_wait_ms": self.config.max_wait_ms,
            },
            "max_message_bytes": self.config.max_message_bytes,
            "auth_required": self.config.api_key is not None,
        }
        meta.setdefault("input_spec", spec.to_dict() if spec is not None else None)
        meta["server"] = server
        return meta

    def http_get(self, path: str) -> tuple[int, str, bytes] | None:
        """The GET routes every HTTP-speaking port shares; ``None`` for an unknown path."""
        route = path.split("?", 1)[0].rstrip("/") or "/"
        if route == "/healthz":
            return 200, "text/plain; charset=utf-8", b"OK\n"
        if route == "/readyz":
            if self.ready:
                return 200, "text/plain; charset=utf-8", b"ready\n"
            return 503, "text/plain; charset=utf-8", b"not ready\n"
        if route == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics.render().encode()
        return None

    def check_api_key(self, provided: str | None) -> bool:
        expected = self.config.api_key
        if expected is None:
            return True
        return provided is not None and hmac.compare_digest(provided.encode(), expected.encode())

    # -- requests --------------------------------------------------------------------------
    def validate(self, obs: Any) -> dict[str, Any]:
        """Strip protocol keys and check the observation against the policy's input spec."""
        if not isinstance(obs, Mapping):
            raise RequestError(f"request must be a map of observation fields, got {type(obs).__name__}")
        bad_keys = [k for k in obs if not isinstance(k, str)]
        if bad_keys:
            raise RequestError(f"observation keys must be strings, got {bad_keys[0]!r}")
        clean = {k: v for k, v in obs.items() if k not in PROTOCOL_KEYS}
        spec = self.policy.input_spec
        if spec is not None:
            try:
                spec.validate(clean)
            except ObservationError as exc:
                raise RequestError(f"invalid observation: {exc}") from exc
        return clean

    async def infer(self, obs: Any, *, transport: str, client_id: str) -> dict[str, Any]:
        """Validate, batch and run one observation; returns the reply dict with timings."""
        t0 = time.perf_counter()
        try:
            clean = self.validate(obs)
            result, timing = await self._submit(clean, client_id)
        except RequestError:
            self._count(transport, "bad_request")
            raise
        except PolicyError:
            self._count(transport, "policy_error")
            raise
        reply = self._reply(result, timing, t0)
        self._count(transport, "ok")
        self.metrics.observe("cosmos_robot_request_latency_seconds", time.perf_counter() - t0, transport=transport)
        return reply

    async def infer_many(self, batch: Sequence[Any], *, transport: str, client_id: str) -> list[dict[str, Any]]:
        """A client-side batch (one request holding N observations), e.g. a vectorised evaluator."""
        if not isinstance(batch, (list, tuple)) or not batch:
            raise RequestError("'batch' must be a non-empty list of observation maps")
        cleans = []
        for i, obs in enumerate(batch):
            try:
                cleans.append(self.validate(obs))
            except RequestError as exc:
                self._count(transport, "bad_request")
                raise RequestError(f"batch[{i}]: {exc}") from exc
        t0 = time.perf_counter()
        outs = await self._with_timeout(self.batcher.submit_many(cleans, client_id))
        replies = []
        for i, out in enumerate(outs):
            if isinstance(out, BaseException):
                self._count(transport, "policy_error")
                raise PolicyError(f"batch[{i}]: {out}") from out
            replies.append(self._reply(out[0], out[1], t0))
        self._count(transport, "ok", len(replies))
        self.metrics.observe("cosmos_robot_request_latency_seconds", time.perf_counter() - t0, transport=transport)
        return replies

    async def reset(self) -> None:
        """Episode boundary from a client (RoboArena ``endpoint: reset``, GR00T ``reset``)."""
        await self.batcher.call(self.policy.reset)

    def connection_closed(self, client_id: str) -> None:
        self.batcher.forget(client_id)

    async def _submit(self, obs: dict[str, Any], client_id: str) -> tuple[dict[str, Any], Timing]:
        return await self._with_timeout(self.batcher.submit(obs, client_id))

    async def _with_timeout(self, coro: Awaitable[T]) -> T:
        if self.config.request_timeout_s is None:
            return await coro
        try:
            return await asyncio.wait_for(coro, self.config.request_timeout_s)
        except asyncio.TimeoutError as exc:
            raise PolicyError(f"inference exceeded request_timeout_s={self.config.request_timeout_s}") from exc

    def _reply(self, result: dict[str, Any], timing: Timing, t0: float) -> dict[str, Any]:
        reply = dict(result)
        policy_timing = dict(reply.get("policy_timing") or {})
        policy_timing.setdefault("infer_ms", timing.infer_ms)
        reply["policy_timing"] = policy_timing
        reply["server_timing"] = {
            "infer_ms": (time.perf_counter() - t0) * 1000,
            "queue_ms": timing.queue_ms,
            "batch_size": timing.batch_size,
        }
        return reply

    def _count(self, transport: str, outcome: str, n: int = 1) -> None:
        self.metrics.inc("cosmos_robot_requests_total", n, transport=transport, outcome=outcome)
        if outcome != "ok":
            self.metrics.inc("cosmos_robot_errors_total", n, transport=transport, kind=outcome)
