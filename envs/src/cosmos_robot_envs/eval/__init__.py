"""Headless parallel evaluation: ``cosmos-robot eval`` without the CLI.

Why it lives in the torch-free envs package: a simulator box evaluates a policy served elsewhere, so
it needs the envs, the vector layer and a websocket client, not torch. The caller hands in the policy
object (a ``WebsocketClientPolicy``, or anything the CLI loaded in-process); nothing here imports
the ``cosmos_robot`` root package.

Example::

    from cosmos_robot_envs.eval import EvalConfig, connect_websocket, run_eval

    policy = connect_websocket("ws://127.0.0.1:8000")
    config = EvalConfig(policy=policy.url, tasks=("reach", "push"), episodes_per_task=20, num_envs=8)
    results = run_eval(config, policy, "runs/eval1", policy_kind="websocket")
    print(results["totals"]["success_rate"])

Output folder: ``config.json``, ``episodes.jsonl`` (one record per policy-scored episode; the resume
point), ``infra_failures.jsonl`` (attempts lost to crashed or hung simulator workers),
``results.json``, ``report.html``, ``success_rate.png``, ``latency_hist.png``, ``videos/*.mp4``.
"""

from cosmos_robot_envs.eval.chunks import ChunkSource, PolicyOutputError
from cosmos_robot_envs.eval.config import RUNTIME_FIELDS, EpisodeSpec, EvalConfig, build_schedule, episode_seed
from cosmos_robot_envs.eval.outdir import ConfigMismatchError
from cosmos_robot_envs.eval.records import EpisodeRecord, InfraEvent, load_events, load_records
from cosmos_robot_envs.eval.remote import connect_websocket, is_websocket_url
from cosmos_robot_envs.eval.runner import EvalCallbacks, run_eval
from cosmos_robot_envs.eval.stats import summarize, wilson_interval
from cosmos_robot_envs.eval.suites import SUITE_NAMES, Suite, get_suite
from cosmos_robot_envs.eval.wire import TABLETOP_KEYS, WireMapping

__all__ = [
    "RUNTIME_FIELDS",
    "SUITE_NAMES",
    "TABLETOP_KEYS",
    "ChunkSource",
    "ConfigMismatchError",
    "EpisodeRecord",
    "EpisodeSpec",
    "EvalCallbacks",
    "EvalConfig",
    "InfraEvent",
    "PolicyOutputError",
    "Suite",
    "WireMapping",
    "build_schedule",
    "connect_websocket",
    "episode_seed",
    "get_suite",
    "is_websocket_url",
    "load_events",
    "load_records",
    "run_eval",
    "summarize",
    "wilson_interval",
]
