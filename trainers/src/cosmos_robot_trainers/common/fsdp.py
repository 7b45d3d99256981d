"""FSDP2 for the trainers: parameters, gradients and optimizer state sharded over the data-parallel ranks.

Why: data parallelism (cosmos_robot/distributed.py) keeps a whole copy of the model and its AdamW state
on every rank, which caps the model at what one device holds. ``fully_shard`` (torch's FSDP2) keeps a
1/N shard per rank and gathers each block's parameters just for its forward and backward.

- ``shard_model`` shards every block of the model's ``nn.ModuleList`` stacks (or the family's own
  units), then the rest as one unit. 0-d parameters (which ``fully_shard`` refuses), and with
  ``keep_dtypes`` each unit's minority dtype, stay whole on every rank; the trainer averages their
  gradients itself (``replicated_params``). It registers the methods the trainer calls instead of
  ``forward`` (SFT: ``flow_loss``; RL: ``RL_FORWARD_METHODS``) as forwards, so the root's parameters are
  gathered for them too.
- Checkpoints stay the single-process ones (whole tensors; the optimizer state keyed by position as
  ``optimizer.state_dict()`` keys it): ``full_state`` gathers them to rank 0 and ``load_full_state``
  shards them back, so a run resumes at any world size, sharded or not.
- ``full_model_state`` gathers the weights for an export or an evaluation on rank 0;
  ``copy_full_into`` gathers them into a whole copy on every rank (the RL trainers' rollout model, which
  samples a number of times no two ranks agree on, so it cannot be sharded: verl's "hybrid engine").
- ``clip_grad_norm`` clips sharded (DTensor) and whole gradients together: one all-reduce of the
  shards' squared norms. ``average_gradients`` then ``clip_gradients`` is every trainer's step, sharded
  or not (robot SFT and RL, text, generator).
- Mixed precision (``compute_dtype``): the shards are float32 master weights, gathered and computed in
  bfloat16, gradients reduced in float32 (``MixedPrecisionPolicy``): the sharded form of the text
  trainers' ``MasterWeights`` (text/precision.py). ``as_master_checkpoint`` / ``from_master_checkpoint``
  convert between its state and that optimizer's checkpoint (bf16 weights, AdamW state, float32 masters),
  so a bf16 run crosses between one process and many in both directions.

Every function here is a collective: every rank calls it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from torch import nn

__all__ = [
    "as_master_checkpoint",
    "clip_grad_norm",
    "copy_full_into",
    "full_optimizer_state",
    "full_tensor",
    "load_full_optimizer_state",
    "load_full_params",
    "grad_cosine",
    "from_master_checkpoint",
    "full_model_state",
    "full_state",
    "is_sharded",
    "kernels_kept",
    "load_full_state",
    "replicated_params",
    "shard_model",
]

FORWARD_METHODS = ("flow_loss",)
# what the RL learner calls on an ``RLModel`` instead of its forward (cosmos_robot/policies/interfaces.py)
RL_FORWARD_METHODS = ("encode", "expert", "velocity", "value", "noise_std")


def shard_model(
    model: nn.Module,
    compute_dtype: torch.dtype | None = None,
    units: list[nn.Module] | None = None,
    methods: tuple[str, ...] = FORWARD_METHODS,
    keep_dtypes: bool = False,
) -> nn.Module:
    """``fully_shard`` each block of the model's ModuleList stacks, then the model (in place; returned).

    ``units``: the modules to shard instead of the stacks' blocks, for a family whose code does not call its
    blocks' ``forward`` (FSDP gathers a unit's parameters in its forward hooks): the modules it does call.
    Parameters outside every unit belong to the model's root unit, gathered for the whole loss.
    ``methods``: the model's methods its trainer calls instead of ``forward`` (each gathers the root unit).

    ``compute_dtype`` (bfloat16): the model is made float32 first, so its shards are the master weights;
    forward and backward run on ``compute_dtype`` copies and the gradients are reduced in float32.

    ``keep_dtypes``: a model that mixes dtypes (pi0.5's bf16 layers beside its float32 norms) keeps them.
    FSDP gathers a unit in one dtype, so in each unit the parameters of the dtype holding fewer elements
    (the norms, a few projections) stay whole on every rank, like 0-d ones (``replicated_params``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    kw: dict[str, Any] = {}
    if compute_dtype is not None and compute_dtype != torch.float32:
        # each entry's own dtype, for the one-process checkpoint form (as_master_checkpoint)
        model._loaded_dtypes = {k: v.dtype for k, v in model.state_dict().items()}  # type: ignore[assignment]
        model.float()
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    scalars = {p for p in model.parameters() if p.dim() == 0}  # fully_shard refuses 0-d parameters
    if units is None:
        units = [
            block
            for module in reversed(list(model.modules()))  # inner stacks first: FSDP nests bottom-up
            if isinstance(module, nn.ModuleList)
            for block in module
        ]
    whole = set(scalars)

    def left_whole(unit: nn.Module) -> set[nn.Parameter]:
        own = [p for p in unit.parameters() if not _is_dtensor(p) and p not in whole]
        sizes: dict[torch.dtype, int] = {}
        for p in own:
            sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
        if keep_dtypes and len(sizes) > 1:
            major = max(sizes, key=lambda d: sizes[d])
            whole.update(p for p in own if p.dtype != major)
        return whole

    for unit in units:
        if any(True for _ in unit.parameters()):
            fully_shard(unit, ignored_params=left_whole(unit), **kw)
    fully_shard(model, ignored_params=left_whole(model), **kw)
    for name in methods:
        if callable(getattr(model, name, None)):
            register_fsdp_forward_method(model, name)
    return model


def replicated_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters ``shard_model`` left whole (0-d ones, a unit's minority dtype): their gradients are the
    caller's to average."""
    return [p for p in model.parameters() if not _is_dtensor(p)]


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: writing it writes the DTensor)."""
    return cast(Any, t).to_local()


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, Any]:
    """The whole weights on rank 0 (CPU tensors); ``{}`` on the other ranks."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options())


def copy_full_into(sharded: nn.Module, whole: nn.Module) -> None:
    """Gather ``sharded``'s parameters and buffers into ``whole``, an unsharded module of the same
    structure, on every rank (one entry at a time: the whole state is never held twice)."""
    source = sharded.state_dict()
    target = whole.state_dict(keep_vars=True)
    if source.keys() != target.keys():
        raise ValueError(f"copy_full_into: the modules differ: {sorted(source.keys() ^ target.keys())[:5]}")
    with torch.no_grad():
        for key, value in source.items():
            full = value.full_tensor() if _is_dtensor(value) else value
            target[key].copy_(full)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value on every rank (gathered when sharded: a collective)."""
    return cast(Any, t).full_tensor() if _is_dtensor(t) else t


def load_full_params(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Set the named parameters of ``model`` (some of them, e.g. a LoRA run's trained ones) from whole
    tensors every rank holds: a sharded parameter takes its own shard of the value."""
    from torch.distributed.tensor import distribute_tensor

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in values.items():
            p = params[name]
            if _is_dtensor(p):
                d = cast(Any, p)
                value = distribute_tensor(value.to(d.device, d.dtype), d.device_mesh, d.placements)
            p.copy_(value)


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state as one process saves it (keyed by position), on rank 0; ``{}`` elsewhere."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if not optimizer.state:  # never stepped: get_optimizer_state_dict would take a zero step
        return optimizer.state_dict() if rank0 else {}
    optim_sd = get_optimizer_state_dict(model, optimizer, options=_options())
    return _by_position(optim_sd) if optim_sd else {}


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, optim_sd: dict[str, Any]) -> None:
    """Shard a one-process optimizer state (every rank passes the whole of it) into ``optimizer``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    with kernels_kept(optimizer):
        if not optim_sd.get("state"):
            optimizer.load_state_dict(optim_sd)
            return
        set_optimizer_state_dict(
            model, optimizer, _by_name(optim_sd, model, optimizer), options=StateDictOptions(full_state_dict=True)
        )


def clip_grad_norm(params: list[nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """The total gradient norm of ``params`` (sharded DTensor gradients and whole ones together; ranks
    hold the same whole gradients), every gradient scaled to ``max_norm`` when above it (None: measured)."""
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    shards = [_local(g) for g in grads if _is_dtensor(g)]
    whole = [g for g in grads if not _is_dtensor(g)]
    device = (shards or whole)[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float64, device=device)
    for g in shards:
        sq += g.double().pow(2).sum()
    if shards and dist.is_initialized():
        dist.all_reduce(sq)
    for g in whole:
        sq += g.double().pow(2).sum()
    norm = sq.sqrt().float()
    if max_norm is not None and math.isfinite(float(norm)):
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in shards + whole:
            g.mul_(coef.to(g.device, g.dtype))
    return norm


def average_gradients(model: nn.Module, world: Any, params: Any = None) -> None:
    """Average the gradients of ``model``'s parameters (or of ``params``, a subset of them) over the
    data-parallel ranks of ``world`` (None: one process, nothing to do). A sharded model's DTensor
    gradients were averaged by FSDP in its backward; only its whole ones (``replicated_params``) are
    averaged here. The one rule every trainer's step follows before clipping."""
    from cosmos_robot.distributed import average_gradients as average

    if world is None:
        return
    chosen = list(model.parameters()) if params is None else list(params)
    if is_sharded(model):
        whole = {id(p) for p in replicated_params(model)}
        chosen = [p for p in chosen if id(p) in whole]
    average(chosen, world)


def clip_gradients(params: Any, max_norm: float | None) -> float:
    """The pre-clip total gradient norm of ``params``, every gradient scaled to ``max_norm`` when above it
    (None: only measured). Sharded (DTensor) gradients go through ``clip_grad_norm`` (one all-reduce);
    whole ones through torch's fused ``clip_grad_norm_``."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    if any(_is_dtensor(p.grad) for p in params):
        return float(clip_grad_norm(params, max_norm))
    if max_norm is None:
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


def grad_cosine(model: nn.Module, params: list[nn.Parameter], batches: Any, loss_of: Any) -> float:
    """The cosine between the gradients of ``params`` under ``loss_of(b)`` for the two ``batches`` (every
    rank computes the same two losses); the sharded model's gradients are left unset. Backward, not
    ``autograd.grad``: FSDP reduces the shards' gradients in its backward hooks."""
    import torch.distributed as dist

    grads = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss_of(batch).backward()
        grads.append([p.grad for p in params])
    model.zero_grad(set_to_none=True)
    device = params[0].device  # a collective's tensor lives where the process group's backend reduces
    sums = torch.zeros(2, 3, dtype=torch.float64, device=device)  # [sharded, whole] x [a.b, a.a, b.b]
    for a, b, p in zip(grads[0], grads[1], params):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b
        row = 0 if _is_dtensor(a) else 1
        a, b = (_local(a), _local(b)) if row == 0 else (a, b)
        a, b = a.double().flatten().to(device), b.double().flatten().to(device)
        sums[row] += torch.stack([a @ b, a @ a, b @ b])
    if dist.is_initialized():
        dist.all_reduce(sums[0])  # a view: reduced in place
    dot, aa, bb = (sums[0] + sums[1]).tolist()
    return dot / max(math.sqrt(aa * bb), 1e-12)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model state, optimizer state)`` as one process saves them, on rank 0; ``({}, {})`` elsewhere."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if not optimizer.state:  # never stepped (an RL update skipped): get_state_dict would take a zero step
        model_sd = full_model_state(model)
        return model_sd, (optimizer.state_dict() if model_sd else {})
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    return model_sd, (_by_position(optim_sd) if optim_sd else {})


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict[str, Any], optim_sd: dict[str, Any]
) -> None:
    """Shard a single-process checkpoint's state (every rank passes the whole of it) into the model and
    the optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

    if not optim_sd.get("state"):  # saved before the first step: set_state_dict would take a zero step
        set_model_state_dict(model, model_sd, options=StateDictOptions(full_state_dict=True))
        with kernels_kept(optimizer):
            optimizer.load_state_dict(optim_sd)
        return
    with kernels_kept(optimizer):
        set_state_dict(
            model,
            optimizer,
            model_state_dict=model_sd,
            optim_state_dict=_by_name(optim_sd, model, optimizer),
            options=StateDictOptions(full_state_dict=True),
        )


def as_master_checkpoint(
    model: nn.Module, model_sd: dict[str, Any], optim_sd: dict[str, Any], dtype: torch.dtype
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A mixed-precision run's gathered ``(float32 weights, AdamW state)`` as the one-process bf16 run saves
    them (text/precision.py ``MasterWeights``): the weights in ``dtype``, the optimizer as ``{"inner": AdamW,
    "master": the trainable float32 weights in parameter order}``. Rank 0 (the others hold ``{}``)."""
    if not model_sd:
        return model_sd, optim_sd
    master = [model_sd[n].float().clone() for n, p in model.named_parameters() if p.requires_grad]
    loaded = getattr(model, "_loaded_dtypes", {})  # entries the model kept in float32 stay float32
    weights = {k: v.to(loaded.get(k, dtype)) if v.is_floating_point() else v for k, v in model_sd.items()}
    return weights, {"inner": optim_sd, "master": master}


def from_master_checkpoint(
    model: nn.Module, model_sd: dict[str, Any], optim_sd: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The inverse of ``as_master_checkpoint`` for a float32-sharded model: ``(float32 weights, AdamW
    state)``, the trainable weights taken from the saved masters (not their bf16 rounding)."""
    if set(optim_sd) != {"inner", "master"}:
        return {k: v.float() if v.is_floating_point() else v for k, v in model_sd.items()}, optim_sd
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if len(names) != len(optim_sd["master"]):
        raise ValueError(
            f"optimizer state: {len(optim_sd['master'])} float32 master weights saved, this model trains {len(names)}"
        )
    weights = {k: v.float() if v.is_floating_point() else v for k, v in model_sd.items()}
    # every key of a trainable parameter takes its master, tied aliases too (a tied head saved under a
    # second name would otherwise load the bf16 rounding over the master)
    position = {id(p): i for i, (_, p) in enumerate((n, p) for n, p in model.named_parameters() if p.requires_grad)}
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) in position:
            weights[key] = optim_sd["master"][position[id(value)]]
    return weights, optim_sd["inner"]


KERNEL_KEYS = ("fused", "foreach", "capturable", "differentiable")


@contextmanager
def kernels_kept(optimizer: Any) -> Iterator[None]:
    """Loading an optimizer's state puts the saved groups' settings back, its kernel choice included; keep
    the kernels this optimizer was built with (a sharded learner that left tensors whole cannot take the
    fused kernel a one-process run saved, and a one-process run should not inherit a sharded one's
    tensor-by-tensor steps)."""
    groups = getattr(optimizer, "param_groups", [])
    kept = [{k: g[k] for k in KERNEL_KEYS if k in g} for g in groups]
    yield
    for group, flags in zip(getattr(optimizer, "param_groups", []), kept):
        group.update(flags)


def _by_position(optim_sd: dict[str, Any]) -> dict[str, Any]:
    """torch.distributed.checkpoint keys optimizer state by parameter name; ``optimizer.state_dict()`` by
    position across the groups. The checkpoint keeps the latter, so every way of training reads it."""
    position: dict[str, int] = {}
    groups = []
    for group in optim_sd["param_groups"]:
        ids = []
        for name in group["params"]:
            position[name] = len(position)
            ids.append(position[name])
        groups.append({**group, "params": ids})
    return {"state": {position[n]: s for n, s in optim_sd["state"].items()}, "param_groups": groups}


def _by_name(optim_sd: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups, i = [], 0
    for group in optim_sd["param_groups"]:
        n = len(group["params"])
        groups.append({**group, "params": order[i : i + n]})
        i += n
    if i != len(order):
        raise ValueError(f"optimizer state: the checkpoint has {i} parameters, this optimizer {len(order)}")
    state = {order[int(k)]: s for k, s in optim_sd["state"].items()}
    # a parameter that never had a gradient (a head the loss does not reach) has no AdamW state in a
    # one-process checkpoint, and set_state_dict wants one for every parameter: its fresh state (zero
    # moments, step 0), shaped like the whole parameter
    template = next(iter(state.values()), None)
    if template is not None:
        params = dict(model.named_parameters())
        for name in order:
            if name not in state:
                shape, dtype = params[name].shape, params[name].dtype
                state[name] = {
                    key: torch.zeros_like(value) if key == "step" else torch.zeros(shape, dtype=dtype)
                    for key, value in template.items()
                }
    return {"state": state, "param_groups": groups}
