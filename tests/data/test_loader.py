"""``load_demonstrations``: in-memory tensors that match what LeRobot stores, action chunks with LeRobot's
padding at episode ends, images resized like serving resizes them, and norm stats of the right shapes."""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from PIL import Image

from cosmos_robot.data.loader import action_chunks, compute_norm_stats, load_demonstrations
from cosmos_robot.data.schema import ACTION, OBJECT_STATE, STATE, camera_key
from cosmos_robot.transforms import ResizeImages


def test_action_chunks_repeat_the_last_action_and_mark_padding() -> None:
    actions = np.arange(5, dtype=np.float32)[:, None]  # episodes [0, 1, 2] and [3, 4]
    chunks, pad = action_chunks(actions, np.array([7, 7, 7, 9, 9]), chunk_size=3)
    assert chunks[..., 0].tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]
    assert pad.tolist() == [
        [False, False, False],
        [False, False, True],
        [False, True, True],
        [False, False, True],
        [False, True, True],
    ]
    with pytest.raises(ValueError, match="chunk_size"):
        action_chunks(actions, np.zeros(5), chunk_size=0)


def test_loaded_tensors_match_the_lerobot_dataset(tiny_dataset: Path) -> None:
    data = load_demonstrations(tiny_dataset, chunk_size=8, image_size=32)
    ds = LeRobotDataset("local/tiny", root=tiny_dataset)
    n = ds.num_frames
    assert len(data) == n and data.num_episodes == 4 and data.fps == 20
    assert data.images.shape == (n, 2, 3, 32, 32) and data.images.dtype == torch.uint8
    assert data.state.shape == (n, 8) and data.actions.shape == (n, 8, 7) and data.action_is_pad.shape == (n, 8)
    for i in (0, 5, n - 1):
        item = ds[i]
        assert data.prompts[i] == item["task"]
        assert int(data.episode_index[i]) == int(item["episode_index"])
        torch.testing.assert_close(data.state[i], item[STATE])
        torch.testing.assert_close(data.actions[i, 0], item[ACTION])
        for c, cam in enumerate(("image", "wrist_image")):  # LeRobot gives float [0, 1] CHW
            assert torch.equal(data.images[i, c], (item[camera_key(cam)] * 255).round().to(torch.uint8))


def test_chunks_stay_inside_their_episode(tiny_dataset: Path) -> None:
    chunk_size = 10
    data = load_demonstrations(tiny_dataset, chunk_size=chunk_size, image_size=32)
    raw = data.actions[:, 0]
    ep = data.episode_index
    for i in range(len(data)):
        same = torch.nonzero(ep == ep[i]).flatten()
        last = int(same.max())
        for k in range(chunk_size):
            j = min(i + k, last)
            assert torch.equal(data.actions[i, k], raw[j])
            assert bool(data.action_is_pad[i, k]) == (i + k > last)
    ends = torch.nonzero(torch.diff(ep)).flatten().tolist() + [len(data) - 1]
    assert all(bool(data.action_is_pad[e, 1:].all()) and not data.action_is_pad[e, 0] for e in ends)


def test_images_are_resized_like_the_serving_transform(tiny_dataset: Path) -> None:
    data = load_demonstrations(tiny_dataset, chunk_size=4, image_size=16, cameras=("wrist_image",))
    assert data.images.shape[1:] == (1, 3, 16, 16) and data.cameras == ("wrist_image",)
    ds = LeRobotDataset("local/tiny", root=tiny_dataset)
    png = ds.hf_dataset.data.column(camera_key("wrist_image"))[3]["bytes"].as_py()
    full = np.asarray(Image.open(BytesIO(png)).convert("RGB"))
    served = ResizeImages(("img",), 16, 16)({"img": full})["img"]
    assert np.array_equal(data.images[3, 0].permute(1, 2, 0).numpy(), served)


def test_camera_free_load_joins_state_vectors_and_decodes_no_image(tiny_dataset: Path) -> None:
    data = load_demonstrations(
        tiny_dataset, chunk_size=4, image_size=16, cameras=(), state_keys=("state", "object_state")
    )
    assert data.images.shape[1] == 0 and data.cameras == ()
    table = LeRobotDataset("local/tiny", root=tiny_dataset).hf_dataset.data
    robot = np.stack(table.column(STATE).to_pylist()).astype(np.float32)
    objects = np.stack(table.column(OBJECT_STATE).to_pylist()).astype(np.float32)
    assert data.state.shape == (len(data), robot.shape[1] + objects.shape[1])
    order = np.argsort(np.asarray(table.column("index")), kind="stable")
    assert np.array_equal(data.state.numpy(), np.concatenate([robot, objects], axis=1)[order])
    with pytest.raises(KeyError, match="observation.velocity"):
        load_demonstrations(tiny_dataset, chunk_size=4, image_size=16, cameras=(), state_keys=("state", "velocity"))


def test_max_episodes_loads_a_prefix(tiny_dataset: Path) -> None:
    data = load_demonstrations(tiny_dataset, chunk_size=4, image_size=32, max_episodes=2)
    assert sorted(set(data.episode_index.tolist())) == [0, 1]
    assert len(set(data.prompts)) == 2  # the schedule interleaves tasks, so a prefix covers both


def test_norm_stats_shapes_and_agree_with_lerobot_stats(tiny_dataset: Path) -> None:
    data = load_demonstrations(tiny_dataset, chunk_size=4, image_size=32)
    stats = compute_norm_stats(data)
    assert set(stats) == {STATE, ACTION}
    q99 = stats[ACTION].q99
    assert stats[STATE].mean.shape == (8,) and q99 is not None and q99.shape == (7,)
    lerobot = json.loads((tiny_dataset / "meta" / "stats.json").read_text())
    for key in (STATE, ACTION):
        for field in ("mean", "min", "max", "std"):
            np.testing.assert_allclose(getattr(stats[key], field), lerobot[key][field], rtol=1e-4, atol=1e-5)


def test_clear_errors_for_a_missing_dataset_or_feature(tiny_dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a LeRobot dataset"):
        load_demonstrations(tmp_path, chunk_size=4, image_size=32)
    with pytest.raises(KeyError, match="observation.images.left"):
        load_demonstrations(tiny_dataset, chunk_size=4, image_size=32, cameras=("image", "left"))
