"""The router load-balancing loss of mixture-of-experts causal LMs (Qwen3-MoE, Qwen2-MoE, Mixtral ...) in training.

Why a hook: transformers computes the balancing loss (``load_balancing_loss_func`` over every layer's
router logits) only when a forward is asked for ``output_router_logits``, and adds it to ``loss``
only when ``labels`` are passed; the text trainers compute their own losses from logits, so without
this an MoE model trains with no balancing term and its experts collapse. ``install_router_aux_loss``
puts two hooks on the model once (``TextRun`` does it for every text trainer): before a forward with
gradients on, it asks for the router logits; after it, it keeps the ``aux_loss`` the model computed.
A trainer adds ``router_aux_loss(model)`` (``router_aux_loss_coef`` x the last training forward's
loss, taken once) to that forward's loss and logs the raw value (``router_aux_loss``); only the last
forward's is kept, so a forward whose loss nobody takes holds no graph. Forwards without gradients (scoring,
rollouts, evaluation) are left as they were. Dense models get no hooks and a 0.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["install_router_aux_loss", "is_moe", "last_router_aux_loss", "router_aux_loss", "with_router_aux_loss"]

_ATTR = "_cosmos_router_aux"


def is_moe(model: Any) -> bool:
    """A model whose config has routed experts and a router loss coefficient."""
    config = getattr(model, "config", None)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    return bool(experts) and hasattr(config, "router_aux_loss_coef")


class _RouterAux:
    def __init__(self, model: Any) -> None:
        self.coef = float(model.config.router_aux_loss_coef)
        self.pending: list[torch.Tensor] = []
        self.last = 0.0
        model.register_forward_pre_hook(self._ask, with_kwargs=True)
        model.register_forward_hook(self._keep, with_kwargs=True)

    def _ask(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if torch.is_grad_enabled():
            kwargs["output_router_logits"] = True
        return args, kwargs

    def _keep(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        aux = getattr(output, "aux_loss", None)
        if aux is not None and torch.is_grad_enabled():
            # the last training forward's only: a trainer takes it right after its forward, and one that does
            # not (or a forward nobody backpropagates) must not keep earlier graphs alive
            self.pending = [aux]


def install_router_aux_loss(model: Any) -> bool:
    """Hook ``model`` (once) if it is a mixture of experts; True if it is."""
    if not is_moe(model):
        return False
    if getattr(model, _ATTR, None) is None:
        setattr(model, _ATTR, _RouterAux(model))
    return True


def router_aux_loss(model: Any) -> torch.Tensor | float:
    """``router_aux_loss_coef`` x the last training forward's balancing loss, once (0 if none is pending)."""
    state: _RouterAux | None = getattr(model, _ATTR, None)
    if state is None or not state.pending:
        return 0.0
    total = torch.stack([a.float() for a in state.pending]).sum()
    state.pending.clear()
    state.last = float(total.detach())
    return state.coef * total


def last_router_aux_loss(model: Any) -> float | None:
    """The raw balancing loss taken by the last ``router_aux_loss`` (None for a dense model), for logs."""
    state: _RouterAux | None = getattr(model, _ATTR, None)
    return None if state is None else state.last


def with_router_aux_loss(model: Any, loss: torch.Tensor, metrics: dict[str, Any]) -> torch.Tensor:
    """``loss`` plus ``router_aux_loss(model)``; the raw balancing loss goes into ``metrics`` for MoE models."""
    total = loss + router_aux_loss(model)
    if (raw := last_router_aux_loss(model)) is not None:
        metrics["router_aux_loss"] = torch.tensor(raw)
    return total
