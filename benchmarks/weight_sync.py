"""Learner -> Ray rollout worker weight sync: the object store against the collective broadcast.

What it times (median of ``--iters`` syncs after one warm-up, per model size): the learner's state
reaching ``--workers`` Ray actors, each loading it into a model of the same shape,

- ``object_store``: ``rl/workers.py``'s path: the state as numpy arrays, ``ray.put`` once, every actor
  gets it and ``load_state_dict``s it (``RolloutWorker.set_weights``);
- ``collective``: ``common/weight_sync.py``'s ``SyncGroup``: one flat buffer per dtype broadcast in a
  process group of the learner and the actors, written in place (gloo here; NCCL between GPUs).

The models are stacks of square linear layers (float32) of about ``--sizes`` million parameters.

    .venv/bin/python benchmarks/weight_sync.py --sizes 1 10 50 --workers 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch


def build(million: float) -> torch.nn.Module:
    width = 1024
    layers = max(1, round(million * 1e6 / (width * width + width)))
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


class Worker:
    """A Ray actor holding a model of the learner's shape, receiving both ways."""

    def __init__(self, million: float) -> None:
        torch.set_num_threads(1)
        self.model = build(million)
        self.group: Any = None

    def set_weights(self, state: dict[str, Any]) -> None:  # RolloutWorker.set_weights
        self.model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})

    def join(self, host: str, port: int, rank: int, size: int) -> None:
        from cosmos_robot_trainers.common.weight_sync import SyncGroup

        self.group = SyncGroup(host, port, rank, size, "gloo")

    def receive(self) -> None:
        self.group.broadcast(list(self.model.state_dict().values()))

    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.model.parameters()))


def measure(ray: Any, million: float, workers: int, iters: int) -> dict[str, Any]:
    """One model size: both ways' median sync time, each checked against the learner's weights."""
    from cosmos_robot_trainers.common.weight_sync import SyncGroup, free_port

    model = build(million)
    actors = [ray.remote(Worker).options(num_cpus=0).remote(million) for _ in range(workers)]
    host = ray.util.get_node_ip_address()
    port = free_port(host)
    joins = [a.join.remote(host, port, w + 1, workers + 1) for w, a in enumerate(actors)]
    group = SyncGroup(host, port, 0, workers + 1, "gloo")
    ray.get(joins)

    def object_store() -> None:
        ref = ray.put({k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
        ray.get([a.set_weights.remote(ref) for a in actors])

    def collective() -> None:
        futures = [a.receive.remote() for a in actors]
        group.broadcast(list(model.state_dict().values()))
        ray.get(futures)

    row: dict[str, Any] = {"million_params": round(sum(p.numel() for p in model.parameters()) / 1e6, 2)}
    row["workers"] = workers
    try:
        for name, fn in (("object_store", object_store), ("collective", collective)):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)  # new weights every round
            fn()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            want = float(sum(p.double().sum() for p in model.parameters()))
            held = ray.get([a.checksum.remote() for a in actors])
            if any(abs(c - want) > 1e-6 * abs(want) + 1e-3 for c in held):
                raise RuntimeError(f"{name}: the workers hold {held}, the learner {want}")
            row[f"{name}_ms"] = round(statistics.median(times), 1)
    finally:
        group.close()
        for a in actors:
            ray.kill(a)
    row["ratio_object_store_over_collective"] = round(row["object_store_ms"] / row["collective_ms"], 2)
    return row


def main(argv: list[str] | None = None) -> int:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1.0, 10.0, 50.0], help="million parameters")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows = []
    try:
        for million in args.sizes:
            rows.append(measure(ray, million, args.workers, args.iters))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
