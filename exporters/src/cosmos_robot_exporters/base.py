"""The exporter seam: one ``Exporter`` per family, found through the family registry, and the
bookkeeping every export shares (staging folder, refusal of an existing ``out``, manifest, tensor matching).

Why the family registry picks the exporter: ``cosmos-robot export SOURCE`` must work for any folder
``serve --ckpt`` takes (and for the training runs that produce them) without a table of family names
here; ``family_of(folder).exporter()`` answers, and a family without one says which families have one.

Why ``<out>.tmp`` then a rename: a killed export (Ctrl-C, OOM, a full disk) must never leave a folder
that looks complete; the manifest is written last inside the staging folder, so a folder named ``out``
always holds a complete export with its checksums.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cosmos_robot.manifest import MANIFEST_FILE, staged_folder, verify_manifest
from cosmos_robot.policies.registry import CheckpointError

__all__ = [
    "ExportError",
    "ExportResult",
    "Exporter",
    "check_target",
    "PolicyFolderExporter",
    "choose_target",
    "export_checkpoint",
    "begin_export",
    "match_tensors",
    "staged_export",
]

log = logging.getLogger(__name__)

VALUE_HEAD = "value_head."  # where every RL model keeps its critic (cosmos_robot.policies.interfaces.RLModel)


class ExportError(CheckpointError):
    """An export that cannot be made as asked; the message names the folder, file, key or shape."""


@dataclass
class ExportResult:
    """What one export wrote."""

    out: Path  # the finished export folder
    family: str  # the registry family of the source (``flow``, ``pi05``, ``groot``)
    target: str  # the format written (one of the exporter's ``targets``)
    source: Path  # what was exported (a policy folder, a run folder or one of its checkpoints)
    files: list[str] = field(default_factory=list)  # relative posix paths under ``out``, manifest.json included
    dropped: list[str] = field(default_factory=list)  # trained tensors left out on purpose (e.g. PPO's value head)
    notes: list[str] = field(default_factory=list)  # what the user should know (EMA used, base kept, ...)

    def summary(self) -> str:
        lines = [f"exported {self.family} ({self.target}) from {self.source} to {self.out}: {len(self.files)} files"]
        if self.dropped:
            head = ", ".join(self.dropped[:4]) + (f" and {len(self.dropped) - 4} more" if len(self.dropped) > 4 else "")
            lines.append(f"  dropped {len(self.dropped)} tensors: {head}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@runtime_checkable
class Exporter(Protocol):
    """One family's exporter. ``targets[0]`` is the default target."""

    name: str
    targets: tuple[str, ...]

    def export(self, source: Path, out: Path, *, target: str, base: Path | None, overwrite: bool) -> ExportResult:
        """Write ``out`` (atomically, ending with ``write_manifest``) from ``source`` in format ``target``."""
        ...


def check_target(exporter: Exporter, target: str) -> None:
    """``target`` is one the exporter writes; else an ``ExportError`` listing them."""
    if target not in exporter.targets:
        raise ExportError(f"the {exporter.name} exporter writes {exporter.targets}, not {target!r}")


def begin_export(exporter: Exporter, source: Path, target: str) -> tuple[Path, Any | None, dict[str, Any]]:
    """What every export starts with: the target checked, the source as a run (``sources.RunSource``, None for
    a policy folder), and the manifest's record (family, target, source; a run's trainer, step, checkpoint)."""
    from cosmos_robot_exporters.sources import resolve_run

    check_target(exporter, target)
    source = Path(source)
    run = resolve_run(source)
    info: dict[str, Any] = {"family": exporter.name, "target": target, "source": str(source)}
    if run is not None:
        info.update({"trainer": run.trainer, "step": run.step, "checkpoint": str(run.checkpoint)})
    return source, run, info


def choose_target(exporter: Exporter, target: str | None) -> str:
    """``target`` checked against the exporter's list (``None``: its default, the first)."""
    if target is None:
        return exporter.targets[0]
    if target not in exporter.targets:
        raise ExportError(
            f"the {exporter.name} exporter writes {', '.join(repr(t) for t in exporter.targets)}, not {target!r} "
            f"(the default is {exporter.targets[0]!r})"
        )
    return target


def export_checkpoint(
    source: str | Path,
    out: str | Path,
    *,
    target: str | None = None,
    base: str | Path | None = None,
    overwrite: bool = False,
) -> ExportResult:
    """Export a policy folder or a training run (``runs/NAME``, or one of its ``checkpoints/step_*``).

    The family comes from the folder (for a run: from the policy it trained, see ``sources``) and its
    exporter from the family registry. ``target``: one of that exporter's targets (default: its
    first); ``base``: the folder the export is built on where the target needs one (GR00T);
    ``overwrite``: replace an existing export at ``out``.
    """
    from cosmos_robot_exporters.sources import family_for, resolve_run

    src = Path(source)
    # a corrupted folder must not come out with a fresh manifest vouching for its bytes
    for folder in (None if resolve_run(src) is not None else src, None if base is None else Path(base)):
        if folder is not None and folder.is_dir():
            verify_manifest(folder)
    family = family_for(src)
    exporter = family.exporter()
    if not isinstance(exporter, Exporter):
        raise ExportError(f"family {family.name!r}: its exporter {type(exporter).__name__} is not an Exporter")
    chosen = choose_target(exporter, target)
    return exporter.export(
        src, Path(out), target=chosen, base=Path(base) if base is not None else None, overwrite=overwrite
    )


# --- staging -------------------------------------------------------------------------------------


def _inside(child: Path, parent: Path) -> bool:
    child, parent = child.resolve(), parent.resolve()
    return child == parent or parent in child.parents


def check_out(out: Path, overwrite: bool, protect: tuple[Path | None, ...] = ()) -> None:
    """Refuse an ``out`` that would destroy a source, or an existing non-empty one without ``overwrite``.

    With ``overwrite`` only an earlier export (a folder with ``manifest.json``) or an empty folder is
    replaced: ``--overwrite`` with a mistyped ``--out`` must not delete someone's data.
    """
    for path in protect:
        if path is not None and path.exists() and _inside(path, out):
            raise ExportError(
                f"--out {out} would overwrite the folder being exported from ({path}); pick another --out"
            )
        if path is not None and path.is_dir() and _inside(out, path):
            raise ExportError(
                f"--out {out} is inside the folder being exported from ({path}); pick a folder outside it"
            )
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; pass a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(f"--out {out} already exists and is not empty; pass --overwrite to replace it")
        if not (out / MANIFEST_FILE).is_file():
            found = sorted(p.name for p in out.iterdir())[:6]
            raise ExportError(
                f"--out {out} holds files that are not an export (no {MANIFEST_FILE}; found {found}); "
                "refusing to delete it even with --overwrite"
            )


@contextmanager
def staged_export(
    out: Path, overwrite: bool, info: Mapping[str, Any], protect: tuple[Path | None, ...] = ()
) -> Iterator[Path]:
    """``cosmos_robot.manifest.staged_folder`` after ``check_out``: refuse a bad ``out`` before writing."""
    out = Path(out)
    check_out(out, overwrite, protect)
    with staged_folder(out, info) as tmp:
        yield tmp


def written_files(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


# --- tensors -------------------------------------------------------------------------------------


def _prefix_for(expected: list[str], found: Mapping[str, Any]) -> str | None:
    """The wrapper prefix ``p`` with ``p + name`` in ``found`` for the most expected names (None: none)."""
    if not expected:
        return None
    counts: dict[str, int] = {}
    probes = expected[:: max(1, len(expected) // 16)]
    for name in probes:
        for key in found:
            if key.endswith(name):
                prefix = key[: len(key) - len(name)]
                if prefix == "" or prefix.endswith("."):
                    counts[prefix] = counts.get(prefix, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda p: (counts[p], -len(p)))


def match_tensors(
    expected: Mapping[str, tuple[int, ...]],
    found: Mapping[str, Any],
    *,
    what: str,
    droppable: Callable[[str], bool] = lambda key: key.startswith(VALUE_HEAD),
) -> tuple[dict[str, str], list[str]]:
    """Map each expected tensor name to its key in ``found`` (trained weights under any wrapper prefix).

    Returns ``(expected name -> found key, dropped keys)``; keys of ``found`` outside the expected
    set that ``droppable`` accepts (PPO's value head) are dropped and listed, anything else missing,
    unexpected or of another shape is an ``ExportError`` naming the tensors and both shapes.
    """
    names = sorted(expected)
    prefix = _prefix_for(names, found)
    if prefix is None:
        raise ExportError(
            f"{what}: none of the {len(names)} tensors the target needs is in the trained weights "
            f"(e.g. {names[:2]}; the weights hold e.g. {sorted(found)[:3]}): a checkpoint of another model?"
        )
    mapping = {name: prefix + name for name in names if prefix + name in found}
    used = set(mapping.values())
    missing = [n for n in names if n not in mapping]
    leftover = sorted(k for k in found if k not in used)
    dropped = [k for k in leftover if droppable(k)]
    unexpected = [k for k in leftover if not droppable(k)]
    problems = []
    if missing:
        problems.append(f"missing tensors: {_head(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_head(unexpected)}")
    for name, key in mapping.items():
        got = tuple(found[key].shape)
        if got != tuple(expected[name]):
            problems.append(
                f"tensor {name!r}: shape {got} in the trained weights vs {tuple(expected[name])} in the target"
            )
    if problems:
        raise ExportError(f"{what}: the trained weights do not match:\n  " + "\n  ".join(problems[:12]))
    return mapping, dropped


def _head(names: list[str], n: int = 6) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


class PolicyFolderExporter(abc.ABC):
    """An exporter whose output is the family's own policy folder (``policy.save_pretrained``).

    The shared path: a policy folder is loaded and written again; a training run's weights go into a
    template policy (``policy_from_run``). Subclasses supply those two loaders and any notes about the
    written folder (``notes_for``).
    """

    name: str
    targets: tuple[str, ...]

    @abc.abstractmethod
    def from_folder(self, source: Path) -> tuple[Any, list[str]]:
        """``(policy, notes)`` of a policy folder."""

    @abc.abstractmethod
    def policy_from_run(self, run: Any, base: Path | None) -> tuple[Any, list[str], list[str]]:
        """``(policy, dropped tensor names, notes)`` of a training run (``sources.RunSource``)."""

    def notes_for(self, out: Path) -> list[str]:
        """Notes about the written folder ``out``."""
        return []

    def export(self, source: Path, out: Path, *, target: str, base: Path | None, overwrite: bool) -> ExportResult:
        source, run, info = begin_export(self, source, target)
        out = Path(out)
        dropped: list[str] = []
        if run is None:
            if base is not None:
                raise ExportError(f"{source} is a policy folder: a {self.name} export of it takes no --base")
            policy, notes = self.from_folder(source)
        else:
            policy, dropped, notes = self.policy_from_run(run, base)
        info["dropped"] = dropped
        with staged_export(out, overwrite, info, protect=(source, base)) as tmp:
            policy.save_pretrained(tmp)
        notes += self.notes_for(out)
        return ExportResult(out, self.name, target, source, written_files(out), dropped, notes)
