"""The two ways pi0.5's prefix got cheaper (issue 19): the actions-only prefix that skips the last VLM
layer's dead work, and the opt-in FP8 linear layers (``precision="fp8"``), checked on the CPU through
the same quantised arithmetic the GPU kernel computes (``fp8_reference_mm``)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from cosmos_robot.policies.fp8 import (
    FP8_MAX,
    Fp8Linear,
    check_fp8_device,
    fp8_reference_mm,
    quantize_rows,
)
from cosmos_robot.policies.pi05.checkpoint import save_weights
from cosmos_robot.policies.pi05.policy import Pi05Policy
from tests.policies._pi05_helpers import libero_obs, tiny_pi05


@pytest.fixture(scope="module")
def policy() -> Pi05Policy:
    return tiny_pi05(seed=3)


def _inputs(policy: Pi05Policy):
    return policy.prepare([libero_obs(0), libero_obs(1, prompt="open the drawer")])


def test_actions_only_prefix_skips_the_last_layers_dead_work_and_keeps_the_chunk(policy: Pi05Policy) -> None:
    m, x = policy.model, _inputs(policy)
    with torch.no_grad():
        full = m.encode_prefix(x.images, x.image_masks, x.tokens, x.token_mask)
        lean = m.encode_prefix(x.images, x.image_masks, x.tokens, x.token_mask, hidden=False)
    assert lean.hidden is None and full.hidden is not None
    assert len(lean.keys) == len(full.keys) == m.arch.vlm.depth
    for a, b in zip(full.keys + full.values, lean.keys + lean.values, strict=True):
        assert torch.equal(a, b)
    last = m._vlm.blocks()[-1]
    calls: list[str] = []
    hooks = [
        last.mlp.register_forward_hook(lambda *_: calls.append("mlp")),
        last.self_attn.q_proj.register_forward_hook(lambda *_: calls.append("q_proj")),
        last.self_attn.o_proj.register_forward_hook(lambda *_: calls.append("o_proj")),
    ]
    noise = torch.randn(2, m.arch.chunk_size, m.arch.max_action_dim, generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            chunk = m.generate(x.images, x.image_masks, x.tokens, x.token_mask, noise, 3)
    finally:
        for h in hooks:
            h.remove()
    assert calls == []  # generate never ran the last layer's query, output projection or MLP
    with torch.no_grad():
        assert torch.equal(chunk, m.sample_actions(full, noise, 3))


def test_rowwise_quantisation_bounds_each_rows_error() -> None:
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(64, 128, generator=gen) * torch.logspace(-4, 4, 64)[:, None]
    t[5] = 0.0
    q, scale = quantize_rows(t)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64, 1) and scale.dtype == torch.float32
    assert torch.equal(q.float().abs().amax(-1)[6:], torch.full((58,), FP8_MAX))  # each row's max maps to 448
    back = q.float() * scale
    assert torch.equal(back[5], torch.zeros(128))  # an all-zero row stays zero (no division by 0)
    row_max = t.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    # e4m3 keeps 3 mantissa bits: at most 2^-4 relative for normals; the subnormal floor near 0 is
    # 2^-9 x scale (2^-9 x amax / 448)
    bound = torch.maximum(t.abs() * 2**-4, row_max * 2**-9 / FP8_MAX)
    assert ((back - t).abs() <= bound * 1.0001).all()


def test_fp8_linear_is_the_quantised_product_and_close_to_the_layer() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    x = torch.randn(3, 5, 64)
    fp8 = Fp8Linear.from_linear(lin)
    with torch.no_grad():
        out, exact = fp8(x), lin(x)
    x_q, x_s = quantize_rows(x.reshape(-1, 64))
    expected = fp8_reference_mm(x_q, x_s, fp8.weight_q, fp8.weight_scale) + lin.bias
    assert out.shape == (3, 5, 32) and torch.equal(out.reshape(-1, 32), expected)
    rel = float((out - exact).norm() / exact.norm())
    assert 0 < rel < 0.05  # rounded, but a few percent at most
    with pytest.raises(ValueError, match="divisible by 16"):
        Fp8Linear.from_linear(nn.Linear(64, 24))


def test_fp8_prefix_converts_the_vlm_and_vision_linears_and_keeps_the_chunk_close(
    policy: Pi05Policy, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="FP8 serving converts a bfloat16 model"):
        copy.deepcopy(policy.model).to_fp8(check_device=False)  # the tiny policy is float32
    bf16 = copy.deepcopy(policy.model).to(torch.bfloat16)
    model = copy.deepcopy(bf16)
    names = model.to_fp8(check_device=False)  # the CPU computes the same quantised product in float32
    assert "language_model.layers.0.mlp.gate_proj" in " ".join(names)
    assert any("vision_tower" in n for n in names) and any("multi_modal_projector" in n for n in names)
    assert not any(isinstance(mod, Fp8Linear) for mod in model._expert.modules())  # the expert keeps its dtype
    for name in names:
        assert isinstance(model.paligemma_with_expert.paligemma.get_submodule(name), Fp8Linear)
    x = _inputs(policy)
    noise = torch.randn(2, model.arch.chunk_size, model.arch.max_action_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = policy.model.generate(x.images, x.image_masks, x.tokens, x.token_mask, noise, 4)
        cams = [im.to(torch.bfloat16) for im in x.images]
        half = bf16.generate(cams, x.image_masks, x.tokens, x.token_mask, noise, 4)
        got = model.generate(cams, x.image_masks, x.tokens, x.token_mask, noise, 4)
    err = float((got - ref).abs().mean() / ref.abs().mean())
    assert 0 < err < 0.1, err
    assert not torch.equal(got, half)  # the conversion changed the arithmetic
    with pytest.raises(ValueError, match="cannot save a pi05 model served in FP8"):
        save_weights(model, tmp_path / "model.safetensors")


def test_fp8_precision_needs_a_hopper_gpu_and_says_so(tmp_path: Path, policy: Pi05Policy) -> None:
    with pytest.raises(ValueError, match="compute capability >= 9.0"):
        check_fp8_device("cpu")
    folder = policy.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="precision 'fp8' needs a CUDA GPU"):
        Pi05Policy.from_pretrained(folder, dtype="bfloat16", precision="fp8")
    with pytest.raises(ValueError, match="precision 'fp8' serves a bfloat16 model"):
        Pi05Policy.from_pretrained(folder, dtype="float32", precision="fp8")
    with pytest.raises(ValueError, match="precision must be one of"):
        Pi05Policy.from_pretrained(folder, dtype="bfloat16", precision="fp16")


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9, reason="needs a Hopper GPU"
)
def test_the_fp8_kernel_computes_the_quantised_product_eager_compiled_and_graphed() -> None:
    """On the GPU ``Fp8Linear`` runs ``torch._scaled_mm``: it must equal the float32 product of the same
    quantised values (``fp8_reference_mm``) to bf16 rounding, eagerly, compiled and replayed as a graph."""
    torch.manual_seed(0)
    lin = nn.Linear(256, 512).to("cuda", torch.bfloat16)
    fp8 = Fp8Linear.from_linear(lin)
    x = torch.randn(2, 37, 256, device="cuda", dtype=torch.bfloat16)
    x_q, x_s = quantize_rows(x.reshape(-1, 256))
    want = (fp8_reference_mm(x_q, x_s, fp8.weight_q, fp8.weight_scale) + lin.bias.float()).reshape(2, 37, 512)
    compiled = torch.compile(fp8, dynamic=False)
    with torch.no_grad():
        eager, comp = fp8(x), compiled(x)
        static_x = x.clone()
        compiled(static_x)  # warm up before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = compiled(static_x)
        graph.replay()
    scale = want.abs().max()
    for got in (eager, comp, static_out):
        assert got.dtype == torch.bfloat16 and float((got.float() - want).abs().max() / scale) < 1e-2
