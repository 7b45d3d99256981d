"""The evaluation loop: N envs in lockstep, one batched chunk request per control step, records on disk.

How a run goes:

1. the schedule (tasks x episodes, each with its own seed) minus the episodes ``episodes.jsonl``
   already holds is handed out to free env slots: one multi-task env per slot, reset with the
   episode's seed and ``options={"task": ...}`` (the vector layer's partial reset);
2. each control step, the envs whose action queue is empty are queried together (one request) and
   get the first ``replan_steps`` actions of their chunk; every active env then takes one step;
3. a finished episode (success, time limit, or a crashed / hung worker, which the vector layer reports
   as ``truncated`` with a reason) is appended to the JSONL, its slot gets the next episode at the
   next replan boundary (``align_starts``): an env idles for fewer than ``replan_steps`` steps, and in
   exchange every env asks for its chunk on the same control steps, so each request carries all the
   envs instead of the ~N/replan_steps that staggered starts would leave (a model server then runs
   one forward pass per replan instead of one per control step). Each episode still replans every
   ``replan_steps`` steps from its own reset, so its outcome does not depend on the alignment;
4. the summary, charts and report are recomputed from all records.

The policy object comes from the caller (a ``WebsocketClientPolicy`` or anything loaded in-process):
this package never imports the ``cosmos_robot`` root package, so a simulator box needs no torch.
One policy serves every env, so ``policy.reset()`` is called once per run, not per episode; a
policy that keeps per-episode state cannot be shared across envs and should run behind a server
with sessions.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_envs.eval.chunks import ChunkSource
from cosmos_robot_envs.eval.config import EpisodeSpec, EvalConfig, build_schedule
from cosmos_robot_envs.eval.outdir import EPISODES_JSONL, VIDEO_DIR, prepare_out_dir
from cosmos_robot_envs.eval.records import EpisodeRecord, append_record, latency_summary, load_records
from cosmos_robot_envs.eval.report import write_report
from cosmos_robot_envs.eval.stats import summarize
from cosmos_robot_envs.eval.suites import Suite, get_suite
from cosmos_robot_envs.eval.video import write_mp4
from cosmos_robot_envs.eval.wire import WireMapping, batch_row, spec_from_metadata
from cosmos_robot_envs.vector import BatchedEnv, make_vector_env

__all__ = ["EvalCallbacks", "run_eval"]


class EvalCallbacks:
    """Hooks for progress display (and for tests that interrupt a run); the defaults do nothing."""

    def start(self, total: int, done: int, successes: int) -> None:
        """Called once, before the first step: ``done`` episodes (``successes`` of them) were resumed."""

    def episode(self, record: EpisodeRecord) -> None:
        """Called after each episode is written to disk."""


@dataclass
class _Slot:
    spec: EpisodeSpec
    t0: float
    queue: deque[np.ndarray] = field(default_factory=deque)
    steps: int = 0
    ret: float = 0.0
    latencies: list[float] = field(default_factory=list)
    frames: list[np.ndarray] | None = None


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


class _Run:
    """One call of :func:`run_eval` after the output folder is prepared."""

    def __init__(
        self, config: EvalConfig, suite: Suite, venv: BatchedEnv, chunks: ChunkSource, wire: WireMapping, out: Path
    ) -> None:
        self.config, self.suite, self.venv, self.chunks, self.wire, self.out = config, suite, venv, chunks, wire, out
        self.slots: list[_Slot | None] = [None] * venv.num_envs
        self.obs: dict[str, Any] = {}
        self.finished: list[EpisodeRecord] = []
        self.on_record: Callable[[EpisodeRecord], None] = lambda r: None

    def run(self, todo: list[EpisodeSpec]) -> None:
        pending = deque(todo)
        action_shape = self.venv.single_action_space.shape
        assert action_shape is not None
        dtype = self.venv.single_action_space.dtype
        phase = 0  # control steps since the envs were last all idle, modulo replan_steps
        while pending or any(self.slots):
            free = [i for i, s in enumerate(self.slots) if s is None]
            if free and pending:
                if len(free) == self.venv.num_envs:
                    phase = 0
                if phase == 0 or not self.config.align_starts:
                    self._fill(free, pending)
            active = [i for i, s in enumerate(self.slots) if s is not None]
            if not active:
                continue  # every reset failed; the next pending episodes get the slots
            need = [i for i in active if not self._slot(i).queue]
            if need:
                wire = [self.wire(batch_row(self.obs, i)) for i in need]
                chunks, latencies = self.chunks.query(wire)
                for i, chunk, latency in zip(need, chunks, latencies):
                    slot = self._slot(i)
                    slot.queue.extend(chunk[: self.config.replan_steps])
                    slot.latencies.append(latency)
            actions = np.zeros((self.venv.num_envs, *action_shape), dtype=dtype)
            mask = np.zeros(self.venv.num_envs, dtype=bool)
            for i in active:
                actions[i] = self._slot(i).queue.popleft()
                mask[i] = True
            self.obs, rewards, terminated, truncated, infos = self.venv.step(actions, mask=mask)
            phase = (phase + 1) % self.config.replan_steps
            for i in active:
                slot, info = self._slot(i), infos[i]
                if "worker_error" not in info:
                    slot.steps += 1
                    slot.ret += float(rewards[i])
                    if slot.frames is not None:
                        slot.frames.append(np.array(self.obs[self.suite.video_key][i]))
                if terminated[i] or truncated[i]:
                    reason = info.get("truncated_reason") or (None if terminated[i] else "max_steps")
                    self._finish(i, bool(info.get("is_success", False)), reason, info.get("worker_error"))

    def _slot(self, i: int) -> _Slot:
        slot = self.slots[i]
        assert slot is not None
        return slot

    def _fill(self, free: list[int], pending: deque[EpisodeSpec]) -> None:
        """Start the next pending episodes on the ``free`` envs (one partial reset)."""
        while free and pending:
            assigned = {i: pending.popleft() for i in free[: len(pending)]}
            mask = np.zeros(self.venv.num_envs, dtype=bool)
            mask[list(assigned)] = True
            specs = list(assigned.values())
            self.obs, infos = self.venv.reset(
                seeds=[s.seed for s in specs], options=[self.suite.reset_options(s) for s in specs], mask=mask
            )
            free = []
            for i, spec in assigned.items():
                self.slots[i] = _Slot(spec, time.perf_counter())
                if "truncated_reason" in infos[i]:  # the reset failed twice: record it, try the next episode
                    self._finish(i, False, str(infos[i]["truncated_reason"]), infos[i].get("worker_error"))
                    free.append(i)
                elif spec.video:
                    self._slot(i).frames = [np.array(self.obs[self.suite.video_key][i])]

    def _finish(self, i: int, success: bool, reason: str | None, error: Any) -> None:
        slot = self._slot(i)
        self.slots[i] = None
        video = None
        if slot.frames:
            video = f"{VIDEO_DIR}/{slot.spec.task}_ep{slot.spec.index:03d}.mp4"
            write_mp4(self.out / video, slot.frames, self.suite.fps)
        record = EpisodeRecord(
            task=slot.spec.task,
            episode=slot.spec.index,
            seed=slot.spec.seed,
            success=success,
            steps=slot.steps,
            episode_return=slot.ret,
            truncated_reason=reason,
            worker_error=None if error is None else str(error)[-2000:],
            latency=latency_summary(slot.latencies),
            latencies_ms=[round(x, 3) for x in slot.latencies],
            video=video,
            wall_s=round(time.perf_counter() - slot.t0, 3),
        )
        append_record(self.out / EPISODES_JSONL, record)
        self.finished.append(record)
        self.on_record(record)


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
    """
    callbacks = callbacks or EvalCallbacks()
    out = Path(out_dir)
    suite = get_suite(config.suite)
    tasks = suite.resolve_tasks(config.tasks)
    config = dataclasses.replace(config, tasks=tasks)  # saved resolved: "all tasks" is explicit on disk
    prepare_out_dir(out, config, overwrite=overwrite)
    records = load_records(out / EPISODES_JSONL)
    schedule = build_schedule(config, tasks)
    wanted = {s.key for s in schedule}
    resumed = [r for key, r in records.items() if key in wanted]
    todo = [s for s in schedule if s.key not in records]
    callbacks.start(len(schedule), len(resumed), sum(r.success for r in resumed))

    metadata = _jsonable(dict(policy.metadata or {}))
    spec = getattr(policy, "input_spec", None) or spec_from_metadata(metadata)
    t_setup = time.perf_counter()
    new: list[EpisodeRecord] = []
    requests = observations = 0
    t_loop = t_setup
    if todo:
        policy.reset()
        venv = make_vector_env(
            suite.make_env(tasks, config.image_size, config.max_steps),
            num_envs=min(config.num_envs, len(todo)),
            mode=config.vector_mode,  # type: ignore[arg-type]
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
            run = _Run(config, suite, venv, chunks, WireMapping(suite.wire_keys, spec), out)
            run.on_record = callbacks.episode
            t_loop = time.perf_counter()
            try:
                run.run(todo)
            finally:
                new = run.finished
                requests, observations = chunks.requests, chunks.observations
        finally:
            venv.close()
    loop_s = time.perf_counter() - t_loop

    all_records = sorted(
        [r for r in load_records(out / EPISODES_JSONL).values() if r.key in wanted],
        key=lambda r: (tasks.index(r.task), r.episode),
    )
    results: dict[str, Any] = {"suite": suite.name, "config": _jsonable(config.to_dict())}
    results.update(summarize(all_records, tasks))
    results["throughput"] = {
        "episodes_this_run": len(new),
        "episodes_resumed": len(resumed),
        "setup_s": round(t_loop - t_setup, 3),
        "loop_s": round(loop_s, 3),
        "episodes_per_min": round(60 * len(new) / loop_s, 3) if new and loop_s > 0 else 0.0,
        "requests": requests,
        "observations": observations,
        "mean_request_batch": round(observations / requests, 3) if requests else 0.0,
    }
    results["policy"] = {"source": config.policy, "kind": policy_kind, "metadata": metadata}
    results["episodes"] = [
        {k: v for k, v in r.to_json().items() if k not in ("latencies_ms", "worker_error")} for r in all_records
    ]
    results["created_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    json.dumps(results, allow_nan=False)  # fail here, not halfway through writing the file
    write_report(out, results, all_records)
    return results


def _policy_name(config: EvalConfig, policy: BasePolicy) -> str:
    url = getattr(policy, "url", None)
    return str(url) if url else config.policy
