"""SFT of a pi0.5 checkpoint (LeRobot folder) on a recorded LeRobotDataset through the shared SFT loop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cosmos_robot.policies import CheckpointError, load_policy_folder
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot_trainers.common import read_metrics
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.sft import SFTConfig, run_sft
from tests.policies._pi05_helpers import libero_obs
from tests.trainers.test_sft import DETERMINISTIC, demo_root, quiet

__all__ = ["demo_root"]  # the recorded-demos fixture, shared with test_sft

ROOT = Path(__file__).resolve().parents[2]


def pi05_config(demo_root: Path, out: Path, *overrides: str) -> SFTConfig:
    _, config = load_train_recipe(
        "debug_sft_pi05",
        [
            f"init={json.dumps(str(ROOT / 'checkpoints' / 'pi05_tiny'))}",
            f"data.root={json.dumps(str(demo_root))}",
            f"output.dir={json.dumps(str(out))}",
            "train.progress=false",
            *overrides,
        ],
    )
    assert isinstance(config, SFTConfig)
    return config


@pytest.mark.slow
def test_pi05_sft_learns_resumes_exactly_and_exports_a_lerobot_folder(demo_root: Path, tmp_path: Path) -> None:
    long = run_sft(pi05_config(demo_root, tmp_path / "long", "train.steps=60"), log=quiet)
    losses = [r["loss"] for r in read_metrics(tmp_path / "long")]
    assert losses[-1] < 0.75 * losses[0], losses  # it fits the demonstrations
    assert long.final_dir is not None
    policy = load_policy_folder(long.final_dir)
    assert isinstance(policy, Pi05Policy)
    assert policy.infer(libero_obs(0))["actions"].shape == (5, 7)
    # the exported processors carry the data's stats, not the starting checkpoint's
    stats = load_file(str(next(long.final_dir.glob("policy_postprocessor_step_*_unnormalizer_processor.safetensors"))))
    start = load_file(str(next((ROOT / "checkpoints" / "pi05_tiny").glob("policy_postprocessor_step_*.safetensors"))))
    assert not torch.equal(stats["action.q99"], start["action.q99"])

    whole = run_sft(pi05_config(demo_root, tmp_path / "whole"), log=quiet)
    split_cfg = pi05_config(demo_root, tmp_path / "split")
    first = run_sft(split_cfg, stop_at_step=13, log=quiet)
    assert not first.finished
    second = run_sft(split_cfg, log=quiet)
    assert second.resumed_from == 10 and second.finished and whole.final_dir is not None
    a, b = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "split")
    for ra, rb in zip(a, b, strict=True):
        assert {k: ra[k] for k in DETERMINISTIC} == {k: rb[k] for k in DETERMINISTIC}
    wa = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    wb = load_file(str(tmp_path / "split" / "final" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert np.isfinite(losses).all()


def test_init_and_model_table_together_is_an_error() -> None:
    with pytest.raises(ValueError, match="either `init`.*or a \\[model\\] table"):
        load_train_recipe("debug_sft_pi05", ["model.chunk_size=4"])


def test_init_must_be_a_pi05_folder(demo_root: Path, tmp_path: Path) -> None:
    config = pi05_config(demo_root, tmp_path, f"init={json.dumps(str(ROOT / 'checkpoints' / 'flow_tabletop'))}")
    with pytest.raises(
        CheckpointError, match="is a flow checkpoint; SFT trains a new flow policy from a \\[model\\] table"
    ):
        run_sft(config, log=quiet)
    assert not tmp_path.joinpath("config.json").exists()  # no run folder content was written
