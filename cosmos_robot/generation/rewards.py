"""Image / video rewards for generator post-training: local scorers and an HTTP reward-service client.

A reward maps ``images`` ``(B, F, H, W, 3)`` uint8 (F = 1 for an image) and their prompts to ``(B,)``
float scores. Local ones are cheap and offline, chosen so that a tiny generator can move them:

- ``jpeg_compressibility``: ``-JPEG(quality 95) kB / 500`` per frame, averaged (flow_grpo's
  ``jpeg_compressibility``): flat, simple images score higher;
- ``brightness``: mean luma (BT.601) in [0, 1];
- ``color_match``: the share of pixels whose nearest palette colour is the colour word the prompt names
  for its object (``shapes.COLORS``), in [0, 1]; a prompt naming none is an error, not a zero.

``HttpImageReward`` scores through a service instead (cosmos-framework's NFT recipe scores with an image
reward service). The wire is JSON over HTTP POST, documented in docs/generator.md::

    request:  {"prompts": [str, ...], "images": [[base64 PNG per frame, ...], ...]}
    response: {"scores": [float, ...]}          (one finite number per image)

``serve_rewards`` is a reference server for any local reward (tests run it on loopback). Nothing on
this wire is unpickled: JSON and PNG only.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from cosmos_robot.generation.shapes import BACKGROUNDS, COLORS

__all__ = [
    "IMAGE_REWARDS",
    "HttpImageReward",
    "RewardServiceError",
    "brightness",
    "color_match",
    "get_reward",
    "jpeg_compressibility",
    "serve_rewards",
]

RewardFn = Callable[[np.ndarray, Sequence[str]], np.ndarray]


def _check(images: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
    arr = np.asarray(images)
    if arr.ndim != 5 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"images: expected (B, frames, H, W, 3) uint8, got {arr.shape} {arr.dtype}")
    if len(prompts) != arr.shape[0]:
        raise ValueError(f"prompts: expected {arr.shape[0]} (one per image), got {len(prompts)}")
    return arr


def jpeg_compressibility(images: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
    from PIL import Image

    arr = _check(images, prompts)
    out = np.empty(arr.shape[0], np.float64)
    for i, clip in enumerate(arr):
        sizes = []
        for frame in clip:
            buf = io.BytesIO()
            Image.fromarray(frame).save(buf, format="JPEG", quality=95)
            sizes.append(buf.tell() / 1000.0)
        out[i] = -float(np.mean(sizes)) / 500.0
    return out


def brightness(images: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
    arr = _check(images, prompts).astype(np.float64) / 255.0
    luma = 0.299 * arr[..., 0] + 0.587 * arr[..., 1] + 0.114 * arr[..., 2]
    return np.asarray(luma.reshape(arr.shape[0], -1).mean(axis=1))


_PALETTE_NAMES = [*COLORS, *BACKGROUNDS]
_PALETTE = np.array([*COLORS.values(), *BACKGROUNDS.values()], np.float64)


def prompt_color(prompt: str) -> str:
    """The first object colour word of ``prompt`` (``shapes.COLORS``); ValueError when it names none."""
    for word in re.findall(r"[a-z]+", prompt.lower()):
        if word in COLORS:
            return word
    raise ValueError(f"color_match: prompt {prompt!r} names no colour of {', '.join(COLORS)}")


def color_match(images: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
    arr = _check(images, prompts).astype(np.float64)
    flat = arr.reshape(arr.shape[0], -1, 3)
    dist = ((flat[:, :, None, :] - _PALETTE[None, None]) ** 2).sum(-1)  # (B, pixels, palette)
    nearest = dist.argmin(-1)
    want = np.array([_PALETTE_NAMES.index(prompt_color(p)) for p in prompts])
    return np.asarray((nearest == want[:, None]).mean(axis=1))


IMAGE_REWARDS: dict[str, RewardFn] = {
    "jpeg_compressibility": jpeg_compressibility,
    "brightness": brightness,
    "color_match": color_match,
}


def get_reward(name: str) -> RewardFn:
    if name not in IMAGE_REWARDS:
        import difflib

        close = difflib.get_close_matches(name, list(IMAGE_REWARDS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown image reward {name!r}.{hint} Known: {', '.join(sorted(IMAGE_REWARDS))}")
    return IMAGE_REWARDS[name]


# --- the HTTP reward service ---------------------------------------------------------------------
class RewardServiceError(RuntimeError):
    """The reward service failed: unreachable, timed out, an HTTP error, or a malformed answer."""


def _png(frame: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _unpng(text: str) -> np.ndarray:
    from PIL import Image

    img = Image.open(io.BytesIO(base64.b64decode(text, validate=True)))
    if img.format != "PNG":
        raise ValueError(f"expected a PNG, got {img.format}")
    return np.asarray(img.convert("RGB"))


def encode_request(images: np.ndarray, prompts: Sequence[str]) -> bytes:
    arr = _check(images, prompts)
    body = {"prompts": list(prompts), "images": [[_png(f) for f in clip] for clip in arr]}
    return json.dumps(body).encode()


def decode_request(body: bytes) -> tuple[np.ndarray, list[str]]:
    """The request's images ``(B, F, H, W, 3)`` and prompts; ValueError naming the field otherwise."""
    data = json.loads(body)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("prompts"), list)
        or not isinstance(data.get("images"), list)
    ):
        raise ValueError("expected a JSON object with lists 'prompts' and 'images'")
    prompts, clips = data["prompts"], data["images"]
    if not all(isinstance(p, str) for p in prompts) or len(prompts) != len(clips):
        raise ValueError(f"'prompts': expected {len(clips)} strings (one per image)")
    if not clips or not all(isinstance(c, list) and c and all(isinstance(f, str) for f in c) for c in clips):
        raise ValueError("'images': expected a non-empty list of non-empty lists of base64 PNG strings")
    frames = [np.stack([_unpng(f) for f in clip]) for clip in clips]
    if len({f.shape for f in frames}) != 1:
        raise ValueError(f"'images': every image must have one shape, got {sorted({f.shape for f in frames})}")
    return np.stack(frames).astype(np.uint8), prompts


class HttpImageReward:
    """A reward computed by a service at ``url`` (POST, the JSON wire above), with a timeout and retries."""

    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 2) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward service url: expected http:// or https://, got {url!r}")
        self.url, self.timeout_s, self.retries = url, float(timeout_s), int(retries)

    def __call__(self, images: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
        body = encode_request(images, prompts)
        last: Exception | None = None
        for _ in range(self.retries + 1):
            req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    raw = resp.read()
                break
            except urllib.error.HTTPError as exc:  # the service answered: retrying will not help
                detail = exc.read()[:300].decode(errors="replace")
                raise RewardServiceError(f"reward service {self.url}: HTTP {exc.code}: {detail}") from exc
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last = exc
        else:
            raise RewardServiceError(
                f"reward service {self.url}: no answer after {self.retries + 1} tries "
                f"(timeout {self.timeout_s:g} s): {last}"
            ) from last
        return self._scores(raw, len(prompts))

    def _scores(self, raw: bytes, n: int) -> np.ndarray:
        try:
            scores = json.loads(raw)["scores"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RewardServiceError(
                f"reward service {self.url}: expected JSON {{'scores': [...]}}, got {raw[:200]!r}"
            ) from exc
        if not isinstance(scores, list) or len(scores) != n:
            raise RewardServiceError(f"reward service {self.url}: expected {n} scores, got {scores!r:.200}")
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in scores):
            raise RewardServiceError(f"reward service {self.url}: scores must be finite numbers, got {scores!r:.200}")
        return np.asarray(scores, np.float64)


def serve_rewards(
    reward: RewardFn, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = 64 << 20
) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve ``reward`` on the JSON wire (a thread); returns the server (``server.server_address``) and
    thread. Bad requests get 400 with the reason; bodies over ``max_body_bytes`` get 413."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and trainers log themselves
            return

        def _reply(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length", "-1"))
            except ValueError:
                length = -1
            if length < 0:
                self._reply(411, {"error": "Content-Length required"})
                return
            if length > max_body_bytes:
                self._reply(413, {"error": f"body of {length} bytes exceeds {max_body_bytes}"})
                return
            try:
                images, prompts = decode_request(self.rfile.read(length))
                scores = reward(images, prompts)
            except (ValueError, OSError) as exc:  # bad JSON / base64 / PNG, or a prompt the reward refuses
                self._reply(400, {"error": str(exc)})
                return
            self._reply(200, {"scores": [float(s) for s in scores]})

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="reward-service", daemon=True)
    thread.start()
    return server, thread
