"""The Cosmos3 generator core: our training forward and sampler equal diffusers' pipeline bit for bit (image,
video, guidance), the VAE codec is the pipeline's, shapes and rewards behave, and the HTTP reward service
round-trips on loopback with clear errors."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cosmos_robot.generation.cosmos3 import Cosmos3Generator, GenShape
from cosmos_robot.generation.rewards import (
    HttpImageReward,
    RewardServiceError,
    brightness,
    color_match,
    get_reward,
    jpeg_compressibility,
    serve_rewards,
)
from cosmos_robot.generation.shapes import Scene, caption, draw, is_heldout, random_scenes, scene_batch


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cosmos_robot.generation.tiny import build_tiny_generator

    return build_tiny_generator(tmp_path_factory.mktemp("gen") / "base", vae_steps=0)


@pytest.mark.parametrize(("frames", "guidance"), [(1, 1.0), (5, 1.0), (1, 3.0)])
def test_training_velocity_and_sampler_equal_the_pipeline_bitwise(base: Path, frames: int, guidance: float) -> None:
    gen = Cosmos3Generator.from_pretrained(base)
    pipe = gen.pipe
    seen: list[dict[str, Any]] = []

    def hook(_: Any, __: Any, kwargs: dict[str, Any], out: Any) -> None:
        seen.append({"x": kwargs["vision_tokens"][0].clone(), "t": kwargs["vision_timesteps"][0], "v": out[0][0]})

    handle = pipe.transformer.register_forward_hook(hook, with_kwargs=True)
    prompt, shape = "a small red circle at the top left on a gray background", GenShape(frames, 64, 64)
    stock = pipe(prompt, num_frames=frames, height=64, width=64, num_inference_steps=3, guidance_scale=guidance,
                 output_type="latent", generator=torch.Generator().manual_seed(5)).video  # fmt: skip
    handle.remove()
    cond, _ = gen.prompt_ids(prompt, shape)
    first = seen[0]  # the conditional call of step 0 (the unconditional one follows it with guidance)
    ours = gen.velocity(first["x"][0], first["t"], cond, shape)
    assert torch.equal(ours, first["v"][0])
    float_t = gen.velocity(first["x"][0], float(first["t"]), cond, shape)  # a training timestep is a float
    assert torch.equal(float_t, ours)
    assert torch.equal(gen.sample(prompt, shape, seed=5, num_steps=3, guidance=guidance), stock[0])
    assert stock.shape == (1, *gen.latent_shape(shape))


def test_training_velocity_is_differentiable_and_batched(base: Path) -> None:
    gen = Cosmos3Generator.from_pretrained(base)
    shape = GenShape(1, 64, 64)
    ids = [gen.prompt_ids(p, shape)[0] for p in ("a red circle", "a blue square")]
    x = torch.randn(2, *gen.latent_shape(shape))
    v = gen.velocities(x, torch.tensor([0.3, 0.8]), ids, shape)
    assert v.shape == x.shape
    v.square().mean().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in gen.transformer.parameters())
    one = gen.velocity(x[1], 800.0, ids[1], shape)
    assert torch.equal(one.float(), v[1])
    with pytest.raises(ValueError, match="batch mismatch"):
        gen.velocities(x, torch.tensor([0.3]), ids, shape)


def test_vae_codec_is_the_pipelines(base: Path) -> None:
    gen = Cosmos3Generator.from_pretrained(base)
    pixels, _ = scene_batch(np.random.default_rng(0), 2, 64, 5)
    lat = gen.encode(torch.from_numpy(pixels))
    assert lat.shape == (2, *gen.latent_shape(GenShape(5, 64, 64)))
    stock = gen.pipe._encode_video(torch.from_numpy(pixels))
    assert torch.equal(lat, stock.float())
    decoded = gen.decode(lat[:1])
    assert decoded.shape == (1, 3, 5, 64, 64) and decoded.abs().max() <= 1.0
    with pytest.raises(ValueError, match=r"pixels: expected \(B, 3, frames, H, W\)"):
        gen.encode(torch.zeros(1, 64, 64, 3))


def test_shape_and_folder_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_frames: expected 1 .* or 4k \\+ 1"):
        GenShape(num_frames=4)
    with pytest.raises(ValueError, match="height: expected a multiple of 16"):
        GenShape(height=40)
    with pytest.raises(ValueError, match="no model_index.json"):
        Cosmos3Generator.from_pretrained(tmp_path)


def test_shapes_draw_what_their_captions_say() -> None:
    scene = Scene("circle", "red", "black", x=0.2, y=0.2, size=0.3)
    img = draw(scene, 64)[0]
    assert caption(scene) == "a large red circle at the top left on a black background"
    assert tuple(img[12, 12]) == (220, 40, 40) and tuple(img[60, 60]) == (15, 15, 15)
    clip = draw(Scene("square", "blue", "white", 0.5, 0.5, 0.2, vx=0.04), 32, frames=5)
    assert clip.shape == (5, 32, 32, 3) and not np.array_equal(clip[0], clip[4])  # it moves
    held = [caption(s) for s in random_scenes(np.random.default_rng(1), 50, heldout=True)]
    train = [caption(s) for s in random_scenes(np.random.default_rng(1), 50, heldout=False)]
    assert all(is_heldout(c) for c in held) and not any(is_heldout(c) for c in train)


def test_local_rewards_rank_images_as_documented() -> None:
    red_on_black = draw(Scene("circle", "red", "black", 0.5, 0.5, 0.3), 64)[None]
    red_on_white = draw(Scene("circle", "red", "white", 0.5, 0.5, 0.3), 64)[None]
    noise = np.random.default_rng(0).integers(0, 256, (1, 1, 64, 64, 3), dtype=np.uint8)
    both = np.concatenate([red_on_black, red_on_white])
    prompts = ["a red circle", "a red circle"]
    b = brightness(both, prompts)
    assert b[1] > b[0] and 0 <= b.min() and b.max() <= 1
    area = np.pi * 0.3**2  # the circle's share of the frame
    assert color_match(both, prompts)[0] == pytest.approx(area, abs=0.02)
    assert color_match(both, ["a blue circle", "a blue circle"]).max() == 0.0
    assert jpeg_compressibility(red_on_black, ["x"])[0] > jpeg_compressibility(noise, ["x"])[0]
    with pytest.raises(ValueError, match="names no colour"):
        color_match(red_on_black, ["a circle"])
    with pytest.raises(ValueError, match=r"images: expected \(B, frames, H, W, 3\) uint8"):
        brightness(red_on_black[0], ["x"])
    with pytest.raises(ValueError, match="Did you mean 'brightness'"):
        get_reward("brightnes")


def test_http_reward_service_round_trips_and_fails_clearly() -> None:
    images = np.stack([draw(Scene("circle", c, "gray", 0.5, 0.5, 0.25), 32, 5) for c in ("red", "blue")])
    prompts = ["a red circle", "a red circle"]
    server, _ = serve_rewards(color_match)
    url = f"http://127.0.0.1:{server.server_address[1]}/score"
    try:
        got = HttpImageReward(url, timeout_s=10)(images, prompts)
        assert np.array_equal(got, color_match(images, prompts))  # PNG is lossless
        with pytest.raises(RewardServiceError, match="HTTP 400: .*names no colour"):
            HttpImageReward(url)(images, ["a circle", "a circle"])
        req = urllib.request.Request(url, data=b"{not json", headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(req, timeout=10)
        assert bad.value.code == 400
    finally:
        server.shutdown()
    with pytest.raises(RewardServiceError, match="no answer after 2 tries"):
        HttpImageReward(url, timeout_s=0.5, retries=1)(images, prompts)  # nothing listens any more
    with pytest.raises(ValueError, match="expected http:// or https://"):
        HttpImageReward("ftp://x")


class _Answer(BaseHTTPRequestHandler):
    reply: bytes = b""
    delay_s: float = 0.0

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.delay_s)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.reply)))
        self.end_headers()
        self.wfile.write(self.reply)


@pytest.mark.parametrize(
    ("reply", "delay", "match"),
    [
        (json.dumps({"scores": [1.0]}).encode(), 0.0, "expected 2 scores"),
        (json.dumps({"scores": [1.0, float("nan")]}).encode(), 0.0, "finite numbers"),
        (b"<html>", 0.0, "expected JSON"),
        (json.dumps({"scores": [1.0, 2.0]}).encode(), 2.0, "timeout 0.3 s"),
    ],
)
def test_a_misbehaving_reward_service_is_a_clear_error(reply: bytes, delay: float, match: str) -> None:
    handler = type("H", (_Answer,), {"reply": reply, "delay_s": delay})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        images = np.zeros((2, 1, 16, 16, 3), np.uint8)
        with pytest.raises(RewardServiceError, match=match):
            HttpImageReward(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=0.3, retries=0)(
                images, ["a", "b"]
            )
    finally:
        server.shutdown()
