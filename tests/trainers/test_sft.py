"""SFT trainer: the debug recipe trains, checkpoints, resumes exactly, exports a loadable policy, and
refuses what it should; plus the pieces (schedule, sampler, augmentation, checkpoints, metrics, RNG)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cosmos_robot.config import ConfigError
from cosmos_robot.policies import load_policy_folder
from cosmos_robot_trainers.common import (
    EpochBatchSampler,
    MetricsLogger,
    capture_rng_state,
    latest_checkpoint,
    read_metrics,
    restore_rng_state,
    save_checkpoint,
)
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.sft import SFTConfig, run_sft
from cosmos_robot_trainers.sft.config import AugmentConfig, OptimConfig
from cosmos_robot_trainers.sft.data import augment_images
from cosmos_robot_trainers.sft.optim import lr_factor
from cosmos_robot_trainers.sft.rundir import RunDirError

DETERMINISTIC = ("loss", "grad_norm", "lr", "epoch")


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The debug recipe's dataset (2 episodes per task at 32 px), recorded once for this module."""
    from cosmos_robot.data.record import RecordConfig, record_demonstrations

    root = tmp_path_factory.mktemp("demos") / "debug"
    record_demonstrations(
        RecordConfig(episodes_per_task=2, image_size=32, num_envs=1, vector_mode="sync", image_writer_threads=0), root
    )
    return root


def debug_config(demo_root: Path, out: Path, *overrides: str) -> SFTConfig:
    _, config = load_train_recipe(
        "debug",
        [
            f"data.root={json.dumps(str(demo_root))}",
            f"output.dir={json.dumps(str(out))}",
            "train.progress=false",
            *overrides,
        ],
    )
    assert isinstance(config, SFTConfig)
    return config


def test_killed_and_resumed_run_matches_an_uninterrupted_one(demo_root: Path, tmp_path: Path) -> None:
    whole = run_sft(debug_config(demo_root, tmp_path / "whole"), log=quiet)
    assert whole.finished and whole.step == 20

    config = debug_config(demo_root, tmp_path / "split")
    first = run_sft(config, stop_at_step=13, log=quiet)  # "killed" between the checkpoints at 10 and 20
    assert not first.finished and first.final_dir is None
    assert [r["step"] for r in read_metrics(tmp_path / "split")] == [5, 10]
    second = run_sft(config, log=quiet)
    assert second.resumed_from == 10 and second.finished

    a, b = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "split")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [5, 10, 15, 20]
    for ra, rb in zip(a, b):
        assert {k: ra[k] for k in DETERMINISTIC} == {k: rb[k] for k in DETERMINISTIC}, (ra, rb)
    wa, wb = (load_file(str(p / "final" / "model.safetensors")) for p in (tmp_path / "whole", tmp_path / "split"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def _losses(out: Path) -> list[tuple[float, float]]:
    return [(r["loss"], r["grad_norm"]) for r in read_metrics(out) if "loss" in r]


def test_grad_accum_takes_the_same_steps_and_bf16_autocasts(demo_root: Path, tmp_path: Path) -> None:
    """``train.grad_accum`` micro-batches, each weighted by its share of the loss's normaliser, sum to the
    whole batch's gradient; ``train.precision = "bf16"`` changes the arithmetic (autocast), not the run."""
    sets = ("train.steps=6", "train.log_every=1", "train.ckpt_every=3", "eval.final=false")
    base = _losses(run_sft(debug_config(demo_root, tmp_path / "a1", *sets), log=quiet).out_dir)
    accum = _losses(run_sft(debug_config(demo_root, tmp_path / "a4", *sets, "train.grad_accum=4"), log=quiet).out_dir)
    assert len(base) == len(accum) == 6
    for (loss_a, grad_a), (loss_b, grad_b) in zip(base, accum, strict=True):
        assert abs(loss_a - loss_b) < 1e-5 and abs(grad_a - grad_b) < 1e-5
    bf16 = run_sft(debug_config(demo_root, tmp_path / "bf16", *sets, 'train.precision="bf16"'), log=quiet)
    half = _losses(bf16.out_dir)
    assert all(math.isfinite(loss) for loss, _ in half)
    assert 0 < max(abs(a[0] - b[0]) for a, b in zip(base, half, strict=True)) < 1e-2  # bf16 matmuls: close, not equal
    assert (bf16.out_dir / "final" / "model.safetensors").is_file()
    tensors = load_file(bf16.out_dir / "final" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in tensors.values())  # float32 masters are what is saved


def test_resume_from_a_checkpoint_step_after_a_crash_past_it(demo_root: Path, tmp_path: Path) -> None:
    """A kill after logging step 15 but before the step-20 checkpoint: resuming from step 10 replays
    11..20, and metrics.jsonl holds each step once."""
    whole = run_sft(debug_config(demo_root, tmp_path / "whole"), log=quiet)
    config = debug_config(demo_root, tmp_path / "crash")
    run_sft(config, log=quiet)
    ckpts = tmp_path / "crash" / "checkpoints"
    import shutil

    shutil.rmtree(ckpts / "step_000020")  # as if killed while step 20 was being written
    (tmp_path / "crash" / "metrics.jsonl").write_text(
        (tmp_path / "crash" / "metrics.jsonl").read_text() + '{"step": 20, "loss": 1.0, "torn'
    )
    again = run_sft(config, log=quiet)
    assert again.resumed_from == 10
    a, b = read_metrics(whole.out_dir), read_metrics(tmp_path / "crash")
    assert [r["step"] for r in b] == [5, 10, 15, 20]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


def test_outputs_and_final_policy_answers_infer(demo_root: Path, tmp_path: Path) -> None:
    result = run_sft(debug_config(demo_root, tmp_path / "run"), log=quiet)
    out = tmp_path / "run"
    for name in ("config.resolved.json", "metrics.jsonl", "learning_curve.png", "final/config.json"):
        assert (out / name).exists(), name
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000010", "step_000020"]
    assert json.loads((out / "config.resolved.json").read_text())["train"]["steps"] == 20

    policy = load_policy_folder(result.final_dir)
    rng = np.random.default_rng(0)
    obs = {
        "observation/image": rng.integers(0, 255, (48, 48, 3), dtype=np.uint8),  # any size: resized to 32
        "observation/wrist_image": rng.integers(0, 255, (48, 48, 3), dtype=np.uint8),
        "observation/state": np.zeros(8, dtype=np.float32),
        "prompt": "reach the red target",
    }
    actions = policy.infer(obs)["actions"]
    assert actions.shape == (4, 7) and actions.dtype == np.float32 and np.isfinite(actions).all()


def test_rerunning_a_finished_run_does_no_training(demo_root: Path, tmp_path: Path) -> None:
    config = debug_config(demo_root, tmp_path / "run")
    run_sft(config, log=quiet)
    again = run_sft(config, log=quiet)
    assert again.resumed_from == 20 and again.finished and again.final_dir is not None
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [5, 10, 15, 20]


def test_resume_refuses_a_changed_recipe_naming_the_field(demo_root: Path, tmp_path: Path) -> None:
    run_sft(debug_config(demo_root, tmp_path / "run"), stop_at_step=10, log=quiet)
    with pytest.raises(RunDirError, match=r"optim\.lr: saved 0\.001, now 0\.002") as info:
        run_sft(debug_config(demo_root, tmp_path / "run", "optim.lr=2e-3"), log=quiet)
    assert "--overwrite" in str(info.value)
    with pytest.raises(RunDirError, match="model.trunk_width"):
        run_sft(debug_config(demo_root, tmp_path / "run", "model.trunk_width=40"), log=quiet)
    # runtime fields may change: logging cadence, output options
    resumed = run_sft(debug_config(demo_root, tmp_path / "run", "output.plot=false", "train.log_every=10"), log=quiet)
    assert resumed.resumed_from == 10 and resumed.finished
    with pytest.raises(RunDirError, match="--no-resume"):
        run_sft(debug_config(demo_root, tmp_path / "run"), resume=False, log=quiet)
    fresh = run_sft(debug_config(demo_root, tmp_path / "run", "optim.lr=2e-3"), overwrite=True, log=quiet)
    assert fresh.resumed_from is None and fresh.finished


def test_missing_dataset_without_recording_names_the_field(tmp_path: Path) -> None:
    config = debug_config(tmp_path / "nowhere", tmp_path / "run", "data.record_if_missing=false")
    with pytest.raises(FileNotFoundError, match=r"data\.root: .*nowhere.*cosmos-robot record"):
        run_sft(config, log=quiet)


def test_recipe_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"train\.stesp: unknown field; did you mean 'train\.steps'"):
        load_train_recipe("debug", ["train.stesp=3"])
    with pytest.raises(ConfigError, match=r"ckpt_every \(7\) must be a multiple of train\.log_every \(5\)"):
        load_train_recipe("debug", ["train.ckpt_every=7"])
    with pytest.raises(ConfigError, match="did you mean 'debug'"):
        load_train_recipe("debgu")
    with pytest.raises(ConfigError, match="unknown trainer 'sfx'; did you mean 'sft'"):
        load_train_recipe("debug", ["trainer=sfx"])
    _, full = load_train_recipe("sft_flow_tabletop")
    assert full.model.chunk_size == 10 and full.data.record_if_missing


def test_max_episodes_per_task_keeps_the_first_episodes_of_each_task(demo_root: Path, tmp_path: Path) -> None:
    from cosmos_robot_trainers.sft.data import load_train_data

    config = debug_config(demo_root, tmp_path / "run", "data.max_episodes_per_task=1")
    data = load_train_data(config.data, config.model)
    assert data.num_episodes == 4 and len(set(data.prompts)) == 4
    assert len(data) < len(load_train_data(debug_config(demo_root, tmp_path / "r").data, config.model))


# --- the pieces ------------------------------------------------------------------------------------


def test_lr_schedule_hand_computed() -> None:
    cfg = OptimConfig(lr=1.0, warmup_steps=10, schedule="cosine", min_lr_ratio=0.0)
    assert lr_factor(0, 110, cfg) == pytest.approx(0.1)
    assert lr_factor(9, 110, cfg) == pytest.approx(1.0)
    assert lr_factor(60, 110, cfg) == pytest.approx(0.5)  # halfway through the cosine
    assert lr_factor(110, 110, cfg) == pytest.approx(0.0)
    lin = OptimConfig(warmup_steps=0, schedule="linear", min_lr_ratio=0.2)
    assert lr_factor(50, 100, lin) == pytest.approx(0.6)
    assert lr_factor(5, 100, OptimConfig(warmup_steps=0, schedule="constant")) == 1.0


def test_sampler_is_a_function_of_its_position() -> None:
    a = EpochBatchSampler(10, 4, seed=3)
    drawn = [a.next_indices().tolist() for _ in range(5)]
    assert a.batches_per_epoch == 2
    assert sorted(drawn[0] + drawn[1]) == sorted(set(drawn[0] + drawn[1]))  # no repeats within an epoch
    b = EpochBatchSampler(10, 4, seed=3)
    b.load_state_dict({**a.state_dict(), "batches_drawn": 3})
    assert [b.next_indices().tolist() for _ in range(2)] == drawn[3:]
    with pytest.raises(ValueError, match="num_items was 10 when saved, now 11"):
        EpochBatchSampler(11, 4, seed=3).load_state_dict(a.state_dict())


def test_weighted_sampler_draws_by_weight_and_resumes() -> None:
    weights = np.array([3.0, 1.0, 0.0, 0.0])
    a = EpochBatchSampler(4, 2, seed=0, weights=weights)
    drawn = np.concatenate([a.next_indices() for _ in range(400)])
    assert set(drawn.tolist()) <= {0, 1} and 0.7 < np.mean(drawn == 0) < 0.8
    b = EpochBatchSampler(4, 2, seed=0, weights=weights)
    b.load_state_dict({**a.state_dict(), "batches_drawn": 0})
    assert np.array_equal(np.concatenate([b.next_indices() for _ in range(400)]), drawn)
    with pytest.raises(ValueError, match="weights must be 4 finite numbers"):
        EpochBatchSampler(4, 2, seed=0, weights=np.zeros(4))


def test_random_shift_moves_pixels_and_is_seeded() -> None:
    images = torch.arange(2 * 1 * 3 * 8 * 8, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(2, 1, 3, 8, 8)
    cfg = AugmentConfig(random_shift=2)
    out1 = augment_images(images, cfg, torch.Generator().manual_seed(0))
    out2 = augment_images(images, cfg, torch.Generator().manual_seed(0))
    assert out1.shape == images.shape and out1.dtype == torch.uint8 and torch.equal(out1, out2)
    assert torch.equal(augment_images(images, AugmentConfig(), torch.Generator()), images)
    # each image is a translation of its input by (dy, dx) in [-2, 2] with edge padding
    idx = torch.arange(8)
    for b in range(2):
        src, dst = images[b, 0], out1[b, 0]
        shifts = [
            (dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if torch.equal(dst, src[:, (idx + dy).clamp(0, 7)][:, :, (idx + dx).clamp(0, 7)])
        ]
        assert shifts, f"image {b} is not a shifted copy"
    jitter = augment_images(images, AugmentConfig(brightness=0.3, contrast=0.3), torch.Generator().manual_seed(1))
    assert jitter.dtype == torch.uint8 and not torch.equal(jitter, images)


def test_checkpoints_are_atomic_and_pruned(tmp_path: Path) -> None:
    model = {"w": torch.ones(3)}
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, {"x": torch.tensor(step)}, keep_last=2)
    (tmp_path / ".step_000004.tmp").mkdir()  # a save killed half way is never picked up
    (tmp_path / "step_000005").mkdir()  # nor a folder without its files
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000002", "step_000003", "step_000005"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000003"


def test_metrics_logger_drops_records_past_the_resume_step(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        for step in (10, 20, 30):
            log.log(step, {"loss": float(step)})
    with MetricsLogger(tmp_path, resume_step=20, tensorboard=False) as log:
        log.log(30, {"loss": 3.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(10, 10.0), (20, 20.0), (30, 3.0)]


def test_rng_snapshot_round_trips_through_weights_only_load(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    torch.save(capture_rng_state(), tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9)
    np.random.seed(9)
    random.seed(9)
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], got[0]) and np.array_equal(expected[1], got[1]) and expected[2] == got[2]


def test_initial_eval_is_the_first_point_of_the_learning_curve(demo_root: Path, tmp_path: Path) -> None:
    extra = ("eval.initial=true", "eval.episodes_per_task=1", "eval.tasks=['reach']", "eval.replan_steps=4")
    run_sft(debug_config(demo_root, tmp_path / "run", "train.steps=10", *extra), log=quiet)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in records if "eval_success" in r]
    assert first and first[0]["step"] == 0
    assert (tmp_path / "run" / "eval" / "step_000000" / "results.json").is_file()
