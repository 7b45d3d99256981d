"""From training weights to a servable policy folder, and the optional in-training evaluation.

Why export through ``FlowPolicy(model, stats).save_pretrained``: ``final/`` is then the same folder
format every other tool reads (``cosmos-robot serve --ckpt``, ``load_policy``, the RL trainers),
with the normalisation stats the data were trained with. The exported weights are the EMA weights
when the recipe keeps an EMA (smoother, usually better closed-loop), else the raw ones.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.normalize import FeatureStats
from cosmos_robot.policies.flow import FlowModel, FlowPolicy
from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_trainers.sft.config import EvalHookConfig

__all__ = ["EMA", "build_policy", "evaluate_policy", "export_policy"]


class EMA:
    """Exponential moving average of the parameters, warmed up (decay ``min(d, (1 + n) / (10 + n))``)."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.updates = 0
        self.shadow = {name: p.detach().clone() for name, p in model.named_parameters()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))
        names = list(self.shadow)
        params = dict(model.named_parameters())
        torch._foreach_lerp_([self.shadow[n] for n in names], [params[n].detach() for n in names], 1.0 - d)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        for name, value in state["shadow"].items():
            self.shadow[name].copy_(value)

    def copy_to(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(self.shadow[name])


def build_policy(model: FlowModel, stats: dict[str, FeatureStats], ema: EMA | None = None) -> FlowPolicy:
    """A ``FlowPolicy`` over a copy of ``model`` (with the EMA weights when given)."""
    served = copy.deepcopy(model)
    if ema is not None:
        ema.copy_to(served)
    return FlowPolicy(served.eval(), stats)


def export_policy(policy: Any, out_dir: str | Path) -> Path:
    """Write the policy folder (``policy.save_pretrained``, any family) into ``<out>.tmp`` first, then
    rename (no half-written ``final/``)."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    policy.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def evaluate_policy(policy: BasePolicy, cfg: EvalHookConfig, out_dir: str | Path, label: str) -> dict[str, Any]:
    """Roll the policy out in the config's suite (``cosmos_robot_envs.eval.run_eval``); results.json content.

    ``label`` names the policy in the results (``sft:step500``, ``joint_ppo:iter20``).
    """
    from cosmos_robot_envs.eval import EvalConfig, get_suite, run_eval

    tasks = get_suite(cfg.suite).resolve_tasks(list(cfg.tasks))
    config = EvalConfig(
        policy=label,
        suite=cfg.suite,
        tasks=tuple(tasks),
        episodes_per_task=cfg.episodes_per_task,
        num_envs=cfg.num_envs,
        replan_steps=cfg.replan_steps,
        seed=cfg.seed,
        image_size=cfg.image_size,
        vector_mode=cfg.vector_mode,
        video_episodes=0,
    )
    with torch.inference_mode():
        results: dict[str, Any] = run_eval(config, policy, out_dir, overwrite=True)
    return results
