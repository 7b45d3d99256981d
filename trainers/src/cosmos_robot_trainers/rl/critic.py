"""Privileged critic (``algo.critic_inputs = "privileged"``): an asymmetric actor-critic for joint PPO.

Why: an image policy's shared-trunk critic must infer object and goal positions from 64 px pixels, and
the diagnosis measured its explained variance on reach at 0.15-0.38: GAE then mostly passes the critic's
noise into the advantages. The simulator knows the state exactly. This critic reads the env's robot
``state`` and ``object_state`` (object and goal positions, drawer opening, task one-hot: 23 floats on
the tabletop suite) through its own MLP, while the actor keeps reading what serving sends; the critic
is dropped at export, so nothing privileged reaches a served policy (Pinto et al. 2018, "Asymmetric
Actor Critic for Image-Based Robot Learning").

How it plugs in without touching the samplers or the learner: ``PrivilegedCriticModel`` wraps the
family's ``RLModel``. Its ``encode`` appends the privileged vector (stored per decision as
``critic_obs``) to the family's context tensor; ``expert`` / ``velocity`` hand the family its own part,
``value`` reads only the appended part. Its MLP is named ``value_head`` so the optimizer's critic group
(``critic_lr``, ``critic_grad_clip``) picks it up as it does the shared head; the family's own value
head is left untrained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from cosmos_robot.policies.interfaces import RLAdapter, RLModel

__all__ = ["CRITIC_OBS", "PRIVILEGED_KEYS", "PrivilegedCriticModel", "attach_privileged_critic", "critic_obs", "unwrap"]

CRITIC_OBS = "critic_obs"  # the stored model-input key of the privileged vector
PRIVILEGED_KEYS = ("state", "object_state")  # env observation vectors the critic reads, joined in this order


def critic_obs(rows: Sequence[Mapping[str, Any]]) -> torch.Tensor:
    """``(B, 23)`` float32: each env observation row's ``PRIVILEGED_KEYS`` joined."""
    missing = [k for k in PRIVILEGED_KEYS if k not in rows[0]]
    if missing:
        raise KeyError(f"the privileged critic needs env observation keys {missing} (got {sorted(rows[0])})")
    return torch.from_numpy(
        np.stack([np.concatenate([np.asarray(r[k], dtype=np.float32) for k in PRIVILEGED_KEYS]) for r in rows])
    )


class PrivilegedCriticModel(RLModel):
    """The family model as the actor, a value MLP over the privileged vector as the critic."""

    def __init__(self, inner: RLModel, obs_dim: int, widths: Sequence[int] = (256, 256), seed: int = 0) -> None:
        super().__init__()
        self.inner = inner
        self.obs_dim = obs_dim
        sizes = [obs_dim, *widths]
        layers: list[nn.Module] = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for a, b in zip(sizes[:-1], sizes[1:]):
                layers += [nn.Linear(a, b), nn.SiLU()]
            last = nn.Linear(sizes[-1], 1)
            nn.init.zeros_(last.weight)  # first values 0, like the family heads
            nn.init.zeros_(last.bias)
        self.value_head = nn.Sequential(*layers, last).to(next(inner.parameters()).device)

    @property
    def config(self) -> Any:  # type: ignore[override]  # the family's config, read-only here
        return self.inner.config

    def encode(self, batch: Mapping[str, Any]) -> torch.Tensor:
        context = self.inner.encode(batch)
        if not isinstance(context, torch.Tensor) or context.ndim != 2:
            raise TypeError("the privileged critic needs a family whose context is a (B, W) tensor (the flow family)")
        if CRITIC_OBS not in batch:
            raise KeyError(f"batch has no {CRITIC_OBS!r}: rollouts store it when algo.critic_inputs = 'privileged'")
        obs = batch[CRITIC_OBS].to(context.device, context.dtype)
        if obs.shape != (context.shape[0], self.obs_dim):
            want = (context.shape[0], self.obs_dim)
            raise ValueError(f"{CRITIC_OBS}: expected shape {want}, got {tuple(obs.shape)}")
        return torch.cat([context, obs], dim=-1)

    def _actor(self, context: torch.Tensor) -> torch.Tensor:
        return context[:, : context.shape[1] - self.obs_dim]

    def expert(self, x: torch.Tensor, t: torch.Tensor, context: Any) -> tuple[torch.Tensor, Any]:
        return self.inner.expert(x, t, self._actor(context))

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor | float, context: Any) -> torch.Tensor:
        return self.inner.velocity(x_t, t, self._actor(context))

    def value(self, context: Any, detach: bool = False) -> torch.Tensor:
        return self.value_head(context[:, -self.obs_dim :]).squeeze(-1)  # never touches the actor's trunk

    def noise_std(self, features: Any) -> torch.Tensor:
        return self.inner.noise_std(features)

    def sample_time(self, n: int, generator: torch.Generator | None = None, device: Any = None) -> torch.Tensor:
        return self.inner.sample_time(n, generator, device)

    def set_num_flow_steps(self, steps: int) -> None:
        self.inner.set_num_flow_steps(steps)


def attach_privileged_critic(adapter: RLAdapter, obs_dim: int, seed: int = 0) -> PrivilegedCriticModel:
    """Wrap ``adapter.model`` (in place) so rollouts and the learner use the privileged critic."""
    wrapped = PrivilegedCriticModel(adapter.model, obs_dim, seed=seed)
    adapter.model = wrapped
    adapter.reads_object_state = True
    return wrapped


def unwrap(model: RLModel) -> RLModel:
    """The family model a serving policy is built from (the privileged critic stays behind)."""
    return model.inner if isinstance(model, PrivilegedCriticModel) else model
