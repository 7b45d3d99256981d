"""Serving benchmark: our server vs openpi-server 0.1.0, same trivial policy, same client, one run.

What is measured (LIBERO-sized request: two 224x224x3 uint8 images + 8-D state + prompt):
  1. round-trip p50/p99 with one client and a free policy (pure transport overhead);
  2. throughput and p50 with 1, 4 and 16 concurrent clients when the policy costs 20 ms per call.
     "Per call" is the point: like a GPU forward pass, the cost barely grows with batch size, so our
     cross-connection batching turns 16 waiting clients into one call. openpi's server calls the
     policy once per request on its event loop. We also run our server with a policy that has NO
     batch support (20 ms per observation), to show what batching alone buys.
Both servers run as subprocesses; the load generator is openpi-client 0.1.2 itself (in .venv-openpi).

    .venv/bin/python benchmarks/serving.py --write docs/benchmarks.md      (or: make bench)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPENPI_PY = REPO / ".venv-openpi" / "bin" / "python"
SECTION = "## Serving (websocket, LIBERO-sized requests)"

OURS = """
import sys
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantBatchPolicy, ConstantPolicy, libero_input_spec
port, delay, batched = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
cls = ConstantBatchPolicy if batched else ConstantPolicy
policy = cls(10, 7, delay_ms=delay, spec=libero_input_spec())
PolicyServer(policy, ServerConfig(port=port, transports=("ws",))).serve_forever()  # defaults
"""

OPENPI = """
import sys, time, numpy as np
from openpi_server.websocket_policy_server import WebsocketPolicyServer
port, delay = int(sys.argv[1]), float(sys.argv[2]) / 1000.0
class Constant:
    def infer(self, obs):
        if delay:
            time.sleep(delay)
        return {"actions": np.zeros((10, 7), dtype=np.float32)}
    def reset(self):
        pass
WebsocketPolicyServer(Constant(), host="127.0.0.1", port=port).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"server on {port} not healthy after {timeout} s")


def run_case(server: str, delay_ms: float, clients: list[int], duration: float) -> list[dict[str, float]]:
    port = free_port()
    if server == "openpi":
        cmd = [str(OPENPI_PY), "-c", OPENPI, str(port), str(delay_ms)]
    else:
        cmd = [sys.executable, "-c", OURS, str(port), str(delay_ms), "0" if server == "ours-unbatched" else "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, proc)
        rows = []
        for n in clients:
            out = subprocess.run(
                [str(OPENPI_PY), str(REPO / "benchmarks" / "serving_load.py"), "--port", str(port),
                 "--clients", str(n), "--duration", str(duration)],
                capture_output=True, text=True, timeout=duration * 4 + 120, check=True,
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(server=server, delay_ms=delay_ms)
            rows.append(row)
            rate, p50, p99 = row["throughput_rps"], row["p50_ms"], row["p99_ms"]
            print(f"  {server:15s} policy {delay_ms:4.0f} ms  clients {n:2d}: "
                  f"{rate:7.1f} req/s  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms", flush=True)  # fmt: skip
        return rows
    finally:
        proc.terminate()
        proc.wait(10)


def render(rows: list[dict[str, float]], duration: float, command: str) -> str:
    def get(server: str, delay: float, n: int) -> dict[str, float]:
        return next(r for r in rows if r["server"] == server and r["delay_ms"] == delay and r["clients"] == n)

    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    machine = f"{platform.machine()} with {os.cpu_count()} CPU cores, Python {platform.python_version()}"
    lines = [SECTION, "", f"Command: `{command}`  ", f"Run: {when} on {machine}; client = openpi-client 0.1.2 "
             f"for both servers; {duration:.0f} s per point after 1 s warm-up.", ""]  # fmt: skip
    free_o, free_u = median_run(rows, "openpi"), median_run(rows, "ours")
    runs = sum(1 for r in rows if r["server"] == "ours" and r["delay_ms"] == 0)
    pairs = sorted(
        u["p50_ms"] / o["p50_ms"]
        for o in rows
        for u in rows
        if o["server"] == "openpi" and u["server"] == "ours" and o["delay_ms"] == u["delay_ms"] == 0
        and o.get("repeat") == u.get("repeat")
    )  # fmt: skip
    lines += [f"**Free policy, 1 client (transport overhead)**: the median of {runs} alternating runs each", "",
              "| server | p50 ms | p99 ms | req/s |", "|---|---:|---:|---:|"]  # fmt: skip
    for name, r in (("openpi-server 0.1.0", free_o), ("cosmos-robot-server", free_u)):
        lines.append(f"| {name} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['throughput_rps']:.0f} |")
    lines.append(
        f"\nRatio ours/openpi p50: **{free_u['p50_ms'] / free_o['p50_ms']:.2f}** (target <= 1.0); per run "
        f"{', '.join(f'{x:.2f}' for x in pairs)}.\n"
    )
    lines += ["**Policy costing 20 ms per call**", "",
              "| clients | openpi req/s | openpi p50 ms | ours req/s | ours p50 ms | throughput ratio "
              "| ours, unbatched policy req/s |",
              "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for n in (1, 4, 16):
        o, u, ub = get("openpi", 20, n), get("ours", 20, n), get("ours-unbatched", 20, n)
        lines.append(
            f"| {n} | {o['throughput_rps']:.0f} | {o['p50_ms']:.1f} | {u['throughput_rps']:.0f} | {u['p50_ms']:.1f} "
            f"| **{u['throughput_rps'] / o['throughput_rps']:.1f}x** | {ub['throughput_rps']:.0f} |"
        )
    lines += ["", "Targets: 16 clients at least 8x openpi's throughput with p50 under 45 ms.", ""]
    return "\n".join(lines)


def median_run(rows: list[dict[str, float]], server: str) -> dict[str, float]:
    """The free-policy run of ``server`` with the median p50."""
    runs = sorted((r for r in rows if r["server"] == server and r["delay_ms"] == 0), key=lambda r: r["p50_ms"])
    return runs[len(runs) // 2]


def write_section(path: Path, text: str) -> None:
    old = (
        path.read_text()
        if path.exists()
        else "# Benchmarks\n\nEvery number here comes from a command in this repository; rerun it to check.\n"
    )
    if SECTION in old:
        head, _, rest = old.partition(SECTION)
        nxt = rest.find("\n## ")
        old = head + (rest[nxt + 1 :] if nxt >= 0 else "")
    path.write_text(old.rstrip() + "\n\n" + text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds measured per point")
    ap.add_argument("--write", type=Path, help="update this markdown file's serving section")
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs of the free-policy point (median)")
    args = ap.parse_args()
    if not OPENPI_PY.exists():
        sys.exit(f"{OPENPI_PY} missing: run `make setup` (it installs openpi-client/openpi-server from PyPI)")
    rows: list[dict[str, float]] = []
    for repeat in range(args.repeats):  # alternating, so drift on a shared machine hits both alike
        for server in ("openpi", "ours"):
            rows += [dict(r, repeat=repeat) for r in run_case(server, 0.0, [1], args.duration)]
    for server in ("openpi", "ours", "ours-unbatched"):
        rows += run_case(server, 20.0, [1, 4, 16], args.duration)
    command = "python benchmarks/serving.py" + (f" --write {args.write}" if args.write else "")
    text = render(rows, args.duration, command)
    print("\n" + text)
    if args.write:
        write_section(args.write, text)
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
