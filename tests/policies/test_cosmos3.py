"""The cosmos3 family: our denoising loop over diffusers' Cosmos3 transformer, cosmos-framework's conventions."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_robot.policies import CheckpointError, detect_family, load_policy_folder
from cosmos_robot.policies.compiling import transformer_blocks
from cosmos_robot.policies.cosmos3.conventions import (
    DROID,
    axis_angle_to_matrix,
    libero_command,
    matrix_to_axis_angle,
    matrix_to_rot6d,
    rot6d_to_matrix,
)
from cosmos_robot.policies.cosmos3.policy import Cosmos3Policy
from cosmos_robot.policies.cosmos3.sampler import Cosmos3Sampler
from cosmos_robot.policies.cosmos3.tiny import build_tiny_cosmos3, build_tiny_pipeline
from cosmos_robot_client.spec import ObservationError

FAST = {"resolution_tier": 256}


def droid_obs(seed: int, joint_shift: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
        "observation/exterior_image_2_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (180, 320, 3), dtype=np.uint8),
        "observation/joint_position": rng.normal(size=7) + joint_shift,
        "observation/gripper_position": np.array([0.25]),
        "prompt": "put the marker in the cup",
    }


@pytest.fixture(scope="module")
def droid(tmp_path_factory: pytest.TempPathFactory) -> Cosmos3Policy:
    policy = load_policy_folder(build_tiny_cosmos3(tmp_path_factory.mktemp("c3") / "droid", "droid", FAST))
    assert isinstance(policy, Cosmos3Policy)
    return policy


def test_state_free_loop_matches_the_stock_pipeline_bit_for_bit() -> None:
    """Without a state row our loop is diffusers' own policy mode: same seed, identical actions."""
    from diffusers import CosmosActionCondition

    pipe = build_tiny_pipeline(seed=3)
    pipe.set_progress_bar_config(disable=True)
    image = np.random.default_rng(1).integers(0, 256, (180, 320, 3), dtype=np.uint8)
    prompt = "pick up the banana"
    for guidance in (1.0, 3.0):
        stock = pipe(
            prompt=prompt,
            action=CosmosActionCondition(
                mode="policy",
                chunk_size=32,
                domain_name="droid_lerobot",
                resolution_tier=256,
                image=image,
                view_point="concat_view",
            ),  # fmt: skip
            fps=15.0,
            num_inference_steps=4,
            guidance_scale=guidance,
            generator=torch.Generator().manual_seed(11),
            output_type="latent",
        ).action[0]
        settings = replace(
            DROID.settings, raw_dim=10, resolution_tier=256, guidance=guidance, view_description=None,
            reimpose_clean=False,
        )  # fmt: skip
        ours, info = Cosmos3Sampler(pipe).sample(image, prompt, settings, None, seed=11)
        assert np.array_equal(ours, stock.numpy()), float(np.abs(ours - stock.numpy()).max())
        assert info["transformer_calls"] == (8 if guidance != 1.0 else 4)


def test_example_observation_is_served(droid: Cosmos3Policy) -> None:
    """The DROID spec's example takes its first layout (the three views), which the policy serves."""
    example = droid.example_observation()
    assert example is not None and "observation/image" not in example
    assert droid.infer(example)["actions"].shape == (32, 8)


def test_droid_chunk_shape_state_row_and_gripper_flip(droid: Cosmos3Policy) -> None:
    a = droid.infer(droid_obs(0))["actions"]
    assert a.shape == (32, 8) and a.dtype == np.float32 and np.isfinite(a).all()
    np.testing.assert_array_equal(droid.infer(droid_obs(0))["actions"], a)  # deterministic
    assert np.abs(droid.infer(droid_obs(0, joint_shift=0.5))["actions"] - a).max() > 1e-5  # the state row matters
    # the model's gripper is 1 - g: in and out
    obs = droid_obs(0)
    state = np.concatenate([obs["observation/joint_position"], [1.0 - 0.25]]).astype(np.float32)
    from cosmos_robot.policies.cosmos3.conventions import droid_composite

    image = droid_composite(
        obs["observation/wrist_image_left"], obs["observation/exterior_image_1_left"],
        obs["observation/exterior_image_2_left"],
    )  # fmt: skip
    rows, _ = droid.sampler.sample(image, obs["prompt"], droid.embodiment.settings, state, seed=0)
    np.testing.assert_allclose(a[:, :7], rows[:, :7])
    np.testing.assert_allclose(a[:, 7], 1.0 - rows[:, 7], atol=1e-6)


def test_guidance_interval_skips_the_unconditional_pass(droid: Cosmos3Policy) -> None:
    image = np.zeros((180, 320, 3), np.uint8)
    s = replace(droid.embodiment.settings, guidance_interval=(960.0, 1001.0))
    _, info = droid.sampler.sample(image, "x", s, np.zeros(8, np.float32), seed=0)
    assert info["transformer_calls"] == 4 + 1  # CFG only at the first of the 4 steps (t = 999)


def test_droid_metadata_and_missing_key(droid: Cosmos3Policy) -> None:
    meta = droid.metadata
    assert meta["type"] == "cosmos3" and meta["action_horizon"] == 32 and meta["action_space"] == "joint_position"
    assert meta["n_external_cameras"] == 2 and meta["needs_wrist_camera"] is True
    obs = droid_obs(0)
    del obs["observation/wrist_image_left"]
    with pytest.raises(ObservationError, match="observation/wrist_image_left"):
        droid.infer(obs)


def test_libero_conventions_end_to_end(tmp_path: Path) -> None:
    policy = load_policy_folder(build_tiny_cosmos3(tmp_path / "libero", "libero", {"num_steps": 4}))
    rng = np.random.default_rng(0)
    obs = {
        "observation/image": rng.integers(0, 256, (128, 128, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (128, 128, 3), dtype=np.uint8),
        "observation/state": np.zeros(8),
        "prompt": "open the top drawer",
    }
    a = policy.infer(obs)["actions"]
    assert a.shape == (16, 7) and a.dtype == np.float32 and np.all(np.abs(a[:, 6]) <= 1.0)


def test_rot6d_and_the_libero_command_by_hand() -> None:
    rng = np.random.default_rng(0)
    v = rng.normal(size=(20, 3)) * 0.9
    m = axis_angle_to_matrix(v)
    np.testing.assert_allclose(matrix_to_axis_angle(rot6d_to_matrix(matrix_to_rot6d(m))), v, atol=1e-12)
    q01 = np.array([-0.5, -1.0, 0.0, -1, -1, -1, -1, -1, -1, 0.0])
    q99 = np.array([0.5, 1.0, 2.0, 1, 1, 1, 1, 1, 1, 1.0])
    rows = np.array([[-1.0, 1.0, 0.0, 1, 0, 0, 0, 1, 0, -1.0], [1.0, -1.0, 1.0, 1, 0, 0, 0, 1, 0, 1.0]])
    cmd = libero_command(rows, q01, q99)
    np.testing.assert_allclose(cmd[0], [-0.5, 1.0, 1.0, 0, 0, 0, 1.0], atol=1e-6)  # g = 0 -> +1 (open)
    np.testing.assert_allclose(cmd[1], [0.5, -1.0, 2.0, 0, 0, 0, -1.0], atol=1e-6)  # g = 1 -> -1 (close)


def test_bad_folders_are_named(tmp_path: Path) -> None:
    folder = build_tiny_cosmos3(tmp_path / "c3", "libero")
    assert detect_family(folder) == "cosmos3"
    (folder / "libero_native_frame_wise_relative_rot6d.json").unlink()
    with pytest.raises(CheckpointError, match="libero_native_frame_wise_relative_rot6d.json.*missing"):
        load_policy_folder(folder)
    (folder / "cosmos_robot_policy.json").write_text(json.dumps({"embodiment": "aloha"}))
    with pytest.raises(CheckpointError, match="embodiment 'aloha' is not one of"):
        load_policy_folder(folder)
    (folder / "cosmos_robot_policy.json").write_text(json.dumps({"embodiment": "droid", "settings": {"stpes": 3}}))
    with pytest.raises(CheckpointError, match="unknown settings \\['stpes'\\]"):
        load_policy_folder(folder)
    (folder / "cosmos_robot_policy.json").unlink()
    with pytest.raises(CheckpointError, match="which policy conventions apply is not recorded"):
        load_policy_folder(folder)


def test_dtype_and_compile_options(tmp_path: Path) -> None:
    folder = build_tiny_cosmos3(tmp_path / "c3", "droid")
    policy = Cosmos3Policy.from_pretrained(folder, dtype="bfloat16")
    assert policy.pipe.transformer.dtype == torch.bfloat16
    with pytest.raises(CheckpointError, match="dtype must be one of"):
        Cosmos3Policy.from_pretrained(folder, dtype="int8")
    compiled = Cosmos3Policy.from_pretrained(folder, compile=True)
    blocks = transformer_blocks(compiled.pipe.transformer)
    assert len(blocks) == 2 and all(b._compiled_call_impl is not None for b in blocks)
