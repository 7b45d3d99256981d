"""Architecture rules from ARCHITECTURE.md, enforced: torch-free packages stay torch-free,
dependencies point down the component table, nothing that crosses a process boundary is pickled, and
no function of project code spans more than 100 lines."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH_FREE = {
    "cosmos_robot_client": REPO / "clients" / "src" / "cosmos_robot_client",
    "cosmos_robot_server": REPO / "policy_server" / "src" / "cosmos_robot_server",
    "cosmos_robot_envs": REPO / "envs" / "src" / "cosmos_robot_envs",
}
# what each component may import from the project (its own package plus those below it)
ALLOWED = {
    "cosmos_robot_client": {"cosmos_robot_client"},
    "cosmos_robot_server": {"cosmos_robot_client", "cosmos_robot_server"},
    "cosmos_robot_envs": {"cosmos_robot_client", "cosmos_robot_envs"},
}
HEAVY = ("torch", "transformers", "diffusers", "lerobot", "jax", "tensorflow")
# modules that need an optional extra (module prefix -> what it imports); imported only where installed
OPTIONAL_EXTRAS = {
    "cosmos_robot_server.alpasim.servicer": ("grpc", "google.protobuf"),
    "cosmos_robot_server.alpasim.server": ("grpc", "google.protobuf"),
    "cosmos_robot_server.alpasim.proto.": ("grpc", "google.protobuf"),
    "cosmos_robot_envs.driving.fast_road": ("highway_env",),  # a subclass of highway-env's Road
}


def _extra_installed(module: str) -> bool:
    for prefix, deps in OPTIONAL_EXTRAS.items():
        if module.startswith(prefix):
            return all(importlib.util.find_spec(dep) is not None for dep in deps)
    return True


def _modules(pkg_dir: Path) -> list[str]:
    root = pkg_dir.parent
    names = (".".join(p.relative_to(root).with_suffix("").parts) for p in pkg_dir.rglob("*.py"))
    names = (name.removesuffix(".__init__") for name in names)
    return sorted(name for name in names if _extra_installed(name))


@pytest.mark.parametrize("package", sorted(TORCH_FREE))
def test_torch_free_packages_import_without_heavy_deps(package: str) -> None:
    mods = _modules(TORCH_FREE[package])
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"bad = [h for h in {HEAVY!r} if h in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", f"{package} imported {res.stdout.strip()}"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(TORCH_FREE))
def test_dependencies_point_down(package: str) -> None:
    for path in TORCH_FREE[package].rglob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            if top.startswith("cosmos_robot"):
                assert top in ALLOWED[package], f"{path.relative_to(REPO)} imports {name} (not allowed for {package})"


def test_no_pickle_in_project_code() -> None:
    roots = [*TORCH_FREE.values(), REPO / "cosmos_robot"]
    for root in roots:
        for path in root.rglob("*.py"):
            names = _imports(path)
            assert not names & {"pickle", "cPickle", "dill", "cloudpickle"}, f"{path} imports a pickler"
            text = path.read_text()
            assert "allow_pickle=True" not in text, f"{path} enables pickle in numpy"


# --- seams inside the torch side (issue 14: one registry, no cycles, trainers independent of each other) ----
PACKAGES = {
    **TORCH_FREE,
    "cosmos_robot": REPO / "cosmos_robot",
    "cosmos_robot_trainers": REPO / "trainers" / "src" / "cosmos_robot_trainers",
    "cosmos_robot_exporters": REPO / "exporters" / "src" / "cosmos_robot_exporters",
}
TRAINERS = PACKAGES["cosmos_robot_trainers"]


def _module_name(package: str, path: Path) -> str:
    parts = [package, *path.relative_to(PACKAGES[package]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: Path) -> set[str]:
    """Imports executed when the module is imported: everywhere but function bodies and ``if TYPE_CHECKING``
    (class bodies, ``try`` / ``except`` / ``else`` / ``finally``, ``with`` and ``for`` bodies all run)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            else:
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []) or [])
                for handler in getattr(node, "handlers", []) or []:
                    visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return names


def test_module_level_import_scan_sees_guarded_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import a\n"
        "try:\n    import b\nexcept ImportError:\n    import c\nelse:\n    import d\nfinally:\n    import e\n"
        "class K:\n    import f\n"
        "with x:\n    import g\n"
        "def fn():\n    import lazy\n"
        "if TYPE_CHECKING:\n    import typing_only\n"
    )
    assert _module_level_imports(src) == set("abcdefg")


def test_core_never_imports_trainers_or_exporters_at_module_level() -> None:
    for path in PACKAGES["cosmos_robot"].rglob("*.py"):
        for name in _module_level_imports(path):
            top = name.split(".")[0]
            assert top not in ("cosmos_robot_trainers", "cosmos_robot_exporters"), (
                f"{path.relative_to(REPO)} imports {name} at module level (import it inside the command that needs it)"
            )


def test_rl_trainers_never_import_sft_modules() -> None:
    for path in (TRAINERS / "rl").rglob("*.py"):
        bad = sorted(n for n in _imports(path) if n.startswith("cosmos_robot_trainers.sft"))
        assert not bad, f"{path.relative_to(REPO)} imports {bad}: shared pieces live in cosmos_robot_trainers.common"


def _family_names() -> set[str]:
    from cosmos_robot.policies.registry import FAMILIES

    return set(FAMILIES)


def _compared_strings(node: ast.Compare) -> set[str]:
    out: set[str] = set()
    for side in (node.left, *node.comparators):
        items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        out.update(i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str))
    return out


@pytest.mark.parametrize("root", ["trainers/src", "exporters/src", "cosmos_robot/cli", "policy_server/src"])
def test_no_family_name_is_compared(root: str) -> None:
    families = _family_names()
    for path in (REPO / root).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                hit = _compared_strings(node) & families
                assert not hit, (
                    f"{path.relative_to(REPO)}:{node.lineno} compares family name(s) {sorted(hit)}: "
                    "ask the family registry (cosmos_robot.policies.registry) instead"
                )
            if isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant):
                assert node.value.value not in families, f"{path.relative_to(REPO)}:{node.lineno} matches a family"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycles(package: str) -> None:
    """Module A imports B (anywhere in A, lazily too) and B imports A: one of them holds the wrong thing."""
    root = PACKAGES[package]
    if not root.exists():
        pytest.skip(f"{package} is not in this checkout")
    mods = {_module_name(package, p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            # a module importing its own parent package is not a cycle worth breaking (the package re-exports)
            graph[mod].update(t for t in targets if t in mods and t != mod and not mod.startswith(t + "."))
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, f"import cycles in {package}: {cycles}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                out.append(comp)
    return out


# --- small functions (issue 14: a function reads as its named phases, STYLE.md items 8 and 12) ------------------
MAX_FUNCTION_LINES = 100
# non-test project code; generated protobuf modules (``*_pb2*.py``) are skipped
FUNCTION_ROOTS = (
    "cosmos_robot",
    "clients/src",
    "policy_server/src",
    "envs/src",
    "trainers/src",
    "exporters/src",
    "benchmarks",
    "scripts",
)


def _long_functions(root: Path, limit: int) -> list[str]:
    """``file:line name (N lines)`` for each function under ``root`` spanning more than ``limit`` lines
    (``def`` line to last line, signature included; decorators not counted)."""
    out: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if fnmatch.fnmatch(path.name, "*_pb2*.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = (node.end_lineno or node.lineno) - node.lineno + 1
                if span > limit:
                    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                    out.append(f"{where}:{node.lineno} {node.name} ({span} lines)")
    return out


def test_no_function_over_100_lines() -> None:
    roots = [REPO / root for root in FUNCTION_ROOTS if (REPO / root).exists()]
    offenders = [hit for root in roots for hit in _long_functions(root, MAX_FUNCTION_LINES)]
    assert not offenders, (
        f"functions over {MAX_FUNCTION_LINES} lines; split each into named phases (STYLE.md items 8 and 12):\n  "
        + "\n  ".join(offenders)
    )


def test_long_function_check_counts_from_def_to_last_line(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "fits.py").write_text(f"@staticmethod\ndef fits():\n{body}")  # 100 lines with the def
    (tmp_path / "long.py").write_text(f"async def long():\n{body}    return x0\n")  # 101 lines
    (tmp_path / "gen_pb2_grpc.py").write_text(f"def generated():\n{body}    return x0\n")
    assert _long_functions(tmp_path, MAX_FUNCTION_LINES) == [f"{tmp_path / 'long.py'}:1 long (101 lines)"]
