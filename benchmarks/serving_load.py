"""Load generator for benchmarks/serving.py, run in the openpi venv with openpi's OWN client.

Using openpi-client 0.1.2 against both servers keeps the client side identical and shows that
our server answers openpi clients unchanged. Prints one JSON line with latencies and throughput.

    .venv-openpi/bin/python benchmarks/serving_load.py --port 8000 --clients 16 --duration 5
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy


def libero_obs(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(8),
        "prompt": "pick up the black bowl between the plate and the ramekin and place it on the plate",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    args = ap.parse_args()

    clients = [WebsocketClientPolicy("127.0.0.1", args.port) for _ in range(args.clients)]
    latencies: list[list[float]] = [[] for _ in clients]
    start_barrier = threading.Barrier(args.clients + 1)
    t_measure = [0.0, 0.0]

    def worker(i: int) -> None:
        obs = libero_obs(i)
        start_barrier.wait()
        while True:
            t0 = time.perf_counter()
            if t0 >= t_measure[1]:
                return
            reply = clients[i].infer(obs)
            t1 = time.perf_counter()
            assert reply["actions"].shape == (10, 7), reply["actions"].shape
            if t0 >= t_measure[0]:
                latencies[i].append((t1 - t0) * 1000)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    now = time.perf_counter()
    t_measure[0] = now + args.warmup
    t_measure[1] = now + args.warmup + args.duration
    start_barrier.wait()
    for t in threads:
        t.join()
    flat = np.array([x for lat in latencies for x in lat])
    print(
        json.dumps(
            {
                "clients": args.clients,
                "requests": int(flat.size),
                "throughput_rps": float(flat.size / args.duration),
                "p50_ms": float(np.percentile(flat, 50)),
                "p99_ms": float(np.percentile(flat, 99)),
                "mean_ms": float(flat.mean()),
            }
        )
    )


if __name__ == "__main__":
    main()
