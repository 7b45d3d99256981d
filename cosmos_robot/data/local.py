"""Local LeRobot datasets: is a folder a whole dataset, an interrupted recording, or a killed one?

Why this check runs before LeRobot ever sees the folder: ``LeRobotDataset(repo_id, root=DIR)`` treats a
missing or short file as "not cached yet" and goes to the Hugging Face Hub for it, so a recording
killed mid-write (LeRobot buffers episode metadata and closes its parquet files only in
``finalize``) ends in a network error about ``local/cosmos_robot_tabletop``, or a long stall
offline, instead of a message about the folder. Here every file LeRobot would otherwise fetch is
checked on disk (footers readable, episode and frame counts as ``meta/info.json`` says), so a
dataset either opens with no network access at all or is refused with what to do about it.

The recorder's sidecar (``meta/cosmos_robot.json``) says how its recording ended: ``complete``,
``interrupted`` (Ctrl-C or an error: LeRobot's ``finalize`` ran, the episodes written so far form a
valid dataset, and rerunning the command resumes it) or ``recording`` (still running, or killed:
not resumable, LeRobot's buffered metadata is lost).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosmos_robot.data.schema import SIDECAR

__all__ = ["IncompleteDatasetError", "check_local_dataset", "read_sidecar", "recording_status"]


class IncompleteDatasetError(FileExistsError):
    """A dataset folder exists but does not hold a whole dataset; the message says how to fix it."""


def read_sidecar(root: Path) -> dict[str, Any] | None:
    """The recorder's sidecar of ``root``, or None when there is none."""
    path = root / SIDECAR
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise IncompleteDatasetError(f"{path} is not valid JSON ({exc}); {_fix(root)}") from exc
    return data if isinstance(data, dict) else None


def recording_status(root: str | Path) -> str:
    """``missing`` (no ``meta/info.json``), ``complete``, ``interrupted``, ``recording`` (running or
    killed) or ``unrecorded`` (a LeRobot dataset without the recorder's sidecar)."""
    root = Path(root)
    if not (root / "meta" / "info.json").exists():
        return "missing"
    side = read_sidecar(root)
    if side is None:
        return "unrecorded"
    return str(side.get("status", "recording"))


def _fix(root: Path) -> str:
    return f"delete it, or record it again with `cosmos-robot record --out {root} --overwrite`"


def killed_message(root: Path) -> str:
    return (
        f"{root} holds a recording that is still running or was killed before it could close its files "
        f"({SIDECAR} says status 'recording'); LeRobot keeps the last episodes' metadata in memory until the "
        f"end, so it cannot be resumed: {_fix(root)}"
    )


def _parquet_rows(files: list[Path], columns: list[str] | None = None) -> tuple[int, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, tables = 0, []
    for f in files:
        try:
            rows += pq.ParquetFile(f).metadata.num_rows
            if columns:
                tables.append(pq.read_table(f, columns=columns))
        except (OSError, pa.ArrowException) as exc:
            raise IncompleteDatasetError(f"{f} cannot be read ({exc})") from exc
    return rows, pa.concat_tables(tables) if tables else None


def check_local_dataset(root: str | Path) -> dict[str, Any]:
    """``meta/info.json`` of ``root`` once every file LeRobot needs is there; raises otherwise.

    ``FileNotFoundError``: not a LeRobot dataset. :class:`IncompleteDatasetError`: a killed recording
    or missing / unreadable / short files, with what to do.
    """
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.exists():
        raise FileNotFoundError(
            f"{root}: not a LeRobot dataset (no meta/info.json); record one with `cosmos-robot record --out {root}`"
        )
    if recording_status(root) == "recording":
        raise IncompleteDatasetError(killed_message(root))
    info: dict[str, Any] = json.loads(info_path.read_text())
    try:
        _check_files(root, info)
    except IncompleteDatasetError as exc:
        raise IncompleteDatasetError(
            f"{root}: incomplete LeRobot dataset: {exc}. It was probably left by a recording that was killed; "
            "opening it would make LeRobot look for the missing files on the Hugging Face Hub. "
            f"{_fix(root).capitalize()}"
        ) from None
    return info


def _check_files(root: Path, info: dict[str, Any]) -> None:
    """Raise :class:`IncompleteDatasetError` (a short reason) unless LeRobot finds everything on disk."""
    if not (root / "meta" / "tasks.parquet").exists():
        raise IncompleteDatasetError("meta/tasks.parquet is missing")
    episodes_files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    data_files = sorted((root / "data").glob("*/*.parquet"))
    total_episodes, total_frames = int(info.get("total_episodes", 0)), int(info.get("total_frames", 0))
    videos = [k for k, f in info.get("features", {}).items() if f.get("dtype") == "video"]
    columns = [c for k in videos for c in (f"videos/{k}/chunk_index", f"videos/{k}/file_index")]
    n_episodes, table = _parquet_rows(episodes_files, columns)
    if n_episodes != total_episodes:
        raise IncompleteDatasetError(
            f"meta/info.json lists {total_episodes} episodes, meta/episodes/ holds {n_episodes}"
        )
    n_frames, _ = _parquet_rows(data_files)
    if n_frames != total_frames:
        raise IncompleteDatasetError(f"meta/info.json lists {total_frames} frames, data/ holds {n_frames}")
    if table is not None and videos:
        template = str(info.get("video_path"))
        for key in videos:
            chunks = table.column(f"videos/{key}/chunk_index").to_pylist()
            files = table.column(f"videos/{key}/file_index").to_pylist()
            for chunk, file in sorted(set(zip(chunks, files))):
                path = root / template.format(video_key=key, chunk_index=chunk, file_index=file)
                if not path.exists():
                    raise IncompleteDatasetError(f"{path.relative_to(root)} is missing")
