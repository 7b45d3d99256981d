"""Success rates with Wilson score intervals, and latency percentiles, from episode records.

Why Wilson and not the normal approximation: evaluations run 10-50 episodes per task and good
policies sit near 100 %, where ``p +- 1.96 sqrt(p(1-p)/n)`` collapses to a zero-width interval (and
leaves [0, 1] near 0 %). Wilson's interval stays inside [0, 1] and keeps a sensible width: 10/10
successes give [0.72, 1.00], saying honestly that ten episodes cannot tell 100 % from 80 %.

Rates are over *policy-scored* episodes only: an attempt lost to a crashed or hung simulator worker
says nothing about the policy, so it is counted apart (``infra_failures``, by reason) and, when its
retries ran out, its episode is ``missing`` (a rerun completes it), never a failure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from cosmos_robot_envs.eval.records import EpisodeRecord, InfraEvent

__all__ = ["latency_percentiles", "summarize", "wilson_interval"]

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for ``successes`` out of ``n`` (``(0, 1)`` when ``n == 0``)."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact bounds at the ends, no rounding error
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def latency_percentiles(latencies_ms: Sequence[float]) -> dict[str, float]:
    """``n``, ``mean``, ``p50``, ``p90``, ``p95``, ``p99``, ``max`` in ms (zeros when empty)."""
    arr = np.asarray(latencies_ms, dtype=np.float64)
    if arr.size == 0:
        return {"n": 0, "mean_ms": 0.0, "p50_ms": 0.0, "p90_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    out: dict[str, float] = {"n": int(arr.size), "mean_ms": round(float(arr.mean()), 3)}
    for q in (50, 90, 95, 99):
        out[f"p{q}_ms"] = round(float(np.percentile(arr, q)), 3)
    out["max_ms"] = round(float(arr.max()), 3)
    return out


def _rate(successes: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(successes, n)
    return {
        "episodes": n,
        "successes": successes,
        "success_rate": successes / n if n else 0.0,
        "ci95_low": round(lo, 6),
        "ci95_high": round(hi, 6),
    }


def _policy_failure(record: EpisodeRecord) -> bool:
    """Failed, and not because its simulator worker crashed, hung or raised (an infrastructure failure)."""
    return not record.success and not record.infra_failure


def _infra(events: Sequence[InfraEvent], legacy: Sequence[EpisodeRecord]) -> dict[str, int]:
    """Infrastructure failures by reason (events, plus older runs' records that kept one as an episode)."""
    reasons: dict[str, int] = {}
    for reason in [e.reason for e in events] + [str(r.truncated_reason) for r in legacy]:
        reasons[reason] = reasons.get(reason, 0) + 1
    return dict(sorted(reasons.items()))


def _metric_means(records: Sequence[EpisodeRecord]) -> dict[str, dict[str, Any]]:
    """Mean (with a 95% interval of the mean) of each end-of-episode metric the env reported; a flag
    (bools: collision, off-road) is a rate with its Wilson interval."""
    names = sorted({k for r in records for k in r.metrics})
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        raw = [r.metrics[name] for r in records if name in r.metrics]
        values = np.array(raw, np.float64)
        n = len(values)
        mean = float(values.mean())
        entry: dict[str, Any] = {"mean": round(mean, 6), "n": n, "ci95": None}
        if n > 1:
            half = float(Z95 * values.std(ddof=1) / np.sqrt(n))
            entry["ci95"] = [round(mean - half, 6), round(mean + half, 6)]
        if all(isinstance(v, bool) for v in raw):
            lo, hi = wilson_interval(int(values.sum()), n)
            entry["ci95"] = [round(lo, 6), round(hi, 6)]
        out[name] = entry
    return out


def summarize(
    records: Iterable[EpisodeRecord],
    tasks: Sequence[str],
    events: Iterable[InfraEvent] = (),
    missing: Iterable[tuple[str, int]] = (),
) -> dict[str, Any]:
    """Totals and per-task stats (in ``tasks`` order) over the policy-scored ``records``.

    Per task, ``failed_seeds`` lists the reset seeds of the episodes the policy failed (episode
    order), to replay them; ``infra_failures`` counts attempts lost to (or delayed by) a crashed or
    hung worker (``events``), ``missing`` the scheduled episodes with no policy-scored record.
    """
    everything = list(records)
    recs = [r for r in everything if not r.infra_failure]
    legacy = [r for r in everything if r.infra_failure]
    evs, gone = list(events), list(missing)
    per_task: dict[str, Any] = {}
    for task in tasks:
        mine = [r for r in recs if r.task == task]
        stats = _rate(sum(r.success for r in mine), len(mine))
        stats["mean_steps"] = round(float(np.mean([r.steps for r in mine])), 3) if mine else 0.0
        stats["mean_return"] = round(float(np.mean([r.episode_return for r in mine])), 6) if mine else 0.0
        stats["truncated"] = sum(r.truncated_reason is not None for r in mine)
        stats["infra_failures"] = sum(
            _infra([e for e in evs if e.task == task], [r for r in legacy if r.task == task]).values()
        )
        stats["missing"] = sum(t == task for t, _ in gone)
        stats["failed_seeds"] = [r.seed for r in sorted(mine, key=lambda r: r.episode) if _policy_failure(r)]
        metrics = _metric_means(mine)
        if metrics:
            stats["metrics"] = metrics
        per_task[task] = stats
    totals = _rate(sum(r.success for r in recs), len(recs))
    reasons: dict[str, int] = {}
    for r in recs:
        if r.truncated_reason is not None:
            reasons[r.truncated_reason] = reasons.get(r.truncated_reason, 0) + 1
    totals["truncated_reasons"] = dict(sorted(reasons.items()))
    infra = _infra(evs, legacy)
    totals["infra_failures"] = sum(infra.values())
    totals["infra_reasons"] = infra
    totals["missing"] = len(gone)
    totals["mean_task_success_rate"] = (
        float(np.mean([s["success_rate"] for s in per_task.values()])) if per_task else 0.0
    )
    metrics = _metric_means(recs)
    if metrics:
        totals["metrics"] = metrics
    latencies = [x for r in recs for x in r.latencies_ms]
    return {"totals": totals, "tasks": per_task, "latency_ms": latency_percentiles(latencies)}
