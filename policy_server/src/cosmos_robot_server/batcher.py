"""Cross-connection dynamic batching: many clients' requests become one policy call.

Why: a GPU policy costs nearly the same for 1 or 16 observations, and evaluation / RL drive many
environments at once. openpi's server calls the model once per request inside its event loop, so
16 clients wait in line (openpi #399).

How: requests land in one queue. A single consumer takes the first request and waits for more
until the batch is full, ``max_wait_ms`` has passed, or every client expected to join is already in
the batch. A client is expected when it is *prompt*: its think time (from our reply to its next
request, smoothed) is below ``max_wait_ms``, as for simulators stepped in lockstep. So a lone
client never waits (its latency stays the single-request cost), robots that think for tens of
milliseconds between requests are not waited for, and lockstep evaluators fill batches. The batch is
split into groups of identical structure (keys, shapes, dtypes) so a policy can stack them, and
each group runs in ONE worker thread: the event loop stays free to answer pings and other
connections, and the model is never entered from two threads at once.

A batch-capable policy (``infer_batch``) gets the whole group; any other policy is called per
request. A policy that declares ``cheap_inference`` (scripted, constant or lookup policies that
answer in microseconds) is called on the event loop itself, saving the two thread hops
(~0.2-0.4 ms) that would otherwise dominate its latency; a lone client's request then skips the
queue too. Should such a call ever take longer than ``_INLINE_LIMIT_S``, the policy is moved to
the worker thread for good, so a wrong declaration cannot stall the loop twice.

If a batched call raises, the group is retried one by one so only the offending request fails
and the others are still answered.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy, supports_batch
from cosmos_robot_server.metrics import Metrics

__all__ = ["DynamicBatcher", "PolicyError", "Timing"]

log = logging.getLogger(__name__)

_ACTIVE_WINDOW_S = 1.0  # a client silent for this long is no longer expected in a batch
_THINK_EMA = 0.3  # smoothing of each client's think time
_INLINE_LIMIT_S = 0.005  # a "cheap" policy slower than this goes back to the worker thread


@dataclass
class _ClientState:
    last_seen: float
    last_reply: float | None = None
    think_ema_s: float | None = None


class PolicyError(RuntimeError):
    """The policy itself raised; the message carries the policy's traceback summary."""


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
    t_enqueue: float = field(default_factory=time.perf_counter)


def structure_signature(value: Any, depth: int = 0) -> Any:
    """A hashable description of keys, shapes and dtypes; equal signatures can be stacked."""
    if depth > 8:
        return "..."
    if isinstance(value, np.ndarray):
        return ("nd", value.shape, value.dtype.str)
    if isinstance(value, dict):
        return tuple(sorted((str(k), structure_signature(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("seq", len(value), tuple(structure_signature(v, depth + 1) for v in value[:16]))
    return type(value).__name__


def _group(items: list[_Item]) -> dict[Any, list[_Item]]:
    groups: dict[Any, list[_Item]] = {}
    for item in items:
        groups.setdefault(structure_signature(item.obs), []).append(item)
    return groups


class DynamicBatcher:
    """Groups concurrent requests into batched policy calls on one worker thread."""

    def __init__(
        self,
        policy: BasePolicy,
        *,
        max_batch_size: int = 16,
        max_wait_ms: float = 10.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.metrics = metrics or Metrics()
        self.batched = supports_batch(policy)
        self.inline = bool(getattr(policy, "cheap_inference", False))
        self._loop_thread: int | None = None
        self._busy = False
        self._free_since = 0.0  # when the last policy call ended
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="policy")
        self._queue: asyncio.Queue[_Item] | None = None
        self._task: asyncio.Task[None] | None = None
        self._clients: dict[str, _ClientState] = {}

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._loop_thread = threading.get_ident()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- requests --------------------------------------------------------------------------
    async def submit(self, obs: dict[str, Any], client_id: str) -> tuple[dict[str, Any], Timing]:
        """Queue one validated observation; resolves to (result dict, timing)."""
        (out,) = await self.submit_many([obs], client_id)
        if isinstance(out, BaseException):
            raise out
        return out

    async def submit_many(
        self, obs_list: Sequence[dict[str, Any]], client_id: str
    ) -> list[tuple[dict[str, Any], Timing] | BaseException]:
        """Queue several observations of ONE client (a vectorised evaluator's batch request).

        They count as one arrival of that client for think-time tracking and land in the queue
        together, so they share policy calls; each entry is a result or that item's exception.
        """
        if self._queue is None:
            raise RuntimeError("DynamicBatcher.start() was not called")
        loop = asyncio.get_running_loop()
        now = time.perf_counter()
        state = self._clients.get(client_id)
        if state is None:
            state = self._clients[client_id] = _ClientState(last_seen=now)
        else:
            state.last_seen = now
            if state.last_reply is not None:
                think = now - state.last_reply
                ema = state.think_ema_s
                state.think_ema_s = think if ema is None else (1 - _THINK_EMA) * ema + _THINK_EMA * think
        items = [_Item(obs, client_id, loop.create_future()) for obs in obs_list]
        if self.inline and not self._busy and self._queue.empty() and not self._missing_peers(now, items):
            for group in _group(items).values():  # lone client, cheap policy: no queue, no thread hop
                self._execute_inline(group)
        else:
            for item in items:
                self._queue.put_nowait(item)
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
        """Run ``fn`` on the policy thread, serialised with inference (used for ``reset``)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def forget(self, client_id: str) -> None:
        """A connection closed: stop counting it as an expected batch member."""
        self._clients.pop(client_id, None)

    # -- consumer --------------------------------------------------------------------------
    def _missing_peers(self, now: float, batch: list[_Item]) -> int:
        """Prompt clients (back within max_wait, by their think time) not yet in the batch."""
        stale = [cid for cid, st in self._clients.items() if now - st.last_seen > _ACTIVE_WINDOW_S]
        for cid in stale:
            del self._clients[cid]
        members = {it.client_id for it in batch}
        return sum(
            1
            for cid, st in self._clients.items()
            if cid not in members and st.think_ema_s is not None and st.think_ema_s <= self.max_wait_s
        )

    async def _collect(self) -> list[_Item]:
        assert self._queue is not None
        first = await self._queue.get()
        batch = [first]
        # The window opens when the policy became free, not when `first` was queued: a request that
        # arrived during the previous call would otherwise leave at once, alone, while its peers
        # arrive a moment later -- batches would alternate (3, 1, 3, 1) instead of filling.
        deadline = max(first.t_enqueue, self._free_since) + self.max_wait_s
        while len(batch) < self.max_batch_size:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            now = time.perf_counter()
            if not self._missing_peers(now, batch) or now >= deadline:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), deadline - now))
            except asyncio.TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            for group in _group(batch).values():
                live = [it for it in group if not it.future.done()]  # skip requests whose client left
                if not live:
                    continue
                self._busy = True
                try:
                    if self.inline:
                        self._execute_inline(live)
                    else:
                        await loop.run_in_executor(self._executor, self._execute, loop, live)
                finally:
                    self._busy = False
                    self._free_since = time.perf_counter()

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
    def _execute(self, loop: asyncio.AbstractEventLoop, group: list[_Item]) -> None:
        t0 = time.perf_counter()
        if self.batched and len(group) > 1:
            try:
                results = self.policy.infer_batch([it.obs for it in group])  # type: ignore[attr-defined]
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
                if self.batched:
                    res = self.policy.infer_batch([it.obs])[0]  # type: ignore[attr-defined]
                else:
                    res = self.policy.infer(it.obs)
                err = None
            except Exception as exc:  # noqa: BLE001 - reported to that client only
                res, err = None, exc
            infer_ms = (time.perf_counter() - t1) * 1000
            self._record_call(1, infer_ms)
            self._resolve(loop, it, res, err, t1, infer_ms, 1)

    def _record_call(self, size: int, infer_ms: float) -> None:
        self.metrics.observe("cosmos_robot_batch_size", size)
        self.metrics.observe("cosmos_robot_policy_latency_seconds", infer_ms / 1000)

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
        if error is not None and not isinstance(error, PolicyError):
            tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            error = PolicyError(f"policy raised {type(error).__name__}: {error}\n{tb}")
        timing = Timing(queue_ms=(t_start - item.t_enqueue) * 1000, infer_ms=infer_ms, batch_size=batch_size)

        def settle() -> None:
            if item.future.done():
                return
            if error is not None:
                item.future.set_exception(error)
            else:
                item.future.set_result((result, timing))

        if threading.get_ident() == self._loop_thread:
            settle()
        else:
            loop.call_soon_threadsafe(settle)
