"""A tiny demonstration dataset recorded once per test session (sync envs, 32 px, two short tasks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos_robot.data.record import RecordConfig, record_demonstrations

TINY = RecordConfig(tasks=("reach", "push"), episodes_per_task=2, num_envs=2, image_size=32, vector_mode="sync")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demos") / "tiny"
    record_demonstrations(TINY, root, command=["test"])
    return root
