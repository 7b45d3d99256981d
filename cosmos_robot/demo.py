"""``make demo``: serve a bundled policy and drive it with every client dialect we speak.

It starts the policy server on all three transports (loopback, free ports), then talks to it the
way real clients do: openpi's own ``openpi-client`` from PyPI (when its venv exists), our websocket
client (single requests and one batched request for 8 environments), a GR00T N1.6 ZMQ client and
cosmos-framework's LIBERO JSON dialect over HTTP. It prints one table and writes
``out/demo/report.json``. The bundled policy is the example constant policy until trained
checkpoints are bundled.

    python -m cosmos_robot.demo [--out out/demo]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from rich.console import Console
from rich.table import Table

from cosmos_robot.probe import latency_summary
from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
from cosmos_robot_client.zmq_client_policy import ZmqClientPolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantBatchPolicy, libero_input_spec

REPO = Path(__file__).resolve().parents[1]
OPENPI_PY = REPO / ".venv-openpi" / "bin" / "python"
N = 20


def _libero_obs(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8),
        "prompt": "put the red cube in the bowl",
    }


def _timed(fn: Any, n: int = N) -> tuple[Any, list[float]]:
    out, samples = None, []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return out, samples


def _openpi_row(port: int) -> dict[str, Any] | None:
    if not OPENPI_PY.exists():
        return None
    code = (
        "import json, time, numpy as np\n"
        "from openpi_client.websocket_client_policy import WebsocketClientPolicy\n"
        f"c = WebsocketClientPolicy('127.0.0.1', {port})\n"
        "rng = np.random.default_rng(0)\n"
        "obs = {'observation/image': rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),\n"
        "       'observation/wrist_image': rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),\n"
        "       'observation/state': np.zeros(8), 'prompt': 'put the red cube in the bowl'}\n"
        "ms = []\n"
        f"for _ in range({N}):\n"
        "    t0 = time.perf_counter(); r = c.infer(obs); ms.append((time.perf_counter() - t0) * 1000)\n"
        "print(json.dumps({'shape': list(r['actions'].shape), 'ms': ms}))\n"
    )
    res = subprocess.run([str(OPENPI_PY), "-c", code], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"openpi client failed:\n{res.stderr}")
    data = json.loads(res.stdout.strip().splitlines()[-1])
    return {"client": "openpi-client 0.1.2 (PyPI)", "transport": "ws", "shape": tuple(data["shape"]), "ms": data["ms"]}


def _http_row(port: int) -> dict[str, Any]:
    img = np.zeros((256, 512, 3), np.uint8)
    img[:, 256:] = 255
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    item = {"image": base64.b64encode(buf.getvalue()).decode(), "prompt": "put the red cube in the bowl",
            "domain_name": "libero", "image_size": 256}  # fmt: skip
    body = json.dumps({"items": [item] * 4}).encode()

    def post() -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/predict_batch", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    out, ms = _timed(post)
    shape = np.asarray(out["actions"]).shape
    return {"client": "cosmos-framework LIBERO JSON, batch of 4", "transport": "http", "shape": shape, "ms": ms}


def run(out_dir: Path) -> dict[str, Any]:
    policy = ConstantBatchPolicy(10, 7, spec=libero_input_spec(state_optional=True))
    config = ServerConfig(port=0, zmq_port=0, http_port=0, transports=("ws", "zmq", "http"))
    rows: list[dict[str, Any]] = []
    with PolicyServer(policy, config) as server:
        ports = server.ports
        openpi = _openpi_row(ports["ws"])
        if openpi:
            rows.append(openpi)
        with WebsocketClientPolicy("127.0.0.1", ports["ws"]) as ws:
            meta = ws.get_server_metadata()
            obs = _libero_obs(0)
            reply, ms = _timed(lambda: ws.infer(obs))
            rows.append({"client": "cosmos-robot-client (ws)", "transport": "ws", "shape": reply["actions"].shape,
                         "ms": ms})  # fmt: skip
            batch = [_libero_obs(i) for i in range(8)]
            replies, ms = _timed(lambda: ws.infer_batch(batch))
            rows.append({"client": "cosmos-robot-client, batch of 8 envs", "transport": "ws",
                         "shape": (len(replies), *replies[0]["actions"].shape), "ms": ms})  # fmt: skip
        with ZmqClientPolicy("127.0.0.1", ports["zmq"]) as zmq_client:
            (action, _info), ms = _timed(lambda: zmq_client.get_action(_libero_obs(1)))
            rows.append({"client": "GR00T N1.6 ZMQ (cosmos-robot-client)", "transport": "zmq",
                         "shape": action["actions"].shape, "ms": ms})  # fmt: skip
        rows.append(_http_row(ports["http"]))
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    console = Console()
    table = Table(title="cosmos-robot demo: one policy server, every client dialect")
    for col in ("client", "transport", "actions", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right" if "ms" in col else "left")
    report_rows = []
    for row in rows:
        s = latency_summary(row["ms"])
        table.add_row(row["client"], row["transport"], str(tuple(row["shape"])), f"{s['p50']:.2f}", f"{s['p99']:.2f}")
        report_rows.append({k: v for k, v in row.items() if k != "ms"} | {"latency_ms": s})
    console.print(table)
    batches = policy.batch_sizes
    console.print(f"policy calls: {len(batches)}, largest batch: {max(batches)}, metadata keys: {sorted(meta)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"rows": report_rows, "metadata": meta, "policy_batch_sizes": batches, "metrics": metrics}
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=list))
    console.print(f"wrote {out_dir / 'report.json'}")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/demo"))
    run(ap.parse_args().out)


if __name__ == "__main__":
    main()
