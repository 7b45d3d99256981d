"""Weight sync by broadcast: a learner and its Ray rollout actors as one small process group of their own.

Why: the object-store sync (``rl/workers.py``) turns every weight into a numpy array, puts the whole
state in Ray's object store and has each actor copy it out and load it: host memory traffic several
times the model's size per iteration, and a device-to-host-to-device round trip when both sides are
on GPUs. ``rollout.weight_sync = "collective"`` instead joins the learner (rank 0) and its N actors
(ranks 1..N) into a process group of N + 1 and broadcasts the state in one flat buffer per dtype,
received in place into each actor's parameters: NCCL when the learner's model and the actors are on
GPUs (device to device), gloo otherwise.

The group is its own (a ``TCPStore`` on a free port of the learner's node and a ``ProcessGroupGloo`` /
``ProcessGroupNCCL`` built on it), not the default one, so it lives beside the data-parallel learners'
torchrun group. Before the first broadcast each actor reports its state's names, shapes and dtypes;
a mismatch with the learner's is an error naming the first differing entry, never a silent misload.
NCCL needs each member on its own GPU: ``choose_backend`` picks it only when every member holds its
model on a GPU and no two members share one (compared by device UUID); learners and actors that share
GPUs (``rollout.worker_gpus = 0.25``) broadcast over gloo.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

__all__ = [
    "SyncGroup",
    "broadcast_to",
    "check_manifests",
    "choose_backend",
    "device_id",
    "form_group",
    "free_port",
    "state_manifest",
]


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the store binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def device_id(tensor: torch.Tensor) -> str | None:
    """The UUID of the GPU holding ``tensor`` (None on the CPU): how members tell whether they share one."""
    if not tensor.is_cuda:
        return None
    return str(torch.cuda.get_device_properties(tensor.device).uuid)


def choose_backend(devices: Sequence[str | None]) -> str:
    """``"nccl"`` when every member's model is on a GPU of its own (``device_id``), else ``"gloo"``."""
    if all(d is not None for d in devices) and len(set(devices)) == len(devices):
        return "nccl"
    return "gloo"


def state_manifest(tensors: dict[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, dtype)`` of every entry, in order: what both sides must agree on."""
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in tensors.items()]


def check_manifests(learner: Sequence[Any], actors: Sequence[Sequence[Any]]) -> None:
    """Raise naming the first entry where an actor's state differs from the learner's."""
    mine = [tuple(map(_plain, e)) for e in learner]
    for i, theirs in enumerate(actors, start=1):
        got = [tuple(map(_plain, e)) for e in theirs]
        if got == mine:
            continue
        for a, b in zip(mine, got, strict=False):
            if a != b:
                raise ValueError(f"weight sync: rollout actor {i} holds {b} where the learner holds {a}")
        raise ValueError(f"weight sync: rollout actor {i} holds {len(got)} tensors, the learner {len(mine)}")


def _plain(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


class SyncGroup:
    """One member of a learner + actors broadcast group (rank 0: the learner, the only sender)."""

    def __init__(self, host: str, port: int, rank: int, size: int, backend: str, timeout_s: float = 600.0) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"weight sync: backend must be 'gloo' or 'nccl', got {backend!r}")
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.size, self.backend = rank, size, backend
        self.store: Any = torch.distributed.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout)
        if backend == "nccl":
            self.pg: Any = torch.distributed.ProcessGroupNCCL(
                self.store, rank, size, torch.distributed.ProcessGroupNCCL.Options()
            )
        else:
            self.pg = torch.distributed.ProcessGroupGloo(self.store, rank, size, timeout)

    def close(self) -> None:
        """Shut the group down (its peers may already be gone) and release the store's port."""
        shutdown = getattr(self.pg, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except RuntimeError:
                pass
        self.pg = self.store = None

    @torch.no_grad()
    def broadcast(self, tensors: Sequence[torch.Tensor]) -> None:
        """Rank 0's ``tensors`` into every other member's ``tensors`` (same order, shapes and dtypes), one
        flat buffer per dtype; the receivers' tensors are written in place."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for dtype in sorted(by_dtype, key=str):  # the same order on every member
            group = by_dtype[dtype]
            device = group[0].device if self.backend == "nccl" else torch.device("cpu")
            wire = torch.uint8 if dtype == torch.bool else dtype  # collectives carry no bool
            if self.rank == 0:
                flat = torch.cat([t.detach().reshape(-1).to(device, wire) for t in group])
            else:
                flat = torch.empty(sum(t.numel() for t in group), dtype=wire, device=device)
            self.pg.broadcast(flat, 0).wait()
            if self.rank != 0:
                offset = 0
                for t in group:
                    t.copy_(flat[offset : offset + t.numel()].view(t.shape).to(dtype))
                    offset += t.numel()


def form_group(ray: Any, state: dict[str, torch.Tensor], actors: Sequence[Any]) -> SyncGroup:
    """The learner's end of a group with ``actors`` (Ray actor handles with ``device_id()`` and
    ``join_sync(host, port, rank, size, backend)`` returning their manifest), checked against ``state``."""
    host = ray.util.get_node_ip_address()
    port, size = free_port(host), len(actors) + 1
    held = ray.get([a.device_id.remote() for a in actors])
    backend = choose_backend([device_id(next(iter(state.values()))), *held])
    joins = [a.join_sync.remote(host, port, w + 1, size, backend) for w, a in enumerate(actors)]
    group = SyncGroup(host, port, 0, size, backend)
    check_manifests(state_manifest(state), ray.get(joins))
    return group


def broadcast_to(ray: Any, group: SyncGroup, state: dict[str, torch.Tensor], actors: Sequence[Any]) -> None:
    """``state`` into every actor (each receiving with ``receive_weights()``), waiting for all of them."""
    received = [a.receive_weights.remote() for a in actors]
    group.broadcast(list(state.values()))
    ray.get(received)
