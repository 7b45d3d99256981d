"""A native PyTorch pi0.5 (PaliGemma + Gemma action expert) that loads LeRobot's ``pi05`` weights as they are.

Why native rather than LeRobot's ``PI05Policy``: LeRobot 0.6.1 only builds the two real sizes
(``gemma_2b`` + ``gemma_300m``, 4.1 B parameters, 17.6 GB RSS on a CPU), hard-codes the vision
projector width, and runs eager attention with a ``DynamicCache`` copied at every flow step. This
module is the same published architecture, written so that

- every parameter has LeRobot's name (``PI05Pytorch`` state-dict keys), so a LeRobot
  ``model.safetensors`` loads strictly, key for key (the unused ``lm_head`` tensors are skipped);
- any size can be built from an explicit ``Pi05Architecture`` (tiny test models);
- inference computes the prefix (2-3 cameras + prompt) once and keeps its per-layer keys and values
  (``PrefixCache``); each of the K flow steps runs only the action expert over the chunk against
  that cache, with fused ``scaled_dot_product_attention``;
- the denoising step is a hook (``velocity``), so RL samplers (Flow-SDE) reuse it unchanged.

Conventions (openpi / LeRobot): flow time runs from 1 (noise) to 0 (actions),
``x_t = t * noise + (1 - t) * actions``, the model predicts ``v = noise - actions`` and the sampler is
forward Euler with ``dt = -1/K``. Prefix tokens attend bidirectionally to the valid prefix; action
tokens attend to the valid prefix and to the whole chunk; the time enters the expert through
adaptive RMSNorm (scale, shift, gate) rather than as a token. ``benchmarks/parity_pi05.py`` checks the
outputs against LeRobot's implementation on the same weights.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosmos_robot.policies.cuda_graphs import GraphCache, bucket_size, pad_rows
from cosmos_robot.policies.fp8 import Fp8Linear, check_fp8_device, convert_linears, fp8_shaped

__all__ = [
    "VARIANTS",
    "GemmaSpec",
    "Pi05Architecture",
    "Pi05Model",
    "PrefixCache",
    "VisionSpec",
    "GraphedGenerate",
    "bucket_size",
    "trim_text",
    "make_attention_mask",
]

# openpi's additive mask value (LeRobot's OPENPI_ATTENTION_MASK_VALUE): large and finite, so fully
# padded rows stay finite instead of turning into NaN.
MASK_VALUE = -2.3819763e38


@dataclass(frozen=True)
class GemmaSpec:
    """One Gemma stack: width, depth, MLP width and attention layout (openpi ``gemma.Config``)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-6
    rope_theta: float = 10_000.0


@dataclass(frozen=True)
class VisionSpec:
    """The SigLIP image encoder (so400m/14 at 224 px in the released checkpoints)."""

    width: int = 1152
    depth: int = 27
    mlp_dim: int = 4304
    num_heads: int = 16
    patch_size: int = 14
    image_size: int = 224
    eps: float = 1e-6

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


# openpi / LeRobot variant names (num_heads is fixed at 8 by the published code).
VARIANTS: dict[str, GemmaSpec] = {
    "gemma_300m": GemmaSpec(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_2b": GemmaSpec(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256),
}


@dataclass(frozen=True)
class Pi05Architecture:
    """Every size of a pi0.5 model; the released ones are ``gemma_2b`` + ``gemma_300m`` + SigLIP so400m."""

    vlm: GemmaSpec = VARIANTS["gemma_2b"]
    expert: GemmaSpec = VARIANTS["gemma_300m"]
    vision: VisionSpec = field(default_factory=VisionSpec)
    vocab_size: int = 257_152
    max_action_dim: int = 32
    chunk_size: int = 50
    min_period: float = 4e-3
    max_period: float = 4.0

    def __post_init__(self) -> None:
        if self.vlm.depth != self.expert.depth:
            raise ValueError(f"the VLM ({self.vlm.depth}) and the action expert ({self.expert.depth}) need equal depth")
        if (self.vlm.num_heads, self.vlm.head_dim) != (self.expert.num_heads, self.expert.head_dim):
            raise ValueError("the VLM and the action expert share attention: num_heads and head_dim must match")
        if self.vlm.num_kv_heads != self.expert.num_kv_heads:
            raise ValueError("the VLM and the action expert share attention: num_kv_heads must match")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pi05Architecture:
        known = {"vlm", "expert", "vision", "vocab_size", "max_action_dim", "chunk_size", "min_period", "max_period"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown architecture fields {unknown} (known: {sorted(known)})")
        kw: dict[str, Any] = {k: v for k, v in data.items() if k not in ("vlm", "expert", "vision")}
        for name, spec_cls in (("vlm", GemmaSpec), ("expert", GemmaSpec), ("vision", VisionSpec)):
            if name in data:
                try:
                    kw[name] = spec_cls(**data[name])
                except TypeError as exc:
                    raise ValueError(f"architecture.{name}: {exc}") from exc
        return cls(**kw)


# --------------------------------------------------------------------------------------------------
# SigLIP vision tower (names as transformers' SiglipVisionModel inside PaliGemma)
# --------------------------------------------------------------------------------------------------
class _SiglipAttention(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.num_heads = spec.num_heads
        self.q_proj = nn.Linear(spec.width, spec.width)
        self.k_proj = nn.Linear(spec.width, spec.width)
        self.v_proj = nn.Linear(spec.width, spec.width)
        self.out_proj = nn.Linear(spec.width, spec.width)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        shape = (b, n, self.num_heads, d // self.num_heads)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class _SiglipMLP(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.fc1 = nn.Linear(spec.width, spec.mlp_dim)
        self.fc2 = nn.Linear(spec.mlp_dim, spec.width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class _SiglipLayer(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(spec.width, eps=spec.eps)
        self.self_attn = _SiglipAttention(spec)
        self.layer_norm2 = nn.LayerNorm(spec.width, eps=spec.eps)
        self.mlp = _SiglipMLP(spec)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class _SiglipEmbeddings(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, spec.width, kernel_size=spec.patch_size, stride=spec.patch_size)
        self.position_embedding = nn.Embedding(spec.num_patches, spec.width)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        return x + self.position_embedding.weight[None]


class _SiglipEncoder(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_SiglipLayer(spec) for _ in range(spec.depth))


class _SiglipVisionModel(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.embeddings = _SiglipEmbeddings(spec)
        self.encoder = _SiglipEncoder(spec)
        self.post_layernorm = nn.LayerNorm(spec.width, eps=spec.eps)

    def forward(self, pixels: Tensor) -> Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)


class _VisionTower(nn.Module):
    def __init__(self, spec: VisionSpec) -> None:
        super().__init__()
        self.vision_model = _SiglipVisionModel(spec)


class _Projector(nn.Module):
    def __init__(self, vision: VisionSpec, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(vision.width, width)


# --------------------------------------------------------------------------------------------------
# Gemma stacks (names as LeRobot's PiGemma modules)
# --------------------------------------------------------------------------------------------------
class _RMSNorm(nn.Module):
    """Gemma RMSNorm, ``x / rms(x) * (1 + w)``, or adaptive (``dense(cond)`` -> scale, shift, gate)."""

    def __init__(self, width: int, eps: float, cond_dim: int | None = None) -> None:
        super().__init__()
        self.eps = eps
        if cond_dim is None:
            self.weight = nn.Parameter(torch.zeros(width))
            self.dense: nn.Linear | None = None
        else:
            self.dense = nn.Linear(cond_dim, 3 * width)
            nn.init.zeros_(self.dense.weight)

    def modulation(self, cond: Tensor) -> Tensor:
        """``dense(cond)``: the (B, 3 * width) scale, shift and gate for the time condition ``cond``."""
        assert self.dense is not None
        return self.dense(cond.to(self.dense.weight.dtype))

    def forward(self, x: Tensor, cond: Tensor | None = None, mod: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``mod``: :meth:`modulation` computed beforehand (for all flow steps at once) instead of ``cond``."""
        var = x.float().square().mean(-1, keepdim=True)
        normed = x * torch.rsqrt(var + self.eps)
        if self.dense is None:
            return (normed * (1.0 + self.weight.float())).type_as(x), None
        if mod is None:
            if cond is None:
                raise ValueError("adaptive RMSNorm needs the time condition")
            mod = self.modulation(cond)
        if x.dim() == 3:
            mod = mod.unsqueeze(1)
        scale, shift, gate = mod.chunk(3, dim=-1)
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


class _GemmaAttention(nn.Module):
    def __init__(self, spec: GemmaSpec) -> None:
        super().__init__()
        self.q_proj = nn.Linear(spec.width, spec.num_heads * spec.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.width, spec.num_kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.width, spec.num_kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, spec.width, bias=False)


class _GemmaMLP(nn.Module):
    def __init__(self, spec: GemmaSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.width, spec.mlp_dim, bias=False)
        self.up_proj = nn.Linear(spec.width, spec.mlp_dim, bias=False)
        self.down_proj = nn.Linear(spec.mlp_dim, spec.width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class _GemmaLayer(nn.Module):
    def __init__(self, spec: GemmaSpec, adaptive: bool) -> None:
        super().__init__()
        cond = spec.width if adaptive else None
        self.input_layernorm = _RMSNorm(spec.width, spec.rms_eps, cond)
        self.self_attn = _GemmaAttention(spec)
        self.post_attention_layernorm = _RMSNorm(spec.width, spec.rms_eps, cond)
        self.mlp = _GemmaMLP(spec)


class _GemmaModel(nn.Module):
    def __init__(self, spec: GemmaSpec, adaptive: bool, vocab_size: int | None) -> None:
        super().__init__()
        if vocab_size is not None:
            self.embed_tokens = nn.Embedding(vocab_size, spec.width)
        self.layers = nn.ModuleList(_GemmaLayer(spec, adaptive) for _ in range(spec.depth))
        self.norm = _RMSNorm(spec.width, spec.rms_eps, spec.width if adaptive else None)

    def blocks(self) -> list[_GemmaLayer]:
        return [cast(_GemmaLayer, layer) for layer in self.layers]

    @property
    def compute_dtype(self) -> torch.dtype:
        return linear_dtype(self.blocks()[0].self_attn.q_proj)


class _PaliGemmaInner(nn.Module):
    def __init__(self, arch: Pi05Architecture) -> None:
        super().__init__()
        self.vision_tower = _VisionTower(arch.vision)
        self.multi_modal_projector = _Projector(arch.vision, arch.vlm.width)
        self.language_model = _GemmaModel(arch.vlm, adaptive=False, vocab_size=arch.vocab_size)


class _PaliGemma(nn.Module):
    def __init__(self, arch: Pi05Architecture) -> None:
        super().__init__()
        self.model = _PaliGemmaInner(arch)


class _Expert(nn.Module):
    def __init__(self, arch: Pi05Architecture) -> None:
        super().__init__()
        self.model = _GemmaModel(arch.expert, adaptive=True, vocab_size=None)


class _PaliGemmaWithExpert(nn.Module):
    def __init__(self, arch: Pi05Architecture) -> None:
        super().__init__()
        self.paligemma = _PaliGemma(arch)
        self.gemma_expert = _Expert(arch)


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def rope_tables(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """RoPE cos/sin (B, 1, L, head_dim) for integer ``positions`` (B, L), computed in float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def _bf16_fp8_shaped(name: str, layer: nn.Linear) -> bool:
    """FP8 conversion's selection: a bfloat16 layer whose sizes allow an FP8 GEMM (``fp8_shaped``)."""
    if layer.weight.dtype != torch.bfloat16:
        raise ValueError(f"FP8 serving converts a bfloat16 model; layer {name!r} is {layer.weight.dtype}")
    return fp8_shaped(name, layer)


def linear_dtype(layer: nn.Module) -> torch.dtype:
    """The dtype a linear layer computes in: its weight's, or an FP8 layer's output dtype."""
    return layer.out_dtype if isinstance(layer, Fp8Linear) else cast(nn.Linear, layer).weight.dtype


def _apply_rope(x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
    cos, sin = rope
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def make_attention_mask(pad_masks: Tensor, ar_masks: Tensor) -> Tensor:
    """big_vision's prefix-LM rule: token i sees token j when j is valid, i is valid and
    ``cumsum(ar)[j] <= cumsum(ar)[i]``. Returns bool (B, L, L)."""
    cumsum = torch.cumsum(ar_masks.long(), dim=1)
    att = cumsum[:, None, :] <= cumsum[:, :, None]
    return att & (pad_masks[:, None, :] & pad_masks[:, :, None])


def _additive(mask: Tensor, dtype: torch.dtype, group: int = 1) -> Tensor:
    """(B, Lq, Lk) bool -> additive (B, 1, group * Lq, Lk): the query rows repeated for grouped heads."""
    add = torch.where(mask[:, None], 0.0, MASK_VALUE).to(dtype)
    if group > 1:
        b, _, lq, lk = add.shape
        add = add[:, :, None].expand(b, 1, group, lq, lk).reshape(b, 1, group * lq, lk)
    return add


def sinusoidal_time_embedding(t: Tensor, dim: int, min_period: float, max_period: float) -> Tensor:
    """openpi's sine-cosine embedding of the flow time, in float64 where the device allows."""
    dtype = torch.float64 if t.device.type not in ("mps",) else torch.float32
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    arg = (1.0 / period * 2 * math.pi)[None, :] * t[:, None]
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=1)


@dataclass
class PrefixCache:
    """Per-layer keys/values of the prefix (after RoPE), its validity mask and its pooled output."""

    keys: list[Tensor]
    values: list[Tensor]
    pad_mask: Tensor  # (B, Lp) bool
    hidden: Tensor | None  # (B, Lp, W) final-norm output of the VLM (the value head pools it); None when
    # encoded for actions only (``encode_prefix(hidden=False)``)
    suffix_mask: Tensor  # (B, 1, group * chunk, Lp + chunk) additive: what the action tokens see
    suffix_rope: tuple[Tensor, Tensor]  # RoPE tables of the action tokens (the same at every flow step)

    def expand(self, repeats: int) -> PrefixCache:
        """Each batch row repeated ``repeats`` times (several samples per observation)."""
        if repeats == 1:
            return self

        def rep(t: Tensor) -> Tensor:
            return t.repeat_interleave(repeats, dim=0)

        return PrefixCache(
            [rep(k) for k in self.keys],
            [rep(v) for v in self.values],
            rep(self.pad_mask),
            None if self.hidden is None else rep(self.hidden),
            rep(self.suffix_mask),
            (rep(self.suffix_rope[0]), rep(self.suffix_rope[1])),
        )


class Pi05Model(nn.Module):
    """pi0.5: SigLIP + Gemma VLM over the prefix, a Gemma action expert over the noisy chunk.

    Parameter names equal LeRobot's ``PI05Pytorch`` (``paligemma_with_expert.*``, ``action_in_proj``,
    ``action_out_proj``, ``time_mlp_in``, ``time_mlp_out``).
    """

    def __init__(self, arch: Pi05Architecture) -> None:
        super().__init__()
        self.arch = arch
        self.attention = "sdpa"  # see set_attention
        self.paligemma_with_expert = _PaliGemmaWithExpert(arch)
        w = arch.expert.width
        self.action_in_proj = nn.Linear(arch.max_action_dim, w)
        self.action_out_proj = nn.Linear(w, arch.max_action_dim)
        self.time_mlp_in = nn.Linear(w, w)
        self.time_mlp_out = nn.Linear(w, w)
        # Gemma scales token embeddings by sqrt(width), rounded to the table's dtype (as transformers does)
        self._embed_scale = {
            d: float(torch.tensor(arch.vlm.width**0.5, dtype=d, device="cpu"))
            for d in (torch.float32, torch.bfloat16, torch.float16)
        }

    # --- modules by role ---------------------------------------------------------------------------
    @property
    def _vlm(self) -> _GemmaModel:
        return self.paligemma_with_expert.paligemma.model.language_model

    @property
    def _expert(self) -> _GemmaModel:
        return self.paligemma_with_expert.gemma_expert.model

    def fsdp_units(self) -> list[nn.Module]:
        """What FSDP shards (SFT and RL): the vision layers, and in both Gemma stacks each projection and
        MLP. The joint attention calls a Gemma layer's parts, never the layer's ``forward``, so the layer
        cannot be a unit; the norms (read outside their ``forward`` by the expert's modulation) and the
        token table (read as a tensor by ``embed_prefix``) stay in the root unit."""
        vision = self.paligemma_with_expert.paligemma.model.vision_tower.vision_model
        units: list[nn.Module] = list(vision.encoder.layers)
        for stack in (self._vlm, self._expert):
            for layer in stack.blocks():
                attn = layer.self_attn
                units += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, layer.mlp]
        return units

    def to_fp8(self, check_device: bool = True) -> list[str]:
        """Serve the prefix in FP8 (``precision="fp8"``, docs/pi05.md): every linear layer of the VLM
        and of SigLIP and the projector becomes an :class:`~cosmos_robot.policies.fp8.Fp8Linear`
        (e4m3, row-wise scales); at the released sizes that is all 289 of them, in a model whose
        sizes are not multiples of 16 (tiny test models) only those that are. The action expert, the
        embeddings and the norms keep their dtype.
        The prefix is ~80% of a batch-8 chunk's time; the expert's GEMMs have 50 rows per
        observation, too few for FP8 to pay. Needs the model on a Hopper GPU (``check_device=False``:
        CPU tests, where the layers compute the same quantised product in float32); returns the
        names converted."""
        if check_device:
            check_fp8_device(next(self.parameters()).device)
        return convert_linears(self.paligemma_with_expert.paligemma, _bf16_fp8_shaped)

    def fp8_layers(self) -> list[str]:
        """Names of the layers :meth:`to_fp8` converted (empty for a model as loaded)."""
        return [name for name, mod in self.named_modules() if isinstance(mod, Fp8Linear)]

    # --- prefix ----------------------------------------------------------------------------------
    def embed_images(self, images: Tensor) -> Tensor:
        """(B, 3, H, W) in [-1, 1] at the vision size -> (B, patches, VLM width)."""
        inner = self.paligemma_with_expert.paligemma.model
        feats = inner.vision_tower.vision_model(images)
        return inner.multi_modal_projector.linear(feats)

    def embed_prefix(
        self, images: list[Tensor], image_masks: list[Tensor], tokens: Tensor, token_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Camera tokens then prompt tokens; returns embeddings (B, Lp, W) and validity (B, Lp)."""
        embs, pads = [], []
        if self.attention == "eager":  # LeRobot's op order: one SigLIP call per camera
            per_cam: Sequence[Tensor] = [self.embed_images(img) for img in images]
        elif images:  # all cameras through SigLIP in one batch (another GEMM shape: rounds differently)
            per_cam = self.embed_images(torch.cat(images, dim=0)).chunk(len(images), dim=0)
        else:
            per_cam = []
        for e, valid in zip(per_cam, image_masks, strict=True):
            embs.append(e)
            pads.append(valid[:, None].expand(e.shape[0], e.shape[1]))
        table = self._vlm.embed_tokens.weight
        lang = F.embedding(tokens, table) * self._embed_scale[table.dtype]
        embs.append(lang.to(embs[0].dtype) if embs else lang)
        pads.append(token_mask.bool())
        return torch.cat(embs, dim=1), torch.cat(pads, dim=1)

    def _qkv(self, layer: _GemmaLayer, h: Tensor, spec: GemmaSpec, cond: Tensor | None, mod: Tensor | None = None):
        x, gate = layer.input_layernorm(h, cond, mod)
        b, n, _ = x.shape
        q = layer.self_attn.q_proj(x).view(b, n, spec.num_heads, spec.head_dim).transpose(1, 2)
        k = layer.self_attn.k_proj(x).view(b, n, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
        v = layer.self_attn.v_proj(x).view(b, n, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
        return q, k, v, gate

    def _finish(
        self,
        layer: _GemmaLayer,
        h: Tensor,
        attn: Tensor,
        gate: Tensor | None,
        cond: Tensor | None,
        mod: Tensor | None = None,
    ) -> Tensor:
        out = layer.self_attn.o_proj(attn.to(linear_dtype(layer.self_attn.o_proj)))
        h = h + (out if gate is None else out * gate)
        x, gate2 = layer.post_attention_layernorm(h, cond, mod)
        out = layer.mlp(x.to(linear_dtype(layer.mlp.up_proj)))
        return h + (out if gate2 is None else out * gate2)

    def set_attention(self, impl: str) -> None:
        """How the masked attention runs: ``"sdpa"`` (PyTorch's fused kernels; with an additive mask
        and head_dim 256 that is cuDNN's or the memory-efficient kernel) or ``"math"`` (two matmuls
        and a float32 softmax, which Inductor fuses under ``compile``). Meant for the flow steps' small
        problems, 400 query rows by ~760 keys, where a fused kernel's fixed cost may dominate; which
        is faster is for ``benchmarks/pi05_latency.py --attention`` to tell on each GPU), or
        ``"eager"`` (LeRobot's own op order: K/V repeated per head, matmul, scale, mask, float32
        softmax; the float32 reference path, ``benchmarks/numerics_pi05.py``). ``"eager"`` also
        embeds each camera with its own SigLIP call as LeRobot does: one batched call rounds
        differently on a GPU (5.1e-5 on the prefix at the released shape, amplified to 1.2e-2 on the
        chunk through 18 random layers; docs/pi05.md)."""
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention {impl!r} is not one of {list(ATTENTION_IMPLS)}")
        self.attention = impl

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Grouped-query attention without copying K/V: the heads sharing a K/V head are stacked
        along the query axis (``mask`` already repeats its rows, see ``_additive``)."""
        b, h, n, d = q.shape
        kv = k.shape[1]
        scale = self.arch.vlm.head_dim**-0.5
        if self.attention == "eager":  # LeRobot's (transformers' Gemma eager) op for op: K/V repeated per head
            nk = k.shape[2]
            k = k[:, :, None].expand(b, kv, h // kv, nk, d).reshape(b, h, nk, d)
            v = v[:, :, None].expand(b, kv, h // kv, nk, d).reshape(b, h, nk, d)
            scores = torch.matmul(q, k.transpose(2, 3)) * scale + mask[:, :, :n]
            out = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
            return out.transpose(1, 2).reshape(b, n, h * d)
        q = q.reshape(b, kv, (h // kv) * n, d)
        if self.attention == "math":
            scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + mask.float()
            out = torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return out.reshape(b, h, n, d).transpose(1, 2).reshape(b, n, h * d)

    def encode_prefix(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        hidden: bool = True,
    ) -> PrefixCache:
        """Run the VLM over the prefix once; keep every layer's keys/values for the flow steps.

        ``hidden=False`` (action generation): the action expert reads only the layers' keys and
        values, so the last layer's query, attention, output projection and MLP, which feed nothing
        but the pooled output a value head reads, are skipped (about 1/18 of the VLM's work; the
        keys and values, and so the chunk, are the same)."""
        spec = self.arch.vlm
        dtype = self._vlm.compute_dtype
        h, pad = self.embed_prefix(images, image_masks, tokens, token_mask)
        h = h.to(dtype)
        group = spec.num_heads // spec.num_kv_heads
        mask = _additive(make_attention_mask(pad, torch.zeros_like(pad)), dtype, group)
        rope = rope_tables(torch.cumsum(pad.long(), dim=1) - 1, spec.head_dim, spec.rope_theta, dtype)
        keys, values = [], []
        blocks = self._vlm.blocks()
        for i, layer in enumerate(blocks):
            if not hidden and i == len(blocks) - 1:
                x, _ = layer.input_layernorm(h, None, None)
                b, n, _ = x.shape
                k = layer.self_attn.k_proj(x).view(b, n, spec.num_kv_heads, spec.head_dim).transpose(1, 2)
                keys.append(_apply_rope(k, rope))
                values.append(layer.self_attn.v_proj(x).view(b, n, spec.num_kv_heads, spec.head_dim).transpose(1, 2))
                break
            q, k, v, gate = self._qkv(layer, h, spec, None)
            q, k = _apply_rope(q, rope), _apply_rope(k, rope)
            keys.append(k)
            values.append(v)
            h = self._finish(layer, h, self._attend(q, k, v, mask), gate, None)
        pooled = self._vlm.norm(h)[0] if hidden else None
        # the action tokens see the valid prefix and the whole chunk, at positions after the prefix
        b, n, lp = pad.shape[0], self.arch.chunk_size, pad.shape[1]
        seen = torch.cat([pad[:, None, :].expand(b, n, lp), pad.new_ones(b, n, n)], dim=2)
        positions = pad.long().sum(-1, keepdim=True) + torch.arange(n, device=pad.device)[None]
        ex = self.arch.expert
        suffix_rope = rope_tables(positions, ex.head_dim, ex.rope_theta, self._expert.compute_dtype)
        return PrefixCache(keys, values, pad, pooled, _additive(seen, self._expert.compute_dtype, group), suffix_rope)

    # --- suffix ----------------------------------------------------------------------------------
    def time_condition(self, t: Tensor) -> Tensor:
        """The adaptive-norm condition for flow time ``t`` (B,)."""
        emb = sinusoidal_time_embedding(t, self.arch.expert.width, self.arch.min_period, self.arch.max_period)
        emb = emb.to(self.time_mlp_in.weight.dtype)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    def modulations(self, t: Tensor) -> list[Tensor]:
        """Every adaptive norm's ``dense(time condition)`` for flow times ``t`` (N,), in the order
        :meth:`velocity` uses them (two per expert layer, then the final norm)."""
        cond = self.time_condition(t.float())
        norms = [n for layer in self._expert.blocks() for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        return [n.modulation(cond) for n in (*norms, self._expert.norm)]

    def velocity(self, cache: PrefixCache, x_t: Tensor, t: Tensor, mods: list[Tensor] | None = None) -> Tensor:
        """Predicted ``noise - actions`` (B, chunk, max_action_dim) at flow time ``t`` (B,). ``mods``:
        :meth:`modulations` of ``t`` computed beforehand (then ``t`` is not used again)."""
        spec = self.arch.expert
        dtype = self._expert.compute_dtype
        cond = self.time_condition(t.float()) if mods is None else None
        h = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype)).to(dtype)
        for i, layer in enumerate(self._expert.blocks()):
            m_in, m_post = (None, None) if mods is None else (mods[2 * i], mods[2 * i + 1])
            q, k, v, gate = self._qkv(layer, h, spec, cond, m_in)
            q, k = _apply_rope(q, cache.suffix_rope), _apply_rope(k, cache.suffix_rope)
            keys = torch.cat([cache.keys[i], k], dim=2)
            values = torch.cat([cache.values[i], v], dim=2)
            h = self._finish(layer, h, self._attend(q, keys, values, cache.suffix_mask), gate, cond, m_post)
        out, _ = self._expert.norm(h, cond, None if mods is None else mods[-1])
        return self.action_out_proj(out[:, -self.arch.chunk_size :].float().to(self.action_out_proj.weight.dtype))

    @torch.no_grad()
    def sample_actions(self, cache: PrefixCache, noise: Tensor, num_steps: int) -> Tensor:
        """Forward Euler from ``noise`` at t=1 to actions at t=0 in ``num_steps`` steps (openpi's sampler).

        The time schedule is fixed, so every adaptive norm's modulation for all steps comes from one
        batched projection up front (37 small GEMMs instead of 37 per step)."""
        dt = -1.0 / num_steps
        b = noise.shape[0]
        # on the device (no host->device copy inside a CUDA graph capture), in float64 so each time is
        # the float32 rounding of 1 + step * dt, exactly the scalar the loop below fills
        times = (1.0 + torch.arange(num_steps, dtype=torch.float64, device=noise.device) * dt).float()
        # "eager" is LeRobot's op order: one modulation projection per step, at its matrix shapes
        all_mods = None if self.attention == "eager" else self.modulations(times.repeat_interleave(b))
        x = noise
        for step in range(num_steps):
            t = torch.full((b,), 1.0 + step * dt, dtype=torch.float32, device=x.device)
            mods = None if all_mods is None else [m[step * b : (step + 1) * b] for m in all_mods]
            x = x + dt * self.velocity(cache, x, t, mods).float()
        return x

    def generate(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        noise: Tensor,
        num_steps: int,
    ) -> Tensor:
        """Prefix encoding plus the K flow steps: one call, no host synchronisation (CUDA-graph safe)."""
        cache = self.encode_prefix(images, image_masks, tokens, token_mask, hidden=False)
        return self.sample_actions(cache, noise, num_steps)

    def compile_steps(self, mode: str | None = None, backend: str = "inductor") -> None:
        """``torch.compile`` the prefix encoder and the flow step (static shapes; compiled on first call).
        ``mode``: Inductor's ``"default"`` or ``"max-autotune-no-cudagraphs"`` (benchmarks the GEMM and
        kernel configurations for these shapes: minutes more to compile); modes that capture their own
        CUDA graphs are refused, the policy captures the whole chunk itself. ``backend``: torch.compile's
        backend (``"eager"`` traces and guards exactly as Inductor would, without code generation:
        what the CPU tests use to count recompilations)."""
        if mode not in COMPILE_MODES:
            raise ValueError(f"compile mode {mode!r} is not one of {sorted(m for m in COMPILE_MODES if m)}")
        options: dict[str, Any] = {"dynamic": False, "backend": backend}
        # one compilation per (batch bucket, prompt length) a server warms: 5 buckets to batch 16 times 2
        # prompt lengths with trim_prompt is past Dynamo's default limit of 8, beyond which it would run
        # the remaining shapes eagerly, silently slower
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        if backend == "inductor":
            options["mode"] = mode
        self.encode_prefix = torch.compile(self.encode_prefix, **options)  # type: ignore[method-assign]
        self.velocity = torch.compile(self.velocity, **options)  # type: ignore[method-assign]

    # --- training --------------------------------------------------------------------------------
    def flow_loss(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        actions: Tensor,
        noise: Tensor,
        t: Tensor,
    ) -> Tensor:
        """Per-element flow-matching loss ``(v - (noise - actions))^2`` (B, chunk, max_action_dim)."""
        tt = t[:, None, None]
        x_t = tt * noise + (1 - tt) * actions
        cache = self.encode_prefix(images, image_masks, tokens, token_mask)
        v = self.velocity(cache, x_t, t)
        return F.mse_loss(v.float(), (noise - actions).float(), reduction="none")


def trim_text(tokens: Tensor, token_mask: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """Cut the prompt to ``length`` tokens when every prompt of the batch fits in it, else leave it whole.

    LeRobot's tokenizer pads every prompt to ``tokenizer_max_length`` (200) on the right; the pads are
    masked out of attention and take no RoPE position, so cutting them changes no output and saves
    up to 200 of the prefix's ~700 tokens in every layer and flow step. The cut is to one pinned length
    (``trim_prompt=N``), not to the batch's own: pi0.5's prompt carries the discretised state as text,
    so its length moves from one observation to the next, and every new length would be a new CUDA
    graph and compilation in the middle of serving. A server therefore meets two prompt shapes, ``N``
    and the full length (a prompt longer than ``N``), and warms both (``Pi05Policy.warmup_observations``).
    A left-padded batch is left as it is.
    """
    valid = token_mask.bool().any(dim=0)
    if length >= tokens.shape[1] or not bool(valid.any()):
        return tokens, token_mask
    if int(valid.nonzero().max()) + 1 > length:
        return tokens, token_mask
    return tokens[:, :length], token_mask[:, :length]


COMPILE_MODES = (None, "default", "max-autotune-no-cudagraphs")
RECOMPILE_LIMIT = 32  # per compiled function: batch buckets x prompt lengths, with room
ATTENTION_IMPLS = ("sdpa", "math", "eager")


class GraphedGenerate:
    """``Pi05Model.generate`` captured as one CUDA graph per input shape (batch size, cameras, tokens).

    Why: at batch 1 the released model is launch-bound. The prefix is ~45 transformer layers and
    every flow step 18 more, so K = 10 steps issue thousands of small kernels; replaying a captured
    graph issues them from the GPU in one call. Inputs are copied into static buffers, the output
    is cloned out of the graph's pool. Graphs share one memory pool. Batches are padded to the next
    power of two (``bucket_size``), so a server sees at most log2(max batch) captures. The first
    call for a new bucket warms up on a side stream and captures (about 2 s at full size; with
    ``compile`` the first bucket also compiles, about a minute on the H200 machine).
    """

    def __init__(
        self,
        model: Pi05Model,
        num_steps: int,
        compile: bool | str = False,
        trim_prompt: int = 0,
        graphs: bool = True,
        compile_backend: str = "inductor",
    ) -> None:
        self.model, self.num_steps, self.trim_prompt = model, num_steps, trim_prompt
        self.long_prompt_calls = 0  # calls served at the full length: a prompt longer than trim_prompt
        if compile:  # Inductor fuses the many small norm/RoPE/gating kernels; graphs then replay them
            model.compile_steps(mode=compile if isinstance(compile, str) else None, backend=compile_backend)
        # graphs off (compiled on a CPU, or -a cuda_graphs=false): the same buckets, so a compiled
        # model meets only the warmed batch shapes and never recompiles while serving
        self.cache = GraphCache(self._generate, enabled=graphs, max_graphs=16)

    @property
    def graphs(self) -> Any:
        return self.cache.graphs

    def fresh(self) -> GraphedGenerate:
        """The same model (compiled already) with graphs of its own: a policy replica's."""
        twin = copy.copy(self)
        twin.cache = self.cache.fresh(twin._generate)
        return twin

    def __call__(
        self, images: list[Tensor], image_masks: list[Tensor], tokens: Tensor, token_mask: Tensor, noise: Tensor
    ) -> Tensor:
        n = tokens.shape[0]
        size = bucket_size(n)
        if self.trim_prompt:
            full = tokens.shape[1]
            tokens, token_mask = trim_text(tokens, token_mask, self.trim_prompt)
            self.long_prompt_calls += tokens.shape[1] == full > self.trim_prompt
        # contiguous: a trimmed prompt is a strided view and the serving noise an expanded one (stride 0);
        # compiled code guards on strides, so each would be one more compilation per shape
        flat = [pad_rows(t, size).contiguous() for t in (*images, *image_masks, tokens, token_mask, noise)]
        with torch.inference_mode():
            return self.cache(*flat, n_cams=len(images))[:n]

    def _generate(self, *flat: Tensor, n_cams: int) -> Tensor:
        images, masks = list(flat[:n_cams]), list(flat[n_cams : 2 * n_cams])
        tokens, token_mask, noise = flat[2 * n_cams :]
        return self.model.generate(images, masks, tokens, token_mask, noise, self.num_steps)
