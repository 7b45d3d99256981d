"""``training_relevant_diff``: which saved-vs-current recipe differences refuse a resume."""

from __future__ import annotations

from cosmos_robot_trainers.common.rundir import training_relevant_diff


def test_diff_names_changed_fields_and_skips_runtime_ones() -> None:
    saved = {"optim": {"lr": 1e-3}, "train": {"log_every": 5}}
    now = {"optim": {"lr": 2e-3}, "train": {"log_every": 10}}
    assert training_relevant_diff(saved, now, ["train.log_every"]) == ["optim.lr: saved 0.001, now 0.002"]


def test_a_run_saved_before_the_chunk_size_rename_still_resumes() -> None:
    saved = {"model": {"horizon": 10, "image_size": 64}}  # config.resolved.json written before issue 14
    assert training_relevant_diff(saved, {"model": {"chunk_size": 10, "image_size": 64}}, []) == []
    assert training_relevant_diff(saved, {"model": {"chunk_size": 8, "image_size": 64}}, []) == [
        "model.chunk_size: saved 10, now 8"
    ]
