"""``cosmos-robot record``: scripted-expert demonstrations as a LeRobot dataset; the options are
``RecordConfig``'s fields (``cosmos_robot/data/record.py``) with their defaults and comments."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from cosmos_robot.cli.common import fail
from cosmos_robot.cli.options import RECORD, split_tasks, tasks_option

__all__ = ["command"]


def command(
    out: str = typer.Option(..., help="Dataset folder to create (a LeRobot v3 dataset)."),
    suite: str = RECORD.option("suite"),
    tasks: Optional[str] = tasks_option(RECORD),
    episodes_per_task: int = RECORD.option("episodes_per_task"),
    num_envs: int = RECORD.option("num_envs"),
    image_size: int = RECORD.option("image_size"),
    seed: int = RECORD.option(
        "seed", help="Base seed; episode seeds hash it with the task and index (disjoint from eval's)."
    ),
    only_success: bool = RECORD.option("only_success", "--only-success/--keep-failed"),
    overwrite: bool = typer.Option(
        False,
        help="Replace an existing dataset in --out (default: resume an interrupted recording of the same config).",
    ),
    vector_mode: str = RECORD.option("vector_mode"),
    videos: bool = RECORD.option("use_videos", "--videos/--no-videos"),
    cameras: bool = RECORD.option("cameras", "--cameras/--no-cameras"),
    expert_noise: float = RECORD.option("expert_noise"),
    noise_tasks: Optional[str] = RECORD.option(
        "noise_tasks",
        help="Comma-separated tasks whose episodes --expert-noise perturbs (default: every task).",
        from_config=lambda names: ",".join(names) or None,
        to_config=split_tasks,
    ),
    max_steps: Optional[int] = RECORD.option("max_steps"),
    repo_id: str = RECORD.option("repo_id"),
    image_writer_threads: int = RECORD.option("image_writer_threads"),
) -> None:
    """Record scripted-expert demonstrations as a LeRobot dataset (cameras, state, actions, instruction).

    Episodes stop at success; failed rollouts are dropped unless --keep-failed. The seeds, the
    command and any dropped episodes are listed in DIR/meta/cosmos_robot.json. Read it back with
    LeRobotDataset(repo_id, root=DIR) or cosmos_robot.data.load_demonstrations. Rerunning an
    interrupted command resumes it; a complete dataset of the same config is left alone.

    \b
    Example:
        cosmos-robot record --tasks reach,push,pick_place,open_drawer --episodes-per-task 50 --out data/tabletop
        cosmos-robot record --suite driving --no-cameras --max-steps 100 --episodes-per-task 100 --out data/driving
    """
    from rich.console import Console

    from cosmos_robot.data.local import recording_status
    from cosmos_robot.data.progress import RichRecordProgress
    from cosmos_robot.data.record import RecordConfig, record_demonstrations

    try:
        config = RecordConfig(
            tasks=split_tasks(tasks),
            episodes_per_task=episodes_per_task,
            suite=suite,
            num_envs=num_envs,
            image_size=image_size,
            seed=seed,
            only_success=only_success,
            vector_mode=vector_mode,
            use_videos=videos,
            cameras=cameras,
            expert_noise=expert_noise,
            noise_tasks=split_tasks(noise_tasks),
            max_steps=max_steps,
            repo_id=repo_id,
            image_writer_threads=image_writer_threads,
        )
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    before = "missing" if overwrite else recording_status(out)
    if before == "interrupted":
        typer.echo(f"resuming the interrupted recording in {out}", err=True)
    try:
        with RichRecordProgress(Console(stderr=True)) as progress:
            summary = record_demonstrations(
                config, out, overwrite=overwrite, callbacks=progress, command=["cosmos-robot", *sys.argv[1:]]
            )
    except KeyboardInterrupt:
        typer.secho(
            f"interrupted; the episodes written so far form a valid dataset in {out}: rerun the same command to "
            "record the rest",
            err=True,
        )
        raise typer.Exit(130) from None
    except (FileExistsError, ValueError) as exc:
        raise fail(str(exc), 2) from exc
    except RuntimeError as exc:
        raise fail(str(exc), 1) from exc
    if before == "complete":
        typer.echo(f"{out} already holds this recording, complete; nothing to do (--overwrite records it again)")
    counts, thr = summary["counts"], summary["throughput"]
    typer.echo(
        f"kept {counts['kept']}/{counts['rolled_out']} episodes ({counts['frames']} frames), "
        f"{counts['failed']} failed; {thr['episodes_per_min']:.1f} episodes/min; dataset: {out}"
    )
