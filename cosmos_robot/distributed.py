"""Data-parallel training across processes: who this process is, and the few collectives the trainers need.

Why a module of its own: every trainer runs the same code single-process (the default) and under
``torchrun`` / ``cosmos-robot train RECIPE --nproc N``. ``World`` answers "which rank am I, how many are
we, am I the one that writes files", and the helpers below are no-ops in a world of one, so a trainer
calls them unconditionally and single-process runs stay exactly what they were.

Data parallelism here keeps every rank's draws identical to the single-process run's: each rank draws
the whole global batch (indices, flow noise, flow times, augmentation) from the same generators and
keeps its own contiguous slice (``shard_range``). After ``backward`` the gradients are averaged over ranks
(``average_gradients``), so a step over the global batch equals the single-process step over the same
batch whenever the loss is a mean over samples that weigh the same (tests compare the loss curves).
Gradients are averaged explicitly rather than through ``DistributedDataParallel`` because the families'
adapters compute their losses through model methods other than ``forward`` (DDP only synchronises what
went through its ``forward``). Checkpoints stay whole (rank 0 saves model and optimizer state, which
every rank holds identically), so a run saved at one world size resumes at any other.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from cosmos_robot.config import ConfigError

__all__ = [
    "World",
    "all_gather_json",
    "all_gather_rows",
    "any_rank",
    "average_gradients",
    "barrier",
    "broadcast_parameters",
    "broadcast_text",
    "max_over_ranks",
    "mean_over_ranks",
    "rank_share",
    "sum_over_ranks",
    "shard_range",
    "world_from_env",
]


@dataclass(frozen=True)
class World:
    """This process's place among the training processes (``world_size == 1``: single-process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = ""  # "gloo" or "nccl" when distributed

    @property
    def comm_device(self) -> torch.device:
        """Where tensors for collectives live (NCCL only moves CUDA tensors)."""
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """The rank that writes the run folder (metrics, checkpoints, exports) and prints progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def world_from_env(device: str | torch.device = "cpu") -> World:
    """The world ``torchrun`` describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), its process group
    initialised once (gloo for CPU training, NCCL for CUDA); a world of one without those variables."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    try:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError) as exc:
        raise RuntimeError(f"WORLD_SIZE={size} but RANK is missing or not an integer: launch with torchrun") from exc
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        raise ConfigError(
            f"train.device={str(dev)!r} names one GPU, and {size} processes would share it: use 'cuda' "
            "(each data-parallel process takes the GPU of its LOCAL_RANK)"
        )
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        # rank 0 alone records data, evaluates and exports while the others wait in a collective: a
        # default timeout (NCCL's 10 minutes) would abort a long evaluation
        timeout = timedelta(seconds=float(os.environ.get("COSMOS_ROBOT_DIST_TIMEOUT_S", 4 * 3600)))
        dist.init_process_group(backend=backend, timeout=timeout)
    return World(rank=rank, world_size=size, local_rank=local_rank, backend=str(dist.get_backend()))


def shard_range(total: int, world: World, what: str = "train.batch_size") -> tuple[int, int]:
    """``(lo, hi)``: this rank's contiguous share of a global batch of ``total`` samples."""
    if total % world.world_size:
        raise ValueError(f"{what}={total} is not divisible by the {world.world_size} training processes")
    per = total // world.world_size
    return world.rank * per, (world.rank + 1) * per


def average_gradients(params: Any, world: World) -> None:
    """Replace every gradient by its mean over ranks: one all-reduce per dtype over a flat buffer."""
    if not world.distributed:
        return
    grads = [p.grad for p in params if p.grad is not None]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in group])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= world.world_size
        offset = 0
        for g in group:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def any_rank(flag: bool, world: World) -> bool:
    """True on every rank when it is true on any (a decision all ranks must take together, such as a
    wall-clock stop that each rank's own clock would time differently)."""
    if not world.distributed:
        return flag
    return mean_over_ranks(float(flag), world) > 0


def mean_over_ranks(value: float, world: World) -> float:
    """The mean of a scalar over ranks (a loss to log: the global batch's, as one process would log it)."""
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=world.comm_device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item() / world.world_size)


def broadcast_parameters(module: torch.nn.Module, world: World) -> None:
    """Rank 0's parameters and buffers to every rank (identical seeds build identical models; this makes
    it a guarantee, e.g. when an init's random parts come from global RNG state)."""
    if not world.distributed:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def broadcast_text(text: str | None, world: World) -> str | None:
    """Rank 0's string (or None) on every rank, as UTF-8 bytes in a tensor: no pickling between processes."""
    if not world.distributed:
        return text
    dev = world.comm_device
    data = torch.tensor(list(text.encode()) if text is not None else [], dtype=torch.uint8, device=dev)
    size = torch.tensor([data.numel() if text is not None else -1], dtype=torch.int64, device=dev)
    dist.broadcast(size, src=0)
    n = int(size.item())
    if n < 0:
        return None
    buf = data if world.is_main else torch.empty(n, dtype=torch.uint8, device=dev)
    dist.broadcast(buf, src=0)
    return bytes(buf.cpu().tolist()).decode()


def barrier(world: World) -> None:
    """Wait for every rank (e.g. until rank 0 has recorded the data or prepared the run folder)."""
    if world.distributed:
        dist.barrier()


def sum_over_ranks(values: torch.Tensor, world: World) -> torch.Tensor:
    """The element-wise sum of a small float64 vector over ranks (one all-reduce for many metrics)."""
    if not world.distributed:
        return values
    t = values.to(dtype=torch.float64, device=world.comm_device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu()


def max_over_ranks(value: float, world: World) -> float:
    """The largest of a scalar over ranks (a worst case every rank must act on, such as a ratio gate)."""
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=world.comm_device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_gather_rows(tensor: torch.Tensor, world: World) -> list[torch.Tensor]:
    """Every rank's ``tensor`` in rank order, where ranks may hold different numbers of rows (the first
    dim; the other dims and the dtype must agree). Padded to the longest for the collective and cut back."""
    if not world.distributed:
        return [tensor]
    dev = world.comm_device
    rows = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=dev)
    counts = [torch.zeros_like(rows) for _ in range(world.world_size)]
    dist.all_gather(counts, rows)
    sizes = [int(c.item()) for c in counts]
    src = tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor  # gloo has no bool
    padded = torch.zeros((max(sizes), *src.shape[1:]), dtype=src.dtype, device=dev)
    padded[: src.shape[0]] = src.to(dev)
    out = [torch.empty_like(padded) for _ in range(world.world_size)]
    dist.all_gather(out, padded.contiguous())
    return [
        (o[:n].view(torch.bool) if tensor.dtype == torch.bool else o[:n]).to(tensor.device)
        for o, n in zip(out, sizes, strict=True)
    ]


def all_gather_json(value: Any, world: World) -> list[Any]:
    """Every rank's JSON-encodable ``value`` in rank order, sent as UTF-8 bytes in a tensor: no pickling
    between processes (a rank can only send data, never code)."""
    if not world.distributed:
        return [value]
    data = torch.tensor(list(json.dumps(value).encode()), dtype=torch.uint8)
    return [json.loads(bytes(part.tolist()).decode()) for part in all_gather_rows(data, world)]


def rank_share(mb: torch.Tensor, world: World, units: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """``(rows, weight)``: this rank's contiguous share of minibatch ``mb`` and the weight of its loss
    (share size x world size / minibatch size), so that the mean over ranks of the weighted share
    losses' gradients is the whole minibatch's gradient. ``units`` (one id per row, e.g. the episode)
    keeps a unit's rows on one rank (GSPO's sequence ratio). A rank whose share is empty (a minibatch
    smaller than the world) computes the first row at weight 0: every rank must run the backward pass
    and the gradient all-reduce, and the parameters with gradients must be the same everywhere."""
    if not world.distributed:
        return mb, 1.0
    if units is None:
        mine = torch.tensor_split(mb, world.world_size)[world.rank]
        n, total = len(mine), len(mb)
    else:
        ids = torch.unique(units)
        own = torch.tensor_split(ids, world.world_size)[world.rank]
        mine = mb[torch.isin(units, own)]
        n, total = len(own), len(ids)
    if n == 0:
        return mb[:1], 0.0
    return mine, n * world.world_size / total
