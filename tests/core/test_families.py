"""The family registry: one entry per family, capabilities resolved lazily, `init` sources for recipes."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos_robot.policies.init_source import resolve_init
from cosmos_robot.policies.interfaces import RLAdapter
from cosmos_robot.policies.registry import FAMILIES, CheckpointError, _resolve, family_of, get_family

ROOT = Path(__file__).resolve().parents[2]


def test_every_capability_target_resolves() -> None:
    """A typo in a registry string would only show when a user asks for that capability: resolve them all."""
    for family in FAMILIES.values():
        if family.policy is not None:
            assert family.policy_class().__name__.endswith("Policy")
        if family.config_match is not None:
            assert callable(_resolve(family.config_match)), (family.name, "config_match")
        for field in ("rl", "sft", "export", "tiny"):
            if getattr(family, field) is not None:
                assert callable(family._capability(field, field)), (family.name, field)
        if family.rl is not None:
            assert issubclass(family._capability("rl", "rl"), RLAdapter)


def test_folders_are_recognised_by_their_own_entry() -> None:
    assert family_of(ROOT / "checkpoints" / "flow_tabletop").name == "flow"
    assert family_of(ROOT / "checkpoints" / "pi05_tiny").name == "pi05"


def test_missing_capability_names_the_families_that_have_it() -> None:
    with pytest.raises(CheckpointError, match=r"cosmos3 family does not support RL post-training \(families that do: "):
        get_family("cosmos3").rl_adapter("anywhere")
    with pytest.raises(CheckpointError, match="cosmos3 family does not support supervised fine-tuning.*groot, pi05"):
        get_family("cosmos3").sft_adapter()


def test_unknown_family_gets_a_did_you_mean() -> None:
    with pytest.raises(CheckpointError, match="did you mean 'groot'"):
        get_family("gr00t")


def test_flow_refuses_freeze_vlm_through_the_registry() -> None:
    with pytest.raises(CheckpointError, match="freeze_vlm applies to VLA checkpoints"):
        family_of(ROOT / "checkpoints" / "flow_tabletop").rl_adapter(
            ROOT / "checkpoints" / "flow_tabletop", freeze_vlm=True
        )


def test_missing_init_names_the_command_that_makes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match=r"made by `cosmos-robot train sft_flow_tabletop`"):
        resolve_init("runs/sft_flow_tabletop/final")
    with pytest.raises(CheckpointError, match=r"does not exist; pass a checkpoint folder .*tiny:groot.*tiny:pi05"):
        resolve_init("somewhere/else")
    with pytest.raises(CheckpointError, match="did you mean 'pi05'"):
        resolve_init("tiny:pi5")


def test_tiny_init_is_built_once_and_an_interrupted_build_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COSMOS_ROBOT_TINY_DIR", str(tmp_path / "tiny"))
    logs: list[str] = []
    folder = resolve_init("tiny:pi05", log=logs.append)
    assert family_of(folder).name == "pi05" and len(logs) == 1 and "building a tiny random pi05" in logs[0]
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_init("tiny:pi05", log=logs.append) == folder and len(logs) == 1  # reused, not rebuilt
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    (tmp_path / "tiny" / "pi05" / ".tiny.json").unlink()  # as if the build had been killed before its marker
    (folder / "config.json").write_text("{")
    rebuilt = resolve_init("tiny:pi05", log=logs.append)
    assert len(logs) == 2 and family_of(rebuilt).name == "pi05"  # a valid folder again
