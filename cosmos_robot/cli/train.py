"""``cosmos-robot train RECIPE``: SFT or online RL from a TOML recipe with ``--set`` overrides.

The trainers are a separate distribution that depends on this one, so they are imported inside the
command (an install without them gets a message, not an import error at start-up).
"""

# ruff: noqa: B008 - typer options are declared as parameter defaults
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import typer

from cosmos_robot.cli.common import fail

__all__ = ["command"]


def command(
    recipe: str = typer.Argument(..., metavar="RECIPE", help="A recipe name (listed above) or a .toml path."),
    set_: Optional[list[str]] = typer.Option(
        None, "--set", "-s", help="Override a recipe field: KEY=VALUE with a dotted key (repeatable)."
    ),
    resume: bool = typer.Option(
        True, help="Continue from the newest checkpoint in the output folder (--no-resume refuses to)."
    ),
    overwrite: bool = typer.Option(False, help="Delete a previous run in the output folder and start fresh."),
    nproc: int = typer.Option(
        1, "--nproc", min=1, help="Data-parallel training processes on this machine (started with torchrun)."
    ),
) -> None:
    """Train a policy from a recipe: SFT (records the demonstrations if missing) or online RL
    (joint_ppo, grpo, nft, dpo recipes) in simulation; checkpoints, resumes.

    Writes config.resolved.json, metrics.jsonl, TensorBoard events, checkpoints/step_XXXXXX/,
    learning_curve.png and final/ (a policy folder for `cosmos-robot serve --ckpt` / `eval --ckpt`)
    into the recipe's output.dir. Rerunning the same command after an interruption continues from
    the newest checkpoint with the same curve; a recipe that differs in a training field is refused.

    Recipes: {recipes}.

    \b
    Examples:
        cosmos-robot train debug
        cosmos-robot train sft_flow_tabletop --set train.steps=2000 --set output.dir=runs/sft_short
        cosmos-robot train joint_ppo_flow_tabletop --set train.device=cuda --set env.num_envs=16
        cosmos-robot train sft_flow_tabletop --nproc 2      # data parallel (docs/scale.md)
    """
    from cosmos_robot.config import ConfigError
    from cosmos_robot.policies.registry import CheckpointError

    try:
        from cosmos_robot_trainers.launch import launch
        from cosmos_robot_trainers.rl.trainer import RatioGateError
        from cosmos_robot_trainers.sft.rundir import RunDirError
    except ImportError as exc:
        raise fail(f"training needs cosmos-robot-trainers (pip install -e trainers): {exc}", 2) from exc
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        raise typer.Exit(_torchrun(recipe, list(set_ or []), resume, overwrite, nproc))
    try:
        result = launch(
            recipe, list(set_ or []), resume=resume, overwrite=overwrite, log=lambda m: typer.echo(m, err=True)
        )
    except (ConfigError, RunDirError, CheckpointError, FileNotFoundError, FileExistsError) as exc:
        raise fail(str(exc), 2) from exc
    except (RatioGateError, FloatingPointError) as exc:  # the RL ratio gate, a diverged loss
        raise fail(f"{exc}\nthe newest checkpoint is kept; fix the cause and rerun to resume", 1) from exc
    except KeyboardInterrupt:
        typer.secho("interrupted; rerun the same command to resume from the newest checkpoint", err=True)
        raise typer.Exit(130) from None
    if os.environ.get("RANK", "0") == "0":  # a data-parallel run's rank 0 speaks for it
        final = f"; policy: {result.final_dir}" if result.final_dir else ""
        typer.echo(f"step {result.step}: {result.out_dir}{final}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _leave_without_finalizing()


def _leave_without_finalizing() -> None:
    """End a data-parallel process now that its run is written and its process group destroyed, without
    the interpreter's finalization: gloo's worker threads may still hold tensors, and freeing them while
    the interpreter is torn down aborts the process (SIGABRT, "terminate called without an active
    exception"; seen once in CI on an FSDP run that had finished; pytorch/pytorch PR 179291)."""
    ray = sys.modules.get("ray")  # the Ray instance a rank started (RL scale-out) is shut down as atexit would
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _torchrun(recipe: str, overrides: list[str], resume: bool, overwrite: bool, nproc: int) -> int:
    """This command again under ``torchrun --standalone`` with ``nproc`` processes; their exit status."""
    from cosmos_robot.config import ConfigError
    from cosmos_robot_trainers.launch import check_world_size, load_train_recipe

    try:
        name, _ = load_train_recipe(recipe, overrides)  # a bad recipe fails here, not in N processes
        check_world_size(name, nproc)
    except (ConfigError, FileNotFoundError) as exc:
        raise fail(str(exc), 2) from exc
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["-m", "cosmos_robot.cli", "train", recipe, *[f"--set={o}" for o in overrides]]
    cmd += ["--resume" if resume else "--no-resume", "--overwrite" if overwrite else "--no-overwrite"]
    typer.echo(f"launching {nproc} processes: {' '.join(cmd[2:])}", err=True)
    return subprocess.call(cmd)
