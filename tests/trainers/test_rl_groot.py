"""Joint PPO on a tiny GR00T N1.7 (LeRobot folders) through the same trainer, and its flow head's conventions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cosmos_robot.policies import load_policy_folder
from cosmos_robot.policies.flow.sampling import sample_actions
from cosmos_robot.policies.groot.policy import Gr00tPolicy
from cosmos_robot.policies.groot.rl import Gr00tRLAdapter
from cosmos_robot.policies.groot.tiny import build_tiny_groot
from cosmos_robot_trainers.rl import run_rl
from tests.policies._pi05_helpers import libero_obs
from tests.trainers.test_rl import debug_config, deterministic, killed_after, libero_overrides, quiet, read_metrics

HEAD_KEY = "_groot_model.action_head.action_decoder.layer2.W"
BACKBONE_PREFIX = "_groot_model.backbone."


@pytest.fixture(scope="module")
def groot_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_groot(tmp_path_factory.mktemp("groot"))


def _config(folder: Path, out: Path, *extra: str):
    return debug_config("joint_ppo_groot", out, f"init={json.dumps(str(folder))}", *extra)


def test_ode_sampler_equals_groots_own_euler_loop(groot_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """t -> 1 - t and v -> -v: the shared sampler's ODE chunk is GR00T's get_action from the same noise."""
    served = load_policy_folder(groot_folder)
    assert isinstance(served, Gr00tPolicy)
    rl = Gr00tRLAdapter(served)
    model = rl.model.eval()
    wire = [libero_obs(0), libero_obs(1)]
    noise = torch.randn(
        (2, model.config.chunk_size, model.config.action_dim), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ours = sample_actions(model, model.encode(rl.model_inputs(wire)), "ode", noise=noise).actions
        processed = served.preprocessor(served.io.batch(wire))
        inputs = served.policy._filter_groot_inputs(processed, include_action=False)
        monkeypatch.setattr(torch, "randn", lambda *a, **k: noise.clone())  # GR00T draws its own noise
        ref = served.policy._groot_model.get_action(inputs)["action_pred"]
    assert float((ours - ref).abs().max()) < 1e-5 < float(ref.abs().max())


@pytest.mark.slow
def test_groot_debug_recipe_trains_resumes_exactly_and_exports(groot_folder: Path, tmp_path: Path) -> None:
    full = run_rl(_config(groot_folder, tmp_path / "full"), log=quiet)
    assert full.finished and full.final_dir is not None
    assert isinstance(load_policy_folder(full.final_dir), Gr00tPolicy)
    records = read_metrics(tmp_path / "full")
    for r in records:
        assert r["ratio_dev_first_mb"] < 1e-3 and r["policy_loss"] != 0.0 and r["value_loss"] > 0.0
    before, after = (
        load_file(str(groot_folder / "model.safetensors")),
        load_file(str(full.final_dir / "model.safetensors")),
    )
    assert not torch.equal(before[HEAD_KEY], after[HEAD_KEY])
    killed_after(tmp_path / "full", tmp_path / "cut", 1)
    resumed = run_rl(_config(groot_folder, tmp_path / "cut"), log=quiet)
    assert resumed.resumed_from == 1 and resumed.final_dir is not None
    assert [deterministic(r) for r in records] == [deterministic(r) for r in read_metrics(tmp_path / "cut")]
    wb = load_file(str(resumed.final_dir / "model.safetensors"))
    assert all(torch.equal(after[k], wb[k]) for k in after)


@pytest.mark.slow
def test_groot_freeze_vlm_keeps_the_backbone(groot_folder: Path, tmp_path: Path) -> None:
    result = run_rl(_config(groot_folder, tmp_path, "optim.freeze_vlm=true", "train.iterations=1"), log=quiet)
    assert result.final_dir is not None
    before, after = (
        load_file(str(groot_folder / "model.safetensors")),
        load_file(str(result.final_dir / "model.safetensors")),
    )
    backbone = [k for k in before if k.startswith(BACKBONE_PREFIX)]
    assert backbone and all(torch.equal(before[k], after[k]) for k in backbone)
    assert not torch.equal(before[HEAD_KEY], after[HEAD_KEY])


@pytest.mark.slow
def test_libero_recipe_runs_on_the_real_libero(groot_folder: Path, tmp_path: Path) -> None:
    """recipes/joint_ppo_groot_libero_spatial.toml, shrunk: rollouts in LIBERO's venv, one PPO update."""
    from cosmos_robot_trainers.launch import load_train_recipe
    from tests.helpers import libero_python

    libero_python()
    small = libero_overrides(
        groot_folder, tmp_path, "pick_up_the_black_bowl_next_to_the_plate_and_place_it_on_the_plate"
    )
    _, config = load_train_recipe("joint_ppo_groot_libero_spatial", small)
    result = run_rl(config, log=quiet)
    assert result.final_dir is not None and isinstance(load_policy_folder(result.final_dir), Gr00tPolicy)
    (record,) = read_metrics(tmp_path)
    assert record["ratio_dev_first_mb"] < 1e-3
    assert record["env_steps"] == 20 and record["decisions"] == 4


@pytest.mark.slow
def test_debug_recipe_runs_as_typed_and_builds_its_tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cosmos-robot train debug_joint_ppo_groot` needs no command before it: init = "tiny:groot"."""
    from cosmos_robot_trainers.launch import load_train_recipe

    monkeypatch.setenv("COSMOS_ROBOT_TINY_DIR", str(tmp_path / "tiny"))
    _, config = load_train_recipe("debug_joint_ppo_groot", [f"output.dir={json.dumps(str(tmp_path / 'run'))}"])
    assert config.init == "tiny:groot"
    logs: list[str] = []
    result = run_rl(config, stop_at_iteration=1, log=logs.append)
    assert result.iteration == 1 and (tmp_path / "tiny" / "groot" / "policy" / "config.json").is_file()
    assert any("building a tiny random groot checkpoint" in line for line in logs)
