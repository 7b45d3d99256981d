"""In-training evaluation, shared by every trainer: when to evaluate, on what, and running it.

Why one config type: the SFT and RL trainers used to carry their own ``[eval]`` tables and the RL
trainer borrowed SFT's internals to run them. ``EvalSchedule`` is the one schema of when and how much
(every N steps, initial, final, episodes, seeds, envs); ``EvalHookConfig`` adds what to evaluate on
(suite, tasks, chunk execution, image size), which SFT sets in its ``[eval]`` table and RL takes from
its training env. What runs is a ``cosmos_robot_envs.eval.EvalConfig``, the same object
``cosmos-robot eval`` runs, so an in-training number and a command-line number mean the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from cosmos_robot.config import StrictModel
from cosmos_robot_client.base_policy import BasePolicy

__all__ = ["EvalHookConfig", "EvalSchedule", "evaluate_policy"]


class EvalSchedule(StrictModel):
    """When the training policy is evaluated, how much, on which seeds: the part every trainer shares."""

    every: int = Field(default=0, ge=0)  # steps / iterations between evaluations during training (0: never)
    initial: bool = False  # evaluate the starting policy before training
    final: bool = False  # evaluate the exported final policy
    episodes_per_task: int = Field(default=10, ge=1)  # episodes per task and evaluation
    final_episodes_per_task: int | None = Field(default=None, ge=1)  # of the final evaluation (None: episodes_per_task)
    num_envs: int = Field(default=2, ge=1)  # envs in lockstep
    seed: int = 1000  # eval seed (different from the recording / training seeds: held-out layouts)
    vector_mode: Literal["sync", "async"] = "sync"  # async: a process per env (survives simulator crashes)

    def episodes(self, final: bool) -> int:
        """Episodes per task of a periodic (``final=False``) or the final evaluation."""
        return (self.final_episodes_per_task or self.episodes_per_task) if final else self.episodes_per_task


class EvalHookConfig(EvalSchedule):
    """The schedule plus what is evaluated; trainers with a training env (RL) fill these from it."""

    suite: str = "tabletop"  # env suite (cosmos_robot_envs.eval)
    tasks: list[str] = Field(default_factory=list)  # task names (empty: the whole suite)
    replan_steps: int = Field(default=5, ge=1)  # actions executed from each chunk
    image_size: int = Field(default=128, ge=8)  # camera side the envs render (the policy resizes)
    max_steps: int | None = Field(default=None, ge=1)  # cap on env steps per episode (None: each task's own)


def evaluate_policy(
    policy: BasePolicy, cfg: EvalHookConfig, out_dir: str | Path, label: str, *, final: bool = False
) -> dict[str, Any]:
    """Roll the policy out in the config's suite (``run_eval``); returns the results.json content.

    ``label`` names the policy in the results (``sft:step500``, ``joint_ppo:iter20``).
    """
    from cosmos_robot_envs.eval import EvalConfig, get_suite, run_eval

    tasks = get_suite(cfg.suite).resolve_tasks(list(cfg.tasks))
    config = EvalConfig(
        policy=label,
        suite=cfg.suite,
        tasks=tuple(tasks),
        episodes_per_task=cfg.episodes(final),
        num_envs=cfg.num_envs,
        replan_steps=cfg.replan_steps,
        seed=cfg.seed,
        image_size=cfg.image_size,
        max_steps=cfg.max_steps,
        vector_mode=cfg.vector_mode,
        video_episodes=0,
    )
    with torch.inference_mode():
        results: dict[str, Any] = run_eval(config, policy, out_dir, overwrite=True)
    return results
