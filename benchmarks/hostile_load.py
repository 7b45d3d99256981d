"""Hostile-load benchmark (issue 15): does one hostile client hurt a well-behaved one?

A server (constant policy, ``action_horizon=10``, transports ws + zmq + http) runs in a subprocess.
A well-behaved websocket client in this process sends LIBERO-sized observations in lockstep (with
``--think-ms`` between requests, like a robot) and records its round trips, alternating idle
phases (nobody else connected) with attack phases, in which a hostile client in its own subprocess
repeats one attack for the whole phase:

1. ``big_map``: a ~40 MB websocket frame holding a map of ``--map-keys`` keys;
2. ``batch_3200``: websocket ``{"batch": [obs] * 3200}``;
3. ``zmq_flood``: a ZMQ DEALER sending 4,000 ``get_action`` without reading the replies;
4. ``big_queue``: 150 ZMQ requests of 8 MiB each, sent without waiting (server RSS is reported);
5. ``http_trickle``: ``--http-conns`` HTTP connections trickling a request head one byte at a time;
6. ``decoder_bombs``: msgpack payloads that claim or nest far more than they carry.

Prints one JSON report and a markdown table: the good client's p50/p99 per phase and its p99
relative to the idle p99 (the issue's target: under 3x), its failed requests, the server's peak
RSS, and what the attacker saw. The idle baseline pools every idle phase, because on a shared
machine the background load drifts during a run. It is a measurement, not a test: it runs
whatever the server currently does.

    .venv/bin/python benchmarks/hostile_load.py                 # ~2 minutes
    .venv/bin/python benchmarks/hostile_load.py --delay-ms 5    # a policy that costs 5 ms per call
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ATTACKS = ("big_map", "batch_3200", "zmq_flood", "big_queue", "http_trickle", "decoder_bombs")
SMALL_OBS = {"observation/state": np.zeros(8, np.float32), "prompt": "pick up the bowl"}


def libero_obs() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8),
        "prompt": "pick up the black bowl between the plate and the ramekin and place it on the plate",
    }


# -- the server (child process) -------------------------------------------------------------------
def serve_child(delay_ms: float, overrides: dict[str, Any]) -> None:
    from cosmos_robot_server import PolicyServer, ServerConfig
    from cosmos_robot_server.example_policies import constant

    config = ServerConfig(port=0, zmq_port=0, http_port=0, transports=("ws", "zmq", "http"), **overrides)
    server = PolicyServer(constant(action_horizon=10, delay_ms=delay_ms), config).start_in_thread()
    print(json.dumps(server.ports), flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- the hostile client (child process) -----------------------------------------------------------
def _ws_connect(port: int) -> Any:
    from websockets.sync.client import connect

    conn = connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None, open_timeout=10, close_timeout=1)
    conn.recv(timeout=10)  # metadata
    return conn


def _ws_attack(port: int, payload: bytes, until: float, stats: dict[str, Any]) -> None:
    """Send ``payload`` over a fresh connection, read the answer, repeat until ``until``."""
    while time.perf_counter() < until:
        try:
            conn = _ws_connect(port)
            try:
                conn.send(payload)
                answer = conn.recv(timeout=max(0.1, until - time.perf_counter() + 5))
                stats["last_answer"] = answer[:160] if isinstance(answer, str) else f"<{len(answer)} bytes>"
            finally:
                conn.close()
        except Exception as exc:  # noqa: BLE001 - the attacker only records what happened
            stats["last_answer"] = f"{type(exc).__name__}: {str(exc)[:140]}"
        stats["rounds"] = stats.get("rounds", 0) + 1


def _bombs() -> list[bytes]:
    import msgpack

    from cosmos_robot_client.codec import packb

    n = 10_000_000
    return [
        b"\x91" * 100_000 + b"\xc0",  # a list nested 100,000 deep
        b"\xdd\xff\xff\xff\xff" + b"\xc0" * 16,  # an array claiming 4 billion items
        b"\xdd" + n.to_bytes(4, "big") + b"\xc0" * n,  # 10 MB that decodes to 10 million objects
        b"\xdf\xff\xff\xff\xff" + b"\xa1k\xc0" * 16,  # a map claiming 4 billion keys
        msgpack.packb({"x": {"__ndarray__": True, "data": b"", "dtype": "<f4", "shape": [100_000, 100_000]}}),
        packb({"x": {"__ndarray_class__": True, "as_npy": _npy_header((100_000, 100_000))}}),  # 40 GB claimed
    ]


def _npy_header(shape: tuple[int, ...]) -> bytes:
    """A .npy file header declaring ``shape`` of float32, with no data after it."""
    header = repr({"descr": "<f4", "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def _zmq_attack(port: int, payload: bytes, count: int, until: float, stats: dict[str, Any]) -> None:
    """A DEALER sends ``count`` requests without reading; the replies are drained afterwards."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    try:
        while time.perf_counter() < until:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(f"tcp://127.0.0.1:{port}")
            for _ in range(count):
                sock.send_multipart([b"", payload])
            errors, replies = 0, 0
            while sock.poll(int(max(0.05, until - time.perf_counter()) * 1000 + 2000)) and replies < count:
                body = msgpack.unpackb(sock.recv_multipart()[-1])
                replies += 1
                if isinstance(body, dict) and "error" in body:
                    errors += 1
                    stats["last_error"] = str(body["error"])[:200]
            sock.close(0)
            stats["rounds"] = stats.get("rounds", 0) + 1
            stats["replies"] = stats.get("replies", 0) + replies
            stats["error_replies"] = stats.get("error_replies", 0) + errors
    finally:
        ctx.destroy(linger=0)


def _http_trickle(port: int, conns: int, until: float, stats: dict[str, Any]) -> None:
    """Hold ``conns`` connections open, each sending its request head one byte per 0.5 s."""
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
    socks: list[tuple[socket.socket, int]] = []
    opened = closed = 0
    while time.perf_counter() < until:
        while len(socks) < conns:
            try:
                socks.append((socket.create_connection(("127.0.0.1", port), timeout=2), 0))
                opened += 1
            except OSError:
                break
        alive = []
        for sock, sent in socks:
            try:
                sock.send(head[sent % len(head) : sent % len(head) + 1])
                alive.append((sock, sent + 1))
            except OSError:
                sock.close()
                closed += 1
        socks = alive
        time.sleep(0.5)
    for sock, _ in socks:
        sock.close()
    stats.update(opened=opened, closed_by_server=closed)


def attack_child(name: str, ports: dict[str, int], seconds: float, map_keys: int) -> None:
    from cosmos_robot_client.codec import packb

    stats: dict[str, Any] = {}
    if name == "big_map":
        import msgpack

        payload = msgpack.packb({f"key{i:07d}": 0 for i in range(map_keys)})
        stats["frame_mb"] = round(len(payload) / 2**20, 1)
    elif name == "batch_3200":
        payload = packb({"batch": [SMALL_OBS] * 3200})
    elif name in ("zmq_flood", "big_queue"):
        data = SMALL_OBS if name == "zmq_flood" else {"observation/state": np.zeros(2 * 2**20, np.float32)}
        payload = packb({"endpoint": "get_action", "data": {"observation": data, "options": None}}, dialect="gr00t")
    print("ready", flush=True)
    sys.stdin.readline()  # the parent says go
    until = time.perf_counter() + seconds
    if name in ("big_map", "batch_3200"):
        _ws_attack(ports["ws"], payload, until, stats)
    elif name == "zmq_flood":
        _zmq_attack(ports["zmq"], payload, 4000, until, stats)
    elif name == "big_queue":
        _zmq_attack(ports["zmq"], payload, 150, until, stats)
    elif name == "http_trickle":
        _http_trickle(ports["http"], int(os.environ.get("HOSTILE_HTTP_CONNS", "200")), until, stats)
    else:
        bombs, i = _bombs(), 0
        while time.perf_counter() < until:
            _ws_attack(ports["ws"], bombs[i % len(bombs)], time.perf_counter() + 1e-3, stats)
            i += 1
    print(json.dumps(stats, default=str), flush=True)


# -- the well-behaved client and the phases (this process) ----------------------------------------
def good_client(port: int, seconds: float, think_s: float) -> dict[str, Any]:
    """Lockstep requests for ``seconds``; a failed request counts as an error and reconnects."""
    from cosmos_robot_client.codec import packb, unpackb

    payload = packb(libero_obs())
    lat: list[float] = []
    errors: list[str] = []
    conn = None
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        t0 = time.perf_counter()
        try:
            if conn is None:
                conn = _ws_connect(port)
                t0 = time.perf_counter()
            conn.send(payload)
            reply = conn.recv(timeout=10)
            if isinstance(reply, str):
                raise RuntimeError(reply[:160])
            assert unpackb(reply)["actions"].shape == (10, 7)
            lat.append((time.perf_counter() - t0) * 1000)
        except Exception as exc:  # noqa: BLE001 - recorded in the report
            errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
            if conn is not None:
                conn.close()
            conn = None
        time.sleep(think_s)
    if conn is not None:
        conn.close()
    return {**percentiles(lat), "errors": len(errors), "first_error": errors[0] if errors else None, "lat_ms": lat}


def percentiles(lat: list[float]) -> dict[str, Any]:
    arr = np.asarray(lat or [float("nan")])
    return {
        "n": len(lat),
        "p50_ms": round(float(np.percentile(arr, 50)), 2),
        "p99_ms": round(float(np.percentile(arr, 99)), 2),
        "max_ms": round(float(arr.max()), 2),
    }


def run_phase(name: str, ports: dict[str, int], server_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    child = None
    if name != "idle":
        cmd = [sys.executable, __file__, "--attack-child", name, "--ports", json.dumps(ports)]
        cmd += ["--seconds", str(args.seconds), "--map-keys", str(args.map_keys)]
        env = {**os.environ, "HOSTILE_HTTP_CONNS": str(args.http_conns)}
        child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready", f"{name}: attacker failed to start"
        child.stdin.write("go\n")
        child.stdin.flush()
    rss_before, peak = rss_mb(server_pid), [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss_mb(server_pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(0.3 if child else 0)  # let the attack get going
    good = good_client(ports["ws"], args.seconds, args.think_ms / 1000)
    attacker: dict[str, Any] = {}
    if child is not None:
        out, _ = child.communicate(timeout=args.seconds + 60)
        attacker = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": "no report"}
    done.set()
    sampler.join()
    rss = {"rss_before_mb": round(rss_before), "rss_peak_mb": round(peak[0])}
    return {"phase": name, **good, **rss, "attacker": attacker}


def _parse_setting(item: str) -> tuple[str, Any]:
    name, sep, raw = item.partition("=")
    if not sep:
        raise SystemExit(f"--server-set {item!r}: expected FIELD=VALUE, e.g. max_client_batch=64")
    try:
        return name.strip(), ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return name.strip(), raw


def markdown(rows: list[dict[str, Any]], idle: dict[str, Any]) -> str:
    """One row per attack (its p99 over the idle p99 of all idle phases pooled), then the idle rows."""
    lines = [
        f"Idle (all {sum(r['phase'] == 'idle' for r in rows)} idle phases pooled, {idle['n']} requests): "
        f"p50 {idle['p50_ms']:.2f} ms, p99 {idle['p99_ms']:.2f} ms.",
        "",
        "| phase | good p50 ms | good p99 ms | p99 / idle p99 | good requests | good errors | server RSS peak MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: r["phase"] == "idle"):
        ratio = r["p99_ms"] / idle["p99_ms"] if idle["p99_ms"] else float("nan")
        lines.append(
            f"| {r['phase']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | **{ratio:.2f}x** | {r['n']} | "
            f"{r['errors']} | {r['rss_peak_mb']} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    ap.add_argument("--think-ms", type=float, default=5.0, help="the good client's pause between requests")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="cost of one policy call (0: the free constant)")
    ap.add_argument("--map-keys", type=int, default=3_000_000, help="keys of the big_map attack's map")
    ap.add_argument("--http-conns", type=int, default=200, help="connections of the http_trickle attack")
    ap.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma list from {', '.join(ATTACKS)}")
    ap.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    ap.add_argument(
        "--server-set", action="append", default=[], metavar="FIELD=VALUE", help="a ServerConfig field (repeatable)"
    )
    ap.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--attack-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ports", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    overrides = dict(_parse_setting(item) for item in args.server_set)
    if args.serve_child:
        serve_child(args.delay_ms, overrides)
        return 0
    if args.attack_child:
        attack_child(args.attack_child, json.loads(args.ports), args.seconds, args.map_keys)
        return 0
    attacks = [a for a in args.attacks.split(",") if a]
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        ap.error(f"unknown attacks {unknown}; choose from {list(ATTACKS)}")
    cmd = [sys.executable, __file__, "--serve-child", "--delay-ms", str(args.delay_ms)]
    cmd += [f"--server-set={item}" for item in args.server_set]
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdin is not None
    ports = json.loads(server.stdout.readline())
    try:
        # an idle phase before every attack: the machine's background load drifts, and the pooled
        # idle samples are the baseline every attack is compared with
        rows = [run_phase(name, ports, server.pid, args) for attack in attacks for name in ("idle", attack)]
    finally:
        server.stdin.close()
        server.wait(30)
    idle = percentiles([x for r in rows if r["phase"] == "idle" for x in r["lat_ms"]])
    for r in rows:
        del r["lat_ms"]
    report = {
        "args": {k: v for k, v in vars(args).items() if k not in ("serve_child", "attack_child", "ports", "json")},
        "cpus": os.cpu_count(),
        "idle": idle,
        "phases": rows,
    }
    text = json.dumps(report, indent=2, default=str)
    print(text)
    print()
    print(markdown(rows, idle))
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
