"""GR00T N1.7's Qwen3-VL backbone as arithmetic on tensors only, so it can run inside a CUDA graph.

Why: LeRobot's ``Qwen3Backbone.forward`` runs transformers' ``Qwen3VLForConditionalGeneration``,
which plans on the CPU in the middle of the forward: the vision tower's rotary table and position
embeddings come from ``grid_thw.tolist()``, its SDPA attention splits the packed patches per image
(``lengths.tolist()``, then one attention call per image and layer: 16 images x 24 layers at batch
8), image tokens are scattered through boolean masks, the 3-D M-RoPE positions are computed per
sample in Python, and the LM head then projects every token onto the 151k vocabulary only to be
thrown away. Each of these syncs the device, so none of it can be captured, and at N1.7-3B's size
on an H200 the backbone is what is left of the served latency once the flow loop is a graph.

Here the same modules do the same arithmetic, split in two:

- :meth:`FastQwen3Backbone.plan` does the layout-dependent planning once per distinct input
  layout (token ids, attention mask, image grids) with transformers' own functions (M-RoPE
  positions, the causal mask, the vision tables) and keeps it in a small cache: a robot sends the
  same prompt and cameras every step.
- :meth:`FastQwen3Backbone.features` is a pure function of tensors: patch embedding, the vision
  blocks with all images of the call in one batched attention (every image has the same patch
  count), the deepstack and patch mergers, token embedding, image tokens written by precomputed
  index, the text decoder layers, and the output of the last one before the final norm (what
  LeRobot's forward hook captures for the action head).

A test checks the features against LeRobot's backbone on the tiny model, with padded prompts.
Serving only: the vision tables are cached from the current weights, so a model whose vision
position embedding is being trained must use LeRobot's forward (the RL adapter does).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["BackbonePlan", "FastQwen3Backbone", "supports_fast_backbone"]


@dataclass
class BackbonePlan:
    """What the forward needs beyond the pixels and token ids, fixed by the input layout."""

    position_embeddings: tuple[Tensor, Tensor]  # text M-RoPE (cos, sin), (B, S, head_dim)
    text_position_ids: Tensor | None  # (B, S): the legacy text row LeRobot forwards
    causal_mask: Tensor | None  # transformers' mask for the decoder layers (None: plain causal)
    image_index: Tensor  # (N_image_tokens,) flat indices into B * S, in masked_scatter's order
    vision_pos: Tensor  # (N_patches, D_vision) interpolated position embeddings
    vision_rope: tuple[Tensor, Tensor]  # (N_patches, head_dim) vision rotary (cos, sin)
    num_images: int
    image_mask: Tensor  # (B, S) bool, for the action head
    attention_mask: Tensor  # (B, S) bool, for the action head

    def tensors(self) -> list[Tensor | None]:
        """The plan's tensors, in :meth:`from_tensors` order (static inputs of a captured graph)."""
        return [
            *self.position_embeddings,
            self.text_position_ids,
            self.causal_mask,
            self.image_index,
            self.vision_pos,
            *self.vision_rope,
            self.image_mask,
            self.attention_mask,
        ]

    @classmethod
    def from_tensors(cls, tensors: list[Tensor | None], num_images: int) -> BackbonePlan:
        cos, sin, text_pos, mask, index, vpos, vcos, vsin, image_mask, attention_mask = tensors
        assert cos is not None and sin is not None and index is not None and vpos is not None
        assert vcos is not None and vsin is not None and image_mask is not None and attention_mask is not None
        return cls((cos, sin), text_pos, mask, index, vpos, (vcos, vsin), num_images, image_mask, attention_mask)


def supports_fast_backbone(backbone: Any) -> bool:
    """Whether ``backbone`` is LeRobot's Qwen3-VL wrapper with the modules this file drives."""
    model = getattr(getattr(backbone, "model", None), "model", None)
    return (
        model is not None
        and hasattr(model, "visual")
        and hasattr(model, "language_model")
        and hasattr(model, "compute_3d_position_ids")
        and hasattr(model.visual, "deepstack_merger_list")
    )


class _BatchedVisionBlock(nn.Module):
    """A Qwen3-VL vision block with every image of the call in one attention batch.

    The block's own forward packs the images into one sequence and attends per image (a loop with
    a ``.tolist()``); with equal-sized images that is exactly attention over an (images, heads,
    patches, dim) batch. The same modules, the same arithmetic otherwise.
    """

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block: Any = block  # transformers' Qwen3VLVisionBlock

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, num_images: int) -> Tensor:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

        blk, attn = self.block, self.block.attn
        seq = x.shape[0]
        qkv = attn.qkv(blk.norm1(x)).reshape(seq, 3, attn.num_heads, -1).permute(1, 0, 2, 3)
        q, k, v = qkv.unbind(0)
        q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)
        per_image = seq // num_images

        def heads(t: Tensor) -> Tensor:  # (seq, H, d) -> (images, H, patches, d)
            return t.reshape(num_images, per_image, attn.num_heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), scale=attn.scaling)
        x = x + attn.proj(out.transpose(1, 2).reshape(seq, -1))
        return x + blk.mlp(blk.norm2(x))


class FastQwen3Backbone:
    """``plan(model_input)`` once per layout, then ``features(pixel_values, input_ids, plan)``."""

    def __init__(self, backbone: Any, max_plans: int = 32) -> None:
        if not supports_fast_backbone(backbone):
            raise TypeError(f"{type(backbone).__name__} is not LeRobot's Qwen3-VL backbone")
        self.backbone = backbone
        self.qwen = backbone.model.model  # Qwen3VLModel: no LM head
        self.visual, self.text = self.qwen.visual, self.qwen.language_model
        self.vision_blocks = [_BatchedVisionBlock(b) for b in self.visual.blocks]
        self.max_plans = max_plans
        self._plans: OrderedDict[tuple[Any, ...], BackbonePlan] = OrderedDict()
        self._vision: dict[tuple[Any, ...], tuple[Tensor, Tensor, Tensor]] = {}

    def fork(self) -> FastQwen3Backbone:
        """The same modules with empty plan and vision-table caches (a policy replica's own: a plan made
        on one replica's CUDA stream must not be read by another's before it is written)."""
        twin = copy.copy(self)
        twin._plans, twin._vision = OrderedDict(), {}
        return twin

    def compile(self, backend: str = "inductor") -> None:
        """``torch.compile`` the batched vision blocks (the text layers are LeRobot's own modules and
        are compiled with the rest of the model by the loader)."""
        for block in self.vision_blocks:
            block.compile(backend=backend)

    # --- planning (outside any graph) ------------------------------------------------------------
    def plan(self, model_input: dict[str, Tensor]) -> BackbonePlan:
        """The layout-dependent tensors for ``model_input`` (LeRobot's processed backbone inputs:
        ``input_ids``, ``attention_mask``, ``pixel_values``, ``image_grid_thw``, optionally
        ``mm_token_type_ids``)."""
        ids, grid = model_input["input_ids"], model_input["image_grid_thw"]
        dtype = self.text.embed_tokens.weight.dtype  # the text hidden states' dtype, as in transformers
        mask = model_input["attention_mask"]
        key = (
            ids.device,
            dtype,
            tuple(ids.shape),
            ids.cpu().numpy().tobytes(),
            mask.cpu().numpy().tobytes(),
            grid.cpu().numpy().tobytes(),
        )
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(model_input, dtype)
            self._plans[key] = plan
            while len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)
        self._plans.move_to_end(key)
        return plan

    def _make_plan(self, model_input: dict[str, Tensor], dtype: torch.dtype) -> BackbonePlan:
        """Planned with transformers' and LeRobot's own functions, so the positions and masks are theirs."""
        from transformers.masking_utils import create_causal_mask

        ids, grid = model_input["input_ids"], model_input["image_grid_thw"]
        attention_mask = model_input["attention_mask"]
        config = self.qwen.config
        rows = grid.cpu().tolist()
        if any(r != rows[0] for r in rows) or rows[0][0] != 1:
            raise ValueError(f"the fast backbone needs single-frame images of one size, got image_grid_thw {rows}")
        if ids.shape[0] == 0 or len(rows) % ids.shape[0]:
            raise ValueError(f"{len(rows)} images do not split evenly over a batch of {ids.shape[0]}")
        inputs = dict(model_input)
        self.backbone._ensure_mm_token_type_ids(inputs)
        inputs.pop("position_ids", None)
        self.backbone._ensure_legacy_qwen3_position_ids(inputs)  # LeRobot's (4, B, S) positions
        position_ids = inputs["position_ids"]
        text_position_ids, position_ids = (position_ids[0], position_ids[1:]) if position_ids.shape[0] == 4 else (
            None, position_ids)  # fmt: skip
        hidden = torch.zeros((*ids.shape, 1), dtype=dtype, device=ids.device)
        causal_mask = create_causal_mask(
            config=self.text.config,
            inputs_embeds=hidden,
            attention_mask=attention_mask,
            past_key_values=None,
            position_ids=text_position_ids,
        )
        if causal_mask is not None and not isinstance(causal_mask, Tensor):
            raise TypeError(f"unexpected causal mask of type {type(causal_mask).__name__} for the text layers")
        image_mask = ids == config.image_token_id
        per_image = rows[0][1] * rows[0][2] // self.visual.spatial_merge_size**2
        image_index = torch.nonzero(image_mask.flatten()).flatten()
        if image_index.numel() != per_image * len(rows):
            raise ValueError(
                f"input_ids hold {image_index.numel()} image tokens for {len(rows)} images of {per_image} tokens"
            )
        vision_pos, vcos, vsin = self._vision_tables(grid)
        return BackbonePlan(
            position_embeddings=self.text.rotary_emb(hidden, position_ids),
            text_position_ids=text_position_ids,
            causal_mask=causal_mask,
            image_index=image_index,
            vision_pos=vision_pos,
            vision_rope=(vcos, vsin),
            num_images=len(rows),
            image_mask=image_mask,
            attention_mask=attention_mask == 1,
        )

    def _vision_tables(self, grid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        key = (grid.device, grid.cpu().numpy().tobytes())
        if key not in self._vision:
            visual = self.visual
            pos = visual.fast_pos_embed_interpolate(grid)
            rotary = visual.rot_pos_emb(grid).reshape(pos.shape[0], -1)
            emb = torch.cat((rotary, rotary), dim=-1)
            self._vision[key] = (pos, emb.cos(), emb.sin())
        return self._vision[key]

    # --- the forward (graph-capturable) ----------------------------------------------------------
    def features(self, pixel_values: Tensor, input_ids: Tensor, plan: BackbonePlan) -> Tensor:
        """(B, S, hidden): the last decoder layer's output, as LeRobot's backbone returns it."""
        visual = self.visual
        x = visual.patch_embed(pixel_values.type(visual.dtype)) + plan.vision_pos
        cos, sin = plan.vision_rope
        deepstack: list[Tensor] = []
        indexes = list(visual.deepstack_visual_indexes)
        for i, block in enumerate(self.vision_blocks):
            x = block(x, cos, sin, plan.num_images)
            if i in indexes:
                deepstack.append(visual.deepstack_merger_list[indexes.index(i)](x))
        image_embeds = visual.merger(x)

        hidden = self.text.embed_tokens(input_ids)
        batch, seq, width = hidden.shape
        hidden = hidden.reshape(batch * seq, width).index_copy(0, plan.image_index, image_embeds.to(hidden.dtype))
        hidden = hidden.view(batch, seq, width)
        layers = list(self.text.layers)
        out = hidden
        for i, layer in enumerate(layers):
            out = layer(
                hidden,
                attention_mask=plan.causal_mask,
                position_ids=plan.text_position_ids,
                past_key_values=None,
                position_embeddings=plan.position_embeddings,
            )
            hidden = out
            if i < len(deepstack) and i < len(layers) - 1:  # LeRobot's hook sees the last layer before deepstack
                flat = hidden.reshape(batch * seq, width)
                hidden = flat.index_add(0, plan.image_index, deepstack[i].to(hidden.dtype)).view(batch, seq, width)
        return out
