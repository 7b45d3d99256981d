"""The flow exporter: a policy folder or a training run -> our flow folder with a manifest, same actions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_robot.manifest import MANIFEST_FILE, verify_manifest
from cosmos_robot.policies import CheckpointError, load_policy_folder
from cosmos_robot.policies.flow import FlowModel, FlowPolicy
from cosmos_robot.policies.registry import get_family
from cosmos_robot_exporters import ExportError, export_checkpoint
from cosmos_robot_exporters.flow import FlowExporter
from tests.exporters._runs import perturbed, write_run
from tests.policies._flow_helpers import make_obs, scrambled_model, tiny_config, tiny_stats

CONFIG = tiny_config()


@pytest.fixture(scope="module")
def init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return FlowPolicy(scrambled_model(CONFIG), tiny_stats(CONFIG)).save_pretrained(
        tmp_path_factory.mktemp("flow") / "init"
    )


def _actions(policy: FlowPolicy, seeds: tuple[int, ...] = (0, 1, 2)) -> np.ndarray:
    return np.stack([r["actions"] for r in policy.infer_batch([make_obs(CONFIG, s) for s in seeds])])


def _rl_run(init: Path, root: Path, **rollout: int) -> tuple[Path, dict[int, dict[str, torch.Tensor]]]:
    model = get_family("flow").rl_adapter(init).model  # the RL trainer's own model for this init
    states = {1: perturbed(model.state_dict(), 1), 2: perturbed(model.state_dict(), 2)}
    config = {"trainer": "joint_ppo", "name": "t", "init": str(init), "rollout": dict(rollout)}
    return write_run(root, config, states), states


def test_policy_folder_round_trip(init: Path, tmp_path: Path) -> None:
    result = FlowExporter().export(init, tmp_path / "out", target="flow", base=None, overwrite=False)
    assert result.out == tmp_path / "out" and result.family == "flow" and result.dropped == []
    assert set(result.files) == {"config.json", "model.safetensors", "policy.json", MANIFEST_FILE}
    assert verify_manifest(result.out) and not (tmp_path / "out.tmp").exists()
    info = json.loads((result.out / MANIFEST_FILE).read_text())["info"]
    assert info["family"] == "flow" and info["target"] == "flow" and info["source"] == str(init)
    np.testing.assert_array_equal(_actions(load_policy_folder(result.out)), _actions(FlowPolicy.from_pretrained(init)))


def test_rl_run_exports_the_newest_checkpoint_into_the_init_folder(init: Path, tmp_path: Path) -> None:
    run, states = _rl_run(init, tmp_path / "run", num_flow_steps=3)
    result = export_checkpoint(run, tmp_path / "out")  # through the family registry
    assert result.family == "flow" and result.target == "flow"
    assert any("step 2" in n for n in result.notes) and any("num_flow_steps 3" in n for n in result.notes)
    exported = load_policy_folder(result.out)
    assert isinstance(exported, FlowPolicy) and exported.config.num_flow_steps == 3
    model = FlowModel(CONFIG.model_copy(update={"num_flow_steps": 3}))
    model.load_state_dict(states[2])
    trained = FlowPolicy(model, FlowPolicy.from_pretrained(init).stats)
    np.testing.assert_array_equal(_actions(exported), _actions(trained))
    # one checkpoint by path
    older = export_checkpoint(run / "checkpoints" / "step_000001", tmp_path / "older")
    assert any("step 1" in n for n in older.notes)
    assert np.abs(_actions(load_policy_folder(older.out)) - _actions(exported)).max() > 1e-4


def test_sft_run_with_ema_uses_the_ema_weights_and_final_stats(init: Path, tmp_path: Path) -> None:
    model = FlowPolicy.from_pretrained(init).model
    raw, shadow = perturbed(model.state_dict(), 3), perturbed(model.state_dict(), 4)
    ema = {"decay": 0.99, "updates": 7, "shadow": {k: shadow[k] for k, _ in model.named_parameters()}}
    final_stats = tiny_stats(CONFIG, seed=5)
    run = write_run(tmp_path / "sft", {"trainer": "sft", "init": None, "model": CONFIG.model_dump(mode="json")},
                    {5: raw}, {"ema": ema})  # fmt: skip
    FlowPolicy(FlowModel(CONFIG), final_stats).save_pretrained(run / "final")
    result = export_checkpoint(run, tmp_path / "out")
    assert any("EMA weights" in n for n in result.notes)
    trained = FlowModel(CONFIG)
    trained.load_state_dict(shadow)
    np.testing.assert_array_equal(_actions(load_policy_folder(result.out)), _actions(FlowPolicy(trained, final_stats)))


def test_out_is_refused_unless_overwrite_and_only_an_export_is_replaced(init: Path, tmp_path: Path) -> None:
    exporter = FlowExporter()
    out = tmp_path / "out"
    exporter.export(init, out, target="flow", base=None, overwrite=False)
    with pytest.raises(ExportError, match="already exists and is not empty; pass --overwrite"):
        exporter.export(init, out, target="flow", base=None, overwrite=False)
    exporter.export(init, out, target="flow", base=None, overwrite=True)
    assert verify_manifest(out) and not (tmp_path / "out.old").exists()
    data = tmp_path / "data"
    data.mkdir()
    (data / "precious.txt").write_text("x")
    with pytest.raises(ExportError, match="not an export .* refusing to delete it even with --overwrite"):
        exporter.export(init, data, target="flow", base=None, overwrite=True)
    with pytest.raises(ExportError, match="would overwrite the folder being exported from"):
        exporter.export(out, out, target="flow", base=None, overwrite=True)
    with pytest.raises(ExportError, match="is inside the folder being exported from"):
        exporter.export(out, out / "again", target="flow", base=None, overwrite=False)
    with pytest.raises(ExportError, match="writes .*'flow'.* not 'lerobot'"):
        export_checkpoint(init, tmp_path / "x", target="lerobot")
    assert (data / "precious.txt").exists() and verify_manifest(out)


def test_a_failed_export_leaves_nothing_behind(init: Path, tmp_path: Path) -> None:
    other = tiny_config(trunk_width=48)  # another architecture: the checkpoint cannot go into the init
    run = write_run(tmp_path / "run", {"trainer": "joint_ppo", "init": str(init)}, {1: FlowModel(other).state_dict()})
    with pytest.raises(
        ExportError, match=r"tensor 'trunk.0.weight': shape \(48, .*\) in the trained weights vs \(32, "
    ):
        export_checkpoint(run, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_runs_without_their_init_are_named(init: Path, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {"trainer": "joint_ppo", "init": "no/such/init"}, {1: {"x": torch.zeros(1)}})
    with pytest.raises(CheckpointError, match="init 'no/such/init' .* does not exist here; pass it with --base"):
        export_checkpoint(run, tmp_path / "out")
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "config.resolved.json").write_text(json.dumps({"trainer": "sft"}))
    with pytest.raises(CheckpointError, match="a training run without a complete checkpoint"):
        export_checkpoint(empty, tmp_path / "out")
