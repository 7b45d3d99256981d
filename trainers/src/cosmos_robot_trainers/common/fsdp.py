"""FSDP2 for the trainers: parameters, gradients and optimizer state sharded over the data-parallel ranks.

Why: data parallelism (cosmos_robot/distributed.py) keeps a whole copy of the model and its AdamW state
on every rank, which caps the model at what one device holds. ``fully_shard`` (torch's FSDP2) keeps a
1/N shard per rank and gathers each block's parameters just for its forward and backward.

- ``shard_model`` shards every block of the model's ``nn.ModuleList`` stacks, then the rest as one unit.
  0-d parameters (which ``fully_shard`` refuses) stay whole on every rank; the trainer averages their
  gradients itself (``replicated_params``).
  It registers the families' loss method (``flow_loss``, which every SFT adapter calls instead of
  ``forward``) as a forward, so the root's parameters are gathered for it too.
- Checkpoints stay the single-process ones (whole tensors; the optimizer state keyed by position as
  ``optimizer.state_dict()`` keys it): ``full_state`` gathers them to rank 0 and ``load_full_state``
  shards them back, so a run resumes at any world size, sharded or not.
- ``full_model_state`` gathers the weights for an export or an evaluation on rank 0.
- Mixed precision (``compute_dtype``): the shards are float32 master weights, gathered and computed in
  bfloat16, gradients reduced in float32 (``MixedPrecisionPolicy``): the sharded form of the text
  trainers' ``MasterWeights`` (text/precision.py). ``as_master_checkpoint`` / ``from_master_checkpoint``
  convert between its state and that optimizer's checkpoint (bf16 weights, AdamW state, float32 masters),
  so a bf16 run crosses between one process and many in both directions.

Every function here is a collective: every rank calls it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = [
    "as_master_checkpoint",
    "from_master_checkpoint",
    "full_model_state",
    "full_state",
    "is_sharded",
    "load_full_state",
    "replicated_params",
    "shard_model",
]

FORWARD_METHODS = ("flow_loss",)


def shard_model(
    model: nn.Module, compute_dtype: torch.dtype | None = None, units: list[nn.Module] | None = None
) -> nn.Module:
    """``fully_shard`` each block of the model's ModuleList stacks, then the model (in place; returned).

    ``units``: the modules to shard instead of the stacks' blocks, for a family whose code does not call its
    blocks' ``forward`` (FSDP gathers a unit's parameters in its forward hooks): the modules it does call.
    Parameters outside every unit belong to the model's root unit, gathered for the whole loss.

    ``compute_dtype`` (bfloat16): the model is made float32 first, so its shards are the master weights;
    forward and backward run on ``compute_dtype`` copies and the gradients are reduced in float32."""
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
    for unit in units:
        if any(True for _ in unit.parameters()):
            fully_shard(unit, ignored_params=scalars, **kw)
    fully_shard(model, ignored_params=scalars, **kw)
    for name in FORWARD_METHODS:
        if callable(getattr(model, name, None)):
            register_fsdp_forward_method(model, name)
    return model


def replicated_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters ``shard_model`` left whole (0-d ones): their gradients are the caller's to average."""
    return [p for p in model.parameters() if not _is_dtensor(p)]


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


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


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model state, optimizer state)`` as one process saves them, on rank 0; ``({}, {})`` elsewhere."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    return model_sd, (_by_position(optim_sd) if optim_sd else {})


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict[str, Any], optim_sd: dict[str, Any]
) -> None:
    """Shard a single-process checkpoint's state (every rank passes the whole of it) into the model and
    the optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

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
