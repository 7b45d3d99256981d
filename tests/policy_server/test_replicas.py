"""Policy replicas (``replicas=N``, ``serve --replicas N``): a request that arrives during a call runs
at once on another replica instead of waiting; one client's requests never run at once; warm-up and
reset reach every replica; a policy without ``replica()`` is refused by name."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_server import ServerConfig
from cosmos_robot_server.batcher import DynamicBatcher, make_replicas
from cosmos_robot_server.core import ServingCore
from cosmos_robot_server.example_policies import ConstantBatchPolicy
from tests.policy_server.helpers import with_batcher


class Journal:
    """What every replica did: (replica index, thread name, start, end, client tags) per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, float, float, list[str]]] = []
        self.lock = threading.Lock()

    def overlapping(self) -> int:
        """The most calls that were running at the same moment."""
        edges = sorted([(s, 1) for _, _, s, _, _ in self.calls] + [(e, -1) for _, _, _, e, _ in self.calls])
        most = now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most


class SlowReplicable(BatchPolicy):
    """A batch policy taking ``delay_s`` per call, with ``replica()`` and ``bind_thread()`` as the torch
    families have them; every replica writes to one journal."""

    def __init__(self, delay_s: float, journal: Journal | None = None, index: int = 0) -> None:
        self.delay_s, self.journal, self.index = delay_s, journal or Journal(), index
        self.bound: list[str] = []
        self.resets = 0
        self.replicas: list[SlowReplicable] = [self]

    def replica(self) -> SlowReplicable:
        twin = SlowReplicable(self.delay_s, self.journal, index=len(self.replicas))
        self.replicas.append(twin)
        return twin

    def bind_thread(self) -> None:
        self.bound.append(threading.current_thread().name)

    def example_observation(self) -> dict[str, Any]:
        return {"state": np.zeros(2, np.float32), "tag": "warm"}

    def reset(self) -> None:
        self.resets += 1

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        start = time.perf_counter()
        time.sleep(self.delay_s)
        with self.journal.lock:
            tags = [str(o["tag"]) for o in obs_batch]
            self.journal.calls.append((self.index, threading.current_thread().name, start, time.perf_counter(), tags))
        return [{"actions": np.full((2, 2), self.index, np.float32)} for _ in obs_batch]


def obs(tag: str) -> dict[str, Any]:
    return {"state": np.zeros(2, np.float32), "tag": tag}


async def _late_second(b: DynamicBatcher) -> list[Any]:
    """Client a's request, then client b's while a's call runs (robots at their own pace)."""
    first = asyncio.ensure_future(b.submit(obs("a"), "a"))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(b.submit(obs("b"), "b"))
    return [await first, await second]


def test_a_request_arriving_during_a_call_starts_on_a_second_replica() -> None:
    policy = SlowReplicable(0.3)
    (ra, ta), (rb, tb) = asyncio.run(with_batcher(policy, _late_second, replicas=2, max_wait_ms=5))
    calls = {c[4][0]: c for c in policy.journal.calls}
    assert calls["a"][0] == 0 and calls["b"][0] == 1  # b ran on the replica, beside a's call
    assert calls["b"][2] < calls["a"][3]  # b started before a's call ended
    assert policy.journal.overlapping() == 2
    assert calls["a"][1] != calls["b"][1]  # each replica on its own thread...
    assert policy.bound == [calls["a"][1]] and policy.replicas[1].bound == [calls["b"][1]]  # ...bound once
    assert ta.batch_size == tb.batch_size == 1 and float(rb["actions"][0, 0]) == 1.0


def test_with_one_worker_the_late_request_waits_for_the_running_call() -> None:
    policy = SlowReplicable(0.3)
    asyncio.run(with_batcher(policy, _late_second, replicas=1, max_wait_ms=5))
    calls = {c[4][0]: c for c in policy.journal.calls}
    assert calls["b"][2] >= calls["a"][3] and policy.journal.overlapping() == 1
    assert len(policy.replicas) == 1  # replicas=1 makes no copy


def test_one_clients_requests_never_run_at_once_and_stay_in_order() -> None:
    """A second worker is free, but the client's first request is running: its next one waits."""
    policy = SlowReplicable(0.2)

    async def go(b: DynamicBatcher) -> list[Any]:
        first = asyncio.ensure_future(b.submit(obs("x1"), "x"))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(b.submit(obs("x2"), "x"))
        return [await first, await second]

    asyncio.run(with_batcher(policy, go, replicas=2, max_wait_ms=5))
    calls = {c[4][0]: c for c in policy.journal.calls}
    assert calls["x2"][2] >= calls["x1"][3] and policy.journal.overlapping() == 1


def test_running_peers_are_not_waited_for() -> None:
    """A lockstep client (prompt) is running on replica 0; a request of another client must not wait
    max_wait_ms for it to join, since it cannot until its call ends."""
    policy = SlowReplicable(0.4)

    async def go(b: DynamicBatcher) -> float:
        for _ in range(3):  # make "a" prompt: it comes back at once after each reply
            await b.submit(obs("a"), "a")
        running = asyncio.ensure_future(b.submit(obs("a"), "a"))
        await asyncio.sleep(0.05)
        _, timing = await b.submit(obs("b"), "b")
        await running
        return timing.queue_ms

    queue_ms = asyncio.run(with_batcher(policy, go, replicas=2, max_wait_ms=300))
    assert queue_ms < 150  # not the 300 ms window: b left at once (its call alone takes 400 ms)


def test_flat_clients_still_fill_one_batch_with_replicas() -> None:
    policy = SlowReplicable(0.05)

    async def go(b: DynamicBatcher) -> None:
        await asyncio.gather(*(b.submit(obs(f"c{i}"), f"c{i}") for i in range(6)))

    asyncio.run(with_batcher(policy, go, replicas=2, max_batch_size=8, max_wait_ms=200))
    assert [len(c[4]) for c in policy.journal.calls] == [6]


def test_warm_up_and_reset_reach_every_replica() -> None:
    policy = SlowReplicable(0.0)

    async def go() -> dict[int, float]:
        core = ServingCore(policy, ServerConfig(port=0, replicas=3))
        await core.start()
        try:
            took = await core.warm_up([1, 2])
            await core.reset()
            return took
        finally:
            await core.stop()

    took = asyncio.run(go())
    assert sorted(took) == [1, 2]
    warm = [(c[0], len(c[4])) for c in policy.journal.calls]
    assert sorted(warm) == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2)]
    assert [r.resets for r in policy.replicas] == [1, 1, 1]
    threads = {c[0]: c[1] for c in policy.journal.calls}
    assert len(set(threads.values())) == 3  # warmed on the thread that serves each replica


def test_a_policy_without_replica_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"replicas=2: ConstantBatchPolicy offers no replica\(\)"):
        DynamicBatcher(ConstantBatchPolicy(4, 2), replicas=2)
    with pytest.raises(ValueError, match="replicas must be an int >= 1, got 0"):
        make_replicas(ConstantBatchPolicy(4, 2), 0)
    with pytest.raises(ValueError, match="ServerConfig.replicas: must be an int >= 1, got 0"):
        ServerConfig(replicas=0)


class Guarded(SlowReplicable):
    """Counts the calls made under its ``call_guard`` (the torch families: never during a graph capture)."""

    guarded: list[str] = []

    def replica(self) -> Guarded:
        twin = Guarded(self.delay_s, self.journal, index=len(self.replicas))
        self.replicas.append(twin)
        return twin

    @contextlib.contextmanager
    def call_guard(self) -> Iterator[None]:
        Guarded.guarded.append(threading.current_thread().name)
        yield


def test_replicas_call_under_the_policys_guard_and_one_worker_does_not() -> None:
    for replicas, expected in ((2, 2), (1, 0)):
        Guarded.guarded = []
        asyncio.run(with_batcher(Guarded(0.05), _late_second, replicas=replicas, max_wait_ms=5))
        assert len(Guarded.guarded) == expected
