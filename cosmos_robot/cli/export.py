"""``cosmos-robot export SOURCE --out DIR``: a policy folder or a training run as a self-contained export.

The exporters are a separate distribution that depends on this one (docs/exporters.md), so they are
imported inside the command: an install without them gets a message, not an import error at start-up.
"""

# ruff: noqa: B008 - typer options are declared as parameter defaults
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cosmos_robot.cli.common import fail

__all__ = ["command"]


def command(
    source: Path = typer.Argument(
        ...,
        metavar="SOURCE",
        help="A policy folder (what serve --ckpt takes, e.g. runs/NAME/final), a training run runs/NAME "
        "(its newest checkpoint) or one checkpoint runs/NAME/checkpoints/step_XXXXXX.",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="The folder to write; refused if it exists and is not empty."),
    target: Optional[str] = typer.Option(
        None,
        help="The format: flow -> flow; pi05 -> lerobot; groot -> lerobot (a LeRobot GrootPolicy folder) or gr00t "
        "(a raw GR00T N1.7 checkpoint). Default: the family's first.",
    ),
    base: Optional[Path] = typer.Option(
        None,
        help="groot: the base checkpoint whose action head is replaced (default: the run's init; for --target gr00t "
        "the base_model_path it names). flow/pi05 runs: a folder to use instead of the run's init.",
    ),
    overwrite: bool = typer.Option(False, help="Replace an earlier export at --out (only an export is deleted)."),
) -> None:
    """Export a policy or a training run as a self-contained folder with a checksum manifest.

    The family is detected from the folder (for a run: from the policy it trained) and the family
    registry names its exporter. The export is written to OUT.tmp and renamed when complete; its
    manifest.json (sha256 and size of every file) is verified by serve --ckpt and eval --ckpt.
    Trained tensors the target has no place for (PPO's value head) are dropped and listed.

    \b
    Examples:
        cosmos-robot export runs/joint_ppo_pi05_libero --out exports/pi05
        cosmos-robot export runs/ppo_groot/checkpoints/step_000020 -o exports/g20
        cosmos-robot export runs/ppo_groot -o exports/groot --base ckpts/groot_init
        cosmos-robot export runs/ppo_groot -o exports/raw --target gr00t
        cosmos-robot export runs/sft_flow_tabletop/final -o exports/flow --overwrite
    """
    from cosmos_robot.policies.registry import CheckpointError

    try:
        from cosmos_robot_exporters import export_checkpoint
    except ImportError as exc:
        raise fail(f"exporting needs cosmos-robot-exporters (pip install -e exporters): {exc}", 2) from exc
    try:
        result = export_checkpoint(source, out, target=target, base=base, overwrite=overwrite)
    except (CheckpointError, FileNotFoundError, NotADirectoryError) as exc:
        raise fail(str(exc), 2) from exc
    except KeyboardInterrupt:
        typer.secho(f"interrupted; nothing was written to {out}", err=True)
        raise typer.Exit(130) from None
    typer.echo(result.summary())
