"""Demonstration-augmented RL: SFT's flow-matching loss on demonstrations beside every RL step (``[bc]``).

Why: from a few-shot start (10 demonstrations per task, 34%) GRPO's gain is all on the tasks that
already succeed (reach 47 -> 92%, the drawer), while the hard ones (push, pick_place at 5-6%) give
almost no group a success to learn from, and the shared network drifts away from what SFT taught
them: pick_place fell to 0-1% in every GRPO run of issue 16. DAPG (Rajeswaran et al. 2018) adds the
behaviour-cloning loss of the demonstrations to the policy-gradient loss, weighted by
``lambda_0 * lambda_1 ** k`` at iteration k; the flow policy's behaviour-cloning loss is the
flow-matching error SFT minimised. So each optimizer step of any online algorithm (``accumulated_step``'s
``aux``) adds ``bc.coef * bc.decay ** iteration`` times that loss on ``bc.batch_size`` demonstration
frames (tasks drawn equally often by default), from the family's ``RLAdapter.demonstrations``: the
same model inputs its rollouts store, the chunks in the model's normalised space.

The draws come from their own generator, seeded by the run seed and the iteration (a stream of its own), so a run with
``bc.coef = 0`` keeps every other draw it made before, and a resumed run draws the same frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cosmos_robot.policies.interfaces import Demonstrations
from cosmos_robot_trainers.common.sampler import task_weights
from cosmos_robot_trainers.rl.config import BCConfig
from cosmos_robot_trainers.rl.policies import RLAdapter, RLModel
from cosmos_robot_trainers.rl.rollout import index_inputs

__all__ = ["DemoTerm", "demo_flow_loss", "load_demos", "only_instructions", "sample_weights"]


def load_demos(cfg: BCConfig, policy: RLAdapter) -> Demonstrations | None:
    """The ``[bc]`` demonstrations mapped into ``policy``'s model space (None when ``bc.coef`` is 0)."""
    if cfg.coef == 0 or cfg.data is None:
        return None
    demos = policy.demonstrations(cfg.data, max_episodes_per_task=cfg.max_episodes_per_task)
    if len(demos) == 0:
        raise ValueError(f"bc.data: {cfg.data} holds no frames")
    if cfg.instructions is not None:
        demos = only_instructions(demos, cfg.instructions)
    return demos


def only_instructions(demos: Demonstrations, instructions: list[str]) -> Demonstrations:
    """The frames of ``instructions`` only; an instruction the recording does not hold is an error naming
    the ones it does."""
    have = sorted(set(demos.prompts))
    missing = [i for i in instructions if i not in have]
    if missing:
        raise ValueError(f"bc.instructions: {missing} not in the recording; it holds {have}")
    keep = torch.tensor([p in instructions for p in demos.prompts])
    idx = torch.nonzero(keep).flatten()
    return Demonstrations(
        inputs=index_inputs(demos.inputs, idx, "cpu"),
        chunks=demos.chunks[idx],
        pad=demos.pad[idx],
        prompts=[demos.prompts[i] for i in idx.tolist()],
        episode=demos.episode[idx],
    )


def sample_weights(prompts: list[str], weighting: str) -> torch.Tensor:
    """Per-frame draw weights: equal mass per instruction (``balanced``) or uniform over frames (as SFT)."""
    w = task_weights(prompts, weighting)
    return torch.ones(len(prompts), dtype=torch.float64) if w is None else torch.from_numpy(w)


def demo_flow_loss(
    model: RLModel, demos: Demonstrations, idx: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """SFT's flow-matching loss on frames ``idx``: the mean squared velocity error at x_t = (1 - t) a + t eps
    over the rows before each episode's end (every action dim, as SFT trained them)."""
    device = next(model.parameters()).device
    a = demos.chunks[idx].to(device)
    eps = torch.randn(tuple(a.shape), generator=generator).to(device)
    t = model.sample_time(len(idx), generator).to(device)
    tt = t[:, None, None]
    x_t = (1.0 - tt) * a + tt * eps
    v = model.velocity(x_t, t, model.encode(index_inputs(demos.inputs, idx, device)))
    keep = (~demos.pad[idx].to(device)).to(v.dtype)[:, :, None].expand_as(v)
    return (((v.float() - (eps - a)) ** 2) * keep).sum() / keep.sum().clamp(min=1.0)


@dataclass
class DemoTerm:
    """The demonstration loss of one iteration's update: each call draws ``batch_size`` frames and returns
    ``(coef x loss, metrics)`` for ``accumulated_step``'s ``aux``."""

    demos: Demonstrations
    weights: torch.Tensor  # (N,) draw weights
    coef: float  # bc.coef * bc.decay ** iteration
    batch_size: int
    generator: torch.Generator

    @classmethod
    def for_iteration(
        cls, demos: Demonstrations, weights: torch.Tensor, cfg: BCConfig, iteration: int, seed: int
    ) -> DemoTerm:
        """Iteration ``iteration``'s term (0-based: ``bc.coef`` itself first), drawing from ``seed``."""
        gen = torch.Generator().manual_seed(seed)
        return cls(demos, weights, cfg.coef * cfg.decay**iteration, cfg.batch_size, gen)

    def __call__(self, model: RLModel) -> tuple[torch.Tensor, dict[str, Any]]:
        idx = torch.multinomial(self.weights, self.batch_size, replacement=True, generator=self.generator)
        loss = demo_flow_loss(model, self.demos, idx, self.generator)
        return self.coef * loss, {"bc_loss": float(loss.detach()), "bc_coef": self.coef}
