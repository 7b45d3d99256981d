"""``manifest.json``: the sha256 and size of every file of an exported folder, checked when it is loaded.

Why a manifest: an export is copied between machines (scp, object stores, USB sticks) and served on
robots; a truncated ``model.safetensors`` may still parse (safetensors only reads the header) and a
hand-edited ``config.json`` still loads, and both give a policy that moves the robot differently
from the one that was evaluated. A loader that finds ``manifest.json`` refuses any listed file that
is missing or whose size or sha256 differ, naming the file and both values.

What it does not do (decided here, documented in docs/exporters.md):

- files present in the folder but not listed (a README, ``.gitattributes`` or the ``.cache/``
  that a hub download adds, eval results written next to it) are a warning, not an error: they do
  not change the listed bytes, and refusing them would break every folder someone annotates.
  ``verify_manifest`` logs them and ``check_manifest`` returns them;
- a folder without ``manifest.json`` (written before manifests existed, a LeRobot download) is not an
  error: ``verify_manifest`` returns False and loading goes on unverified;
- it is an integrity check, not a signature: whoever can rewrite the weights can rewrite the manifest.

Torch-free on purpose: it runs before any model is built (and in tools that never build one).
Files are hashed in 1 MiB blocks, so a 7 GB checkpoint never sits in memory; sizes are compared for
every file before any hash, so a truncated copy fails in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cosmos_robot.policies.registry import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "ManifestCheck",
    "check_manifest",
    "file_sha256",
    "read_manifest",
    "staged_folder",
    "verify_manifest",
    "write_manifest",
]

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
FORMAT = "cosmos-robot-manifest"
FORMAT_VERSION = 1
BLOCK = 1 << 20  # 1 MiB


@dataclass
class ManifestCheck:
    """What ``check_manifest`` found: the verified files and those the manifest does not list."""

    folder: Path
    verified: list[str] = field(default_factory=list)  # relative posix paths, every one matched
    unlisted: list[str] = field(default_factory=list)  # present in the folder, not in the manifest (a warning)
    info: dict[str, Any] = field(default_factory=dict)  # the manifest's "info" (family, source, target, ...)

    @property
    def note(self) -> str:
        """One line for logs: what was verified and which files were added after export."""
        text = f"{self.folder}: {len(self.verified)} files match {MANIFEST_FILE}"
        if self.unlisted:
            head = ", ".join(self.unlisted[:8]) + (
                f" and {len(self.unlisted) - 8} more" if len(self.unlisted) > 8 else ""
            )
            text += f"; not listed (added after export, not verified): {head}"
        return text


def file_sha256(path: str | Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


_TMP_FILE = f".{MANIFEST_FILE}.tmp"  # written, then renamed: never listed (a stale one may survive a kill)


def _files(root: Path) -> list[str]:
    """Every regular file under ``root`` (symlinks followed) as sorted relative posix paths, the manifest excluded."""
    found = []
    for dirpath, _dirnames, filenames in os.walk(root, followlinks=True):
        for name in filenames:
            full = Path(dirpath) / name
            if full.is_file():
                rel = full.relative_to(root).as_posix()
                if rel not in (MANIFEST_FILE, _TMP_FILE):
                    found.append(rel)
    return sorted(found)


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("cosmos-robot")
    except PackageNotFoundError:
        from cosmos_robot import __version__

        return __version__


@contextmanager
def staged_folder(out: str | Path, info: Mapping[str, Any] | None = None) -> Iterator[Path]:
    """Yield ``<out>.tmp`` to write a folder into; on success add its manifest and swap it in as ``out``.

    On an error the staging folder is removed and ``out`` is left as it was; a kill at any moment
    leaves either the old ``out`` (or ``out.old``) or the new one, never half of one. Trainers'
    ``final/`` and every ``cosmos-robot export`` are written through this.
    """
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        write_manifest(tmp, dict(info or {}))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.with_name(out.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    if old.exists():
        shutil.rmtree(old)


def write_manifest(folder: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write ``folder/manifest.json`` listing every file below ``folder`` (sha256, bytes); returns its path.

    ``extra`` (e.g. ``{"family": "pi05", "source": ..., "target": ...}``) is stored under ``"info"``;
    it must be JSON-serialisable. An existing manifest is replaced.
    """
    root = Path(folder)
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: not a folder; write_manifest lists the files of a folder")
    files = {rel: {"sha256": file_sha256(root / rel), "size": (root / rel).stat().st_size} for rel in _files(root)}
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cosmos_robot_version": _version(),
        "hash": "sha256",
        "info": dict(extra or {}),
        "files": files,
    }
    path = root / MANIFEST_FILE
    tmp = root / _TMP_FILE
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The parsed ``manifest.json`` of ``folder`` (None when there is none); a malformed one is a
    ``CheckpointError`` naming the file and what is wrong."""
    path = Path(folder) / MANIFEST_FILE
    if not path.exists():
        return None
    if not path.is_file():  # a folder called manifest.json must not pass as "no manifest"
        raise CheckpointError(f"{path}: is not a file; a manifest is a JSON file")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f'{path}: not a cosmos-robot manifest (no "format": {FORMAT!r})')
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format_version {version!r} is newer than this cosmos-robot reads ({FORMAT_VERSION}); "
            "upgrade cosmos-robot"
        )
    files = data.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) and isinstance(v.get("size"), int)
        for v in files.values()
    ):
        raise CheckpointError(f'{path}: \'files\' must map each path to {{"sha256": str, "size": int}}')
    for rel in files:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CheckpointError(f"{path}: listed path {rel!r} leaves the folder")
    return data


def _short(digest: str) -> str:
    return digest[:12] + "..."


def check_manifest(folder: str | Path) -> ManifestCheck | None:
    """Verify ``folder`` against its manifest (None when it has none).

    Raises ``CheckpointError`` naming the first listed file that is missing, has another size or
    another sha256. Files the manifest does not list come back in ``unlisted`` (not an error).
    """
    root = Path(folder)
    manifest = read_manifest(root)
    if manifest is None:
        return None
    listed: dict[str, dict[str, Any]] = manifest["files"]
    # sizes first: a truncated or missing file fails before hashing gigabytes
    for rel, entry in listed.items():
        path = root / rel
        if not path.is_file():
            raise CheckpointError(
                f"{path}: listed in {MANIFEST_FILE} but missing: the export is incomplete (copy the whole folder)"
            )
        size = path.stat().st_size
        if size != entry["size"]:
            raise CheckpointError(
                f"{path}: size mismatch with {MANIFEST_FILE} (expected {entry['size']} bytes, got {size}): "
                "the file is truncated, corrupted or was changed after export"
            )
    for rel, entry in listed.items():
        path = root / rel
        got = file_sha256(path)
        if got != entry["sha256"]:
            raise CheckpointError(
                f"{path}: sha256 mismatch with {MANIFEST_FILE} (expected {_short(entry['sha256'])}, "
                f"got {_short(got)}): the file is corrupted or was changed after export"
            )
    unlisted = [rel for rel in _files(root) if rel not in listed and not rel.startswith(".cache/")]
    info = manifest.get("info") if isinstance(manifest.get("info"), dict) else {}
    return ManifestCheck(root, sorted(listed), unlisted, dict(info or {}))


def verify_manifest(folder: str | Path) -> bool:
    """True when ``folder`` has a manifest and every listed file matches; False when it has none.

    A mismatch is a ``CheckpointError`` naming the file (see ``check_manifest``). Files added after
    export are logged as a warning naming them; they do not fail the check.
    """
    result = check_manifest(folder)
    if result is None:
        return False
    if result.unlisted:
        log.warning("%s", result.note)
    return True
