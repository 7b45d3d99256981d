"""FlowPolicy: serving pipeline, checkpoint round trip and every CheckpointError a folder can cause."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cosmos_robot.policies import CheckpointError, load_policy_folder
from cosmos_robot.policies.flow import FlowConfig, FlowModel, FlowPolicy, collate_observations, sample_actions
from cosmos_robot.transforms import run_transforms
from cosmos_robot_client.spec import ObservationError
from tests.policies._flow_helpers import PROMPTS, make_obs, scrambled_model, tiny_config, tiny_stats

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/policies/conftest.py


def _policy(**overrides: object) -> FlowPolicy:
    cfg = tiny_config(**overrides)
    return FlowPolicy(scrambled_model(cfg), tiny_stats(cfg))


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return _policy().save_pretrained(tmp_path / "ckpt")


def test_infer_batch_mixed_prompts() -> None:
    policy = _policy()
    cfg = policy.config
    obs = [make_obs(cfg, seed=i, prompt=PROMPTS[i % len(PROMPTS)], size=24 + 8 * (i % 2)) for i in range(5)]
    out = policy.infer_batch(obs)
    assert len(out) == 5
    for item in out:
        assert set(item) == {"actions"}
        assert item["actions"].shape == (cfg.chunk_size, cfg.action_dim) and item["actions"].dtype == np.float32
    # the prompt matters: same images and state, another instruction -> other actions
    other = policy.infer(dict(obs[0], prompt=PROMPTS[1]))
    assert not np.allclose(other["actions"], out[0]["actions"])
    assert policy.infer_batch([]) == []


def test_serving_is_deterministic_and_batch_independent() -> None:
    policy = _policy()
    obs = make_obs(policy.config, seed=3)
    first = policy.infer(obs)["actions"]
    assert np.array_equal(first, policy.infer(obs)["actions"])  # identical inputs -> identical actions
    batch = policy.infer_batch([make_obs(policy.config, seed=9), obs, obs])
    assert np.array_equal(batch[1]["actions"], batch[2]["actions"])
    np.testing.assert_allclose(batch[1]["actions"], first, atol=1e-5)  # whatever else is in the batch


def test_actions_are_unnormalised() -> None:
    cfg = tiny_config()
    stats = tiny_stats(cfg)
    policy = FlowPolicy(scrambled_model(cfg), stats)
    obs = make_obs(cfg)
    items = [run_transforms(policy.input_transforms, dict(obs))]
    with torch.no_grad():
        ctx = policy.model.encode(collate_observations(items, cfg))
        raw = sample_actions(policy.model, ctx, noise=policy.serving_noise(1)).actions[0].numpy()
    want = raw * stats["actions"].std + stats["actions"].mean
    np.testing.assert_allclose(policy.infer(obs)["actions"], want, rtol=1e-5, atol=1e-6)


def test_binarized_gripper_is_served_saved_and_validated(tmp_path: Path) -> None:
    cfg = tiny_config()
    plain = FlowPolicy(scrambled_model(cfg), tiny_stats(cfg))
    snapped_cfg = tiny_config(binarize_action_dims=(cfg.action_dim - 1,))
    snapped = FlowPolicy(scrambled_model(snapped_cfg), tiny_stats(snapped_cfg))
    obs = make_obs(cfg)
    want = plain.infer(obs)["actions"]
    got = snapped.infer(obs)["actions"]
    np.testing.assert_array_equal(got[:, :-1], want[:, :-1])  # the same weights: only the gripper column differs
    np.testing.assert_array_equal(got[:, -1], np.where(want[:, -1] >= 0, 1.0, -1.0))
    loaded = load_policy_folder(snapped.save_pretrained(tmp_path / "snapped"))
    np.testing.assert_array_equal(loaded.infer(obs)["actions"], got)  # policy.json carries BinarizeActions
    with pytest.raises(ValueError, match=r"binarize_action_dims: expected distinct indices in \[0, 7\)"):
        tiny_config(binarize_action_dims=(7,))


def test_serve_noise_modes() -> None:
    obs = make_obs(tiny_config())
    zero = _policy(serve_noise="zero")
    assert np.array_equal(zero.infer(obs)["actions"], zero.infer(obs)["actions"])
    rand = _policy(serve_noise="random")
    assert not np.array_equal(rand.infer(obs)["actions"], rand.infer(obs)["actions"])


def test_metadata_and_input_spec() -> None:
    policy = _policy()
    assert policy.metadata == {
        "type": "flow",
        "action_horizon": 4,
        "action_dim": 7,
        "state_dim": 8,
        "image_size": 16,
        "cameras": ["image", "wrist_image"],
        "state_keys": ["state"],
        "num_flow_steps": 4,
    }
    assert policy.cheap_inference is False
    spec = policy.input_spec
    assert spec.to_dict()["observation/image"] == {
        "kind": "array",
        "shape": [None, None, 3],
        "dtype": "uint8",
        "optional": False,
    }
    obs = make_obs(policy.config)
    spec.validate(obs)
    spec.validate(dict(obs, **{"observation/object_state": np.zeros(15)}))  # eval clients may send it
    policy.infer(dict(obs, **{"observation/object_state": np.zeros(15)}))
    one_cam = _policy(cameras=("image",))
    assert "observation/wrist_image" not in one_cam.input_spec.fields
    one_cam.infer(make_obs(one_cam.config))


def test_camera_free_policy_reads_state_and_object_state(tmp_path: Path) -> None:
    policy = _policy(cameras=(), state_keys=("state", "object_state"), state_dim=23)
    assert policy.model.image_encoder is None  # no parameters that never see a gradient
    assert sorted(policy.input_spec.fields) == ["observation/object_state", "observation/state", "prompt"]
    obs = make_obs(policy.config)
    out = policy.infer(obs)["actions"]
    assert out.shape == (4, 7)
    with pytest.raises(KeyError, match="observation/object_state"):
        policy.infer({k: v for k, v in obs.items() if k != "observation/object_state"})
    with pytest.raises(ValueError, match=r"state: expected last dimension 23, got shape \(22,\)"):
        policy.infer(dict(obs, **{"observation/object_state": np.zeros(14, np.float32)}))
    with pytest.raises(ObservationError, match="observation/image: unknown key"):
        policy.infer(dict(obs, **{"observation/image": np.zeros((8, 8, 3), np.uint8)}))
    loaded = FlowPolicy.from_pretrained(policy.save_pretrained(tmp_path / "state"))
    assert np.array_equal(loaded.infer(obs)["actions"], out)
    # the object state moves the actions (the concatenation reaches the model)
    moved = dict(obs, **{"observation/object_state": obs["observation/object_state"] + 1.0})
    assert not np.allclose(policy.infer(moved)["actions"], out)


def test_wrong_observation_key_is_named() -> None:
    policy = _policy()
    obs = make_obs(policy.config)
    bad = {("observation/imag" if k == "observation/image" else k): v for k, v in obs.items()}
    with pytest.raises(ObservationError, match="observation/imag"):
        policy.input_spec.validate(bad)  # what the server answers
    with pytest.raises(KeyError, match=r"missing required key 'observation/image'.*'observation/imag'"):
        policy.infer(bad)  # in-process
    with pytest.raises(ObservationError, match="observation/state: expected shape"):
        policy.infer(dict(obs, **{"observation/state": np.zeros(3)}))
    with pytest.raises(ObservationError, match="observation/image: expected dtype uint8"):
        policy.infer(dict(obs, **{"observation/image": np.zeros((8, 8, 3), np.float32)}))
    with pytest.raises(ObservationError, match="extra_key: unknown key"):
        policy.infer(dict(obs, extra_key=1))


def test_round_trip_reproduces_actions_bitwise(ckpt: Path) -> None:
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors", "policy.json"]
    original = FlowPolicy.from_pretrained(ckpt)
    loaded = load_policy_folder(ckpt)  # through the registry
    assert isinstance(loaded, FlowPolicy)
    obs = [make_obs(original.config, seed=i, prompt=PROMPTS[i]) for i in range(3)]
    for a, b in zip(original.infer_batch(obs), loaded.infer_batch(obs)):
        assert np.array_equal(a["actions"], b["actions"])
    # and against the in-memory policy the folder came from
    cfg = tiny_config()
    source = FlowPolicy(scrambled_model(cfg), tiny_stats(cfg))
    for a, b in zip(source.infer_batch(obs), loaded.infer_batch(obs)):
        assert np.array_equal(a["actions"], b["actions"])
    assert json.loads((ckpt / "config.json").read_text())["type"] == "flow"
    resaved = loaded.save_pretrained(ckpt.parent / "again")
    for name in ("config.json", "policy.json"):
        assert (resaved / name).read_text() == (ckpt / name).read_text()


def test_default_size_checkpoint_is_small(tmp_path: Path) -> None:
    cfg = FlowConfig()
    path = FlowPolicy(FlowModel(cfg), tiny_stats(cfg)).save_pretrained(tmp_path / "full")
    assert (path / "model.safetensors").stat().st_size <= 10 * 1024 * 1024


def test_missing_files(ckpt: Path) -> None:
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"missing model\.safetensors"):
        load_policy_folder(ckpt)
    (ckpt / "policy.json").unlink()
    with pytest.raises(CheckpointError, match=r"missing model\.safetensors, policy\.json"):
        FlowPolicy.from_pretrained(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"missing config\.json"):
        load_policy_folder(ckpt)
    with pytest.raises(CheckpointError, match=r"missing config\.json"):
        FlowPolicy.from_pretrained(ckpt)
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        FlowPolicy.from_pretrained(ckpt / "nope")


def _edit_config(ckpt: Path, **changes: object) -> None:
    data = json.loads((ckpt / "config.json").read_text())
    data.update(changes)
    (ckpt / "config.json").write_text(json.dumps(data))


def test_unknown_type_did_you_mean(ckpt: Path) -> None:
    _edit_config(ckpt, type="flwo")
    with pytest.raises(CheckpointError, match="unknown policy type 'flwo'; did you mean 'flow'"):
        load_policy_folder(ckpt)
    with pytest.raises(CheckpointError, match="expected 'flow'"):
        FlowPolicy.from_pretrained(ckpt)


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"chunk_size": "ten"}, r"chunk_size: Input should be a valid integer"),
        ({"chunk_sise": 4}, r"chunk_sise: unknown field; did you mean 'chunk_size'"),
        ({"image_size": 18}, r"image_size \(18\) must be a multiple of encoder_patch"),
    ],
)
def test_bad_config_field_is_named(ckpt: Path, changes: dict[str, object], pattern: str) -> None:
    _edit_config(ckpt, **changes)
    with pytest.raises(CheckpointError, match=pattern) as info:
        load_policy_folder(ckpt)
    assert "config.json" in str(info.value)


def test_legacy_horizon_key_still_loads_and_saves_as_chunk_size(ckpt: Path, tmp_path: Path) -> None:
    """Folders written before issue 14 name the chunk rows ``horizon``; they load unchanged."""
    data = json.loads((ckpt / "config.json").read_text())
    old = {("horizon" if k == "chunk_size" else k): v for k, v in data.items()}  # same order, old key
    (ckpt / "config.json").write_text(json.dumps(old, indent=2))
    assert FlowConfig.model_validate(old) == FlowConfig.model_validate(data)
    policy = load_policy_folder(ckpt)
    assert isinstance(policy, FlowPolicy) and policy.config.chunk_size == data["chunk_size"]
    obs = [make_obs(policy.config, seed=0, prompt=PROMPTS[0])]
    assert policy.infer_batch(obs)[0]["actions"].shape == (data["chunk_size"], policy.config.action_dim)
    saved = json.loads((policy.save_pretrained(tmp_path / "resaved") / "config.json").read_text())
    assert saved["chunk_size"] == data["chunk_size"] and "horizon" not in saved


def test_legacy_and_new_chunk_key_together_is_an_error(ckpt: Path) -> None:
    _edit_config(ckpt, horizon=4)
    with pytest.raises(CheckpointError, match=r"(?s)config\.json.*both 'chunk_size' \(4\) and its old name 'horizon'"):
        load_policy_folder(ckpt)


def test_bundled_flow_checkpoints_use_chunk_size() -> None:
    root = Path(__file__).resolve().parents[2] / "checkpoints"
    for name in ("flow_tabletop", "flow_tabletop_weak"):
        data = json.loads((root / name / "config.json").read_text())
        assert "horizon" not in data and FlowConfig.model_validate(data).chunk_size == data["chunk_size"] == 10


def test_tensor_shape_mismatch_is_named(ckpt: Path) -> None:
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["velocity_out.weight"] = torch.zeros(27, 32)
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'velocity_out\.weight' has shape \(27, 32\) .* builds \(28, 32\)"):
        load_policy_folder(ckpt)


def test_config_that_disagrees_with_weights(ckpt: Path) -> None:
    _edit_config(ckpt, chunk_size=5)  # a valid config, but not the one the weights were trained with
    with pytest.raises(CheckpointError, match=r"action_in\.weight.*\(32, 28\).*\(32, 35\)"):
        load_policy_folder(ckpt)


def test_extra_and_missing_tensors_are_named(ckpt: Path) -> None:
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["head.extra"] = torch.zeros(3)
    del tensors["value_head.0.bias"]
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensors \['value_head\.0\.bias'\]") as info:
        load_policy_folder(ckpt)
    assert "unexpected tensors ['head.extra']" in str(info.value)


def test_corrupt_files(ckpt: Path) -> None:
    (ckpt / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_policy_folder(ckpt)
    (ckpt / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        FlowPolicy.from_pretrained(ckpt)


def test_bad_policy_json(ckpt: Path) -> None:
    data = json.loads((ckpt / "policy.json").read_text())
    data["input_transforms"][0]["name"] = "RenameKey"
    (ckpt / "policy.json").write_text(json.dumps(data))
    with pytest.raises(
        CheckpointError,
        match=r"policy\.json: transforms\[0\]: unknown transform 'RenameKey'; did you mean 'RenameKeys'",
    ):
        load_policy_folder(ckpt)
    data["input_transforms"][0]["name"] = "RenameKeys"
    data["stats"]["actions"]["mean"] = [0.0] * 3
    (ckpt / "policy.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"stats\['actions'\]"):
        load_policy_folder(ckpt)
    del data["stats"]
    (ckpt / "policy.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"missing \['stats'\]"):
        load_policy_folder(ckpt)


def test_stats_must_match_config() -> None:
    cfg = tiny_config()
    stats = tiny_stats(tiny_config(state_dim=5))
    with pytest.raises(ValueError, match=r"stats\['state'\]: has 5 dims, the config says 8"):
        FlowPolicy(FlowModel(cfg), stats)
    with pytest.raises(ValueError, match="missing 'actions'"):
        FlowPolicy(FlowModel(cfg), {"state": tiny_stats(cfg)["state"]})


def test_example_observation_is_served() -> None:
    """What `serve --warmup` runs: the spec's example (224 px cameras, zero state)."""
    policy = _policy()
    example = policy.example_observation()
    assert example is not None and all(
        example[f"observation/{c}"].shape == (224, 224, 3) for c in policy.config.cameras
    )
    assert policy.infer(example)["actions"].shape == (policy.config.chunk_size, policy.config.action_dim)
