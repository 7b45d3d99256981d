"""Denoising with per-step log-probabilities: ODE (serving), Flow-SDE and Flow-Noise (RL rollouts).

Why three samplers over one transition function: PPO needs the log-probability of the action the
rollout executed under the *current* parameters. Each denoising step k (t_k -> t_{k+1}, with
``t = linspace(1, 0, K + 1)`` and delta = t_k - t_{k+1}) is made a Gaussian transition
``x_{k+1} ~ N(mean_k, std_k^2)``; the rollout stores the whole chain, and ``recompute_log_prob``
re-evaluates the stored transitions with the same formulas (``_transition`` is shared), so the
ratio is exactly 1 before an update. Formulas follow RLinf's openpi action model (research notes
section 1.2), with x0_hat = x_t - t v and x1_hat = x_t + (1 - t) v:

- ``ode``:   mean = x0_hat (1 - t + delta) + x1_hat (t - delta), std = 0 (the Euler step x_t - delta v).
- ``flow_sde``: sigma_t = a sqrt(t / (1 - t)) (at t = 1 the denominator uses 1 - t_1),
  mean = x0_hat (1 - t + delta) + x1_hat (t - delta - sigma_t^2 delta / (2 t)), std = sigma_t sqrt(delta).
  ONE step j ~ U{0..K-1} (shared by the batch, like RLinf) is stochastic, the rest are ODE; the
  log-prob is that transition's only.
- ``flow_noise``: every step stochastic with the ODE mean and the learned bounded std
  (``model.noise_std``); log-prob = mean over the K + 1 terms [log N(x_0; 0, I), log N(x_1 | x_0), ...].

Log-probs are summed over the executed slice of the chunk, rows ``[:replan_steps]`` and the action
dims ``dims`` (the first d, or a set of indices: the RL recipes leave out dims the tasks never use),
chunk-level, one ratio per decision; ``dim_log_prob`` keeps the per-element values for action- or
token-level ratios; ``executed_mask`` is the same slice as a mask for regression losses.
Zero-std coordinates contribute 0, as in RLinf. Everything is float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from cosmos_robot.policies.flow.modeling_flow import draw_randn

__all__ = [
    "FlowSampler",
    "Dims",
    "LogProbResult",
    "SampleMode",
    "SampleResult",
    "executed_mask",
    "recompute_log_prob",
    "sample_actions",
    "sde_sigmas",
    "timesteps",
]

SampleMode = Literal["ode", "flow_sde", "flow_noise"]


class FlowSampler(Protocol):
    """What the samplers need from a model (``FlowModel``, ``Pi05RLModel``): sizes, the velocity and
    features at per-sample times (``expert``), and the Flow-Noise std head."""

    config: Any  # .chunk_size (chain rows), .action_dim (chain width), .num_flow_steps, .noise_level

    def expert(self, x: torch.Tensor, t: torch.Tensor, context: Any) -> tuple[torch.Tensor, Any]: ...

    def noise_std(self, features: Any) -> torch.Tensor: ...


_MODES = ("ode", "flow_sde", "flow_noise")
_LOG_2PI = math.log(2.0 * math.pi)


@dataclass
class LogProbResult:
    """Log-probabilities of stored transitions (``recompute_log_prob``)."""

    log_prob: torch.Tensor  # (B,) chunk-level: summed over the [:replan_steps, :dims] slice
    step_log_probs: torch.Tensor  # (B, K) per transition (flow_sde: 0 except the SDE step); flow_noise (B, K + 1)
    dim_log_prob: torch.Tensor  # (B, replan_steps, dims) per element (flow_noise: mean over the K + 1 terms)
    entropy: torch.Tensor  # (B,) Gaussian entropy of the stochastic transitions (flow_noise: mean over steps)


@dataclass
class SampleResult(LogProbResult):
    """A sampled chunk with everything PPO must store to recompute its log-prob."""

    actions: torch.Tensor  # (B, chunk_size, D) normalised actions (x at t = 0)
    chain: torch.Tensor  # (B, K + 1, chunk_size, D) x at t_0 = 1 (noise) ... t_K = 0
    sde_step: torch.Tensor  # (B,) int64 index j of the stochastic Flow-SDE step; -1 for ode / flow_noise


def timesteps(num_steps: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``t_k = 1 - k / K`` for k = 0..K (K + 1 values from 1 to 0)."""
    return torch.linspace(1.0, 0.0, num_steps + 1, device=device, dtype=torch.float32)


def sde_sigmas(num_steps: int, noise_level: float, device: torch.device | str | None = None) -> torch.Tensor:
    """Flow-SDE ``sigma_t = a sqrt(t / (1 - t))`` at t_0..t_{K-1}; at t = 1 the denominator is 1 - t_1."""
    ts = timesteps(num_steps, device)
    denom = 1.0 - torch.where(ts == 1.0, ts[1], ts)
    return (noise_level * torch.sqrt(ts / denom))[:-1]


def _gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Element-wise log N(x; mean, std^2); 0 where std == 0 (deterministic coordinates)."""
    zero = std == 0
    safe = torch.where(zero, torch.ones_like(std), std)
    logp = -torch.log(safe) - 0.5 * _LOG_2PI - 0.5 * ((x - mean) / safe).pow(2)
    return torch.where(zero, torch.zeros_like(logp), logp)


def _gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    zero = std == 0
    safe = torch.where(zero, torch.ones_like(std), std)
    ent = 0.5 * (_LOG_2PI + 1.0) + torch.log(safe)
    return torch.where(zero, torch.zeros_like(ent), ent)


def _transition(
    model: FlowSampler,
    x: torch.Tensor,
    step: torch.Tensor,
    context: Any,
    kind: SampleMode,
    num_steps: int,
    noise_level: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of x_{k+1} given x_k = ``x`` at per-sample step indices ``step`` (B,)."""
    ts = timesteps(num_steps, x.device)
    t = ts[step][:, None, None]
    delta = (ts[step] - ts[step + 1])[:, None, None]
    v, feats = model.expert(x, ts[step], context)
    x0_hat = x - t * v
    x1_hat = x + (1.0 - t) * v
    if kind == "flow_sde":
        sigma = sde_sigmas(num_steps, noise_level, x.device)[step][:, None, None]
        mean = x0_hat * (1.0 - t + delta) + x1_hat * (t - delta - sigma.pow(2) * delta / (2.0 * t))
        return mean, (sigma * torch.sqrt(delta)).expand_as(x)
    mean = x0_hat * (1.0 - t + delta) + x1_hat * (t - delta)
    if kind == "flow_noise":
        return mean, model.noise_std(feats)
    return mean, torch.zeros_like(x)


Dims = int | Sequence[int] | None  # the first d action dims, a set of dim indices, or all


def _columns(dims: Dims, action_dim: int) -> slice | list[int]:
    """The chunk columns the log-probs cover: a prefix slice (``dims`` an int or ``0..d-1``) or indices."""
    if dims is None:
        return slice(0, action_dim)
    if isinstance(dims, int):
        if not 1 <= dims <= action_dim:
            raise ValueError(f"dims must be in [1, {action_dim}] (the real action dims), got {dims}")
        return slice(0, dims)
    idx = sorted({int(i) for i in dims})
    if not idx or len(idx) != len(dims) or idx[0] < 0 or idx[-1] >= action_dim:
        raise ValueError(f"dims: expected distinct action-dim indices in [0, {action_dim - 1}], got {list(dims)}")
    return slice(0, len(idx)) if idx == list(range(len(idx))) else idx


def _width(cols: slice | list[int]) -> int:
    return len(cols) if isinstance(cols, list) else int(cols.stop)


def executed_mask(chunk_size: int, action_dim: int, replan_steps: int | None = None, dims: Dims = None) -> torch.Tensor:
    """``(chunk_size, action_dim)`` bool: True on the slice the log-probs cover (rows ``[:replan_steps]``,
    columns ``dims``), for the regression losses (DiffusionNFT, Flow-DPO) to count the same elements."""
    mask = torch.zeros((chunk_size, action_dim), dtype=torch.bool)
    h = chunk_size if replan_steps is None else replan_steps
    mask[:h, _columns(dims, action_dim)] = True
    return mask


def _check(
    mode: str, num_steps: int, model: FlowSampler, replan_steps: int | None, dims: Dims
) -> tuple[int, slice | list[int]]:
    """Validate the arguments; return the executed slice ``(h, cols)`` of the chunk: ``h`` of its
    ``chunk_size`` rows (``replan_steps``), the columns ``cols`` of its ``action_dim`` (``dims``)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {list(_MODES)}, got {mode!r}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    cfg = model.config
    h = cfg.chunk_size if replan_steps is None else replan_steps
    if not 1 <= h <= cfg.chunk_size:
        raise ValueError(
            f"replan_steps must be in [1, chunk_size={cfg.chunk_size}] (the executed steps of the chunk), got {h}"
        )
    return h, _columns(dims, cfg.action_dim)


@torch.no_grad()
def sample_actions(
    model: FlowSampler,
    context: Any,
    mode: SampleMode = "ode",
    num_steps: int | None = None,
    generator: torch.Generator | None = None,
    noise_level: float | None = None,
    sde_step: int | None = None,
    noise: torch.Tensor | None = None,
    replan_steps: int | None = None,
    dims: Dims = None,
) -> SampleResult:
    """Denoise from ``noise`` (default: N(0, I) drawn from ``generator``) to an action chunk.

    ``num_steps`` defaults to ``config.num_flow_steps`` and ``noise_level`` to ``config.noise_level``;
    ``sde_step`` fixes the Flow-SDE step (else drawn from ``generator``); ``replan_steps``/``dims``
    slice the log-probs to the executed steps and to action dims (an int d: the first d; a sequence:
    those indices; default: the whole chunk). Runs
    without gradients: recompute log-probs for training with ``recompute_log_prob``.
    """
    cfg = model.config
    k_steps = num_steps if num_steps is not None else cfg.num_flow_steps
    h, cols = _check(mode, k_steps, model, replan_steps, dims)
    d = _width(cols)
    a = noise_level if noise_level is not None else cfg.noise_level
    b, device = context.shape[0], context.device
    shape = (b, cfg.chunk_size, cfg.action_dim)
    x = noise.to(device).float() if noise is not None else draw_randn(shape, generator, device)
    if tuple(x.shape) != shape:
        raise ValueError(f"noise: expected shape {shape}, got {tuple(x.shape)}")
    j = -1
    if mode == "flow_sde":
        if sde_step is None:
            gen_device = generator.device if generator is not None else None
            j = int(torch.randint(k_steps, (1,), generator=generator, device=gen_device))
        else:
            j = int(sde_step)
        if not 0 <= j < k_steps:
            raise ValueError(f"sde_step must be in [0, {k_steps - 1}], got {j}")
    chain, logps, ents = [x], [], []
    if mode == "flow_noise":
        logps.append(_gaussian_log_prob(x, torch.zeros_like(x), torch.ones_like(x))[:, :h, cols])
    for k in range(k_steps):
        kind: SampleMode = mode if (mode == "flow_noise" or k == j) else "ode"
        step = torch.full((b,), k, dtype=torch.long, device=device)
        mean, std = _transition(model, x, step, context, kind, k_steps, a)
        if kind == "ode":
            x = mean
            logps.append(torch.zeros((b, h, d), device=device))
            ents.append(torch.zeros((b, h, d), device=device))
        else:
            x = mean + std * draw_randn(shape, generator, device)
            logps.append(_gaussian_log_prob(x, mean, std)[:, :h, cols])
            ents.append(_gaussian_entropy(std)[:, :h, cols])
        chain.append(x)
    per_elem = torch.stack(logps, dim=1)  # (B, K or K+1, h, d)
    ent = torch.stack(ents, dim=1).sum(dim=(2, 3))  # (B, K)
    result = _aggregate(mode, per_elem, ent, j)
    return SampleResult(
        log_prob=result.log_prob,
        step_log_probs=result.step_log_probs,
        dim_log_prob=result.dim_log_prob,
        entropy=result.entropy,
        actions=x,
        chain=torch.stack(chain, dim=1),
        sde_step=torch.full((b,), j, dtype=torch.long, device=device),
    )


def _aggregate(mode: SampleMode, per_elem: torch.Tensor, ent: torch.Tensor, j: int | torch.Tensor) -> LogProbResult:
    """Turn per-step, per-element log-probs into the chunk-level result of ``mode``."""
    steps = per_elem.sum(dim=(2, 3))
    b = per_elem.shape[0]
    if mode == "flow_noise":
        return LogProbResult(steps.mean(dim=1), steps, per_elem.mean(dim=1), ent.mean(dim=1))
    if mode == "flow_sde":
        idx = torch.as_tensor(j, device=per_elem.device).expand(b)
        rows = torch.arange(b, device=per_elem.device)
        return LogProbResult(steps[rows, idx], steps, per_elem[rows, idx], ent[rows, idx])
    return LogProbResult(steps.sum(dim=1), steps, per_elem.sum(dim=1), ent.sum(dim=1))


def recompute_log_prob(
    model: FlowSampler,
    context: Any,
    chain: torch.Tensor,
    mode: SampleMode,
    sde_step: torch.Tensor | int | None = None,
    noise_level: float | None = None,
    replan_steps: int | None = None,
    dims: Dims = None,
) -> LogProbResult:
    """Log-probs of a stored ``chain`` (B, K + 1, chunk_size, D) under the current parameters (with gradients).

    ``flow_sde`` re-evaluates only transition ``sde_step`` (an int or a per-sample (B,) tensor, so
    minibatches may mix rollouts); ``flow_noise`` re-evaluates all K transitions in one batched
    expert call plus the prior term. Same ``noise_level``/``replan_steps``/``dims`` as at sampling time.
    """
    cfg = model.config
    if chain.ndim != 4 or tuple(chain.shape[2:]) != (cfg.chunk_size, cfg.action_dim) or chain.shape[1] < 2:
        raise ValueError(
            f"chain: expected shape (B, K + 1, {cfg.chunk_size}, {cfg.action_dim}), got {tuple(chain.shape)}"
        )
    b, k_steps = chain.shape[0], chain.shape[1] - 1
    h, cols = _check(mode, k_steps, model, replan_steps, dims)
    d = _width(cols)
    a = noise_level if noise_level is not None else cfg.noise_level
    device = context.device
    chain = chain.to(device).float()
    if mode == "ode":
        zeros = torch.zeros((b, k_steps, h, d), device=device)
        return _aggregate("ode", zeros, torch.zeros((b, k_steps), device=device), -1)
    if mode == "flow_sde":
        if sde_step is None:
            raise ValueError("flow_sde needs the sde_step stored at sampling time (SampleResult.sde_step)")
        j = torch.as_tensor(sde_step, dtype=torch.long, device=device).expand(b)
        if bool(((j < 0) | (j >= k_steps)).any()):
            raise ValueError(f"sde_step must be in [0, {k_steps - 1}], got {j.tolist()}")
        rows = torch.arange(b, device=device)
        mean, std = _transition(model, chain[rows, j], j, context, "flow_sde", k_steps, a)
        elem = _gaussian_log_prob(chain[rows, j + 1], mean, std)[:, :h, cols]
        per_elem = torch.zeros((b, k_steps, h, d), device=device, dtype=elem.dtype)
        per_elem = per_elem.index_put((rows, j), elem)
        ent = torch.zeros((b, k_steps), device=device).index_put(
            (rows, j), _gaussian_entropy(std)[:, :h, cols].sum((1, 2))
        )
        return _aggregate("flow_sde", per_elem, ent, j)
    steps = torch.arange(k_steps, device=device).repeat(b)  # (B*K,) step index of each row
    x = chain[:, :-1].reshape(b * k_steps, *chain.shape[2:])
    mean, std = _transition(model, x, steps, context.repeat_interleave(k_steps, dim=0), "flow_noise", k_steps, a)
    nxt = chain[:, 1:].reshape_as(x)
    trans = _gaussian_log_prob(nxt, mean, std)[:, :h, cols].reshape(b, k_steps, h, d)
    x0 = chain[:, 0, :h, cols]
    prior = _gaussian_log_prob(x0, torch.zeros_like(x0), torch.ones_like(x0))
    per_elem = torch.cat([prior[:, None], trans], dim=1)
    ent = _gaussian_entropy(std)[:, :h, cols].sum(dim=(1, 2)).reshape(b, k_steps)
    return _aggregate("flow_noise", per_elem, ent, -1)
