"""Transforms round-trip through their saved config; the registry names bad checkpoint folders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosmos_robot import transforms as tf
from cosmos_robot.normalize import FeatureStats, compute_stats
from cosmos_robot.policies import CheckpointError, detect_family, load_policy_folder


def test_concat_keys_joins_vectors_in_order_and_names_bad_input() -> None:
    join = tf.transforms_from_config(tf.transforms_to_config([tf.ConcatKeys(("state", "object_state"), "state")]))
    out = tf.run_transforms(join, {"state": np.array([1.0, 2.0]), "object_state": np.array([3.0]), "prompt": "p"})
    assert sorted(out) == ["prompt", "state"] and out["state"].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(KeyError, match="missing 'object_state'"):
        tf.run_transforms(join, {"state": np.zeros(2)})
    with pytest.raises(ValueError, match=r"object_state: expected a flat vector .* shape \(2, 2\)"):
        tf.run_transforms(join, {"state": np.zeros(2), "object_state": np.zeros((2, 2))})
    # flatten: arrays joined row-major (AlpaSim's (16, 3) ego history), and the option survives policy.json
    flat = tf.transforms_from_config(
        tf.transforms_to_config([tf.ConcatKeys(("ego_history", "route"), "state", flatten=True)])
    )
    hist, route = np.arange(6.0).reshape(3, 2), np.array([[10.0, 11.0, 12.0]])
    out = tf.run_transforms(flat, {"ego_history": hist, "route": route})
    assert out["state"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0, 12.0]


def test_pipeline_round_trips_through_config() -> None:
    rng = np.random.default_rng(0)
    stats = {"state": compute_stats(rng.normal(3, 2, (200, 4))).to_dict()}
    pipeline = [
        tf.RenameKeys({"observation/state": "state", "observation/image": "image"}),
        tf.SelectKeys(("state", "image")),
        tf.ResizeImages(("image",), 8, 8),
        tf.NormalizeKeys(stats, "mean_std"),
    ]
    rebuilt = tf.transforms_from_config(json.loads(json.dumps(tf.transforms_to_config(pipeline))))
    obs = {"observation/state": rng.normal(3, 2, 4), "observation/image": np.zeros((16, 16, 3), np.uint8), "x": 1}
    a, b = tf.run_transforms(pipeline, dict(obs)), tf.run_transforms(rebuilt, dict(obs))
    assert sorted(a) == ["image", "state"] and a["image"].shape == (8, 8, 3)
    np.testing.assert_array_equal(a["state"], b["state"])


@pytest.mark.parametrize("mode", ["mean_std", "min_max", "quantile"])
def test_normalize_inverts(mode: str) -> None:
    x = np.random.default_rng(1).normal(0, 5, (100, 3)).astype(np.float32)
    x[:, 2] = 7.0  # a constant dimension passes through instead of dividing by zero
    stats = {"actions": compute_stats(x).to_dict()}
    y = tf.NormalizeKeys(stats, mode)({"actions": x})["actions"]  # type: ignore[arg-type]
    assert np.isfinite(y).all()
    back = tf.UnnormalizeKeys(stats, mode)({"actions": y})["actions"]  # type: ignore[arg-type]
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-4)


def test_transform_errors_name_the_problem() -> None:
    stats = {"state": compute_stats(np.zeros((3, 4))).to_dict()}
    with pytest.raises(ValueError, match=r"state: expected last dimension 4, got shape \(3,\)"):
        tf.NormalizeKeys(stats)({"state": np.zeros(3)})
    with pytest.raises(ValueError, match=r"no stats for keys \['action'\]"):
        tf.NormalizeKeys(stats, keys=("action",))
    with pytest.raises(KeyError, match="missing \\['state'\\]"):
        tf.SelectKeys(("state",))({"image": 1})
    with pytest.raises(ValueError, match="did you mean 'RenameKeys'"):
        tf.transforms_from_config([{"name": "RenameKey", "mapping": {}}])
    with pytest.raises(ValueError, match="HxWx3"):
        tf.ResizeImages(("image",), 4, 4)({"image": np.zeros((4, 4))})
    assert tf.PadOrSliceActions(2)({"actions": np.ones((5, 4))})["actions"].shape == (5, 2)
    assert tf.PadOrSliceActions(6)({"actions": np.ones((5, 4))})["actions"].shape == (5, 6)
    with pytest.raises(ValueError, match="missing"):
        FeatureStats.from_dict({"mean": [0.0]}, name="stats['x']")


def test_binarize_actions_snaps_the_gripper_and_round_trips() -> None:
    chunk = np.array([[0.3, -0.2, 0.05], [0.1, 0.4, -0.01], [0.0, 0.0, 0.0]], dtype=np.float32)
    t = tf.BinarizeActions((2,))
    out = t({"actions": chunk})["actions"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[:, 2], [1.0, -1.0, 1.0])  # the sign; 0 counts as closed
    np.testing.assert_array_equal(out[:, :2], chunk[:, :2])  # other dims untouched
    assert chunk[0, 2] == np.float32(0.05)  # the input is not modified in place
    batched = t({"actions": np.stack([chunk, -chunk])})["actions"]  # (B, H, D) too
    np.testing.assert_array_equal(batched[1, :, 2], [-1.0, 1.0, 1.0])
    (back,) = tf.transforms_from_config(tf.transforms_to_config([tf.BinarizeActions([2], threshold=0.5, low=0.0)]))
    assert back == tf.BinarizeActions((2,), threshold=0.5, low=0.0)
    np.testing.assert_array_equal(back({"actions": chunk})["actions"][:, 2], [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"has 3 dims per step, dims \[6\]"):
        tf.BinarizeActions((6,))({"actions": chunk})
    with pytest.raises(ValueError, match="distinct indices"):
        tf.BinarizeActions((1, 1))


def test_detect_family_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        detect_family(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="missing config.json"):
        detect_family(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"type": "flwo"}))
    with pytest.raises(CheckpointError, match="unknown policy type 'flwo'; did you mean 'flow'"):
        load_policy_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"no_type": 1}))
    with pytest.raises(CheckpointError, match="missing the 'type' field"):
        detect_family(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        detect_family(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"type": "flow"}))
    assert detect_family(tmp_path) == "flow"
