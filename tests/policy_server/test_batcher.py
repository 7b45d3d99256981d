"""Dynamic batching: grouping across clients, no wait for a lone client, failure isolation, and
admission: per-client round-robin, in-flight caps, departed clients' requests dropped, sessions, finite replies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_server.admission import Limits, ServerBusy
from cosmos_robot_server.batcher import DynamicBatcher, NonFiniteOutput, PolicyError, SessionSlot
from cosmos_robot_server.example_policies import ConstantBatchPolicy, ConstantPolicy, StepCounterPolicy
from cosmos_robot_server.metrics import Metrics
from cosmos_robot_server.payloads import nonfinite_problem, payload_nbytes, structure_signature
from tests.policy_server.helpers import RecordingPolicy, with_batcher


def obs(n: int = 3) -> dict[str, Any]:
    return {"state": np.zeros(n, np.float32), "prompt": "p"}


def test_concurrent_clients_share_one_call() -> None:
    policy = ConstantBatchPolicy(4, 2, delay_ms=1)  # not cheap: goes through the queue

    async def go(b: DynamicBatcher) -> list[Any]:
        return await asyncio.gather(*(b.submit(obs(), f"c{i}") for i in range(8)))

    results = asyncio.run(with_batcher(policy, go, max_batch_size=16, max_wait_ms=200))
    assert policy.batch_sizes == [8]
    assert all(r[0]["actions"].shape == (4, 2) and r[1].batch_size == 8 for r in results)


def test_max_batch_size_caps_a_call() -> None:
    policy = ConstantBatchPolicy(4, 2, delay_ms=1)  # not cheap: goes through the queue

    async def go(b: DynamicBatcher) -> None:
        await asyncio.gather(*(b.submit(obs(), f"c{i}") for i in range(10)))

    asyncio.run(with_batcher(policy, go, max_batch_size=4, max_wait_ms=200))
    assert sorted(policy.batch_sizes, reverse=True) == [4, 4, 2]


def test_lone_client_does_not_wait_for_max_wait() -> None:
    policy = ConstantBatchPolicy(4, 2)

    async def go(b: DynamicBatcher) -> float:
        await b.submit(obs(), "solo")  # warm-up
        t0 = time.perf_counter()
        for _ in range(5):
            await b.submit(obs(), "solo")
        return (time.perf_counter() - t0) / 5

    per_request = asyncio.run(with_batcher(policy, go, max_wait_ms=500))
    assert per_request < 0.25  # would be >= 0.5 s if it waited for max_wait


def test_different_structures_are_separate_calls() -> None:
    policy = ConstantBatchPolicy(4, 2, delay_ms=1)  # not cheap: goes through the queue

    async def go(b: DynamicBatcher) -> None:
        await asyncio.gather(*(b.submit(obs(3 if i % 2 else 5), f"c{i}") for i in range(6)))

    asyncio.run(with_batcher(policy, go, max_wait_ms=200))
    assert sorted(policy.batch_sizes) == [3, 3]
    assert structure_signature(obs(3)) != structure_signature(obs(5))
    assert structure_signature(obs(3)) == structure_signature(obs(3))


def test_unbatched_policy_is_called_per_request() -> None:
    policy = ConstantPolicy(4, 2)

    async def go(b: DynamicBatcher) -> list[Any]:
        return await asyncio.gather(*(b.submit(obs(), f"c{i}") for i in range(5)))

    results = asyncio.run(with_batcher(policy, go, max_wait_ms=100))
    assert policy.calls == 5 and all(r[1].batch_size == 1 for r in results)


class PickyPolicy(BatchPolicy):
    """Raises on observations flagged bad, like a model hitting a NaN in one sample."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        self.batch_sizes.append(len(obs_batch))
        if any(o["state"][0] < 0 for o in obs_batch):
            raise FloatingPointError("negative state")
        return [{"actions": np.ones((2, 2))} for _ in obs_batch]


def test_failing_request_is_isolated_from_its_batch() -> None:
    policy = PickyPolicy()

    async def go(b: DynamicBatcher) -> list[Any]:
        items = [obs() for _ in range(4)]
        items[2]["state"][0] = -1
        return await asyncio.gather(*(b.submit(o, f"c{i}") for i, o in enumerate(items)), return_exceptions=True)

    results = asyncio.run(with_batcher(policy, go, max_wait_ms=200))
    assert isinstance(results[2], PolicyError) and "negative state" in str(results[2])
    assert all(isinstance(results[i], tuple) for i in (0, 1, 3))
    assert policy.batch_sizes[0] == 4  # tried together first, then one by one


class BrokenPolicy(BatchPolicy):
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.mode == "short":
            return [{"actions": np.zeros(1)}][: len(obs_batch) - 1]
        return ["not a dict"] * len(obs_batch)  # type: ignore[list-item]


@pytest.mark.parametrize(("mode", "message"), [("short", "length"), ("type", "expected a dict")])
def test_malformed_policy_output_is_a_clear_error(mode: str, message: str) -> None:
    async def go(b: DynamicBatcher) -> list[Any]:
        return await asyncio.gather(*(b.submit(obs(), f"c{i}") for i in range(2)), return_exceptions=True)

    results = asyncio.run(with_batcher(BrokenPolicy(mode), go, max_wait_ms=100))
    assert all(isinstance(r, PolicyError) for r in results)
    assert any(message in str(r) for r in results) or mode == "short"


def test_reset_runs_on_the_policy_thread() -> None:
    policy = ConstantPolicy()

    async def go(b: DynamicBatcher) -> None:
        await b.submit(obs(), "c")
        await b.call(policy.reset)

    asyncio.run(with_batcher(policy, go))
    assert policy.resets == 1


def test_prompt_client_is_not_held_back_by_a_slow_one() -> None:
    policy = ConstantBatchPolicy(4, 2)

    async def go(b: DynamicBatcher) -> list[float]:
        async def slow() -> None:
            for _ in range(3):
                await b.submit(obs(), "slow")
                await asyncio.sleep(0.2)  # think time far above max_wait: not expected in batches

        async def fast() -> list[float]:
            lat = []
            for _ in range(30):
                t0 = time.perf_counter()
                await b.submit(obs(), "fast")
                lat.append(time.perf_counter() - t0)
                await asyncio.sleep(0.01)
            return lat

        task = asyncio.create_task(slow())
        lat = await fast()
        await task
        return lat

    lat = asyncio.run(with_batcher(policy, go, max_wait_ms=60))
    assert sorted(lat)[len(lat) // 2] < 0.03  # the median request did not sit out max_wait


def test_lockstep_clients_fill_batches_even_when_arriving_staggered() -> None:
    policy = ConstantBatchPolicy(4, 2, delay_ms=5)

    async def go(b: DynamicBatcher) -> None:
        async def client(i: int) -> None:
            for _ in range(8):
                await asyncio.sleep(0.002 * i)  # arrivals spread over ~6 ms, like 4 envs stepping
                await b.submit(obs(), f"env{i}")

        await asyncio.gather(*(client(i) for i in range(4)))

    asyncio.run(with_batcher(policy, go, max_wait_ms=50))
    # once the first rounds teach the batcher that all four are prompt, calls carry all four
    # (the last rounds may split when a client has finished its loop before the others)
    assert policy.batch_sizes.count(4) >= 5, policy.batch_sizes
    assert sum(policy.batch_sizes) == 32


def test_cheap_policy_runs_inline_and_falls_back_when_slow() -> None:
    policy = ConstantBatchPolicy(4, 2)
    assert policy.cheap_inference

    async def go(b: DynamicBatcher) -> list[Any]:
        assert b.inline
        out = [await b.submit(obs(), "solo") for _ in range(3)]
        policy.delay_s = 0.02  # now it lies about being cheap
        out.append(await b.submit(obs(), "solo"))
        assert not b.inline  # moved to the worker thread after the slow call
        out.append(await b.submit(obs(), "solo"))
        return out

    results = asyncio.run(with_batcher(policy, go))
    assert all(r[0]["actions"].shape == (4, 2) for r in results)


def test_request_queued_during_a_call_waits_for_its_prompt_peers() -> None:
    """Regression: one straggler used to leave alone each round, so batches went 3, 1, 3, 1."""
    policy = ConstantBatchPolicy(4, 2, delay_ms=20)

    async def go(b: DynamicBatcher) -> None:
        async def client(i: int) -> None:
            if i == 3:
                await asyncio.sleep(0.01)  # starts out of phase: lands while the others' call runs
            for _ in range(10):
                await asyncio.sleep(0.001)
                await b.submit(obs(), f"env{i}")

        await asyncio.gather(*(client(i) for i in range(4)))

    asyncio.run(with_batcher(policy, go, max_wait_ms=15))
    assert policy.batch_sizes.count(4) >= 5, policy.batch_sizes


# -- admission, fairness, departed clients, sessions, finite outputs (issue 15) ----------------


def test_flood_by_one_client_delays_another_by_about_one_batch() -> None:
    """Per-client queues served round-robin: a 400-request flood used to put a newcomer 100 batches back."""
    policy = ConstantBatchPolicy(4, 2, delay_ms=5)

    async def go(b: DynamicBatcher) -> tuple[float, float]:
        t0 = time.perf_counter()
        flood = asyncio.gather(*(b.submit(obs(), "flood") for _ in range(400)))
        await asyncio.sleep(0.02)  # the flood is queued and running
        t1 = time.perf_counter()
        await b.submit(obs(), "good")
        good = time.perf_counter() - t1
        await flood
        return good, time.perf_counter() - t0

    good, flood_s = asyncio.run(with_batcher(policy, go, max_batch_size=4, max_wait_ms=1))
    assert flood_s > 0.4  # 100 calls of >= 5 ms: the flood really occupied the policy
    assert good < 0.1, f"good client waited {good:.3f} s behind the flood"


def test_inflight_caps_refuse_with_server_busy_naming_the_limit() -> None:
    policy = ConstantBatchPolicy(4, 2, delay_ms=30)
    limits = Limits(max_inflight_per_client=3, max_inflight_bytes_per_client=4096, max_queued_requests=5)

    async def go(b: DynamicBatcher) -> None:
        held = [asyncio.ensure_future(b.submit(obs(), "a")) for _ in range(3)]
        await asyncio.sleep(0)
        assert b.inflight("a")[0] == 3
        with pytest.raises(ServerBusy, match=r"client a has 3 requests in flight \(max_inflight_per_client=3\)") as e:
            await b.submit(obs(), "a")
        assert e.value.status == 429
        big = {"state": np.zeros(2048, np.float32)}  # 8 KiB
        with pytest.raises(ServerBusy, match="max_inflight_bytes_per_client=4096") as e:
            await b.submit(big, "b")
        assert e.value.status == 429
        more = [asyncio.ensure_future(b.submit(obs(), "b")) for _ in range(2)]  # 5 in flight: server full
        await asyncio.sleep(0)
        with pytest.raises(ServerBusy, match=r"server busy: 5 requests in flight \(max_queued_requests=5\)") as e:
            await b.submit(obs(), "c")
        assert e.value.status == 503
        await asyncio.gather(*held, *more)
        assert b.inflight() == (0, 0)
        await b.submit(obs(), "a")  # answered requests free their place

    asyncio.run(with_batcher(policy, go, max_wait_ms=1, limits=limits))


def test_forget_drops_queued_requests_of_a_departed_client() -> None:
    policy = RecordingPolicy()
    metrics = Metrics()

    async def go(b: DynamicBatcher) -> None:
        first = asyncio.ensure_future(b.submit({"tag": "x0"}, "stay"))
        await asyncio.sleep(0.05)  # x0 is running (blocked on the gate)
        gone = asyncio.ensure_future(b.submit_many([{"tag": f"g{i}"} for i in range(6)], "gone"))
        stay = asyncio.ensure_future(b.submit({"tag": "x1"}, "stay"))
        await asyncio.sleep(0)
        assert b.forget("gone") == 6
        policy.gate.set()
        await asyncio.gather(first, stay)
        outs = await gone
        assert all(isinstance(o, asyncio.CancelledError) for o in outs)
        assert b.inflight() == (0, 0)

    asyncio.run(with_batcher(policy, go, max_wait_ms=1, metrics=metrics))
    assert policy.seen == ["x0", "x1"]  # the departed client's requests never reached the policy
    assert "cosmos_robot_batch_size_sum 2\n" in metrics.render()  # only executed requests are counted


def test_structure_signature_is_bounded_for_huge_maps() -> None:
    huge = {f"k{i}": i for i in range(300_000)}
    t0 = time.perf_counter()
    sig = structure_signature(huge)
    assert time.perf_counter() - t0 < 0.05  # not a walk over 300,000 keys
    assert sig != structure_signature(dict(huge))  # too big to describe: batched alone
    assert payload_nbytes({"a": np.zeros(1000, np.uint8), "b": "xy"}) >= 1002


class HalfNaNPolicy(BatchPolicy):
    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        value = [np.nan if o["state"][0] < 0 else 1.0 for o in obs_batch]
        return [{"actions": np.full((10, 7), v, np.float32), "info": {"ok": 1.0}} for v in value]


def test_nonfinite_output_fails_only_that_request_naming_the_key() -> None:
    async def go(b: DynamicBatcher) -> list[Any]:
        items = [obs() for _ in range(3)]
        items[1]["state"][0] = -1
        return await asyncio.gather(*(b.submit(o, f"c{i}") for i, o in enumerate(items)), return_exceptions=True)

    results = asyncio.run(with_batcher(HalfNaNPolicy(), go, max_wait_ms=100))
    assert isinstance(results[1], NonFiniteOutput)
    assert str(results[1]) == "policy output 'actions' has 70 non-finite values (NaN/inf); refusing to send it"
    assert isinstance(results[0], tuple) and isinstance(results[2], tuple)
    assert nonfinite_problem({"a": {"b": [np.ones(2), float("inf")]}}) == "'a/b[1]' is inf (non-finite)"
    assert nonfinite_problem({"a": np.arange(3), "b": np.ones(2)}) is None


def test_session_slots_keep_separate_state() -> None:
    policy = StepCounterPolicy(2, 2)

    async def go(b: DynamicBatcher) -> list[int]:
        a, c = SessionSlot(), SessionSlot()
        for _ in range(3):
            await b.submit(obs(), "a", session=a)
        await b.submit(obs(), "c", session=c)
        after_a = (await b.submit(obs(), "a", session=a))[0]["steps"]
        return [after_a, (await b.submit(obs(), "c", session=c))[0]["steps"]]

    assert asyncio.run(with_batcher(policy, go)) == [4, 2]


def test_answered_requests_leave_the_inflight_count_at_once() -> None:
    """A cheap policy answers inline without yielding; its answers must not pile up as in flight."""
    policy = ConstantBatchPolicy(4, 2)

    async def go(b: DynamicBatcher) -> None:
        for _ in range(10):
            await b.submit(obs(), "solo")
        assert b.inflight("solo") == (0, 0)

    asyncio.run(with_batcher(policy, go, limits=Limits(max_inflight_per_client=2)))


def test_window_scales_with_the_call_so_a_late_lockstep_peer_still_joins() -> None:
    """Four lockstep clients, one of which comes back 30 ms after its reply (the last of 16 replies
    and requests crossing a busy event loop), with 10 ms max_wait and a 200 ms call: waiting a quarter
    of the call (50 ms) takes it into the batches once the call and its think time are measured; a fixed
    10 ms window leaves it behind, alone or a whole call late, in more rounds."""

    def sizes(fraction: float) -> list[int]:
        policy = ConstantBatchPolicy(4, 2, delay_ms=200)

        async def go(b: DynamicBatcher) -> None:
            async def client(i: int) -> None:
                for _ in range(6):
                    await asyncio.sleep(0.03 if i == 3 else 0.001)
                    await b.submit(obs(), f"env{i}")

            await asyncio.gather(*(client(i) for i in range(4)))

        asyncio.run(with_batcher(policy, go, max_wait_ms=10, wait_call_fraction=fraction))
        return policy.batch_sizes

    scaled, fixed = sizes(0.25), sizes(0.0)
    assert scaled.count(4) >= 4, scaled  # once the batcher has timed a call and the straggler's think time
    assert fixed.count(4) < scaled.count(4) and len(fixed) > len(scaled), (fixed, scaled)


def test_wait_call_fraction_is_checked() -> None:
    with pytest.raises(ValueError, match=r"wait_call_fraction must be in \[0, 1\], got 2"):
        DynamicBatcher(ConstantBatchPolicy(4, 2), wait_call_fraction=2)


def test_window_follows_the_typical_call_not_one_slow_one_and_is_capped() -> None:
    b = DynamicBatcher(ConstantBatchPolicy(4, 2), max_wait_ms=10, wait_call_fraction=0.25)
    assert b.window_s == 0.01  # nothing measured yet: max_wait_ms
    for _ in range(10):
        b._record_call(1, 90.0)
    assert abs(b.window_s - 0.0225) < 1e-9
    b._record_call(1, 60_000.0)  # a recompilation: not typical
    assert abs(b.window_s - 0.0225) < 1e-9
    for _ in range(15):
        b._record_call(1, 1_000.0)  # a 1 s policy: a quarter would be 250 ms
    assert b.window_s == 0.1


def test_paced_peers_a_few_ms_apart_share_one_call_instead_of_queueing() -> None:
    """Two robots at a fixed rate (every 100 ms), the second's request 5 ms after the first's, a 40 ms
    call and a 10 ms window. Neither is *prompt* (each thinks ~55 ms after its reply), so without
    ``paced_peers`` the first leaves alone and the second waits its whole call (~75 ms); expecting
    each client at its own cadence, the first waits 5 ms and both share one call (~45 ms)."""

    def run(paced: bool) -> tuple[list[int], list[float]]:
        policy = ConstantBatchPolicy(4, 2, delay_ms=40)

        async def go(b: DynamicBatcher) -> list[float]:
            t0 = time.perf_counter() + 0.02
            late: list[float] = []

            async def robot(i: int) -> None:
                for k in range(10):
                    due = t0 + 0.1 * k + 0.005 * i
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    start = time.perf_counter()
                    await b.submit(obs(), f"robot{i}")
                    if k >= 3 and i == 1:  # once both periods are measured
                        late.append(time.perf_counter() - start)

            await asyncio.gather(robot(0), robot(1))
            return late

        late = asyncio.run(with_batcher(policy, go, max_wait_ms=10, wait_call_fraction=0.25, paced_peers=paced))
        return policy.batch_sizes, late

    paced_sizes, paced_late = run(True)
    queued_sizes, queued_late = run(False)
    assert paced_sizes.count(2) >= 6, paced_sizes  # from the third tick on, once both periods are known
    assert sorted(paced_late)[len(paced_late) // 2] < 0.06, paced_late  # one shared call, not two in a row
    assert queued_sizes.count(1) >= 12, queued_sizes
    assert sorted(queued_late)[len(queued_late) // 2] > 0.065, queued_late


def test_a_paced_peer_is_expected_only_when_due_soon_and_never_by_a_cheap_policy() -> None:
    """The rule itself, on a clock we set: a 10 Hz client with 40 ms calls (window 10 ms, half a call
    20 ms) is waited for when due within both, not when due later, overdue or with the rule off;
    two requests 1 ms apart are one tick of its cadence; a cheap (inline) policy never waits."""
    b = DynamicBatcher(ConstantBatchPolicy(4, 2, delay_ms=1), max_wait_ms=10)
    for _ in range(15):
        b._record_call(1, 40.0)
    t = 100.0
    for k in range(4):
        b._arrival("robot", t + 0.1 * k)  # due again at t + 0.4
    assert b._missing_peers(t + 0.395, []) == 1  # due in 5 ms
    assert b._missing_peers(t + 0.37, []) == 0  # due in 30 ms: later than the window
    assert b._missing_peers(t + 0.415, []) == 0  # 15 ms overdue: off its cadence
    b.paced_peers = False
    assert b._missing_peers(t + 0.395, []) == 0
    b.paced_peers = True
    b._arrival("robot", t + 0.4)
    b._arrival("robot", t + 0.401)  # a second request in the same tick
    assert abs(b._clients["robot"].period_ema_s - 0.1) < 1e-9
    assert b._missing_peers(t + 0.495, []) == 1
    cheap = DynamicBatcher(ConstantBatchPolicy(4, 2), max_wait_ms=10)
    assert cheap.inline
    for _ in range(15):
        cheap._record_call(1, 40.0)
    for k in range(4):
        cheap._arrival("robot", t + 0.1 * k)
    assert cheap._missing_peers(t + 0.395, []) == 0
