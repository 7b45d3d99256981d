"""Read a demonstration LeRobotDataset into memory once, as tensors a CPU training loop can index directly.

Why not ``LeRobotDataset.__getitem__`` in the training loop: each call decodes two images and
converts every column to torch (~5-8 ms per frame), so a 30-minute CPU budget would go to data loading.
Here the dataset is opened with LeRobot's API (``LeRobotDataset(repo_id, root=...)``, its
``hf_dataset`` Arrow table and ``meta``) and decoded once: PNG bytes straight from the Arrow column
(or frames from the MP4 files with LeRobot's ``decode_video_frames``), resized to the policy's image
size on the way in, so memory is ``N x cameras x 3 x S x S`` bytes (20k frames, 2 cameras, 64 px:
~0.5 GB). A batch is then one fancy-index per tensor.

Images are resized with PIL bilinear, the same resampling as the ``ResizeImages`` transform that
serving applies, so a policy sees the same pixels in training and at inference.

The folder is checked on disk first (``cosmos_robot.data.local``): LeRobot fetches whatever it finds
missing from the Hugging Face Hub, so a recording killed mid-write would otherwise end in a network
error, and an interrupted recording (a valid dataset holding only part of what was asked for) is
refused unless ``allow_incomplete``: training on half the data without noticing is the worse failure.

Action chunks follow LeRobot's ``delta_timestamps`` semantics: frame ``t`` gets actions
``t .. t+chunk_size-1`` of its own episode; past the episode's last frame the last action is repeated and
``action_is_pad`` is True there (a loss should mask those steps).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from cosmos_robot.data.local import IncompleteDatasetError, check_local_dataset, read_sidecar
from cosmos_robot.data.schema import ACTION, CAMERAS, SIDECAR, STATE, camera_key
from cosmos_robot.normalize import FeatureStats, compute_stats

_VIDEO_BLOCK = 512  # frames per video decode call (bounds the full-resolution buffer)

__all__ = ["DemoData", "action_chunks", "compute_norm_stats", "first_episodes_per_task", "load_demonstrations"]


@dataclass
class DemoData:
    """Every frame of a demonstration dataset, in memory (frame order = LeRobot's ``index`` order)."""

    images: torch.Tensor  # (N, n_cameras, 3, S, S) uint8
    state: torch.Tensor  # (N, state_dim) float32
    actions: torch.Tensor  # (N, chunk_size, action_dim) float32: actions t .. t+chunk_size-1 of the frame's episode
    action_is_pad: torch.Tensor  # (N, chunk_size) bool: True where t+k is past the episode's end
    episode_index: torch.Tensor  # (N,) int64: LeRobot's episode_index
    frame_index: torch.Tensor  # (N,) int64: position within the episode
    prompts: list[str]  # (N,) the instruction (LeRobot's per-frame ``task``)
    cameras: tuple[str, ...]  # camera names, in the order of images' axis 1
    fps: int
    root: Path
    load_s: float = 0.0  # seconds load_demonstrations took
    info: dict[str, Any] = field(default_factory=dict)  # the dataset's meta/info.json

    def __len__(self) -> int:
        return int(self.state.shape[0])

    @property
    def chunk_size(self) -> int:
        return int(self.actions.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.images.shape[-1])

    @property
    def num_episodes(self) -> int:
        return int(torch.unique(self.episode_index).numel())


def action_chunks(actions: np.ndarray, episode_index: np.ndarray, chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(N, chunk_size, D)`` chunks and ``(N, chunk_size)`` pad mask from per-frame ``actions`` grouped in
    contiguous episodes."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
    n = len(actions)
    if n == 0:
        return np.zeros((0, chunk_size, actions.shape[-1]), actions.dtype), np.zeros((0, chunk_size), bool)
    boundaries = np.flatnonzero(np.diff(episode_index)) + 1
    ends = np.append(boundaries, n)  # exclusive end of each contiguous episode run
    run_of_frame = np.repeat(np.arange(len(ends)), np.diff(np.concatenate([[0], ends])))
    end = ends[run_of_frame]
    idx = np.arange(n)[:, None] + np.arange(chunk_size)[None, :]
    pad = idx >= end[:, None]
    idx = np.minimum(idx, end[:, None] - 1)
    return actions[idx], pad


def first_episodes_per_task(episodes: np.ndarray, prompts: list[str], limit: int | None) -> torch.Tensor | None:
    """Frame indices of the first ``limit`` episodes of each instruction (None: keep everything): the
    few-shot subsets that SFT recipes (``data.max_episodes_per_task``) and demonstration-augmented RL
    (``bc.max_episodes_per_task``) take from one recording."""
    if limit is None:
        return None
    first_frame = {int(ep): i for i, ep in reversed(list(enumerate(episodes.tolist())))}
    per_task: dict[str, list[int]] = {}
    for ep in sorted(first_frame):
        per_task.setdefault(prompts[first_frame[ep]], []).append(ep)
    chosen = {ep for eps in per_task.values() for ep in eps[:limit]}
    return torch.from_numpy(np.flatnonzero(np.isin(episodes, sorted(chosen))))


def _resize_png(data: bytes, size: int) -> np.ndarray:
    img = Image.open(BytesIO(data)).convert("RGB")
    if img.size != (size, size):
        img = img.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(img)


def _column(table: Any, key: str) -> np.ndarray:
    import pyarrow as pa

    col = table.column(key).combine_chunks()
    if pa.types.is_fixed_size_list(col.type):
        return np.asarray(col.flatten().to_numpy(zero_copy_only=False)).reshape(len(col), col.type.list_size)
    return np.asarray(col.to_numpy(zero_copy_only=False))


def _decode_images(table: Any, key: str, size: int, out: np.ndarray, workers: int) -> None:
    """PNG bytes of column ``key`` -> ``out`` (N, 3, S, S) uint8, resized."""
    blobs = table.column(key).combine_chunks().field("bytes").to_pylist()

    def work(start: int, stop: int) -> None:
        for i in range(start, stop):
            out[i] = _resize_png(blobs[i], size).transpose(2, 0, 1)

    step = max(1, -(-len(blobs) // max(1, workers)))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(lambda s: work(s, min(s + step, len(blobs))), range(0, len(blobs), step)))


def _decode_videos(
    dataset: Any, key: str, episodes: np.ndarray, timestamps: np.ndarray, size: int, out: np.ndarray
) -> None:
    """Frames of video feature ``key`` -> ``out`` (N, 3, S, S) uint8: one sequential decode per file and
    block of frames (per-episode calls reopen and seek the file, ~0.15 s each)."""
    from lerobot.datasets.video_utils import decode_video_frames

    by_file: dict[Path, list[tuple[int, float]]] = {}
    for ep in np.unique(episodes):
        meta = dataset.meta.episodes[int(ep)]
        start = float(meta[f"videos/{key}/from_timestamp"])
        path = dataset.root / dataset.meta.get_video_file_path(int(ep), key)
        rows = np.flatnonzero(episodes == ep)
        by_file.setdefault(path, []).extend((int(r), start + float(timestamps[r])) for r in rows)
    for path, queries in by_file.items():
        queries.sort(key=lambda q: q[1])
        for b in range(0, len(queries), _VIDEO_BLOCK):
            block = queries[b : b + _VIDEO_BLOCK]
            frames = decode_video_frames(path, [q[1] for q in block], dataset.tolerance_s, return_uint8=True)
            for (row, _), frame in zip(block, frames.numpy()):
                img = frame.transpose(1, 2, 0)
                if img.shape[:2] != (size, size):
                    img = np.asarray(Image.fromarray(img).resize((size, size), Image.Resampling.BILINEAR))
                out[row] = img.transpose(2, 0, 1)


def _repo_id(root: Path) -> str:
    sidecar = root / SIDECAR
    if sidecar.exists():
        repo = json.loads(sidecar.read_text()).get("config", {}).get("repo_id")
        if isinstance(repo, str) and "/" in repo:
            return repo
    return f"local/{root.name or 'dataset'}"


def _refuse_interrupted(root: Path, allow_incomplete: bool) -> None:
    side = read_sidecar(root)
    if allow_incomplete or side is None or side.get("status") != "interrupted":
        return
    counts = side.get("counts", {})
    command = " ".join(str(c) for c in side.get("command", [])) or f"cosmos-robot record --out {root}"
    raise IncompleteDatasetError(
        f"{root} holds an interrupted recording: {counts.get('rolled_out', '?')} of the "
        f"{counts.get('scheduled', '?')} scheduled episodes were rolled out. Rerun the command that recorded it "
        f"(`{command}`) to finish it (recording resumes where it stopped), or delete {root} to start over"
    )


def load_demonstrations(
    root: str | Path,
    *,
    chunk_size: int,
    image_size: int,
    cameras: Sequence[str] = CAMERAS,
    state_keys: Sequence[str] = ("state",),
    max_episodes: int | None = None,
    decode_workers: int = 2,
    allow_incomplete: bool = False,
) -> DemoData:
    """Load the LeRobot dataset at ``root`` into a :class:`DemoData`.

    ``cameras``: env camera names (``"image"``, ``"wrist_image"``) in the order the policy stacks them;
    empty for a camera-free policy (no video is decoded).
    ``state_keys``: observation vectors (``"state"``, ``"object_state"``) concatenated, in order, into ``state``.
    ``max_episodes``: only the first that many episodes (LeRobot's ``episodes=`` filter).
    ``allow_incomplete``: load an interrupted recording as it is instead of refusing it.
    Raises ``FileNotFoundError`` for a folder that is not a LeRobot dataset,
    :class:`~cosmos_robot.data.local.IncompleteDatasetError` for a killed or (unless
    ``allow_incomplete``) interrupted recording, and ``KeyError`` naming a feature the dataset lacks.
    Never accesses the network.
    """
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    t0 = time.perf_counter()
    root = Path(root)
    info = check_local_dataset(root)
    _refuse_interrupted(root, allow_incomplete)
    if image_size < 1:
        raise ValueError(f"image_size: expected >= 1, got {image_size}")
    if max_episodes is not None and max_episodes < 1:
        raise ValueError(f"max_episodes: expected >= 1 or None, got {max_episodes}")
    features = info.get("features", {})
    state_features = [f"observation.{key}" for key in state_keys]
    wanted = [*state_features, ACTION, *(camera_key(c) for c in cameras)]
    missing = [k for k in wanted if k not in features]
    if missing:
        raise KeyError(f"{root}: the dataset has no feature(s) {missing}; it has {sorted(features)}")
    episodes = None
    if max_episodes is not None and max_episodes < int(info.get("total_episodes", 0)):
        episodes = list(range(max_episodes))

    dataset = LeRobotDataset(_repo_id(root), root=root, episodes=episodes)
    table = dataset.hf_dataset.data  # the Arrow table behind LeRobot's hf_dataset (PNG bytes undecoded)
    order = np.argsort(_column(table, "index"), kind="stable")
    if np.any(order != np.arange(len(order))):
        table = table.take(order)
    episode_index = _column(table, "episode_index").astype(np.int64)
    actions = _column(table, ACTION).astype(np.float32)
    chunks, pad = action_chunks(actions, episode_index, chunk_size)
    task_of_index = {int(i): str(t) for t, i in zip(dataset.meta.tasks.index, dataset.meta.tasks["task_index"])}
    prompts = [task_of_index[int(i)] for i in _column(table, "task_index")]

    n = len(episode_index)
    images = np.empty((n, len(cameras), 3, image_size, image_size), dtype=np.uint8)
    for c, cam in enumerate(cameras):
        key = camera_key(cam)
        if features[key]["dtype"] == "video":
            _decode_videos(dataset, key, episode_index, _column(table, "timestamp"), image_size, images[:, c])
        else:
            _decode_images(table, key, image_size, images[:, c], decode_workers)
    return DemoData(
        images=torch.from_numpy(images),
        state=torch.from_numpy(np.concatenate([_column(table, k).astype(np.float32) for k in state_features], axis=1)),
        actions=torch.from_numpy(np.ascontiguousarray(chunks)),
        action_is_pad=torch.from_numpy(pad),
        episode_index=torch.from_numpy(episode_index),
        frame_index=torch.from_numpy(_column(table, "frame_index").astype(np.int64)),
        prompts=prompts,
        cameras=tuple(cameras),
        fps=int(dataset.fps),
        root=root,
        load_s=time.perf_counter() - t0,
        info=info,
    )


def compute_norm_stats(data: DemoData) -> dict[str, FeatureStats]:
    """Per-dimension stats of ``observation.state`` and ``action`` over every frame (not over chunk padding)."""
    return {
        STATE: compute_stats(data.state.numpy()),
        ACTION: compute_stats(data.actions[:, 0].numpy()),  # chunk step 0 is the frame's own action
    }
