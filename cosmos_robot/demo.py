"""``make demo``: serve the bundled checkpoint and evaluate it headless on parallel simulated envs.

Exactly what a user would type, in two processes: ``cosmos-robot serve --ckpt`` (the policy
server, websocket on a free loopback port) and ``cosmos-robot eval --policy ws://...`` (N tabletop
envs in lockstep, one batched request per control step). The eval prints the success table and
writes ``report.html`` / ``results.json`` / videos into ``--out``.

    python -m cosmos_robot.demo [--ckpt checkpoints/flow_tabletop] [--episodes-per-task 10] [--out out/demo]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CKPT = REPO / "checkpoints" / "flow_tabletop"
CLI = [sys.executable, "-m", "cosmos_robot.cli"]


def start_server(ckpt: Path, timeout_s: float = 120.0) -> tuple[subprocess.Popen[str], int]:
    """Start ``cosmos-robot serve --ckpt`` on a free port; returns the process and its websocket port."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*CLI, "serve", "--ckpt", str(ckpt), "--port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"cosmos-robot serve exited with {proc.returncode}:\n{''.join(lines)}")
        lines.append(line)
        match = re.search(r"ws ws://[\d.]+:(\d+)", line)
        if line.startswith("ready:") and match:
            return proc, int(match.group(1))
    proc.kill()
    raise TimeoutError(f"cosmos-robot serve did not become ready in {timeout_s:.0f} s:\n{''.join(lines)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", type=Path, default=DEFAULT_CKPT, help="checkpoint folder to serve")
    ap.add_argument("--episodes-per-task", type=int, default=10)
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("out/demo"))
    args = ap.parse_args()
    if not (args.ckpt / "config.json").exists():
        sys.exit(f"error: {args.ckpt} is not a checkpoint folder (no config.json)")
    print(f"serving {args.ckpt} ...", flush=True)
    server, port = start_server(args.ckpt)
    try:
        url = f"ws://127.0.0.1:{port}"
        print(f"server ready at {url}; evaluating on the tabletop suite ...", flush=True)
        cmd = [*CLI, "eval", "--policy", url, "--suite", "tabletop", "--episodes-per-task", str(args.episodes_per_task),
               "--num-envs", str(args.num_envs), "--out", str(args.out), "--overwrite"]  # fmt: skip
        rc = subprocess.run(cmd, check=False).returncode
    finally:
        server.terminate()
        server.wait(timeout=20)
    if rc != 0:
        sys.exit(rc)
    print(f"report: {args.out / 'report.html'}  (results: {args.out / 'results.json'})")


if __name__ == "__main__":
    main()
