"""Joint PPO on a tiny pi0.5 (LeRobot folder format) through the same trainer as the flow family."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cosmos_robot.policies import load_policy_folder
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot_trainers.rl import run_rl
from tests.trainers.test_rl import (
    ROOT,
    debug_config,
    deterministic,
    killed_after,
    libero_overrides,
    quiet,
    read_metrics,
)

INIT = ROOT / "checkpoints" / "pi05_tiny"
EXPERT_KEY = "model.paligemma_with_expert.gemma_expert.model.layers.0.mlp.up_proj.weight"
VLM_KEY = "model.paligemma_with_expert.paligemma.model.language_model.layers.0.mlp.up_proj.weight"
VISION_KEY = "model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.post_layernorm.weight"


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_pi05_debug_recipe_trains_resumes_exactly_and_exports(tmp_path: Path) -> None:
    full = run_rl(debug_config("joint_ppo_pi05", tmp_path / "full"), log=quiet)
    assert full.finished and full.final_dir is not None
    assert isinstance(load_policy_folder(full.final_dir), Pi05Policy)  # a LeRobot pi05 folder again
    records = read_metrics(tmp_path / "full")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["ratio_dev_first_mb"] < 1e-3  # the learner re-encodes exactly what the rollout stored
        assert r["policy_loss"] != 0.0 and r["value_loss"] > 0.0 and r["grad_norm"] > 0.0
    before, after = _weights(INIT), _weights(full.final_dir)
    assert not torch.equal(before[EXPERT_KEY], after[EXPERT_KEY])  # the action expert moved
    assert not torch.equal(before[VLM_KEY], after[VLM_KEY])  # and so did the VLM (not frozen)
    # killed after iteration 1, resumed by the same command: the same numbers and weights
    killed_after(tmp_path / "full", tmp_path / "cut", 1)
    resumed = run_rl(debug_config("joint_ppo_pi05", tmp_path / "cut"), log=quiet)
    assert resumed.resumed_from == 1 and resumed.final_dir is not None
    assert [deterministic(r) for r in records] == [deterministic(r) for r in read_metrics(tmp_path / "cut")]
    wa, wb = _weights(full.final_dir), _weights(resumed.final_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_pi05_freeze_vlm_trains_only_the_expert(tmp_path: Path) -> None:
    config = debug_config("joint_ppo_pi05", tmp_path, "optim.freeze_vlm=true", "train.iterations=1")
    result = run_rl(config, log=quiet)
    assert result.final_dir is not None
    before, after = _weights(INIT), _weights(result.final_dir)
    assert torch.equal(before[VLM_KEY], after[VLM_KEY]) and torch.equal(before[VISION_KEY], after[VISION_KEY])
    assert not torch.equal(before[EXPERT_KEY], after[EXPERT_KEY])
    (record,) = read_metrics(tmp_path)
    assert record["ratio_dev_first_mb"] < 1e-3


def test_pi05_flow_noise_is_refused_clearly(tmp_path: Path) -> None:
    config = debug_config("joint_ppo_pi05", tmp_path, "rollout.sample_mode=flow_noise", "train.iterations=1")
    with pytest.raises(ValueError, match="pi05 has no learned noise head"):
        run_rl(config, log=quiet)


@pytest.mark.slow
def test_libero_recipe_runs_on_the_real_libero(tmp_path: Path) -> None:
    """recipes/joint_ppo_pi05_libero_spatial.toml, shrunk: rollouts in LIBERO's venv, one PPO update."""

    from cosmos_robot_trainers.launch import load_train_recipe
    from tests.helpers import libero_python

    libero_python()
    small = libero_overrides(INIT, tmp_path, "pick_up_the_black_bowl_on_the_ramekin_and_place_it_on_the_plate")
    _, config = load_train_recipe("joint_ppo_pi05_libero_spatial", small)
    result = run_rl(config, log=quiet)
    assert result.final_dir is not None and isinstance(load_policy_folder(result.final_dir), Pi05Policy)
    (record,) = read_metrics(tmp_path)
    assert record["ratio_dev_first_mb"] < 1e-3
    assert record["env_steps"] == 20 and record["decisions"] == 4  # 2 episodes x 10 steps, chunks of 5
    assert record["train_success"] == 0.0 and record["episode_length"] == 10.0


def test_libero_recipe_refuses_progress_shaping(tmp_path: Path) -> None:
    from cosmos_robot_trainers.launch import load_train_recipe

    with pytest.raises(ValueError, match="reward.shaping_coef needs the env's progress signal"):
        load_train_recipe("joint_ppo_pi05_libero_spatial", ["reward.shaping_coef=1.0"])
