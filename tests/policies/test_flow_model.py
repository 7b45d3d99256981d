"""FlowConfig validation, instruction hashing, and the FlowModel's loss, heads and shapes."""

from __future__ import annotations

import zlib

import pytest
import torch
from pydantic import ValidationError

from cosmos_robot.policies.flow import FlowConfig, FlowModel, encode_prompts
from cosmos_robot.policies.flow.text import prompt_buckets
from tests.policies._flow_helpers import make_batch, scrambled_model, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/policies/conftest.py


def test_default_config_size_fits_a_committed_checkpoint() -> None:
    model = FlowModel(FlowConfig())
    n = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n <= 2_500_000, n  # float32: <= 10 MB on disk
    assert n * 4 < 10 * 1024 * 1024


def test_config_is_deterministic_and_seeded() -> None:
    cfg = tiny_config()
    a, b = FlowModel(cfg).state_dict(), FlowModel(cfg).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = FlowModel(tiny_config(seed=1)).state_dict()
    assert not torch.equal(a["action_in.weight"], c["action_in.weight"])
    before = torch.random.get_rng_state()
    FlowModel(cfg)
    assert torch.equal(before, torch.random.get_rng_state())  # building a model leaves the global RNG alone


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"image_size": 30, "encoder_patch": 4}, "encoder_patch"),
        ({"noise_std_min": 0.2, "noise_std_max": 0.1}, "noise_std_min"),
        ({"cameras": ("image", "image")}, "cameras"),
        ({"state_keys": ()}, "state_keys"),
        ({"state_shapes": {"route": (20, 3)}}, "state_shapes"),  # not one of the state_keys
        ({"state_keys": ("route",), "state_shapes": {"route": (0, 3)}}, "state_shapes"),
        ({"state_keys": ("state", "image")}, "state_keys"),
        ({"time_embed_dim": 7}, "time_embed_dim"),
        ({"chunk_sise": 3}, "chunk_sise"),
    ],
)
def test_config_errors_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        FlowConfig(**overrides)  # type: ignore[arg-type]


def test_wire_keys_follow_cameras() -> None:
    assert tiny_config(cameras=("image",)).wire_keys == {"observation/image": "image", "observation/state": "state"}
    state_only = tiny_config(cameras=(), state_keys=("state", "object_state"), state_dim=23)
    assert state_only.wire_keys == {"observation/state": "state", "observation/object_state": "object_state"}


def test_prompt_hashing_is_stable_and_offline() -> None:
    buckets = 64
    assert prompt_buckets("Open   the DRAWER!", buckets) == prompt_buckets("open the drawer", buckets)
    assert prompt_buckets("open", buckets) == (1 + zlib.crc32(b"open") % (buckets - 1),)
    assert prompt_buckets("", buckets) == (0,)
    ids, offsets = encode_prompts(["open the drawer", "", "reach"], buckets)
    assert offsets.tolist() == [0, 5, 6]  # 3 words + 2 bigrams, the empty bucket, 1 word
    assert ids.dtype == torch.long and int(ids.max()) < buckets
    with pytest.raises(TypeError, match=r"prompt\[1\]"):
        encode_prompts(["ok", 3], buckets)  # type: ignore[list-item]


def test_encode_shapes_and_errors() -> None:
    cfg = tiny_config()
    model = FlowModel(cfg)
    batch = make_batch(cfg, batch=5)
    assert model.encode(batch).shape == (5, cfg.trunk_width)
    ids, offsets = encode_prompts(batch["prompt"], cfg.text_buckets)
    by_ids = {k: v for k, v in batch.items() if k != "prompt"} | {"text_ids": ids, "text_offsets": offsets}
    assert torch.equal(model.encode(by_ids), model.encode(batch))
    float_images = dict(batch, images=batch["images"].float() / 255.0)  # float in [0, 1] is accepted too
    assert torch.allclose(model.encode(float_images), model.encode(batch), atol=1e-6)
    with pytest.raises(ValueError, match=r"images: expected shape \(B, 2, 3, 16, 16\)"):
        model.encode(dict(batch, images=batch["images"][:, :1]))
    with pytest.raises(ValueError, match="state: expected shape"):
        model.encode(dict(batch, state=batch["state"][:, :3]))
    with pytest.raises(KeyError, match="instruction"):
        model.encode({k: v for k, v in batch.items() if k != "prompt"})


def test_one_camera_model() -> None:
    cfg = tiny_config(cameras=("image",))
    batch = make_batch(cfg, batch=3)
    loss, _ = FlowModel(cfg).flow_loss(batch)
    assert batch["images"].shape[1] == 1 and torch.isfinite(loss)


def test_flow_loss_overfits_a_tiny_problem() -> None:
    torch.manual_seed(0)
    cfg = tiny_config()
    model = FlowModel(cfg)
    batch = make_batch(cfg, batch=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(100):  # ~0.5 s
        loss, metrics = model.flow_loss(batch, generator=gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(metrics["flow_loss"])
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.6 * first, (first, last)  # measured 2.34 -> 0.98


def test_flow_loss_convention_and_padding() -> None:
    cfg = tiny_config()
    model = scrambled_model(cfg)
    batch = make_batch(cfg, batch=4)
    noise = torch.randn(4, cfg.chunk_size, cfg.action_dim)
    time = torch.tensor([0.2, 0.5, 0.9, 1.0])
    loss, metrics = model.flow_loss(batch, noise=noise, time=time)
    # pi0 convention: x_t = (1 - t) a + t eps, target eps - a
    a, t = batch["actions"], time[:, None, None]
    v = model.velocity((1 - t) * a + t * noise, time, model.encode(batch))
    assert torch.allclose(loss, (v - (noise - a)).pow(2).mean(), atol=1e-6)
    assert metrics["real_steps"] == 4 * cfg.chunk_size
    pad = torch.zeros(4, cfg.chunk_size, dtype=torch.bool)
    pad[:, -1] = True
    pad[0, -2] = True
    loss_pad, metrics = model.flow_loss(dict(batch, action_pad_mask=pad), noise=noise, time=time)
    keep = ~pad[:, :, None]
    err = (v - (noise - a)).pow(2)
    assert torch.allclose(loss_pad, (err * keep).sum() / (keep.sum() * cfg.action_dim), atol=1e-6)
    assert metrics["real_steps"] == 4 * cfg.chunk_size - 5


def test_time_sampling_range() -> None:
    for mode in ("beta", "uniform"):
        t = FlowModel(tiny_config(time_sampling=mode)).sample_time(4000, torch.Generator().manual_seed(0))
        assert float(t.min()) >= 0.001 and float(t.max()) <= 1.0
        mean = float(t.mean())
        assert abs(mean - (0.6 if mode == "beta" else 0.5)) < 0.02  # Beta(1.5, 1) has mean 0.6


def test_value_head_shape_and_detach() -> None:
    cfg = tiny_config()
    model = FlowModel(cfg)
    context = model.encode(make_batch(cfg, batch=3))
    assert model.value(context).shape == (3,)
    assert torch.equal(model.value(context), torch.zeros(3))  # zero-initialised last layer
    model = scrambled_model(cfg)
    model.value(model.encode(make_batch(cfg, batch=3)), detach=True).sum().backward()
    assert model.trunk[0].weight.grad is None  # the critic did not train the trunk
    assert model.value_head[0].weight.grad is not None


def test_noise_std_stays_in_bounds() -> None:
    cfg = tiny_config()
    model = scrambled_model(cfg)
    feats = 100.0 * torch.randn(64, cfg.expert_width)
    with torch.no_grad():
        std = model.noise_std(feats)
    assert std.shape == (64, cfg.chunk_size, cfg.action_dim)
    assert float(std.min()) >= cfg.noise_std_min - 1e-7 and float(std.max()) <= cfg.noise_std_max + 1e-7
    assert float(std.min()) < 0.09 and float(std.max()) > 0.15  # the bounds are reachable
    mid = FlowModel(cfg).noise_std(torch.randn(2, cfg.expert_width))  # zero-init: the geometric midpoint
    assert torch.allclose(mid, torch.full_like(mid, (cfg.noise_std_min * cfg.noise_std_max) ** 0.5))
