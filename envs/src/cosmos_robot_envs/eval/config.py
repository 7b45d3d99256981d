"""What one evaluation run is: its config, its episode schedule and how each episode's seed is made.

Why seeds come from a hash of ``(seed, task, episode index)`` rather than a counter: an episode's
seed must not depend on how many tasks or episodes the run has, on the task order or on which env
slot ran it. Then ``push`` episode 3 is the same scene whether the run asks for 5 or 50 episodes
per task, a resumed run replays exactly the episodes it skipped, and 1, 4 or 16 envs give the same
per-episode outcomes for a deterministic policy.

``episode_seed(seed, task, index)`` is the first 4 bytes (big-endian) of
``sha256(f"{seed}/{task}/{index}")``, masked to 31 bits (valid for any numpy / gymnasium seeding).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "FAILURE_VIDEOS_PER_TASK",
    "RUNTIME_FIELDS",
    "EpisodeSpec",
    "EvalConfig",
    "VECTOR_MODES",
    "build_schedule",
    "check_rollout_fields",
    "config_mismatch",
    "episode_seed",
]

VECTOR_MODES = ("sync", "async")

# Fields that change how fast a run goes but not what any episode does: a resumed run may change them.
# (``video_failures`` only picks which failed episodes get an MP4.)
# (``infra_retries`` and the worker timeouts only decide how hard a failed simulator worker is retried.)
RUNTIME_FIELDS = frozenset(
    {
        "num_envs",
        "vector_mode",
        "batch_requests",
        "align_starts",
        "video_failures",
        "infra_retries",
        "step_timeout_s",
        "reset_timeout_s",
    }
)
FAILURE_VIDEOS_PER_TASK = 3  # with video_failures, MP4s of at most this many failed episodes per task


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation run. Saved as ``config.json`` in the output folder; a resume must match it."""

    policy: str  # what is evaluated: "ws://host:port" or "module:factory" (identity for resume checks)
    policy_args: dict[str, Any] = field(default_factory=dict)  # --policy-arg values of an in-process factory
    suite: str = "tabletop"  # env suite name (see suites.py)
    tasks: tuple[str, ...] = ()  # task names of the suite, in report order; empty = every task
    episodes_per_task: int = 10  # episodes per task
    num_envs: int = 4  # envs stepped in lockstep (one batched policy request per control step)
    replan_steps: int = 5  # actions executed open-loop from each chunk before asking again
    seed: int = 0  # base seed; each episode's seed derives from it, its task and its index (episode_seed)
    image_size: int = 128  # camera image side in pixels (square images)
    # "async" (one worker process per env: a crashed or hung simulator costs one episode, not the run,
    # and envs step on several cores) or "sync" (in-process)
    vector_mode: str = "async"
    video_episodes: int = 1  # record an MP4 of the first N episodes of every task (embedded in report.html)
    video_failures: bool = True  # with video_episodes >= 1, also film up to 3 failed episodes per task
    max_steps: int | None = None  # override every task's episode length (control steps); unset: each task's own
    batch_requests: bool = True  # one request for all envs needing a chunk; off: one request per env
    align_starts: bool = True  # start episodes on replan boundaries so all envs replan in the same request
    # reruns (same seed) of an episode lost to a crashed, hung or raising env worker; one still lost
    # after them is left missing (never a policy failure) for a rerun of the command to complete
    infra_retries: int = 2
    step_timeout_s: float = 60.0  # an env worker silent this long in a step counts as hung (async mode)
    reset_timeout_s: float = 120.0  # an env worker silent this long in a reset counts as hung (async mode)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))
        check_rollout_fields(self, ("episodes_per_task", "num_envs", "replan_steps", "image_size"), "EvalConfig.")
        if self.video_episodes < 0:
            raise ValueError(f"EvalConfig.video_episodes: expected >= 0, got {self.video_episodes}")
        if not isinstance(self.infra_retries, int) or self.infra_retries < 0:
            raise ValueError(f"EvalConfig.infra_retries: expected an int >= 0, got {self.infra_retries!r}")
        for name in ("step_timeout_s", "reset_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"EvalConfig.{name}: expected seconds > 0, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tasks"] = list(self.tasks)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"saved eval config has unknown field(s) {unknown}")
        return cls(**{**data, "tasks": tuple(data.get("tasks", ()))})


def check_rollout_fields(config: Any, positive: Iterable[str], prefix: str = "") -> None:
    """The checks every config of a suite rolled out on lockstep envs makes (this one, ``RecordConfig``).

    The fields named in ``positive`` must be ints >= 1, ``max_steps`` >= 1 or None, ``vector_mode`` one
    of ``VECTOR_MODES`` and ``tasks`` free of repeats. Each error names its field after ``prefix``.
    """
    for name in positive:
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{prefix}{name}: expected an int >= 1, got {value!r}")
    if config.max_steps is not None and config.max_steps < 1:
        raise ValueError(f"{prefix}max_steps: expected >= 1 or None, got {config.max_steps}")
    if config.vector_mode not in VECTOR_MODES:
        raise ValueError(f"{prefix}vector_mode: expected one of {VECTOR_MODES}, got {config.vector_mode!r}")
    if len(set(config.tasks)) != len(config.tasks):
        raise ValueError(f"{prefix}tasks: duplicate task names in {list(config.tasks)}")


def config_mismatch(saved: dict[str, Any], current: EvalConfig) -> list[str]:
    """The fields (other than RUNTIME_FIELDS) whose saved value differs, as ``name: saved -> current``.

    A field missing from ``saved`` (a run saved before the field existed) counts as its default.
    """
    now = json.loads(json.dumps(current.to_dict(), default=str))  # compare as saved (tuples become lists)
    defaults = {f.name: f.default for f in fields(EvalConfig) if f.default is not MISSING}
    saved = {**json.loads(json.dumps(defaults, default=str)), **saved}
    diffs = []
    for name in sorted(set(saved) | set(now)):
        if name in RUNTIME_FIELDS:
            continue
        if saved.get(name) != now.get(name):
            diffs.append(f"{name}: saved {saved.get(name)!r}, now {now.get(name)!r}")
    return diffs


def episode_seed(seed: int, task: str, index: int) -> int:
    """The reset seed of episode ``index`` of ``task`` (see the module docstring)."""
    digest = hashlib.sha256(f"{seed}/{task}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class EpisodeSpec:
    """One scheduled episode (an ``EpisodeSpecLike`` of ``cosmos_robot_envs.episodes``)."""

    task: str
    index: int  # episode index within its task
    seed: int
    video: bool  # record an MP4 of it

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.index)


def build_schedule(config: EvalConfig, tasks: tuple[str, ...]) -> list[EpisodeSpec]:
    """Episodes in run order: episode 0 of every task, then episode 1, ... (so early results cover all tasks)."""
    return [
        EpisodeSpec(task, i, episode_seed(config.seed, task, i), i < config.video_episodes)
        for i in range(config.episodes_per_task)
        for task in tasks
    ]
