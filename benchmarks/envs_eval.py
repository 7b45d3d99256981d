"""Evaluation throughput: one batched request per control step vs one request per env.

Same server (a separate process, so it does not share our GIL), same envs, same episodes (same seeds).
Rows: ``batched`` (the default: one request per control step for every env that needs a chunk, and
episode starts aligned to replan boundaries so all envs replan together), ``batched, unaligned``
(episodes start as soon as a slot frees, so replans stagger) and ``sequential`` (one request per env,
the naive loop). Measured in episodes per minute of the eval loop (env start-up excluded), with the
requests sent and the mean observations per request; the ratio printed is batched / sequential.

Two policies are served:
  - ``expert``: the scripted tabletop expert, ~1 ms of CPU per observation and no ``infer_batch``,
    so batching only saves round trips (websocket framing, event-loop hops);
  - ``model``: the same expert behind ``infer_batch`` plus a fixed ``--model-ms`` delay per call, a
    stand-in for a GPU forward pass whose cost barely depends on the batch size. Sequential requests
    pay that cost N times per control step, a batched request once.

    MUJOCO_GL=egl .venv/bin/python benchmarks/envs_eval.py [--num-envs 8] [--episodes-per-task 8]
        [--image-size 128] [--model-ms 20] [--vector-mode async] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import tempfile
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

from rich.console import Console
from rich.table import Table

from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_envs.eval import EvalConfig, connect_websocket, run_eval
from cosmos_robot_envs.tabletop import ExpertPolicy


class SimulatedModelExpert(BatchPolicy):
    """The expert's answers at the price of a model: ``delay_ms`` per call, whatever the batch size."""

    def __init__(self, delay_ms: float) -> None:
        self.expert = ExpertPolicy()
        self.delay_s = delay_ms / 1000

    @property
    def metadata(self) -> dict[str, Any]:
        return {**self.expert.metadata, "policy": "SimulatedModelExpert", "delay_ms": self.delay_s * 1000}

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        time.sleep(self.delay_s)
        return [self.expert.infer(obs) for obs in obs_batch]


def _serve(kind: str, model_ms: float, port: int) -> None:
    from cosmos_robot_server import PolicyServer, ServerConfig

    policy = ExpertPolicy() if kind == "expert" else SimulatedModelExpert(model_ms)
    PolicyServer(policy, ServerConfig(port=port, max_batch_size=64)).serve_forever()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench(kind: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    port = _free_port()
    server = mp.get_context("spawn").Process(target=_serve, args=(kind, args.model_ms, port), daemon=True)
    server.start()
    url = f"ws://127.0.0.1:{port}"
    rows: dict[str, dict[str, Any]] = {}
    try:
        policy = connect_websocket(url, connect_timeout_s=60)
        for mode, batched, aligned in (
            ("batched", True, True),
            ("batched, unaligned", True, False),
            ("sequential", False, False),
        ):
            config = EvalConfig(
                policy=url,
                episodes_per_task=args.episodes_per_task,
                num_envs=args.num_envs,
                image_size=args.image_size,
                vector_mode=args.vector_mode,
                replan_steps=args.replan_steps,
                batch_requests=batched,
                align_starts=aligned,
                video_episodes=0,  # measure the loop, not the MP4 encoder
            )
            with tempfile.TemporaryDirectory() as out:
                results = run_eval(config, policy, out, policy_kind="websocket")
            thr = results["throughput"]
            rows[mode] = {
                "episodes_per_min": thr["episodes_per_min"],
                "episodes": thr["episodes_this_run"],
                "loop_s": thr["loop_s"],
                "requests": thr["requests"],
                "mean_request_batch": thr["mean_request_batch"],
                "latency_p50_ms": results["latency_ms"]["p50_ms"],
                "success_rate": results["totals"]["success_rate"],
            }
        policy.close()
    finally:
        server.terminate()
        server.join(10)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--episodes-per-task", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--replan-steps", type=int, default=5)
    parser.add_argument("--vector-mode", default="async", choices=["sync", "async"])
    parser.add_argument("--model-ms", type=float, default=20.0, help="per-call cost of the simulated model")
    parser.add_argument("--policies", default="expert,model", help="comma-separated: expert, model")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    results: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
        "settings": vars(args),
        "policies": {},
    }
    console = Console(width=120)
    console.print(results["machine"], f"| {args.num_envs} envs ({args.vector_mode}), {args.image_size}px")
    table = Table(title="eval throughput: one batched request per step vs one request per env")
    for col in ("policy", "requests", "episodes/min", "requests sent", "obs/request", "p50 latency ms", "success"):
        table.add_column(col, justify="left" if col in ("policy", "requests") else "right")
    for kind in [k.strip() for k in args.policies.split(",") if k.strip()]:
        rows = bench(kind, args)
        name = kind if kind == "expert" else f"model ({args.model_ms:g} ms/call)"
        for mode, row in rows.items():
            table.add_row(
                name,
                mode,
                f"{row['episodes_per_min']:.1f}",
                str(row["requests"]),
                f"{row['mean_request_batch']:.2f}",
                f"{row['latency_p50_ms']:.1f}",
                f"{100 * row['success_rate']:.0f}%",
            )
        ratio = rows["batched"]["episodes_per_min"] / max(rows["sequential"]["episodes_per_min"], 1e-9)
        results["policies"][kind] = {**rows, "ratio_batched_over_sequential": ratio}
    console.print(table)
    for kind, data in results["policies"].items():
        console.print(
            f"{kind}: batched / sequential episodes per minute = {data['ratio_batched_over_sequential']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
