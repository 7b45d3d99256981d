"""``record_demonstrations``: a LeRobot dataset LeRobot reads back, only solved episodes, reproducible
content in schedule order, the sidecar's seeds, and clear refusals for a taken folder or unknown task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from cosmos_robot.data.background import BackgroundWriter
from cosmos_robot.data.record import RecordConfig, load_sidecar, prepare_out_dir, record_demonstrations
from cosmos_robot.data.rollouts import build_schedule, demo_seed
from cosmos_robot.data.schema import ACTION, FPS, OBJECT_STATE, ROBOT_TYPE, STATE, camera_key
from cosmos_robot_envs.eval.config import episode_seed
from cosmos_robot_envs.tabletop import TASKS


def _column(root: Path, key: str) -> np.ndarray:
    ds = LeRobotDataset("local/t", root=root)
    return np.stack(ds.hf_dataset.with_format("numpy")[key])


def test_lerobot_reads_the_dataset_back(tiny_dataset: Path) -> None:
    ds = LeRobotDataset("local/tiny", root=tiny_dataset)
    assert ds.fps == FPS and ds.meta.robot_type == ROBOT_TYPE
    assert ds.num_episodes == 4
    assert set(ds.meta.tasks.index) == {TASKS["reach"].instruction, TASKS["push"].instruction}
    for cam in ("image", "wrist_image"):
        assert ds.features[camera_key(cam)]["dtype"] == "image"
        assert tuple(ds.features[camera_key(cam)]["shape"]) == (32, 32, 3)
    item = ds[0]
    assert item[camera_key("image")].shape == (3, 32, 32)
    assert item[STATE].shape == (8,) and item[OBJECT_STATE].shape == (15,) and item[ACTION].shape == (7,)
    assert item["task"] == TASKS["reach"].instruction  # schedule order: reach 0, push 0, reach 1, push 1
    assert ds[len(ds) - 1]["task"] == TASKS["push"].instruction
    assert ds.meta.stats[ACTION]["mean"].shape == (7,)


def test_sidecar_lists_seeds_command_and_counts(tiny_dataset: Path) -> None:
    side = load_sidecar(tiny_dataset)
    assert side["status"] == "complete" and side["command"] == ["test"]
    assert side["config"]["tasks"] == ["reach", "push"] and side["config"]["image_size"] == 32
    rows = side["episodes"]
    assert [(r["episode_index"], r["task"], r["index"]) for r in rows] == [
        (0, "reach", 0),
        (1, "push", 0),
        (2, "reach", 1),
        (3, "push", 1),
    ]
    assert all(r["seed"] == demo_seed(0, r["task"], r["index"]) and r["success"] for r in rows)
    ds = LeRobotDataset("local/tiny", root=tiny_dataset)
    assert [r["length"] for r in rows] == [int(ds.meta.episodes[i]["length"]) for i in range(4)]
    assert side["counts"]["kept"] == 4 and side["counts"]["failed"] == 0
    assert side["counts"]["frames"] == ds.num_frames


def test_demo_seeds_are_deterministic_and_disjoint_from_eval_seeds() -> None:
    assert demo_seed(0, "push", 3) == demo_seed(0, "push", 3)
    assert demo_seed(0, "push", 3) != demo_seed(1, "push", 3) != demo_seed(0, "push", 4)
    assert demo_seed(0, "push", 3) != episode_seed(0, "push", 3)
    schedule = build_schedule(("a", "b"), 2, 7)
    assert [(s.task, s.index) for s in schedule] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_same_seed_same_episodes_whatever_the_number_of_envs(tiny_dataset: Path, tmp_path: Path) -> None:
    """One env instead of two finishes episodes in another order; the dataset must not change."""
    saved = RecordConfig(**load_sidecar(tiny_dataset)["config"])  # the sidecar's config rebuilds the run
    other = RecordConfig(**{**saved.__dict__, "num_envs": 1, "image_writer_threads": 0})
    record_demonstrations(other, tmp_path / "again")
    for key in (ACTION, STATE, "episode_index", "frame_index"):
        np.testing.assert_array_equal(_column(tiny_dataset, key), _column(tmp_path / "again", key))
    a = LeRobotDataset("local/a", root=tiny_dataset)
    b = LeRobotDataset("local/b", root=tmp_path / "again")
    for i in (0, len(a) - 1):
        assert np.array_equal(a[i][camera_key("wrist_image")].numpy(), b[i][camera_key("wrist_image")].numpy())


@pytest.mark.parametrize("only_success", [True, False])
def test_only_successful_episodes_are_kept(tmp_path: Path, only_success: bool) -> None:
    # 20 steps: enough for these reach episodes (13 and 18 steps), too few to open a drawer (~25)
    config = RecordConfig(
        tasks=("reach", "open_drawer"),
        episodes_per_task=2,
        num_envs=2,
        image_size=32,
        vector_mode="sync",
        max_steps=20,
        only_success=only_success,
    )
    side = record_demonstrations(config, tmp_path / "ds")
    ds = LeRobotDataset("local/ds", root=tmp_path / "ds")
    kept, dropped = side["episodes"], side["dropped_episodes"]
    assert side["counts"]["failed"] == 2 and side["counts"]["per_task"]["open_drawer"]["failed"] == 2
    failed = [r for r in kept + dropped if not r["success"]]
    assert {r["task"] for r in failed} == {"open_drawer"} and all(r["reason"] == "max_steps" for r in failed)
    assert all(r["length"] == 20 for r in failed)
    if only_success:
        assert [r["task"] for r in kept] == ["reach", "reach"] and len(dropped) == 2
        assert ds.num_episodes == 2 and set(ds.meta.tasks.index) == {TASKS["reach"].instruction}
    else:
        assert len(kept) == 4 and not dropped and ds.num_episodes == 4


def test_a_taken_out_folder_is_refused_unless_overwrite(tiny_dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FileExistsError, match="--overwrite"):
        prepare_out_dir(tiny_dataset, overwrite=False)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a LeRobot dataset"):
        prepare_out_dir(other, overwrite=True)
    assert (other / "todo.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare_out_dir(empty, overwrite=False)  # an empty folder is free
    assert not empty.exists()


def test_overwrite_replaces_a_dataset(tmp_path: Path) -> None:
    config = RecordConfig(tasks=("reach",), episodes_per_task=1, num_envs=1, image_size=32, vector_mode="sync")
    record_demonstrations(config, tmp_path / "ds")
    side = record_demonstrations(RecordConfig(**{**config.__dict__, "seed": 5}), tmp_path / "ds", overwrite=True)
    assert json.loads((tmp_path / "ds" / "meta" / "cosmos_robot.json").read_text())["config"]["seed"] == 5
    assert side["episodes"][0]["seed"] == demo_seed(5, "reach", 0)


def test_unknown_task_and_bad_config_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'pick' not in suite 'tabletop'"):
        record_demonstrations(RecordConfig(tasks=("reach", "pick")), tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
    with pytest.raises(ValueError, match="episodes_per_task"):
        RecordConfig(episodes_per_task=0)
    with pytest.raises(ValueError, match="vector_mode"):
        RecordConfig(vector_mode="ray")
    with pytest.raises(ValueError, match="suite"):
        record_demonstrations(RecordConfig(suite="libero"), tmp_path / "ds")


def test_background_writer_keeps_order_and_reraises_errors() -> None:
    seen: list[int] = []
    with BackgroundWriter(seen.append, max_pending=2) as writer:
        for i in range(10):
            writer.put(i)
    assert seen == list(range(10))

    def boom(item: int) -> None:
        raise OSError(f"disk full at {item}")

    with pytest.raises(RuntimeError, match="disk full at 0"):
        with BackgroundWriter(boom) as writer:
            writer.put(0)


def test_suites_without_scripted_experts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"scripted experts, which exist for \['driving', 'tabletop'\] only; LIBERO"):
        record_demonstrations(RecordConfig(suite="libero_spatial"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_expert_noise_perturbs_the_hand_and_keeps_clean_expert_labels(tmp_path: Path) -> None:
    """DART on the tabletop: the executed hand motion drifts off the expert's path, yet every stored action
    is what the (memoryless) expert asks for in the recorded state, so the data shows the way back."""
    from cosmos_robot_envs.tabletop.experts import scripted_expert

    def record(noise: float, name: str) -> dict:
        config = RecordConfig(
            tasks=("pick_place",), episodes_per_task=2, num_envs=2, cameras=False, vector_mode="sync",
            expert_noise=noise, only_success=False,
        )  # fmt: skip
        return record_demonstrations(config, tmp_path / name)

    clean, noisy = record(0.0, "clean"), record(0.75, "noisy")
    assert noisy["config"]["expert_noise"] == 0.75
    assert [r["seed"] for r in noisy["episodes"]] == [r["seed"] for r in clean["episodes"]]  # the same layouts
    state, obj, action = (_column(tmp_path / "noisy", k) for k in (STATE, OBJECT_STATE, ACTION))
    clean_state = _column(tmp_path / "clean", STATE)
    n = min(len(state), len(clean_state))
    assert np.abs(state[:n, :3] - clean_state[:n, :3]).max() > 0.005  # the hand went elsewhere (> 5 mm)
    expert = scripted_expert("pick_place")
    for s, o, a in zip(state, obj, action, strict=True):
        assert np.allclose(expert.act({"state": s, "object_state": o}), a, atol=1e-5)  # labels stay clean
    again = record(0.75, "again")  # the perturbation is drawn from each episode's seed: reproducible
    assert again["counts"]["frames"] == noisy["counts"]["frames"]
    assert np.array_equal(_column(tmp_path / "again", STATE), state)


def test_noise_tasks_limit_the_perturbation_to_the_tasks_named(tmp_path: Path) -> None:
    """``noise_tasks``: only those tasks' episodes run perturbed (push is recorded clean beside a noisy
    pick_place, as ``sft_flow_tabletop`` does); a task that is not recorded is refused by name."""

    def record(noise: float, name: str, noise_tasks: tuple[str, ...] = ()) -> Path:
        config = RecordConfig(
            tasks=("push", "pick_place"), episodes_per_task=1, num_envs=2, cameras=False, vector_mode="sync",
            expert_noise=noise, noise_tasks=noise_tasks, only_success=False,
        )  # fmt: skip
        record_demonstrations(config, tmp_path / name)
        return tmp_path / name

    def by_task(root: Path) -> dict[int, np.ndarray]:
        episodes = _column(root, "episode_index")
        return {int(e): _column(root, STATE)[episodes == e] for e in np.unique(episodes)}

    clean, some = by_task(record(0.0, "clean")), by_task(record(0.75, "some", ("pick_place",)))
    assert np.array_equal(some[0], clean[0])  # episode 0 (push): not perturbed
    n = min(len(some[1]), len(clean[1]))
    assert not np.array_equal(some[1][:n], clean[1][:n])  # episode 1 (pick_place): perturbed
    with pytest.raises(ValueError, match=r"noise_tasks: \['reach'\] are not among the recorded tasks"):
        record(0.75, "stray", ("reach",))
    with pytest.raises(ValueError, match=r"noise_tasks: \['push'\] given but expert_noise is 0"):
        RecordConfig(noise_tasks=("push",))
