"""Interrupted and killed recordings: resumed to the full count, or refused with the fix; never the hub.

What is proved here: a recording stopped by a real SIGINT after its second episode is a valid but
short dataset that the loader refuses (naming the command that finishes it) and that rerunning the
same recording, or SFT's ``ensure_dataset``, resumes to exactly the uninterrupted dataset (same
episodes, seeds and frames); a recording SIGKILLed mid-run is refused by the recorder, the loader and
SFT with a message naming the folder and ``--overwrite``; and none of it reaches for the Hugging Face
Hub, checked in subprocesses with ``HF_HUB_OFFLINE`` unset and the hub pointed at a closed port.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from lerobot.datasets.lerobot_dataset import LeRobotDataset

from cosmos_robot.data.background import BackgroundWriter
from cosmos_robot.data.loader import load_demonstrations
from cosmos_robot.data.local import IncompleteDatasetError, recording_status
from cosmos_robot.data.record import RecordCallbacks, load_sidecar, record_demonstrations
from cosmos_robot.data.rollouts import Episode, demo_seed
from cosmos_robot.data.schema import ACTION, SIDECAR, STATE
from tests.data.conftest import TINY

# a hub that refuses every connection at once: any download attempt fails fast instead of passing
NO_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2"}

_RECORD_AND_SIGNAL = """
import os, signal, sys, time
from cosmos_robot.data.record import RecordCallbacks, record_demonstrations
from tests.data.conftest import TINY

class Stop(RecordCallbacks):
    written = 0
    def episode(self, episode, kept):
        self.written += 1
        if self.written == 2:
            os.kill(os.getpid(), getattr(signal, sys.argv[2]))
            time.sleep(30)

record_demonstrations(TINY, sys.argv[1], callbacks=Stop(), command=["cosmos-robot", "record", "--out", sys.argv[1]])
"""

_NO_HUB_CHECKS = """
import json, sys
from cosmos_robot.data.background import BackgroundWriter
from cosmos_robot.data.loader import load_demonstrations
from cosmos_robot.data.local import IncompleteDatasetError
from cosmos_robot.data.record import record_demonstrations
from tests.data.conftest import TINY

import huggingface_hub.constants as hub
assert not hub.HF_HUB_OFFLINE and hub.ENDPOINT == "http://127.0.0.1:9", (hub.HF_HUB_OFFLINE, hub.ENDPOINT)
resume, legacy, killed = sys.argv[1:4]
out = {"resumed_episodes": record_demonstrations(TINY, resume)["counts"]["kept"]}
out["loaded_episodes"] = load_demonstrations(resume, chunk_size=4, image_size=16).num_episodes
for name, root in (("legacy_error", legacy), ("killed_error", killed)):
    try:
        load_demonstrations(root, chunk_size=4, image_size=16)
    except IncompleteDatasetError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def _no_hub_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return {**env, **NO_HUB, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


def _python(code: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cwd = Path(__file__).resolve().parents[2]  # the repository root: `tests` is importable from there
    cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_no_hub_env(), cwd=cwd)


class _SigintAfter(RecordCallbacks):
    """A real SIGINT to this process once the second episode is written (the writer thread waits for it)."""

    written = 0

    def episode(self, episode: Episode, kept: bool) -> None:
        self.written += 1
        if self.written == 2:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)  # the main thread stops the rollouts meanwhile: nothing more gets written


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("interrupted") / "demos"
    with pytest.raises(KeyboardInterrupt):
        record_demonstrations(TINY, root, callbacks=_SigintAfter(), command=["cosmos-robot", "record", "--out", "X"])
    return root


def _columns(root: Path) -> dict[str, np.ndarray]:
    table = LeRobotDataset("local/t", root=root).hf_dataset.with_format("numpy")
    return {key: np.stack(table[key]) for key in (ACTION, STATE, "episode_index", "frame_index")}


def test_an_interrupted_recording_is_a_valid_short_dataset_the_loader_refuses(interrupted: Path) -> None:
    side = load_sidecar(interrupted)
    assert side["status"] == "interrupted" and recording_status(interrupted) == "interrupted"
    assert side["counts"]["kept"] == 2 and side["counts"]["scheduled"] == 4
    assert LeRobotDataset("local/t", root=interrupted).num_episodes == 2
    with pytest.raises(
        IncompleteDatasetError, match=r"interrupted recording: 2 of the 4 .*`cosmos-robot record --out X`"
    ):
        load_demonstrations(interrupted, chunk_size=4, image_size=16)
    partial = load_demonstrations(interrupted, chunk_size=4, image_size=16, allow_incomplete=True)
    assert partial.num_episodes == 2


def test_rerunning_the_recording_resumes_to_the_uninterrupted_dataset(
    interrupted: Path, tiny_dataset: Path, tmp_path: Path
) -> None:
    root = tmp_path / "demos"
    shutil.copytree(interrupted, root)
    # another env count and writer setting may resume (they cannot change an episode)
    resumed = record_demonstrations(TINY.__class__(**{**TINY.__dict__, "num_envs": 1, "image_writer_threads": 0}), root)
    assert resumed["status"] == "complete" and resumed["counts"]["resumed"] == 2 and resumed["counts"]["kept"] == 4
    full = load_sidecar(tiny_dataset)
    assert [(r["task"], r["index"], r["seed"], r["length"]) for r in resumed["episodes"]] == [
        (r["task"], r["index"], r["seed"], r["length"]) for r in full["episodes"]
    ]
    assert all(r["seed"] == demo_seed(0, r["task"], r["index"]) for r in resumed["episodes"])
    ours, theirs = _columns(root), _columns(tiny_dataset)
    for key in ours:
        np.testing.assert_array_equal(ours[key], theirs[key])
    assert load_demonstrations(root, chunk_size=4, image_size=16).num_episodes == 4
    again = record_demonstrations(TINY, root)  # complete, same config: nothing to do
    assert again["created_at"] == resumed["created_at"] and load_sidecar(root)["status"] == "complete"
    with pytest.raises(FileExistsError, match=r"another config \(seed: saved 0, now 9\).*--overwrite"):
        record_demonstrations(TINY.__class__(**{**TINY.__dict__, "seed": 9}), root)


def test_sft_resumes_an_interrupted_recording_instead_of_training_on_half(interrupted: Path, tmp_path: Path) -> None:
    from cosmos_robot_trainers.sft.config import DataConfig
    from cosmos_robot_trainers.sft.data import ensure_dataset

    root = tmp_path / "demos"
    shutil.copytree(interrupted, root)
    data = {"tasks": ["reach", "push"], "episodes_per_task": 2, "record_image_size": 32, "record_num_envs": 1}
    logged: list[str] = []
    summary = ensure_dataset(DataConfig(root=str(root), record_if_missing=True, **data), log=logged.append)
    assert summary is not None and summary["counts"]["kept"] == 4 and "resuming" in logged[0]
    assert ensure_dataset(DataConfig(root=str(root), record_if_missing=True, **data)) is None  # complete now
    assert load_demonstrations(root, chunk_size=4, image_size=16).num_episodes == 4


@pytest.mark.slow
def test_a_killed_recording_is_refused_with_the_fix_and_nothing_reaches_the_hub(
    interrupted: Path, tmp_path: Path
) -> None:
    from cosmos_robot_trainers.sft.config import DataConfig
    from cosmos_robot_trainers.sft.data import ensure_dataset

    killed = tmp_path / "killed"
    res = _python(_RECORD_AND_SIGNAL, str(killed), "SIGKILL")
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]
    assert recording_status(killed) == "recording"
    fix = rf"{killed}.*(delete it|--overwrite)"
    with pytest.raises(IncompleteDatasetError, match=rf"still running or was killed.*{fix}"):
        record_demonstrations(TINY, killed)
    with pytest.raises(IncompleteDatasetError, match=fix):
        load_demonstrations(killed, chunk_size=4, image_size=16)
    with pytest.raises(IncompleteDatasetError, match=fix):
        ensure_dataset(DataConfig(root=str(killed), record_if_missing=True, tasks=["reach", "push"]))

    # a folder killed by an older recorder has no sidecar at all: its missing files are named instead
    legacy = tmp_path / "legacy"
    shutil.copytree(killed, legacy)
    (legacy / SIDECAR).unlink()
    with pytest.raises(FileExistsError, match=rf"without {SIDECAR}.*--overwrite"):
        record_demonstrations(TINY, legacy)

    # in a process where the hub is reachable in principle (HF_HUB_OFFLINE unset) but refuses: the
    # interrupted recording resumes and loads, and the killed ones are refused before LeRobot looks
    resume = tmp_path / "resume"
    shutil.copytree(interrupted, resume)
    res = _python(_NO_HUB_CHECKS, str(resume), str(legacy), str(killed))
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["resumed_episodes"] == 4 and out["loaded_episodes"] == 4
    assert "meta/info.json lists 2 episodes, meta/episodes/ holds 0" in out["legacy_error"]
    assert "Hugging Face Hub" in out["legacy_error"] and "--overwrite" in out["legacy_error"]
    assert "still running or was killed" in out["killed_error"]

    fresh = record_demonstrations(TINY, killed, overwrite=True)  # the fix the messages name works
    assert fresh["status"] == "complete" and fresh["counts"]["kept"] == 4


def test_ctrl_c_while_the_writer_finishes_waits_for_the_item_being_written() -> None:
    """Ctrl-C during the final wait drops the queued items but never leaves a write running behind."""
    written: list[int] = []
    done: list[int] = []

    def write(item: int) -> None:
        written.append(item)
        if item == 0:
            os.kill(os.getpid(), signal.SIGINT)  # lands while the caller waits for this item
            time.sleep(1.0)
        done.append(item)

    writer = BackgroundWriter(write, max_pending=8)
    with pytest.raises(KeyboardInterrupt):
        with writer:
            for i in range(4):
                writer.put(i)
    assert written == done == [0]  # item 0 finished; 1-3 were dropped, not written after the caller left
