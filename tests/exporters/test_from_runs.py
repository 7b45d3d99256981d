"""Exports of real training runs (the trainers' debug recipes): the export of a run's last checkpoint holds
what the trainer's own final/ holds, so `cosmos-robot export runs/NAME` is the trained policy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cosmos_robot.manifest import verify_manifest
from cosmos_robot_exporters import export_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _quiet(_: str) -> None:
    pass


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert set(wa) == set(wb)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _assert_same_stats(a: Path, b: Path) -> None:
    for f in sorted(a.glob("*processor*.safetensors")):
        sa, sb = load_file(str(f)), load_file(str(b / f.name))
        assert set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa), f.name


@pytest.mark.parametrize("recipe,init", [("debug_joint_ppo", "checkpoints/flow_tabletop"),
                                         ("debug_joint_ppo_pi05", "checkpoints/pi05_tiny")])  # fmt: skip
def test_rl_run_export_equals_its_final_folder(recipe: str, init: str, tmp_path: Path) -> None:
    from cosmos_robot_trainers.launch import load_train_recipe
    from cosmos_robot_trainers.rl import run_rl

    out = tmp_path / "run"
    _, config = load_train_recipe(
        recipe, [f"init={json.dumps(str(ROOT / init))}", f"output.dir={json.dumps(str(out))}", "train.iterations=1"]
    )
    result = run_rl(config, log=_quiet)  # type: ignore[arg-type]
    assert result.final_dir is not None
    exported = export_checkpoint(out, tmp_path / "export")
    assert verify_manifest(exported.out)
    _assert_same_weights(exported.out, result.final_dir)
    assert json.loads((exported.out / "config.json").read_text()) == json.loads(
        (result.final_dir / "config.json").read_text()
    )
    _assert_same_stats(exported.out, result.final_dir)
    if exported.family == "pi05":
        assert exported.dropped and all(k.startswith("value_head.") for k in exported.dropped)


def test_sft_run_without_final_recomputes_the_data_stats(tmp_path: Path) -> None:
    """A pi05 SFT run exported from its checkpoint before final/ exists: the data's stats are recomputed
    as the trainer computes them; the export equals the final/ the trainer writes."""
    from cosmos_robot.data.record import RecordConfig, record_demonstrations
    from cosmos_robot_trainers.launch import load_train_recipe
    from cosmos_robot_trainers.sft import run_sft

    demos = tmp_path / "demos"
    record_demonstrations(
        RecordConfig(episodes_per_task=2, image_size=32, num_envs=1, vector_mode="sync", image_writer_threads=0), demos
    )
    out = tmp_path / "run"
    overrides = [
        f"init={json.dumps(str(ROOT / 'checkpoints' / 'pi05_tiny'))}",
        f"data.root={json.dumps(str(demos))}",
        f"output.dir={json.dumps(str(out))}",
        "train.steps=4",
        "train.log_every=2",
        "train.ckpt_every=2",
        "train.progress=false",
        "data.max_episodes_per_task=1",
    ]
    _, config = load_train_recipe("debug_sft_pi05", overrides)
    result = run_sft(config, log=_quiet)  # type: ignore[arg-type]
    assert result.final_dir is not None
    reference = tmp_path / "final_ref"
    shutil.move(result.final_dir, reference)  # as if the run had not written final/ yet
    exported = export_checkpoint(out, tmp_path / "export")
    assert any("recomputed from the run's data" in n for n in exported.notes)
    _assert_same_weights(exported.out, reference)
    _assert_same_stats(exported.out, reference)


@pytest.mark.slow
def test_groot_rl_run_exports_the_trained_head_on_the_base(tmp_path: Path) -> None:
    """GR00T's action-head export of a real run with a frozen backbone is exactly the run's final/."""
    from cosmos_robot.policies.groot.tiny import build_tiny_groot
    from cosmos_robot_trainers.launch import load_train_recipe
    from cosmos_robot_trainers.rl import run_rl

    init = build_tiny_groot(tmp_path / "tiny")
    out = tmp_path / "run"
    overrides = [f"init={json.dumps(str(init))}", f"output.dir={json.dumps(str(out))}", "train.iterations=1",
                 "optim.freeze_vlm=true"]  # fmt: skip
    _, config = load_train_recipe("debug_joint_ppo_groot", overrides)
    result = run_rl(config, log=_quiet)  # type: ignore[arg-type]
    assert result.final_dir is not None
    exported = export_checkpoint(out, tmp_path / "export")
    assert exported.dropped and not any("differs from the base" in n for n in exported.notes)
    _assert_same_weights(exported.out, result.final_dir)  # head trained, backbone frozen = the base's
    assert (exported.out / "config.json").read_bytes() == (init / "config.json").read_bytes()
