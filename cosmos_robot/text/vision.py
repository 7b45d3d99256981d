"""Qwen3-VL on the text stack: image prompts, image-text sequences, and packing with M-RoPE.

Why here: the VLM paths (SFT, GRPO, PPO on images; issue 18) reuse the text trainers, which batch by
packing several sequences into one row. A Qwen3-VL sequence carries more than token ids: each image
becomes ``<|vision_start|>`` + one ``<|image_pad|>`` per merged patch + ``<|vision_end|>``, its
pixels go in ``pixel_values`` (patches, ``3 * temporal * patch * patch``) with ``image_grid_thw``,
``mm_token_type_ids`` marks image tokens (transformers 5.x requires it), and positions are
three-dimensional (M-RoPE: time, height, width). ``pack_vl`` packs such sequences the way the text
packer does (``collate_vl_rows`` for the SFT trainer's rows): each sequence's own M-RoPE positions from
the model's ``get_rope_index``, plus a fourth leading row of text positions that restart at 0 for every
sequence; transformers' Qwen3-VL reads that row to keep packed sequences from attending to each other,
but only without a KV cache (``use_cache=False``; with the default cache the second sequence attends to
the first, which ``tests/text/test_vision.py`` catches).

Images are prepared by transformers' own ``Qwen2VLImageProcessor`` (the processor Qwen3-VL checkpoints
name), so a real checkpoint's folder and a tiny one (``cosmos_robot.text.tiny.tiny_qwen3_vl``) go
through the same code. ``expand_images`` puts a prompt's images into its messages as vision tokens before
the chat template runs, so prompts and SFT masks are made as for text; ``image_kwargs`` gives any forward
(rollout, scoring, critic) its rows' images; ``ImageInputs`` is one prompt's pixels and grids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cosmos_robot.text.tasks import IMAGE_PLACEHOLDER

__all__ = [
    "IMAGE_PLACEHOLDER",
    "VISION_TOKENS",
    "ImageInputs",
    "VLSequence",
    "collate_vl_rows",
    "example_conversation",
    "example_prompt",
    "expand_images",
    "image_kwargs",
    "image_processor",
    "is_vl_model",
    "pack_vl",
    "vl_sequence",
    "vision_token_ids",
]

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def image_processor(side: int = 64, patch: int = 16, merge: int = 2) -> Any:
    """transformers' ``Qwen2VLImageProcessor`` resizing every image to ``side`` x ``side`` pixels."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    pixels = side * side
    return Qwen2VLImageProcessor(
        patch_size=patch, temporal_patch_size=2, merge_size=merge, min_pixels=pixels, max_pixels=pixels
    )


def is_vl_model(model: Any) -> bool:
    """An image-text model (its config has a vision tower and an image token)."""
    config = getattr(model, "config", None)
    return hasattr(config, "vision_config") and getattr(config, "image_token_id", None) is not None


def vision_token_ids(model: Any) -> list[int]:
    """The ids of the vision tokens (start, end, image and video pads) of an image-text model's config."""
    names = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")
    return [int(v) for v in (getattr(model.config, n, None) for n in names) if v is not None]


@dataclass
class ImageInputs:
    """One prompt's images as the model takes them: patches (P, 3 * temporal * patch * patch) and grids (I, 3)."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor

    def to(self, device: Any) -> ImageInputs:
        return ImageInputs(self.pixel_values.to(device), self.image_grid_thw.to(device))


def _vision_text(grid: torch.Tensor, merge: int) -> str:
    return "<|vision_start|>" + "<|image_pad|>" * (int(grid.prod()) // merge) + "<|vision_end|>"


def expand_images(
    messages: Sequence[dict[str, str]], processor: Any, images: Sequence[np.ndarray], where: str = "prompt"
) -> tuple[list[dict[str, str]], ImageInputs | None]:
    """``messages`` with each ``IMAGE_PLACEHOLDER`` (in order across the turns) replaced by the vision tokens its
    image's grid needs, and the images' model inputs; the chat template and tokenizer then see ordinary text
    with special tokens, so prompts and SFT's assistant masks are made exactly as for text."""
    found = sum(str(m.get("content", "")).count(IMAGE_PLACEHOLDER) for m in messages)
    if found != len(images):
        raise ValueError(f"{where}: {found} {IMAGE_PLACEHOLDER} placeholders in the messages for {len(images)} images")
    if not images:
        return [dict(m) for m in messages], None
    if processor is None:
        raise ValueError(f"{where}: the prompt has {len(images)} image(s) but the model has no image processor")
    inputs = processor(images=list(images), return_tensors="pt")
    pixel_values, grids = inputs["pixel_values"], inputs["image_grid_thw"]
    merge = int(processor.merge_size) ** 2
    out, k = [], 0
    for m in messages:
        parts = str(m["content"]).split(IMAGE_PLACEHOLDER)
        text = parts[0]
        for part in parts[1:]:
            text += _vision_text(grids[k], merge) + part
            k += 1
        out.append({**m, "content": text})
    return out, ImageInputs(pixel_values, grids)


def image_kwargs(model: Any, input_ids: torch.Tensor, images: Sequence[ImageInputs | None]) -> dict[str, Any]:
    """The forward's image arguments for rows of ``input_ids`` whose prompts had ``images`` (row order; None: a
    row without images): patches and grids concatenated, ``mm_token_type_ids`` 1 on image tokens. Empty for a
    text-only batch of a text model."""
    present = [im for im in images if im is not None]
    if not present:
        return {}
    if not is_vl_model(model):
        raise ValueError(f"{len(present)} prompt(s) have images but the model ({model.config.model_type}) is text-only")
    device = input_ids.device
    return {
        "pixel_values": torch.cat([im.pixel_values for im in present]).to(device),
        "image_grid_thw": torch.cat([im.image_grid_thw for im in present]).to(device),
        "mm_token_type_ids": (input_ids == int(model.config.image_token_id)).int(),
    }


def example_prompt(tokenizer: Any, processor: Any, example: Any) -> tuple[list[int], ImageInputs | None]:
    """A text task example's prompt ids (chat template, generation prompt) and its images' inputs (or None)."""
    from cosmos_robot.text.chat import prompt_ids

    where = f"{example.task} seed {example.seed}"
    messages, images = expand_images(example.prompt, processor, example.images, where=where)
    return prompt_ids(tokenizer, messages, where=where), images


def example_conversation(
    tokenizer: Any, processor: Any, example: Any, max_length: int | None = None
) -> tuple[Any, ImageInputs | None]:
    """An example with its solution as a tokenized conversation (assistant mask) and its images' inputs."""
    from cosmos_robot.text.chat import ChatError, tokenize_conversation

    where = f"{example.task} seed {example.seed}"
    messages = list(example.prompt) + [{"role": "assistant", "content": example.solution}]
    messages, images = expand_images(messages, processor, example.images, where=where)
    conv = tokenize_conversation(tokenizer, messages, max_length=max_length, where=where)
    if conv.truncated and images is not None:
        raise ChatError(f"{where}: truncated to max_length={max_length} with images in it; raise data.max_length")
    return conv, images


def collate_vl_rows(
    model: Any,
    rows: Sequence[Sequence[tuple[list[int], list[int], ImageInputs | None]]],
    pad_id: int,
) -> dict[str, Any]:
    """``collate_rows`` for image-text sequences: the same ``input_ids`` / ``labels`` (B, L), plus ``position_ids``
    (4, B, L) (text positions restarting per sequence, then each sequence's M-RoPE from ``get_rope_index``;
    padding continues both) and the image arguments. Forward with ``use_cache=False`` (``packed_logits``)."""
    from cosmos_robot.text.packing import collate_rows

    out: dict[str, Any] = collate_rows([[(ids, mask) for ids, mask, _ in row] for row in rows], pad_id)
    width = out["input_ids"].shape[1]
    rope = torch.zeros((3, len(rows), width), dtype=torch.long)
    image_token = int(model.config.image_token_id)
    for b, row in enumerate(rows):
        at = 0
        for ids, _, images in row:
            t = torch.tensor([ids])
            grid = None if images is None else images.image_grid_thw
            pos, _ = model.model.get_rope_index(t, (t == image_token).int(), image_grid_thw=grid)
            rope[:, b, at : at + len(ids)] = pos[:, 0].cpu()
            at += len(ids)
        nxt = int(rope[:, b, :at].max()) + 1 if at else 0
        rope[:, b, at:] = torch.arange(nxt, nxt + width - at)
    out["position_ids"] = torch.cat([out["position_ids"].unsqueeze(0), rope])
    out.update(image_kwargs(model, out["input_ids"], [im for row in rows for _, _, im in row]))
    return out


@dataclass
class VLSequence:
    """One image-text sequence, ready for the model: (1, L) ids and types, its images' patches and grids."""

    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor  # 0 text, 1 image
    pixel_values: torch.Tensor | None  # (patches, 3 * temporal * patch * patch)
    image_grid_thw: torch.Tensor | None  # (images, 3)


def vl_sequence(tokenizer: Any, processor: Any, text: str, images: Sequence[np.ndarray]) -> VLSequence:
    """``text`` with one ``IMAGE_PLACEHOLDER`` per image, each expanded to the vision tokens its grid needs."""
    (message,), inputs = expand_images([{"role": "user", "content": text}], processor, images, where="text")
    ids = tokenizer(message["content"], return_tensors="pt").input_ids
    types = (ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).int()
    if inputs is None:
        return VLSequence(ids, types, None, None)
    return VLSequence(ids, types, inputs.pixel_values, inputs.image_grid_thw)


def pack_vl(model: Any, sequences: Sequence[VLSequence]) -> dict[str, Any]:
    """Sequences packed into one row: the model's keyword arguments (forward them with ``use_cache=False``).

    ``position_ids`` is (4, 1, L): text positions restarting at 0 per sequence, then each sequence's M-RoPE
    (time, height, width) from ``get_rope_index``."""
    positions = []
    for s in sequences:
        rope, _ = model.model.get_rope_index(s.input_ids, s.mm_token_type_ids, image_grid_thw=s.image_grid_thw)
        text = torch.arange(s.input_ids.shape[1], device=rope.device).view(1, 1, -1)
        positions.append(torch.cat([text, rope], dim=0))
    images = [s for s in sequences if s.pixel_values is not None]
    return {
        "input_ids": torch.cat([s.input_ids for s in sequences], dim=1),
        "mm_token_type_ids": torch.cat([s.mm_token_type_ids for s in sequences], dim=1),
        "position_ids": torch.cat(positions, dim=-1),
        "pixel_values": torch.cat([s.pixel_values for s in images]) if images else None,  # type: ignore[misc]
        "image_grid_thw": torch.cat([s.image_grid_thw for s in images]) if images else None,  # type: ignore[misc]
    }
