"""Architecture rules from ARCHITECTURE.md, enforced: torch-free packages stay torch-free,
dependencies point down the component table, and nothing that crosses a process boundary is pickled."""

from __future__ import annotations

import ast
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
