"""What every transport shares: validation, batching, timing, auth, metadata and metrics.

Transports (websocket, ZMQ, HTTP) only translate their wire format to a plain observation dict
and back; the rules live here once, so a request is checked the same way whichever door it
came through, and one client's bad payload is answered with an error that names the field
without ever reaching the model (and so without disturbing anybody else's batch).

Entry points for transports (all on the server's event loop):

- ``await core.infer(obs, transport=, client_id=)``: validate (in a worker thread when the map is
  large, so a 3-million-key map never blocks the loop), admit (per-client and global in-flight
  caps: ``RequestError`` 429/503 "server busy: ..."), batch, run, check the reply is finite;
- ``await core.infer_many(batch, transport=, client_id=)``: a client-side batch of at most
  ``max_client_batch`` observations, admitted or refused as a whole;
- ``await core.validate_async(obs)``: the same check as ``validate``, off the loop when large;
- ``await core.reset(client_id=, session=)``: a client's episode boundary (see sessions below);
  ``core.reset()`` with no arguments resets the policy for everybody (operators, tests);
- ``core.connection_closed(client_id)``: cancels that client's queued requests (they never reach
  the policy) and drops its sessions;
- ``release = core.reserve(client_id, len(message), transport=)`` before decoding a message, and
  ``release()`` once it is answered: the raw message is admitted as one request of its size
  against the per-client and global caps (``RequestError`` 429/503 when over), so a peer that
  sends without waiting for replies (ZMQ) is refused before anything is decoded (150 x 8 MiB
  requests would otherwise all be held at once); its decoded request is then not refused again.

Sessions: ``reset`` on a shared policy used to reset it for every client. A policy that keeps
per-episode state declares it with ``new_session() -> state`` and takes the state as
``infer(obs, *, session)`` / ``infer_batch(obs_batch, *, sessions)`` (``StepCounterPolicy`` in
``example_policies`` is the reference). The core keeps one state per (connection, session name):
the request's ``session_id`` field (RoboArena) names it, else the connection is the session, and
entry ``i`` of a client-side batch without ``session_id`` is session ``#i`` of its connection. A
client's reset replaces only its own states (all of its connection's, or the one named by
``session``); a session lives until its connection closes, or is evicted least-recently-used past
``max_sessions`` (ZMQ gives no close events). A policy without ``new_session`` has one shared
state and keeps the old meaning: any client's reset calls its ``reset()``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, TypeVar

from cosmos_robot_client.base_policy import BasePolicy, supports_batch
from cosmos_robot_client.spec import ObservationError
from cosmos_robot_server.admission import Limits, ServerBusy
from cosmos_robot_server.batcher import DynamicBatcher, NonFiniteOutput, PolicyError, SessionSlot, Timing
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.gc_watch import HEAP_FREEZE, GCWatch
from cosmos_robot_server.metrics import Metrics
from cosmos_robot_server.payloads import payload_nbytes

__all__ = ["PROTOCOL_KEYS", "NonFiniteOutput", "PolicyError", "RequestError", "ServingCore", "ShapeWatch"]

T = TypeVar("T")
_log = logging.getLogger(__name__)
PROTOCOL_KEYS = frozenset({"endpoint", "session_id"})  # RoboArena / vllm-omni request envelope fields
PROTOCOL_VERSION = 1
_LARGE_MAP_KEYS = 256  # validate maps with more keys (or batches with more entries) in a worker thread
_MAX_SESSION_ID = 256  # characters of a session_id


class RequestError(ValueError):
    """The client sent something we cannot serve (HTTP 4xx); the message names the problem."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class _SwitchInterval:
    """``sys.setswitchinterval`` shared by the servers of one process; the last to stop restores it."""

    def __init__(self) -> None:
        self.users = 0
        self.saved = 0.0

    def claim(self, seconds: float) -> None:
        if self.users == 0:
            self.saved = sys.getswitchinterval()
        self.users += 1
        sys.setswitchinterval(seconds)

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            sys.setswitchinterval(self.saved)


_SWITCH_INTERVAL = _SwitchInterval()


class ShapeWatch:
    """Compilations and CUDA-graph captures after ``/readyz``: each one is a latency spike a robot sees.

    A policy that reports ``runtime_counters()`` (the torch families do: ``compiles``,
    ``graph_captures``, ``shape_misses``; see ``cosmos_robot.policies.shape_events``) is read after
    every policy call once the server is ready (on the policy thread, a few microseconds); any
    increase is counted as ``cosmos_robot_after_ready_total{kind=...}`` and logged with the batch size
    that caused it, so a benchmark or an operator sees that warm-up missed a shape.

    With replicas the counters are summed over them, except ``compiles``, which every replica reports
    for the whole process (Dynamo counts per process) and is taken once. Calls end on several threads
    then, so reading and comparing is done under a lock."""

    def __init__(self, policies: Sequence[Any], metrics: Metrics) -> None:
        reads = [getattr(p, "runtime_counters", None) for p in policies]
        self._reads: list[Callable[[], Mapping[str, int]]] = [r for r in reads if callable(r)]
        self._metrics = metrics
        self._last: dict[str, int] | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self._reads)

    def _read(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for read in self._reads:
            for kind, value in read().items():
                total[kind] = max(total.get(kind, 0), value) if kind == "compiles" else total.get(kind, 0) + value
        return total

    def arm(self) -> None:
        if self._reads:
            with self._lock:
                self._last = self._read()
            for kind in self._last:
                self._metrics.inc("cosmos_robot_after_ready_total", 0, kind=kind)  # present at 0

    def after_call(self, batch_size: int) -> None:
        if not self._reads or self._last is None:
            return
        with self._lock:
            now, last = self._read(), self._last
            self._last = now
        for kind, value in now.items():
            grew = value - last.get(kind, 0)
            if grew > 0:
                self._metrics.inc("cosmos_robot_after_ready_total", grew, kind=kind)
                _log.warning(
                    "%d %s after ready, in a call of batch size %d: warm-up did not cover this shape",
                    grew,
                    kind,
                    batch_size,
                )
        self._last = now


class _Checked(NamedTuple):
    clean: dict[str, Any]
    nbytes: int
    session: Hashable  # the session name within the connection (None: the connection itself)


class _Sessions:
    """Per-(connection, session name) slots of a session-aware policy, least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._slots: OrderedDict[tuple[str, Hashable], SessionSlot] = OrderedDict()
        self._by_client: dict[str, set[Hashable]] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def slot(self, client_id: str, name: Hashable) -> SessionSlot:
        key = (client_id, name)
        slot = self._slots.get(key)
        if slot is not None:
            self._slots.move_to_end(key)
            return slot
        slot = self._slots[key] = SessionSlot()
        self._by_client.setdefault(client_id, set()).add(name)
        while len(self._slots) > self.capacity:
            (old_client, old_name), _ = self._slots.popitem(last=False)
            self._forget_name(old_client, old_name)
        return slot

    def reset(self, client_id: str, name: Hashable | None = None, *, every: bool = False) -> None:
        """Fresh state for one session of the client, or (``every``) all of its sessions."""
        names = list(self._by_client.get(client_id, ())) if every else [name]
        for n in names:
            if (client_id, n) in self._slots:
                self._slots[(client_id, n)] = SessionSlot()

    def drop(self, client_id: str) -> None:
        for name in self._by_client.pop(client_id, ()):
            self._slots.pop((client_id, name), None)

    def clear(self) -> None:
        self._slots.clear()
        self._by_client.clear()

    def _forget_name(self, client_id: str, name: Hashable) -> None:
        names = self._by_client.get(client_id)
        if names is not None:
            names.discard(name)
            if not names:
                del self._by_client[client_id]


def _session_name(value: Any) -> Hashable:
    """The ``session_id`` envelope field as a session name; ``None`` when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RequestError(f"session_id must be a string or an integer, got {type(value).__name__}")
    name = str(value)
    if len(name) > _MAX_SESSION_ID:
        raise RequestError(f"session_id has {len(name)} characters; at most {_MAX_SESSION_ID} are accepted")
    return name


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
            replicas=config.replicas,
            wait_call_fraction=config.wait_call_fraction,
            paced_peers=config.paced_peers,
            metrics=self.metrics,
            limits=Limits(
                max_inflight_per_client=config.max_inflight_per_client,
                max_inflight_bytes_per_client=config.max_inflight_bytes_per_client,
                max_queued_requests=config.max_queued_requests,
                max_queued_bytes=config.max_queued_bytes,
            ),
        )
        self.sessions = _Sessions(config.max_sessions) if self.batcher.session_aware else None
        self.shape_watch = ShapeWatch(self.batcher.policies, self.metrics)
        if self.shape_watch.enabled:
            self.batcher.on_call = self.shape_watch.after_call
        self.ready = False
        self.started_at = time.time()
        self._holds_switch_interval = False
        self.gc_watch = GCWatch()
        self.metrics.gc_watch = self.gc_watch
        self._froze_heap = False

    async def start(self) -> None:
        # Decoding and validation run in worker threads that hold the GIL in pure-Python stretches;
        # with CPython's 5 ms hand-off a good client's request waits up to 5 ms at each of its
        # several GIL acquisitions while a hostile one's 3,200-observation batch decodes (its p50
        # was 18.7 ms at 5 ms, 6.6 ms at 0.5 ms: docs/benchmarks.md).
        if self.config.gil_switch_interval_ms is not None and not self._holds_switch_interval:
            _SWITCH_INTERVAL.claim(self.config.gil_switch_interval_ms / 1000)
            self._holds_switch_interval = True
        self.gc_watch.install()
        self.batcher.start()

    def mark_ready(self) -> None:
        """Warm-up is over: ``/readyz`` answers 200, and compilations or captures from now on are counted.
        With ``gc_freeze`` the warm heap goes to the collector's permanent generation first (gc_watch.py).
        The collector's pauses so far (loading, compiling, the freeze itself: seconds of full collections on
        a compiled model) are logged and the watch starts afresh, so ``/metrics`` shows serving's pauses."""
        if self.config.gc_freeze and not self._froze_heap:
            HEAP_FREEZE.claim()
            self._froze_heap = True
        pauses = [f"{gen} {g['count']:.0f} x, {g['total_ms']:.0f} ms (max {g['max_ms']:.0f})"
                  for gen, g in self.gc_watch.summary().items()]  # fmt: skip
        _log.info("gc pauses before ready: %s", ", ".join(pauses))
        self.gc_watch.reset()
        self.shape_watch.arm()
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        await self.batcher.stop()
        if self._holds_switch_interval:  # the setting is process-wide: the last server out restores it
            _SWITCH_INTERVAL.release()
            self._holds_switch_interval = False
        self.gc_watch.remove()
        if self._froze_heap:
            HEAP_FREEZE.release()
            self._froze_heap = False

    async def warm_up(self, batch_sizes: Sequence[int]) -> dict[int, float]:
        """Run the policy once per batch size on its warm-up observations, on the thread that serves
        it (every replica, on its own thread: each captures its own graphs); returns seconds per size
        (all replicas together). The observations are ``warmup_observations()`` where the policy has
        it (one per input shape it can meet, e.g. pi0.5's pinned and full prompt lengths), else
        ``[example_observation()]``. A policy that cannot make one, or fails on it, is an error
        (better than serving one that fails on the first robot)."""
        examples = self._warm_examples()
        seconds: dict[int, float] = {}
        for n in sorted(set(batch_sizes)):
            t0 = time.perf_counter()
            for example in examples:
                batch = [dict(example) for _ in range(n)]
                try:
                    await self.batcher.call_each(partial(self._warm_call, batch=batch))
                except Exception as exc:
                    raise RuntimeError(f"warm-up with a batch of {n} failed: {type(exc).__name__}: {exc}") from exc
            seconds[n] = time.perf_counter() - t0
        return seconds

    def _warm_examples(self) -> list[Mapping[str, Any]]:
        several = getattr(self.policy, "warmup_observations", None)
        if callable(several):
            examples = list(several())
        else:
            make_example = getattr(self.policy, "example_observation", None)
            example = make_example() if callable(make_example) else None
            examples = [] if example is None else [example]
        if not examples:
            raise ValueError(
                f"{type(self.policy).__name__} offers no example observation (example_observation() is None), "
                "so it cannot be warmed up; serve without warm-up"
            )
        return examples

    def _warm_call(self, policy: Any, *, batch: list[dict[str, Any]]) -> Any:
        """One warm-up call; a session-aware policy gets scratch sessions, never a client's."""
        if self.batcher.session_aware:
            if supports_batch(policy):
                return policy.infer_batch(batch, sessions=[policy.new_session() for _ in batch])
            return [policy.infer(o, session=policy.new_session()) for o in batch]
        if supports_batch(policy):
            return policy.infer_batch(batch)
        return [policy.infer(o) for o in batch]

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
                "paced_peers": self.config.paced_peers,
            },
            "max_message_bytes": self.config.max_message_bytes,
            "limits": {
                "max_inflight_per_client": self.config.max_inflight_per_client,
                "max_client_batch": self.config.max_client_batch,
            },
            "sessions": self.sessions is not None,
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
        return self._check(obs).clean

    async def validate_async(self, obs: Any) -> dict[str, Any]:
        """``validate``, in a worker thread when the map is large (the event loop keeps serving)."""
        return (await self._check_async(obs)).clean

    def _check(self, obs: Any) -> _Checked:
        if not isinstance(obs, Mapping):
            raise RequestError(f"request must be a map of observation fields, got {type(obs).__name__}")
        bad_keys = [k for k in obs if not isinstance(k, str)]
        if bad_keys:
            raise RequestError(f"observation keys must be strings, got {bad_keys[0]!r}")
        session = _session_name(obs.get("session_id"))
        clean = {k: v for k, v in obs.items() if k not in PROTOCOL_KEYS}
        spec = self.policy.input_spec
        if spec is not None:
            try:
                spec.validate(clean)
            except ObservationError as exc:
                raise RequestError(f"invalid observation: {exc}") from exc
        return _Checked(clean, payload_nbytes(clean), session)

    async def _check_async(self, obs: Any) -> _Checked:
        if isinstance(obs, Mapping) and len(obs) > _LARGE_MAP_KEYS:
            return await asyncio.to_thread(self._check, obs)
        return self._check(obs)

    def _check_batch(self, batch: Sequence[Any]) -> list[_Checked]:
        checked = []
        for i, obs in enumerate(batch):
            try:
                checked.append(self._check(obs))
            except RequestError as exc:
                raise RequestError(f"batch[{i}]: {exc}", status=exc.status) from exc
        return checked

    async def infer(self, obs: Any, *, transport: str, client_id: str) -> dict[str, Any]:
        """Validate, admit, batch and run one observation; returns the reply dict with timings."""
        t0 = time.perf_counter()
        try:
            checked = await self._check_async(obs)
            slot = self._slot(client_id, checked.session)
            result, timing = await self._with_timeout(
                self.batcher.submit(checked.clean, client_id, nbytes=checked.nbytes, session=slot)
            )
        except RequestError:
            self._count(transport, "bad_request")
            raise
        except ServerBusy as exc:
            self._count(transport, "busy")
            raise RequestError(str(exc), status=exc.status) from exc
        except PolicyError as exc:
            self._count(transport, "policy_output" if isinstance(exc, NonFiniteOutput) else "policy_error")
            raise
        reply = self._reply(result, timing, t0)
        self._count(transport, "ok")
        self.metrics.observe("cosmos_robot_request_latency_seconds", time.perf_counter() - t0, transport=transport)
        return reply

    async def infer_many(self, batch: Sequence[Any], *, transport: str, client_id: str) -> list[dict[str, Any]]:
        """A client-side batch (one request holding N observations), e.g. a vectorised evaluator."""
        limit = self.config.max_client_batch
        try:
            if not isinstance(batch, (list, tuple)) or not batch:
                raise RequestError("'batch' must be a non-empty list of observation maps")
            if len(batch) > limit:
                raise RequestError(
                    f"batch of {len(batch)} observations exceeds max_client_batch={limit}; "
                    f"send at most {limit} per request",
                    status=413,
                )
            if len(batch) > 16 or any(isinstance(o, Mapping) and len(o) > _LARGE_MAP_KEYS for o in batch):
                checked = await asyncio.to_thread(self._check_batch, batch)
            else:
                checked = self._check_batch(batch)
            names = [c.session if c.session is not None else f"#{i}" for i, c in enumerate(checked)]
            slots = [self._slot(client_id, name) for name in names]
            t0 = time.perf_counter()
            outs = await self._with_timeout(
                self.batcher.submit_many(
                    [c.clean for c in checked], client_id, nbytes=[c.nbytes for c in checked], sessions=slots
                )
            )
        except RequestError:
            self._count(transport, "bad_request")
            raise
        except ServerBusy as exc:
            self._count(transport, "busy", len(batch))
            raise RequestError(str(exc), status=exc.status) from exc
        return self._batch_replies(outs, transport, t0)

    def _batch_replies(self, outs: list[Any], transport: str, t0: float) -> list[dict[str, Any]]:
        replies = []
        for i, out in enumerate(outs):
            if isinstance(out, asyncio.CancelledError):  # the client left meanwhile
                raise out
            if isinstance(out, BaseException):
                nonfinite = isinstance(out, NonFiniteOutput)
                self._count(transport, "policy_output" if nonfinite else "policy_error")
                raise (NonFiniteOutput if nonfinite else PolicyError)(f"batch[{i}]: {out}") from out
            replies.append(self._reply(out[0], out[1], t0))
        self._count(transport, "ok", len(replies))
        self.metrics.observe("cosmos_robot_request_latency_seconds", time.perf_counter() - t0, transport=transport)
        return replies

    async def reset(self, *, client_id: str | None = None, session: Any = None) -> None:
        """Episode boundary from a client (RoboArena ``endpoint: reset``, GR00T ``reset``).

        A session-aware policy resets only the caller's state: the session named ``session``
        (a ``session_id``), or every session of ``client_id``'s connection. Without ``client_id``
        (or for a policy without sessions) the policy itself is reset, for everybody."""
        if self.sessions is not None:
            if client_id is None:
                self.sessions.clear()
                return
            name = _session_name(session)
            self.sessions.reset(client_id, name, every=name is None)
            return
        await self.batcher.call_each(lambda policy: policy.reset())

    def reserve(self, client_id: str, nbytes: int, *, transport: str) -> Callable[[], None]:
        """Admit a not yet decoded message of ``nbytes`` as one request; returns its release."""
        try:
            return self.batcher.reserve(client_id, nbytes)
        except ServerBusy as exc:
            self._count(transport, "busy")
            raise RequestError(str(exc), status=exc.status) from exc

    def connection_closed(self, client_id: str) -> None:
        """Cancel the client's queued requests (they never reach the policy) and drop its sessions."""
        self.batcher.forget(client_id)
        if self.sessions is not None:
            self.sessions.drop(client_id)

    def _slot(self, client_id: str, name: Hashable) -> SessionSlot | None:
        return None if self.sessions is None else self.sessions.slot(client_id, name)

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
