"""MP4 episode videos with PyAV (H.264, yuv420p: what every browser's ``<video>`` tag plays).

Why PyAV: its wheels bundle FFmpeg, so a headless simulator box needs no system ``ffmpeg`` binary and
no subprocess pipe. yuv420p needs even sides, so odd-sized frames are padded by one edge pixel.
Imported lazily: an evaluation that records no videos (RL trainers' eval hooks, a slim simulator
image) must not need PyAV.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

__all__ = ["write_mp4"]


def write_mp4(path: Path, frames: Sequence[np.ndarray], fps: int, *, crf: int = 23) -> None:
    """Write uint8 ``(H, W, 3)`` RGB ``frames`` to ``path`` as H.264 at ``fps`` frames per second."""
    if not frames:
        raise ValueError(f"write_mp4({path}): no frames")
    first = np.asarray(frames[0])
    if first.dtype != np.uint8 or first.ndim != 3 or first.shape[2] != 3:
        raise ValueError(f"write_mp4({path}): frames must be uint8 (H, W, 3), got {first.dtype} {first.shape}")
    import av

    h, w = first.shape[0], first.shape[1]
    pad_h, pad_w = h % 2, w % 2
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height = w + pad_w, h + pad_h
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": "veryfast"}
        for i, frame in enumerate(frames):
            arr = np.asarray(frame)
            if arr.shape != first.shape or arr.dtype != np.uint8:
                raise ValueError(
                    f"write_mp4({path}): frame {i} is {arr.dtype} {arr.shape}, expected uint8 {first.shape}"
                )
            if pad_h or pad_w:
                arr = np.pad(arr, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
