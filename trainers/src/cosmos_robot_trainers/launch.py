"""``cosmos-robot train RECIPE``: pick the trainer a recipe names, validate it, run it.

Why a dispatch table keyed by the recipe's ``trainer`` field: one command launches every algorithm
(SFT, joint PPO, GRPO, DiffusionNFT, Flow-DPO), and each trainer's config model and entry point are
imported only when a recipe asks for them.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomllib

from cosmos_robot.config import ConfigError, apply_overrides, find_recipe, load_recipe
from cosmos_robot_trainers.rl.config import ALGORITHMS

__all__ = ["DATA_PARALLEL", "TRAINERS", "check_world_size", "launch", "load_train_recipe"]

# trainer name -> ("module:ConfigClass", "module:run_function")
TRAINERS: dict[str, tuple[str, str]] = {
    "sft": ("cosmos_robot_trainers.sft.config:SFTConfig", "cosmos_robot_trainers.sft.trainer:run_sft"),
    "text_sft": ("cosmos_robot_trainers.text.config:TextSFTConfig", "cosmos_robot_trainers.text.sft:run_text_sft"),
    "text_dpo": ("cosmos_robot_trainers.text.config:TextDPOConfig", "cosmos_robot_trainers.text.dpo:run_text_dpo"),
    "text_grpo": ("cosmos_robot_trainers.text.config:TextGRPOConfig", "cosmos_robot_trainers.text.grpo:run_text_grpo"),
    "text_opd": ("cosmos_robot_trainers.text.config:TextOPDConfig", "cosmos_robot_trainers.text.opd:run_text_opd"),
    "text_ppo": ("cosmos_robot_trainers.text.config:TextPPOConfig", "cosmos_robot_trainers.text.ppo:run_text_ppo"),
    "generator_sft": (
        "cosmos_robot_trainers.generator.config:GenSFTConfig",
        "cosmos_robot_trainers.generator.sft:run_generator_sft",
    ),
    "generator_dpo": (
        "cosmos_robot_trainers.generator.config:GenDPOConfig",
        "cosmos_robot_trainers.generator.dpo:run_generator_dpo",
    ),
    "generator_nft": (
        "cosmos_robot_trainers.generator.config:GenNFTConfig",
        "cosmos_robot_trainers.generator.nft:run_generator_nft",
    ),
    **{
        name: ("cosmos_robot_trainers.rl.config:RLConfig", "cosmos_robot_trainers.rl.trainer:run_rl")
        for name in ALGORITHMS
    },
}


# trainers that run data parallel under torchrun / `train --nproc N` (cosmos_robot/distributed.py)
DATA_PARALLEL = frozenset(
    {
        "sft",
        "text_sft",
        "text_grpo",
        "text_ppo",
        "text_opd",
        "text_dpo",
        "generator_sft",
        "generator_dpo",
        "generator_nft",
        *ALGORITHMS,
    }
)


def check_world_size(name: str, world_size: int) -> None:
    """Refuse a multi-process launch of a trainer that would run N unsynchronised copies into one folder."""
    if world_size > 1 and name not in DATA_PARALLEL:
        raise ConfigError(
            f"trainer {name!r} runs in one process; data-parallel training (--nproc / torchrun, here "
            f"{world_size} processes) is built for: {', '.join(sorted(DATA_PARALLEL))}"
        )


def _resolve(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_train_recipe(recipe: str | Path, overrides: list[str] | None = None) -> tuple[str, Any]:
    """``(trainer name, validated config)`` of a recipe name or path with ``--set`` overrides applied."""
    path = find_recipe(recipe)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
    name = apply_overrides(raw, overrides or []).get("trainer", "sft")
    if name not in TRAINERS:
        hint = difflib.get_close_matches(str(name), list(TRAINERS), n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else f" (known: {', '.join(sorted(TRAINERS))})"
        raise ConfigError(f"{path}: trainer: unknown trainer {name!r}{extra}")
    config_cls = _resolve(TRAINERS[name][0])
    return name, load_recipe(path, overrides, config_cls)


def launch(
    recipe: str | Path,
    overrides: list[str] | None = None,
    *,
    resume: bool = True,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> Any:
    """Validate and run a recipe; returns the trainer's result object."""
    name, config = load_train_recipe(recipe, overrides)
    check_world_size(name, int(os.environ.get("WORLD_SIZE", "1")))
    run = _resolve(TRAINERS[name][1])
    try:
        return run(config, resume=resume, overwrite=overwrite, log=log)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
