"""Concurrency sweep through the real server: what a robot sees at 1, 2, 4, 8, 16 clients.

Why (issue 19): a policy's model call says little about what a control loop gets through the server;
the tail does. This script serves a checkpoint with ``cosmos-robot serve --ckpt`` in its own process
(as a user runs it: warm-up, then ``/readyz``), and drives it with N websocket clients (our client
library), each in its own process as robots are separate machines, every one a closed loop:

- ``flat``: the next request as soon as the reply is in (throughput, batching under pressure);
- ``paced``: one request per ``1 / --pace-hz`` seconds, as a robot asks for chunks (a late reply
  starts the next period at once).

For each (clients, mode) it reports latency p50 / p99 / max, throughput, the batch-size histogram (the
``server_timing.batch_size`` every reply carries), the model-call time per batch size
(``policy_timing.infer_ms``: the policy's own call, measured in the server) and, at the end, the
server's ``cosmos_robot_after_ready_total`` counters: compilations, CUDA-graph captures and unseen
shapes after ``/readyz``, which must all be 0. Observations follow the server's own input spec (random
images and state, one fixed prompt).

    # on the GPU machine, released shapes, random weights:
    python benchmarks/serving_sweep.py --build pi05 --size released --device cuda -a compile=true -a attention=math
    python benchmarks/serving_sweep.py --build groot --size released --device cuda -a dtype=bfloat16 \
        -a gpu_images=true --replicas 1 2  # one server per replica count, in turn
    python benchmarks/serving_sweep.py --build cosmos3 --size released --device cuda --clients 1 2 4 --duration 20
    # anywhere (what the script itself is checked with):
    python benchmarks/serving_sweep.py --build pi05 --size tiny --device cpu --clients 1 2 --duration 2
    python benchmarks/serving_sweep.py --ckpt checkpoints/flow_tabletop --device cpu
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


# -- checkpoints ---------------------------------------------------------------------------------
def build_folder(family: str, size: str, root: Path, device: str) -> Path:
    """A checkpoint folder of ``family`` at ``size`` (``tiny`` or ``released``) with random weights."""
    if family == "pi05":
        return _build_pi05(size, root / "pi05", device)
    if family == "groot":
        from cosmos_robot.policies.groot.tiny import build_tiny_groot

        return build_tiny_groot(root / "groot", size=size)
    if family == "cosmos3":
        from cosmos_robot.policies.cosmos3.tiny import build_tiny_cosmos3

        folder = build_tiny_cosmos3(root / "cosmos3")
        if size == "released":  # Nano's shapes, random weights, in place of the tiny pipeline
            import torch
            from cosmos3_latency import build_nano_pipeline

            build_nano_pipeline(device, torch.bfloat16).save_pretrained(folder)
        return folder
    raise SystemExit(f"--build {family!r}: choose pi05, groot or cosmos3")


def _build_pi05(size: str, folder: Path, device: str) -> Path:
    import parity_pi05 as parity
    import torch

    from cosmos_robot.policies.pi05.modeling import GemmaSpec, Pi05Architecture, Pi05Model, VisionSpec
    from cosmos_robot.policies.pi05.policy import Pi05Policy
    from cosmos_robot.policies.pi05.tokenizer import make_byte_tokenizer

    cfg = parity.make_config("tiny" if size == "tiny" else "full", device, "bfloat16")
    tiny = {
        "vlm": GemmaSpec(**parity.TINY),
        "expert": GemmaSpec(**parity.TINY),
        "vision": VisionSpec(**parity.TINY_VISION),
    }
    arch = Pi05Architecture(chunk_size=cfg.chunk_size, **(tiny if size == "tiny" else {}))
    with torch.device(device):
        model = Pi05Model(arch).to(torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, device=device) * 0.05)
    policy = Pi05Policy.from_model(model, cfg, parity.make_stats(0), make_byte_tokenizer(), cuda_graphs=False)
    return Path(policy.save_pretrained(folder))


# -- the server ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    args: argparse.Namespace, folder: Path, port: int, log: Path, replicas: int = 1
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "cosmos_robot.cli", "serve", "--ckpt", str(folder), "--port", str(port),
        "--transport", "ws", "--max-batch", str(args.max_batch), "--device", args.device, "--warmup", args.warmup,
        "--replicas", str(replicas),
    ]  # fmt: skip
    for item in args.policy_arg:
        cmd += ["-a", item]
    if args.no_paced_peers:
        cmd.append("--no-paced-peers")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; its log:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
                if reply.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server not ready after {timeout_s:.0f} s; its log:\n{log.read_text()[-4000:]}")


def after_ready(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = re.findall(r'^cosmos_robot_after_ready_total\{kind="(\w+)"\} (\S+)$', text, flags=re.M)
    counters = {kind: float(value) for kind, value in found}
    # the collector's pauses over the server's life (the heap is frozen after warm-up: gc_watch.py)
    for gen, count in re.findall(r'^cosmos_robot_gc_pause_seconds_count\{generation="(\d)"\} (\S+)$', text, re.M):
        counters[f"gc_gen{gen}_collections"] = float(count)
    for gen, total in re.findall(r'^cosmos_robot_gc_pause_seconds_sum\{generation="(\d)"\} (\S+)$', text, re.M):
        counters[f"gc_gen{gen}_seconds"] = float(total)
    return counters


# -- the load ------------------------------------------------------------------------------------
def observation(metadata: dict[str, Any], seed: int, prompt: str) -> dict[str, Any]:
    """``cosmos-robot probe``'s observation for this server (one name per input, 224 px images) with
    random pixels and state, and ``prompt`` for the text fields."""
    from cosmos_robot.probe import example_observation

    rng = np.random.default_rng(seed)
    obs: dict[str, Any] = {}
    for key, value in example_observation(metadata).items():
        if isinstance(value, np.ndarray) and value.dtype == np.uint8:
            obs[key] = rng.integers(0, 256, value.shape, dtype=np.uint8)
        elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
            obs[key] = rng.uniform(-1, 1, value.shape).astype(value.dtype)
        elif isinstance(value, str):
            obs[key] = prompt
        else:
            obs[key] = value
    return obs


def client_process(
    port: int, index: int, metadata: dict[str, Any], prompt: str, period: float, window: tuple[float, float, float]
) -> list[tuple[float, int, float]]:
    """One robot: connect, then from ``window[0]`` (wall clock) ask for chunks in a closed loop until
    ``window[2]``, recording those sent after ``window[1]`` as (latency ms, batch size, model call ms)."""
    from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

    conn = WebsocketClientPolicy("127.0.0.1", port)
    obs = observation(metadata, index, prompt)
    conn.infer(obs)  # connected and served once before the clock starts
    start, measure_from, end = window
    time.sleep(max(0.0, start - time.time()))
    records: list[tuple[float, int, float]] = []
    next_at = time.perf_counter()
    while time.time() < end:
        if period:
            time.sleep(max(0.0, next_at - time.perf_counter()))
            next_at = max(next_at + period, time.perf_counter())
        sent = time.time()
        t0 = time.perf_counter()
        reply = conn.infer(obs)
        latency_ms = (time.perf_counter() - t0) * 1e3
        if measure_from <= sent < end:
            timing = reply.get("server_timing", {})
            policy_ms = float(reply.get("policy_timing", {}).get("infer_ms", float("nan")))
            records.append((latency_ms, int(timing.get("batch_size", 1)), policy_ms))
    conn.close()
    return records


def run_point(port: int, clients: int, mode: str, args: argparse.Namespace, metadata: dict[str, Any]) -> dict[str, Any]:
    """``clients`` robots, each its own process (as robots are separate machines: one load-generating
    process would serialise their encoding on its GIL and make late requests of its own), for
    ``args.duration`` seconds after ``args.warmup_s``."""
    period = 1.0 / args.pace_hz if mode == "paced" else 0.0
    start = time.time() + args.spawn_s  # every process is connected and waiting by then
    window = (start, start + args.warmup_s, start + args.warmup_s + args.duration)
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
    with ProcessPoolExecutor(max_workers=clients, mp_context=context) as pool:
        futures = [pool.submit(client_process, port, i, metadata, args.prompt, period, window) for i in range(clients)]
        records = [r for f in futures for r in f.result()]
    return summarize(clients, mode, records, args.duration)


def summarize(clients: int, mode: str, records: list[tuple[float, int, float]], duration: float) -> dict[str, Any]:
    if not records:
        return {"clients": clients, "mode": mode, "requests": 0}
    lat = np.array([r[0] for r in records])
    sizes = Counter(r[1] for r in records)
    per_size: dict[int, list[float]] = {}
    for _, size, policy_ms in records:
        per_size.setdefault(size, []).append(policy_ms)
    p50, p99 = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
    main_size = max(sizes, key=lambda s: sizes[s])
    model_ms = float(np.median(per_size[main_size]))
    return {
        "clients": clients,
        "mode": mode,
        "requests": len(records),
        "req_per_s": len(records) / duration,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": float(lat.max()),
        "p99_over_p50": p99 / p50,
        "batch_sizes": {str(k): v for k, v in sorted(sizes.items())},  # requests served in calls of that size
        "model_call_ms": {str(k): float(np.median(v)) for k, v in sorted(per_size.items())},
        # the slowest calls: a p99 spike that is in the model call is not queueing or transport
        "model_call_p99_ms": float(np.percentile([r[2] for r in records], 99)),
        "main_batch": main_size,
        "p50_over_model_call": p50 / model_ms,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| replicas | clients | mode | req/s | p50 ms | p99 ms | max ms | p99/p50 | batch sizes (requests) "
        "| model call ms (median, by batch) | model call p99 ms | p50 / model call |"
    )
    lines = [head, "|---:|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        if not r["requests"]:
            lines.append(f"| {r.get('replicas', 1)} | {r['clients']} | {r['mode']} | 0 | | | | | | | | |")
            continue
        sizes = ", ".join(f"{k}: {v}" for k, v in r["batch_sizes"].items())
        calls = ", ".join(f"{k}: {v:.1f}" for k, v in r["model_call_ms"].items())
        lines.append(
            f"| {r.get('replicas', 1)} | {r['clients']} | {r['mode']} | {r['req_per_s']:.1f} "
            f"| {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
            f"| {r['max_ms']:.1f} | {r['p99_over_p50']:.2f} | {sizes} | {calls} | {r['model_call_p99_ms']:.1f} "
            f"| {r['p50_over_model_call']:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", type=Path, help="a checkpoint folder to serve")
    src.add_argument("--build", choices=["pi05", "groot", "cosmos3"], help="build a random-weight folder first")
    ap.add_argument("--size", choices=["tiny", "released"], default="released", help="with --build")
    ap.add_argument("--work", type=Path, default=None, help="where --build writes (default: a temp folder)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("-a", "--policy-arg", action="append", default=[], help="passed to serve -a (repeatable)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--modes", nargs="+", choices=["paced", "flat"], default=["paced", "flat"])
    ap.add_argument("--pace-hz", type=float, default=10.0, help="requests per second of a paced client")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    ap.add_argument("--warmup-s", type=float, default=2.0, help="unmeasured seconds before each point")
    ap.add_argument("--spawn-s", type=float, default=5.0, help="seconds the client processes get to start")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument(
        "--replicas", type=int, nargs="+", default=[1], help="serve --replicas; several: one server each, in turn"
    )
    ap.add_argument("--warmup", default="auto", help="serve --warmup")
    ap.add_argument(
        "--no-paced-peers",
        action="store_true",
        help="serve --no-paced-peers: do not wait for clients due at their cadence",
    )
    ap.add_argument(
        "--prompt",
        default="pick up the black bowl between the plate and the ramekin and put it on the plate",
    )
    ap.add_argument("--ready-timeout-s", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="sweep_"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    folder = args.ckpt or build_folder(args.build, args.size, work, args.device)
    build_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    counters: dict[str, dict[str, float]] = {}
    ready: dict[str, float] = {}
    meta: dict[str, Any] = {}
    for replicas in args.replicas:
        port, log = free_port(), work / f"server_r{replicas}.log"
        proc = start_server(args, folder, port, log, replicas)
        try:
            ready[str(replicas)] = wait_ready(port, proc, args.ready_timeout_s, log)
            from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

            probe = WebsocketClientPolicy("127.0.0.1", port)
            meta = probe.get_server_metadata()
            probe.close()
            print(
                f"{folder}: built in {build_s:.0f} s, {replicas} replica(s) ready in {ready[str(replicas)]:.0f} s "
                f"(type {meta.get('type')})",
                flush=True,
            )
            for n in args.clients:
                for mode in args.modes:
                    rows.append({"replicas": replicas, **run_point(port, n, mode, args, meta)})
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
            counters[str(replicas)] = after_ready(port)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    report = {
        "folder": str(folder),
        "family": meta.get("type"),
        "device": args.device,
        "policy_args": args.policy_arg,
        "paced_peers": not args.no_paced_peers,
        "pace_hz": args.pace_hz,
        "duration_s": args.duration,
        "build_s": build_s,
        "ready_s": ready,
        "after_ready": counters,
        "rows": rows,
    }
    print(table(rows))
    print(f"after /readyz: {counters}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
