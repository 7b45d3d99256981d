"""Evaluation: the episode scheduler with one batched chunk request per decision, records on disk.

How a run goes:

1. the schedule (tasks x episodes, each with its own seed) minus the episodes ``episodes.jsonl``
   already holds goes to the episode scheduler (``cosmos_robot_envs.episodes``): one multi-task env
   per slot, reset with the episode's seed and ``suite.reset_options`` (at least its task);
2. the envs whose action queue is empty are queried together (one request through
   :class:`ChunkSource`) and execute ``replan_steps`` actions of their chunk; with ``align_starts``
   episodes start on replan boundaries, so every request carries all the envs (see the scheduler);
3. a finished episode (success or time limit) is appended to the JSONL; its MP4 is written when it
   is one of the first ``video_episodes`` of its task or, with ``video_failures``, one of the first
   ``FAILURE_VIDEOS_PER_TASK`` policy failures of its task (frames are kept in memory only for
   episodes that may need them);
4. an attempt lost to a crashed, hung or raising simulator worker (the vector layer reports it as
   ``truncated`` with a reason, or as a failed reset) is not the policy's failure: it goes to
   ``infra_failures.jsonl`` and to ``callbacks.infra_failure``, and the episode runs again with the
   same seed, at most ``infra_retries`` times, after the queue; one still lost stays *missing*
   (``results["complete"]`` is False) and a rerun of the same command runs exactly the missing
   episodes. A reset that hung or crashed and worked on the vector layer's own retry is reported the
   same way (``recovered``), since it cost up to ``reset_timeout_s``;
5. the summary, charts and report are recomputed from all records. A rerun with nothing left to do
   keeps the report and charts as they are and the throughput of the run that did the episodes.

The policy object comes from the caller (a ``WebsocketClientPolicy`` or anything loaded in-process):
this package never imports the ``cosmos_robot`` root package, so a simulator box needs no torch.
One policy serves every env, so ``policy.reset()`` is called once per run, not per episode; a
policy that keeps per-episode state cannot be shared across envs and should run behind a server
with sessions.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_envs.episodes import EpisodeHooks, EpisodeOutcome, EpisodeScheduler, LiveEpisode, Step, obs_row
from cosmos_robot_envs.eval.chunks import ChunkSource
from cosmos_robot_envs.eval.config import FAILURE_VIDEOS_PER_TASK, EpisodeSpec, EvalConfig, build_schedule
from cosmos_robot_envs.eval.outdir import EPISODES_JSONL, INFRA_JSONL, VIDEO_DIR, prepare_out_dir
from cosmos_robot_envs.eval.records import (
    EpisodeRecord,
    InfraEvent,
    append_event,
    append_record,
    latency_summary,
    load_events,
    load_records,
)
from cosmos_robot_envs.eval.report import REPORT_HTML, RESULTS_JSON, write_report
from cosmos_robot_envs.eval.stats import summarize
from cosmos_robot_envs.eval.suites import Suite, get_suite
from cosmos_robot_envs.eval.video import write_mp4
from cosmos_robot_envs.eval.wire import WireMapping, reads_images, spec_from_metadata
from cosmos_robot_envs.vector import RESET_FAILURE, BatchedEnv, make_vector_env

__all__ = ["EvalCallbacks", "run_eval"]

CHECKPOINT_KEYS = ("checkpoint", "ckpt", "checkpoint_path", "model_path")  # metadata naming the served weights
FAMILY_KEYS = ("family", "type", "policy")  # metadata naming the model family / policy class
# the vector layer's failure reasons, when the worker failed in a reset rather than a step
RESET_REASONS = {"worker_timeout": "reset_timeout", "worker_crashed": "reset_crashed", "env_error": "reset_error"}


class EvalCallbacks:
    """Hooks for progress display (and for tests that interrupt a run); the defaults do nothing."""

    def start(self, total: int, done: int, successes: int) -> None:
        """Called once, before the first step: ``done`` episodes (``successes`` of them) were resumed."""

    def episode(self, record: EpisodeRecord) -> None:
        """Called after each episode is written to disk."""

    def infra_failure(self, event: InfraEvent) -> None:
        """Called after an attempt lost to (or delayed by) a failed simulator worker is written to disk."""


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Metadata as JSON: arrays become lists, bytes and unknown objects become short strings."""
    if depth > 10:
        return "..."
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 64 else f"<array {value.dtype} {value.shape}>"
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)[:200]


class _EvalHooks(EpisodeHooks[EpisodeSpec]):
    """Evaluation on the episode scheduler: chunks from the policy, frames for videos, one record per episode.

    Per-episode state is keyed by the episode's position in the schedule, not by env row: a row whose
    reset failed takes the next episode before the failed one is recorded.
    """

    def __init__(
        self,
        config: EvalConfig,
        suite: Suite,
        chunks: ChunkSource,
        wire: WireMapping,
        out: Path,
        filmed_failures: dict[str, int],
        callbacks: EvalCallbacks,
    ) -> None:
        self.config, self.suite, self.chunks, self.wire, self.out = config, suite, chunks, wire, out
        self.filmed_failures = filmed_failures  # failure MP4s per task so far (resumed ones included)
        self.callbacks = callbacks
        self.latencies: dict[int, list[float]] = {}
        self.frames: dict[int, list[np.ndarray]] = {}
        self.finished: list[EpisodeRecord] = []
        self.lost: dict[tuple[str, int], int] = {}  # attempts lost to a failed worker, per episode, this run
        self.events: dict[tuple[str, int], int] = {}  # infrastructure events per episode, this run
        self.retry: list[EpisodeSpec] = []  # lost episodes to run again (same seed) after the queue

    def _may_film(self, spec: EpisodeSpec) -> bool:
        """Keep frames: a scheduled video, or a possible failure video while its task has room for one."""
        if spec.video:
            return True
        on = self.config.video_failures and self.config.video_episodes > 0
        return on and self.filmed_failures.get(spec.task, 0) < FAILURE_VIDEOS_PER_TASK

    def started(self, ep: LiveEpisode[EpisodeSpec], obs: dict[str, Any], info: dict[str, Any]) -> None:
        self.latencies[ep.position] = []
        failed = info.get(RESET_FAILURE)
        if isinstance(failed, dict):  # the vector layer's retry of this reset worked: report what it cost
            reason = str(failed.get("reason"))
            self._event(ep.spec, "reset", RESET_REASONS.get(reason, reason), str(failed.get("error")), "recovered", 0)
        if self.suite.video_key in obs and self._may_film(ep.spec):  # a camera-free run renders nothing to film
            self.frames[ep.position] = [np.array(obs[self.suite.video_key])]

    def decide(self, episodes: Sequence[LiveEpisode[EpisodeSpec]], obs: Any) -> list[np.ndarray]:
        chunks, latencies = self.chunks.query([self.wire(obs_row(obs, ep.row)) for ep in episodes])
        for ep, latency in zip(episodes, latencies):
            self.latencies[ep.position].append(latency)
        return chunks

    def stepped(self, ep: LiveEpisode[EpisodeSpec], step: Step) -> None:
        frames = self.frames.get(ep.position)
        if frames is not None:
            frames.append(np.array(step.obs[self.suite.video_key]))

    def ended(self, outcomes: Sequence[EpisodeOutcome[EpisodeSpec]], obs: Any) -> None:
        for outcome in outcomes:
            if outcome.infra_failure:
                self._lose(outcome)
            else:
                self._record(outcome)

    def _event(self, spec: EpisodeSpec, phase: str, reason: str, error: str, action: str, steps: int) -> None:
        attempt = self.events[spec.key] = self.events.get(spec.key, 0) + 1
        event = InfraEvent(spec.task, spec.index, spec.seed, attempt, phase, reason, error, action, steps)
        append_event(self.out / INFRA_JSONL, event)
        self.callbacks.infra_failure(event)

    def _lose(self, outcome: EpisodeOutcome[EpisodeSpec]) -> None:
        """An attempt lost to a failed worker: rescheduled with its seed while retries are left, else missing."""
        spec = outcome.spec
        started = self.latencies.pop(outcome.position, None) is not None
        self.frames.pop(outcome.position, None)
        reason = str(outcome.reason)
        if not started:
            reason = RESET_REASONS.get(reason, f"reset_{reason}")
        lost = self.lost[spec.key] = self.lost.get(spec.key, 0) + 1
        action = "retried" if lost <= self.config.infra_retries else "missing"
        if action == "retried":
            self.retry.append(spec)
        phase = "step" if started else "reset"
        self._event(spec, phase, reason, str(outcome.error), action, outcome.steps)

    def _video(self, outcome: EpisodeOutcome[EpisodeSpec]) -> str | None:
        spec = outcome.spec
        frames = self.frames.pop(outcome.position, None)
        policy_failure = not outcome.success and not outcome.infra_failure
        if not frames or not (spec.video or (policy_failure and self._may_film(spec))):
            return None
        if not spec.video:
            self.filmed_failures[spec.task] = self.filmed_failures.get(spec.task, 0) + 1
        video = f"{VIDEO_DIR}/{spec.task}_ep{spec.index:03d}.mp4"
        write_mp4(self.out / video, frames, self.suite.fps)
        return video

    def _record(self, outcome: EpisodeOutcome[EpisodeSpec]) -> None:
        latencies = self.latencies.pop(outcome.position, [])
        record = EpisodeRecord(
            task=outcome.spec.task,
            episode=outcome.spec.index,
            seed=outcome.spec.seed,
            success=outcome.success,
            steps=outcome.steps,
            episode_return=outcome.episode_return,
            truncated_reason=outcome.reason,
            worker_error=outcome.error,
            latency=latency_summary(latencies),
            latencies_ms=[round(x, 3) for x in latencies],
            video=self._video(outcome),
            wall_s=round(outcome.wall_s, 3),
            infra_failures=self.lost.get(outcome.spec.key, 0),
            metrics={k: v if isinstance(v, bool) else round(v, 6) for k, v in outcome.metrics.items()},
        )
        append_record(self.out / EPISODES_JSONL, record)
        self.finished.append(record)
        self.callbacks.episode(record)


@dataclass
class _Work:
    """What one invocation of :func:`run_eval` did (zeros when there was nothing to do)."""

    new: list[EpisodeRecord] = dataclasses.field(default_factory=list)
    requests: int = 0
    observations: int = 0
    setup_s: float = 0.0
    loop_s: float = 0.0


def _evaluate(
    config: EvalConfig,
    suite: Suite,
    policy: BasePolicy,
    metadata: dict[str, Any],
    todo: list[EpisodeSpec],
    out: Path,
    filmed_failures: dict[str, int],
    callbacks: EvalCallbacks,
) -> _Work:
    """Run the ``todo`` episodes; each is on disk (and reported to ``callbacks``) as soon as it ends.

    Episodes lost to a failed worker run again, with their seed, in rounds after the queue.
    """
    t_setup = time.perf_counter()
    policy.reset()
    input_spec = getattr(policy, "input_spec", None) or spec_from_metadata(metadata)
    # render only when the policy reads a camera or videos were asked for (camera-free: ~7x faster stepping)
    cameras = config.video_episodes > 0 or reads_images(input_spec, suite.wire_keys, suite.image_keys)
    venv: BatchedEnv = make_vector_env(
        suite.make_env(config.tasks, config.image_size, config.max_steps, cameras),
        num_envs=min(config.num_envs, len(todo)),
        mode=config.vector_mode,  # type: ignore[arg-type]
        step_timeout=config.step_timeout_s,
        reset_timeout=config.reset_timeout_s,
    )
    try:
        shape = venv.single_action_space.shape
        if shape is None or len(shape) != 1:
            raise ValueError(f"suite {suite.name!r}: expected a 1-D action space, got shape {shape}")
        chunks = ChunkSource(
            policy,
            name=_policy_name(config, policy),
            action_dim=int(shape[0]),
            replan_steps=config.replan_steps,
            batch_requests=config.batch_requests,
        )
        wire = WireMapping(suite.wire_keys, input_spec)
        hooks = _EvalHooks(config, suite, chunks, wire, out, filmed_failures, callbacks)
        scheduler = EpisodeScheduler[EpisodeSpec](
            venv, replan_steps=config.replan_steps, align_starts=config.align_starts, reset_options=suite.reset_options
        )
        t_loop = time.perf_counter()
        queue = todo
        while queue:
            scheduler.run(queue, hooks)
            queue, hooks.retry = hooks.retry, []
        return _Work(
            hooks.finished, chunks.requests, chunks.observations, t_loop - t_setup, time.perf_counter() - t_loop
        )
    finally:
        venv.close()


def run_eval(
    config: EvalConfig,
    policy: BasePolicy,
    out_dir: str | Path,
    *,
    policy_kind: str = "in_process",
    overwrite: bool = False,
    callbacks: EvalCallbacks | None = None,
) -> dict[str, Any]:
    """Run (or resume) the evaluation described by ``config`` and write its report into ``out_dir``.

    ``policy``: any ``BasePolicy`` (``infer_batch`` is used when it has one), e.g. a
    ``WebsocketClientPolicy`` (``policy_kind="websocket"``) or a policy built in-process. Returns the
    ``results.json`` content. Raises ``ConfigMismatchError`` when ``out_dir`` holds another run,
    ``PolicyOutputError`` when a reply cannot drive the env.

    A rerun runs the scheduled episodes that have no policy-scored record (never run, interrupted, or
    lost to failed workers past ``infra_retries``). A rerun of a complete evaluation runs nothing,
    leaves ``report.html`` and the charts alone, and only refreshes the invocation counts of
    ``results.json`` (its throughput stays the one measured by the run that did the episodes).
    """
    callbacks = callbacks or EvalCallbacks()
    out = Path(out_dir)
    suite = get_suite(config.suite)
    tasks = suite.resolve_tasks(config.tasks)
    config = dataclasses.replace(config, tasks=tasks)  # saved resolved: "all tasks" is explicit on disk
    prepare_out_dir(out, config, overwrite=overwrite)
    scored = {k: r for k, r in load_records(out / EPISODES_JSONL).items() if not r.infra_failure}
    schedule = build_schedule(config, tasks)
    wanted = {s.key for s in schedule}
    resumed = [r for key, r in scored.items() if key in wanted]
    todo = [s for s in schedule if s.key not in scored]
    callbacks.start(len(schedule), len(resumed), sum(r.success for r in resumed))

    metadata = _jsonable(dict(policy.metadata or {}))
    work = _Work()
    if todo:
        filmed = _filmed_failures(resumed, config.video_episodes)
        work = _evaluate(config, suite, policy, metadata, todo, out, filmed, callbacks)

    all_records = sorted(
        [r for r in load_records(out / EPISODES_JSONL).values() if r.key in wanted],
        key=lambda r: (tasks.index(r.task), r.episode),
    )
    events = [e for e in load_events(out / INFRA_JSONL) if e.key in wanted]
    results = _results(config, suite, tasks, all_records, schedule, events, policy_kind, metadata)
    results["throughput"] = _throughput(work, len(resumed), results["created_at"])
    saved = _saved_results(out) if not todo else None
    if saved is not None and "throughput" in saved:  # nothing ran: keep what the working run measured
        results["throughput"] = {**saved["throughput"], "episodes_this_run": 0, "episodes_resumed": len(resumed)}
        results["throughput"].setdefault("measured_at", saved.get("created_at"))
        if saved.get("complete") and (out / REPORT_HTML).exists():  # its report already says it all
            results["created_at"] = saved.get("created_at", results["created_at"])
            json.dumps(results, allow_nan=False)
            (out / RESULTS_JSON).write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
            return results
    json.dumps(results, allow_nan=False)  # fail here, not halfway through writing the file
    write_report(out, results, all_records)
    return results


def _results(
    config: EvalConfig,
    suite: Suite,
    tasks: tuple[str, ...],
    records: list[EpisodeRecord],
    schedule: list[EpisodeSpec],
    events: list[InfraEvent],
    policy_kind: str,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """The ``results.json`` content but its throughput."""
    results: dict[str, Any] = {"suite": suite.name, "config": _jsonable(config.to_dict())}
    scored = {r.key for r in records if not r.infra_failure}
    missing = [s for s in schedule if s.key not in scored]
    results["complete"] = not missing
    results["episodes_scheduled"] = len(schedule)
    results.update(summarize(records, tasks, events, [s.key for s in missing]))
    last_reason = {e.key: e.reason for e in events}
    results["episodes_missing"] = [
        {"task": s.task, "episode": s.index, "seed": s.seed, "reason": last_reason.get(s.key, "not_run")}
        for s in missing
    ]
    results["infra_failures"] = [{k: v for k, v in e.to_json().items() if k != "error"} for e in events]
    results["policy"] = {
        "source": config.policy,
        "kind": policy_kind,
        **_identity(metadata, config.policy),
        "metadata": metadata,
    }
    results["episodes"] = [
        {k: v for k, v in r.to_json().items() if k not in ("latencies_ms", "worker_error")}
        for r in records
        if not r.infra_failure
    ]
    results["created_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results["versions"] = {"cosmos-robot-envs": _version("cosmos-robot-envs")}
    return results


def _throughput(work: _Work, resumed: int, created_at: str) -> dict[str, Any]:
    return {
        "episodes_this_run": len(work.new),
        "episodes_resumed": resumed,
        "setup_s": round(work.setup_s, 3),
        "loop_s": round(work.loop_s, 3),
        "episodes_per_min": round(60 * len(work.new) / work.loop_s, 3) if work.new and work.loop_s > 0 else 0.0,
        "requests": work.requests,
        "observations": work.observations,
        "mean_request_batch": round(work.observations / work.requests, 3) if work.requests else 0.0,
        "measured_at": created_at if work.new else None,  # when the run that measured these numbers ended
    }


def _saved_results(out: Path) -> dict[str, Any] | None:
    """The ``results.json`` of an earlier run in ``out`` (None if missing or unreadable)."""
    try:
        saved = json.loads((out / RESULTS_JSON).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def _filmed_failures(records: list[EpisodeRecord], video_episodes: int) -> dict[str, int]:
    """Failure MP4s each task already has (resumed runs keep their count toward the cap)."""
    counts: dict[str, int] = {}
    for r in records:
        if r.video is not None and not r.success and r.episode >= video_episodes:
            counts[r.task] = counts.get(r.task, 0) + 1
    return counts


def _identity(metadata: dict[str, Any], source: str) -> dict[str, Any]:
    """Which checkpoint / family was evaluated: from the policy's (server's) metadata, else its source."""
    checkpoint = next((str(metadata[k]) for k in CHECKPOINT_KEYS if metadata.get(k)), source)
    family = next((str(metadata[k]) for k in FAMILY_KEYS if metadata.get(k)), None)
    return {"checkpoint": checkpoint, "family": family}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _policy_name(config: EvalConfig, policy: BasePolicy) -> str:
    url = getattr(policy, "url", None)
    return str(url) if url else config.policy
