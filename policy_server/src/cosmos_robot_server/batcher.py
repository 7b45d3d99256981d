"""Cross-connection dynamic batching: many clients' requests become one policy call.

Why: a GPU policy costs nearly the same for 1 or 16 observations, and evaluation / RL drive many
environments at once. openpi's server calls the model once per request inside its event loop, so
16 clients wait in line (openpi #399).

How: each client's requests wait in its own FIFO queue. A single consumer takes the first request
and waits for more until the batch is full, the batching window has passed, or every client expected
to join is already in the batch. A client is expected when it is *prompt*: its think time (from
our reply to its next request, smoothed) is within the window, as for simulators stepped in
lockstep. The window is ``max_wait_ms``, or ``wait_call_fraction`` of the typical policy call when
that is longer: a peer that misses a batch waits a whole call for the next one, so for a 90 ms GPU
call it is worth waiting ~20 ms for it, while with 16 clients the replies and the next requests of
the last ones can take more than a fixed 10 ms to cross the event loop (on an H200, 16 flat GR00T
clients had p99 1.6x p50 with 10 ms, batches of 7 and 15 among the 16s). So a lone client never
waits (its latency stays the single-request cost) and lockstep evaluators fill batches. Robots at
a fixed control rate think for tens of milliseconds, but their requests come on a *cadence*: a
client is also expected when its next request is due, by its smoothed arrival-to-arrival period,
before the batch's window closes (``paced_peers``). Without that, two 10 Hz clients whose requests
land a few ms apart ran as two calls, the second waiting the whole first one: p99 1.5-1.7x p50 on
the GPU (docs/benchmarks.md). With it the first waits those few ms (at most the window) and both
share one call. The batch is split into
groups of identical structure (keys, shapes, dtypes) so a policy can stack them, and each group runs
in ONE worker thread: the event loop stays free to answer pings and other connections, and a policy
(or replica, below) is never entered from two threads at once.

Why per-client queues served round-robin: with one shared FIFO, a client that queues 3,200
requests puts everybody else's next request behind all of them (4.5 s measured). Taking one
request per client in turn, a flood costs another client at most about one batch. Admission is
bounded the same way (``admission.py``: ``Limits``, ``ServerBusy``): requests in flight per client
and in total, and their bytes, are capped, and the excess is refused at once (429 for one client
over its share, 503 for a full server) instead of growing memory without bound. A request whose
future is cancelled (its client left, or ``forget`` dropped it) is skipped, so work of departed
clients never reaches the policy, and batch-size metrics count only the requests that ran.

The structure signature that groups requests is bounded (``payloads.py``): a request too large to
describe cheaply is simply batched alone, so grouping never walks a 3-million-key map on the event
loop.

A batch-capable policy (``infer_batch``) gets the whole group; any other policy is called per
request. A policy that declares ``cheap_inference`` (scripted, constant or lookup policies that
answer in microseconds) is called on the event loop itself, saving the two thread hops
(~0.2-0.4 ms) that would otherwise dominate its latency; a lone client's request then skips the
queue too. Should such a call ever take longer than ``_INLINE_LIMIT_S``, the policy is moved to
the worker thread for good, so a wrong declaration cannot stall the loop twice.

A *session-aware* policy (one with ``new_session()``) keeps per-client episode state: each request
carries a ``SessionSlot``; the state is made by ``new_session()`` on the policy thread at first use
and passed as ``infer(obs, session=state)`` / ``infer_batch(obs_batch, sessions=[...])``. The core
decides which slot a request uses (see ``core.py``).

*Replicas* (``replicas=N``, ``serve --replicas N``): a policy that offers ``replica()`` (a copy that
shares its weights but owns its per-call state: CUDA graphs, a CUDA stream, tokenizer) is served by
N workers, each one replica on its own thread. Why: with one worker a request that arrives while a
batch runs waits for that whole call and then its own, so at a robot's pace (arrivals not in
lockstep) p99 approaches twice p50 (measured on an H200: docs/benchmarks.md). With a second worker
it starts at once, beside the running batch. A client with a request running is not taken again
until it finishes (its replies stay in order, and a session's state is never used by two calls at
once), and peers that are running are not waited for. With replicas, ``bind_thread()``, if the
policy has it, runs first on each worker thread (the torch families make their CUDA stream current).

If a batched call raises, the group is retried one by one so only the offending request fails
and the others are still answered. Every reply is checked for NaN/inf in its numeric values before
it leaves (``NonFiniteOutput``): a robot must never be sent a NaN action.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cosmos_robot_client.base_policy import BasePolicy, supports_batch
from cosmos_robot_server.admission import Admission, Limits, ServerBusy
from cosmos_robot_server.metrics import Metrics
from cosmos_robot_server.payloads import nonfinite_problem, payload_nbytes, structure_signature

__all__ = [
    "DynamicBatcher",
    "Limits",
    "NonFiniteOutput",
    "PolicyError",
    "ServerBusy",
    "SessionSlot",
    "Timing",
    "make_replicas",
    "nonfinite_problem",
    "payload_nbytes",
    "structure_signature",
]

log = logging.getLogger(__name__)

_ACTIVE_WINDOW_S = 1.0  # a client silent for this long is no longer expected in a batch
_THINK_EMA = 0.3  # smoothing of each client's think time
_CALL_SAMPLES = 15  # recent policy calls whose median scales the batching window
_WINDOW_CAP_S = 0.1  # the call-scaled window never exceeds this (a 1 s call waits 100 ms, not 250)
_INLINE_LIMIT_S = 0.005  # a "cheap" policy slower than this goes back to the worker thread


@dataclass
class _ClientState:
    last_seen: float
    last_reply: float | None = None
    think_ema_s: float | None = None
    period_ema_s: float | None = None  # tick to tick (a paced client's control period)
    tick: float | None = None  # when its current tick's first request came (a burst is one tick)
    think_min_s: float | None = None  # the shortest think time seen (a closed loop never comes back sooner)


class PolicyError(RuntimeError):
    """The policy itself raised; the message names the exception in one line (the traceback is logged)."""


class NonFiniteOutput(PolicyError):
    """The policy answered NaN or inf; the reply is refused instead of being sent to a robot."""


class SessionSlot:
    """One client's episode state for a session-aware policy; made on the policy thread at first use.

    A reset replaces the slot (the core does that), so requests already queued finish on the old state."""

    __slots__ = ("made", "state")

    def __init__(self) -> None:
        self.state: Any = None
        self.made = False


@dataclass
class Timing:
    queue_ms: float = 0.0
    infer_ms: float = 0.0
    batch_size: int = 1


@dataclass
class _Item:
    obs: dict[str, Any]
    client_id: str
    future: asyncio.Future[tuple[dict[str, Any], Timing]]
    nbytes: int = 0
    session: SessionSlot | None = None
    _signature: Hashable = None  # computed when first needed: a lone request is never grouped
    t_enqueue: float = field(default_factory=time.perf_counter)
    held: bool = False  # counted in flight (``_hold``) and not yet released
    count: int = 1  # requests it counts as (0: its raw message's reservation counts it)
    _signed: bool = False

    @property
    def signature(self) -> Hashable:
        if not self._signed:
            self._signature, self._signed = structure_signature(self.obs), True
        return self._signature


class _Worker:
    """One policy replica and the single thread that calls it."""

    def __init__(self, policy: BasePolicy, index: int, bind_thread: bool) -> None:
        self.policy = policy
        self.index = index
        bind = getattr(policy, "bind_thread", None) if bind_thread else None
        self.executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"policy{index}", initializer=bind if callable(bind) else None
        )
        self.busy = False


def make_replicas(policy: BasePolicy, replicas: int) -> list[BasePolicy]:
    """``policy`` and ``replicas - 1`` copies from its ``replica()`` (a clear error if it has none)."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an int >= 1, got {replicas!r}")
    if replicas == 1:
        return [policy]
    make = getattr(policy, "replica", None)
    if not callable(make):
        raise ValueError(
            f"replicas={replicas}: {type(policy).__name__} offers no replica() (a copy sharing its weights "
            "that can run beside it), so it is served by one worker; use replicas=1"
        )
    return [policy, *(make() for _ in range(replicas - 1))]


class DynamicBatcher:
    """Groups concurrent requests into batched policy calls on one worker thread."""

    def __init__(
        self,
        policy: BasePolicy,
        *,
        max_batch_size: int = 16,
        max_wait_ms: float = 10.0,
        metrics: Metrics | None = None,
        limits: Limits | None = None,
        replicas: int = 1,
        wait_call_fraction: float = 0.25,
        paced_peers: bool = True,
    ) -> None:
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        if not 0.0 <= wait_call_fraction <= 1.0:
            raise ValueError(f"wait_call_fraction must be in [0, 1], got {wait_call_fraction!r}")
        self.wait_call_fraction = wait_call_fraction
        self.paced_peers = paced_peers
        self._recent_calls: deque[float] = deque(maxlen=_CALL_SAMPLES)  # durations of the last policy calls
        self.metrics = metrics or Metrics()
        self.limits = limits or Limits()
        self.admission = Admission(self.limits)
        self.batched = supports_batch(policy)
        self.session_aware = callable(getattr(policy, "new_session", None))
        self.inline = bool(getattr(policy, "cheap_inference", False))
        self._loop_thread: int | None = None
        self._free_since = 0.0  # when the last policy call ended
        copies = make_replicas(policy, replicas)
        # one worker keeps the policy as it is (the default CUDA stream); replicas each bind their own
        self.workers = [_Worker(p, i, bind_thread=len(copies) > 1) for i, p in enumerate(copies)]
        self._executor = self.workers[0].executor  # the primary policy's thread (reset, warm-up, inline)
        self._running: dict[str, int] = {}  # client -> its requests in a call now (never taken twice at once)
        self._worker_free: asyncio.Event | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._waiting: OrderedDict[str, deque[_Item]] = OrderedDict()  # per-client FIFOs, round-robin order
        self._arrived: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._clients: dict[str, _ClientState] = {}
        self.on_call: Callable[[int], None] | None = None  # after each policy call, with its batch size

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def policies(self) -> list[BasePolicy]:
        """The policy and its replicas, one per worker."""
        return [w.policy for w in self.workers]

    @property
    def _busy(self) -> bool:
        return any(w.busy for w in self.workers)

    def start(self) -> None:
        self._arrived = asyncio.Event()
        self._worker_free = asyncio.Event()
        self._loop_thread = threading.get_ident()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for task in list(self._calls):
            task.cancel()
        for worker in self.workers:
            worker.executor.shutdown(wait=False, cancel_futures=True)

    # -- requests --------------------------------------------------------------------------
    async def submit(
        self, obs: dict[str, Any], client_id: str, *, nbytes: int | None = None, session: SessionSlot | None = None
    ) -> tuple[dict[str, Any], Timing]:
        """Queue one validated observation; resolves to (result dict, timing)."""
        (out,) = await self.submit_many(
            [obs], client_id, nbytes=None if nbytes is None else [nbytes], sessions=[session]
        )
        if isinstance(out, BaseException):
            raise out
        return out

    async def submit_many(
        self,
        obs_list: Sequence[dict[str, Any]],
        client_id: str,
        *,
        nbytes: Sequence[int] | None = None,
        sessions: Sequence[SessionSlot | None] | None = None,
    ) -> list[tuple[dict[str, Any], Timing] | BaseException]:
        """Queue several observations of ONE client (a vectorised evaluator's batch request).

        They are admitted or refused together (``ServerBusy``), count as one arrival of that client
        for think-time tracking and land in its queue together, so they share policy calls; each
        entry is a result or that item's exception. ``nbytes`` defaults to ``payload_nbytes``.
        """
        if self._arrived is None:
            raise RuntimeError("DynamicBatcher.start() was not called")
        sizes = list(nbytes) if nbytes is not None else [payload_nbytes(o) for o in obs_list]
        reserved = self.admission.reserved(client_id)  # admitted by ``reserve`` already
        if not reserved:
            self.admission.admit(client_id, len(obs_list), sum(sizes))
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        state = self._arrival(client_id, now)
        slots = list(sessions) if sessions is not None else [None] * len(obs_list)
        items = [
            _Item(obs, client_id, loop.create_future(), size, slot, count=int(not reserved))
            for obs, size, slot in zip(obs_list, sizes, slots)
        ]
        for item in items:
            self._hold(item)
        if self.inline and not self._busy and not self._waiting and not self._missing_peers(now, items):
            for group in _group(items).values():  # lone client, cheap policy: no queue, no thread hop
                self._execute_inline(group)
        else:
            self._waiting.setdefault(client_id, deque()).extend(items)
            self._arrived.set()
        try:
            if len(items) == 1:  # the common case: skip gather's bookkeeping
                try:
                    return [await items[0].future]
                except Exception as exc:  # noqa: BLE001 - returned like gather(return_exceptions=True)
                    return [exc]
            return list(await asyncio.gather(*(it.future for it in items), return_exceptions=True))
        finally:
            state.last_reply = time.perf_counter()

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the primary policy's thread, serialised with its inference."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def call_each(self, fn: Callable[[BasePolicy], Any]) -> list[Any]:
        """Run ``fn(replica)`` for every replica on its own worker thread, one after another (warm-up:
        a capture must not overlap another replica's call; ``reset``)."""
        loop = asyncio.get_running_loop()
        return [await loop.run_in_executor(w.executor, fn, w.policy) for w in self.workers]

    def forget(self, client_id: str) -> int:
        """A connection closed: drop its queued requests (never run) and stop expecting it in batches.

        Returns how many queued requests were dropped; their futures are cancelled."""
        self._clients.pop(client_id, None)
        queued = self._waiting.pop(client_id, None) or ()
        dropped = 0
        for item in queued:
            if item.future.cancel():
                dropped += 1
        return dropped

    def reserve(self, client_id: str, nbytes: int) -> Callable[[], None]:
        """Admit one request of ``nbytes`` not yet decoded against every cap (``ServerBusy`` if over).

        For transports whose peers need not wait for replies (ZMQ): reserve each raw message before
        decoding it and call the returned release (idempotent) once it is answered, so a flood is
        refused per client before any decoding. While a client holds reservations, its decoded
        requests were admitted already: they are not refused again, and count only their bytes (the
        decoded copy is memory too, and bounds later reservations)."""
        return self.admission.reserve(client_id, nbytes)

    def inflight(self, client_id: str | None = None) -> tuple[int, int]:
        """(requests, bytes) admitted and not yet answered, of one client or of all."""
        return self.admission.inflight(client_id)

    # -- in flight (counted by ``admission.py``) ----------------------------------------------
    def _hold(self, item: _Item) -> None:
        """Count the item in flight until its future is done (answered, failed or cancelled)."""
        self.admission.hold(item.client_id, item.count, item.nbytes)
        item.held = True
        item.future.add_done_callback(functools.partial(self._release, item))

    def _release(self, item: _Item, _future: Any = None) -> None:
        """Called when the item is settled (at once) and again by its future's done callback (which
        also covers cancellation); only the first call counts."""
        if item.held:
            item.held = False
            self.admission.unhold(item.client_id, item.count, item.nbytes)

    def _arrival(self, client_id: str, now: float) -> _ClientState:
        state = self._clients.get(client_id)
        if state is None:
            state = self._clients[client_id] = _ClientState(last_seen=now, tick=now)
            return state
        state.last_seen = now
        period = now - (state.tick if state.tick is not None else now)
        if period >= self.window_s:  # requests closer than the window (two per tick, pipelining) are one tick
            state.tick = now
            if period < _ACTIVE_WINDOW_S:
                ema = state.period_ema_s
                state.period_ema_s = period if ema is None else (1 - _THINK_EMA) * ema + _THINK_EMA * period
        if state.last_reply is not None:
            think = now - state.last_reply
            ema = state.think_ema_s
            state.think_ema_s = think if ema is None else (1 - _THINK_EMA) * ema + _THINK_EMA * think
            state.think_min_s = think if state.think_min_s is None else min(state.think_min_s, think)
        return state

    # -- consumer --------------------------------------------------------------------------
    @property
    def window_s(self) -> float:
        """How long a batch waits for prompt peers (and how prompt a peer must be): ``max_wait_ms``, or
        ``wait_call_fraction`` of the typical policy call (the median of the last ones: a capture or a
        recompilation is not typical) when longer, at most ``_WINDOW_CAP_S``."""
        if not self._recent_calls:
            return self.max_wait_s
        return max(self.max_wait_s, min(self.wait_call_fraction * self._typical_call_s(), _WINDOW_CAP_S))

    def _typical_call_s(self) -> float:
        return float(sorted(self._recent_calls)[len(self._recent_calls) // 2]) if self._recent_calls else 0.0

    def _missing_peers(self, now: float, batch: list[_Item], deadline: float | None = None) -> int:
        """Clients expected before the batch closes and not yet in it: *prompt* ones (back within the
        window, by their think time) and, with ``paced_peers``, *paced* ones, whose next request is
        due by the deadline at their own cadence (a robot asking every 100 ms whose request lands a
        few ms after its peer's: waiting those ms puts both in one call, where leaving at once makes
        the second wait a whole call)."""
        stale = [cid for cid, st in self._clients.items() if now - st.last_seen > _ACTIVE_WINDOW_S]
        for cid in stale:
            del self._clients[cid]
        members = {it.client_id for it in batch} | self._running.keys()  # running peers cannot join
        until = now + self.window_s if deadline is None else deadline
        return sum(1 for cid, st in self._clients.items() if cid not in members and self._expected(st, now, until))

    def _expected(self, st: _ClientState, now: float, until: float) -> bool:
        window = self.window_s
        if st.think_ema_s is not None and st.think_ema_s <= window:
            return True
        if not self.paced_peers or self.inline or st.period_ema_s is None or st.tick is None or not self._recent_calls:
            return False  # a cheap policy's next call costs nothing to wait for; an untimed one, unknown
        if sum(not w.busy for w in self.workers) > 1:  # the batch's worker and another free one
            return False  # the free replica will start the peer's request at once
        due = st.tick + st.period_ema_s
        if st.last_reply is not None and st.last_reply > st.tick and st.think_min_s is not None:
            due = max(due, st.last_reply + st.think_min_s)  # a closed loop answered late comes back late
        # waiting d ms for a peer pays while d is under half a call (both in one call instead of the
        # peer waiting the whole call); a request overdue by more than the window is off its cadence
        # (a client that paused) and is not waited for
        return now - window <= due <= min(until, now + self._typical_call_s() / 2)

    def _pop(self) -> _Item | None:
        """The next live request, one client at a time in turn (round-robin over the client FIFOs),
        skipping clients with a request in a call now (only possible with replicas)."""
        while True:
            client_id = next((c for c in self._waiting if c not in self._running), None)
            if client_id is None:
                return None
            fifo = self._waiting[client_id]
            item = fifo.popleft()
            if fifo:
                self._waiting.move_to_end(client_id)
            else:
                del self._waiting[client_id]
            if not item.future.done():  # cancelled: its client left or its request timed out
                return item

    async def _wait_arrival(self, timeout: float | None) -> bool:
        assert self._arrived is not None
        self._arrived.clear()  # nothing can arrive between the caller's empty _pop() and here
        if timeout is None:
            await self._arrived.wait()
            return True
        try:
            await asyncio.wait_for(self._arrived.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _collect(self) -> list[_Item]:
        first = self._pop()
        while first is None:
            await self._wait_arrival(None)
            first = self._pop()
        batch = [first]
        # The window opens when the policy became free, not when `first` was queued: a request that
        # arrived during the previous call would otherwise leave at once, alone, while its peers
        # arrive a moment later -- batches would alternate (3, 1, 3, 1) instead of filling.
        deadline = max(first.t_enqueue, self._free_since) + self.window_s
        while len(batch) < self.max_batch_size:
            item = self._pop()
            if item is not None:
                batch.append(item)
                continue
            now = time.perf_counter()
            if not self._missing_peers(now, batch, deadline) or now >= deadline:
                break
            if not await self._wait_arrival(deadline - now):
                break
        return batch

    async def _free_worker(self) -> _Worker:
        assert self._worker_free is not None
        while True:
            worker = next((w for w in self.workers if not w.busy), None)
            if worker is not None:
                return worker
            self._worker_free.clear()
            await self._worker_free.wait()

    async def _run(self) -> None:
        while True:
            worker = await self._free_worker()
            batch = await self._collect()
            worker.busy = True
            for it in batch:
                self._running[it.client_id] = self._running.get(it.client_id, 0) + 1
            if len(self.workers) == 1:  # one worker: nothing to collect until it is done
                await self._serve(worker, batch)
            else:
                task = asyncio.get_running_loop().create_task(self._serve(worker, batch))
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)

    async def _serve(self, worker: _Worker, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        try:
            for group in _group(batch).values():
                live = [it for it in group if not it.future.done()]  # skip requests whose client left
                if not live:
                    continue
                if self.inline:
                    self._execute_inline(live)
                else:
                    await loop.run_in_executor(worker.executor, self._execute, loop, live, worker.policy)
        finally:
            for it in batch:
                left = self._running[it.client_id] - 1
                if left:
                    self._running[it.client_id] = left
                else:
                    del self._running[it.client_id]
            worker.busy = False
            self._free_since = time.perf_counter()
            assert self._worker_free is not None and self._arrived is not None
            self._worker_free.set()
            self._arrived.set()  # a client that was running may have requests waiting

    def _execute_inline(self, group: list[_Item]) -> None:
        t0 = time.perf_counter()
        self._execute(asyncio.get_running_loop(), group)
        took = time.perf_counter() - t0
        if self.inline and took > _INLINE_LIMIT_S * max(1, len(group)):
            self.inline = False
            log.warning(
                "policy %s declares cheap_inference but a call took %.1f ms; "
                "running it on the worker thread from now on",
                type(self.policy).__name__,
                took * 1000,
            )

    # -- worker thread ---------------------------------------------------------------------
    def _execute(self, loop: asyncio.AbstractEventLoop, group: list[_Item], policy: BasePolicy | None = None) -> None:
        policy = self.policy if policy is None else policy
        group = [it for it in group if not it.future.done()]  # cancelled while waiting for this thread
        if not group:
            return
        # replicas call under the policy's guard if it has one (the torch families: never during
        # another replica's CUDA graph capture)
        guard = getattr(policy, "call_guard", None) if len(self.workers) > 1 else None
        with guard() if callable(guard) else contextlib.nullcontext():
            self._execute_group(loop, group, policy)

    def _execute_group(self, loop: asyncio.AbstractEventLoop, group: list[_Item], policy: BasePolicy) -> None:
        t0 = time.perf_counter()
        if self.batched and len(group) > 1:
            try:
                results = self._call_batch(policy, group)
                if not isinstance(results, (list, tuple)) or len(results) != len(group):
                    raise PolicyError(
                        f"infer_batch returned {type(results).__name__} of length "
                        f"{len(results) if hasattr(results, '__len__') else '?'} for {len(group)} observations"
                    )
                infer_ms = (time.perf_counter() - t0) * 1000
                self._record_call(len(group), infer_ms)
                for it, res in zip(group, results):
                    self._resolve(loop, it, res, None, t0, infer_ms, len(group))
                return
            except Exception:  # noqa: BLE001 - isolate the offending request below
                pass
        for it in group:
            t1 = time.perf_counter()
            try:
                res = self._call_batch(policy, [it])[0] if self.batched else self._call_one(policy, it)
                err = None
            except Exception as exc:  # noqa: BLE001 - reported to that client only
                res, err = None, exc
            infer_ms = (time.perf_counter() - t1) * 1000
            self._record_call(1, infer_ms)
            self._resolve(loop, it, res, err, t1, infer_ms, 1)

    @staticmethod
    def _session_state(policy: BasePolicy, item: _Item) -> Any:
        if item.session is None:  # no slot from the core (direct use, warm-up): a scratch session
            item.session = SessionSlot()
        slot = item.session
        if not slot.made:
            slot.state = policy.new_session()  # type: ignore[attr-defined]
            slot.made = True
        return slot.state

    def _call_batch(self, policy: BasePolicy, group: list[_Item]) -> Any:
        obs_batch = [it.obs for it in group]
        if self.session_aware:
            sessions = [self._session_state(policy, it) for it in group]
            return policy.infer_batch(obs_batch, sessions=sessions)  # type: ignore[attr-defined]
        return policy.infer_batch(obs_batch)  # type: ignore[attr-defined]

    def _call_one(self, policy: BasePolicy, item: _Item) -> Any:
        if self.session_aware:
            return policy.infer(item.obs, session=self._session_state(policy, item))  # type: ignore[call-arg]
        return policy.infer(item.obs)

    def _record_call(self, size: int, infer_ms: float) -> None:
        self._recent_calls.append(infer_ms / 1000)
        self.metrics.observe("cosmos_robot_batch_size", size)
        self.metrics.observe("cosmos_robot_policy_latency_seconds", infer_ms / 1000)
        if self.on_call is not None:
            self.on_call(size)

    def _resolve(
        self,
        loop: asyncio.AbstractEventLoop,
        item: _Item,
        result: Any,
        error: BaseException | None,
        t_start: float,
        infer_ms: float,
        batch_size: int,
    ) -> None:
        if error is None and not isinstance(result, dict):
            error = PolicyError(f"policy returned {type(result).__name__}, expected a dict like {{'actions': ...}}")
        if error is None:
            problem = nonfinite_problem(result)
            if problem is not None:
                log.error("policy output refused: %s", problem)
                error = NonFiniteOutput(f"policy output {problem}; refusing to send it")
        if error is not None and not isinstance(error, PolicyError):
            # the traceback stays in the server log; the client gets one line naming the exception
            log.error("policy raised %s", type(error).__name__, exc_info=error)
            error = PolicyError(f"policy raised {type(error).__name__}: {' '.join(str(error).split())}")
        timing = Timing(queue_ms=(t_start - item.t_enqueue) * 1000, infer_ms=infer_ms, batch_size=batch_size)

        def settle() -> None:
            if item.future.done():
                return
            if error is not None:
                item.future.set_exception(error)
            else:
                item.future.set_result((result, timing))
            self._release(item)  # now, not at the done callback: an inline answer does not yield

        if threading.get_ident() == self._loop_thread:
            settle()
        else:
            loop.call_soon_threadsafe(settle)


def _group(items: list[_Item]) -> dict[Hashable, list[_Item]]:
    if len(items) == 1:  # nothing to group with: no signature to compute
        return {None: items}
    groups: dict[Hashable, list[_Item]] = {}
    for item in items:
        groups.setdefault(item.signature, []).append(item)
    return groups
