"""Qwen3-VL on the text stack: a tiny real-format model folder that transformers loads unchanged, image-text
sequences from transformers' own image processor, and packing with M-RoPE that gives every sequence the
logits of its own forward only without the KV cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_robot.text.tiny import tiny_qwen3_vl, vl_tokenizer, write_tiny_vl
from cosmos_robot.text.vision import IMAGE_PLACEHOLDER, image_processor, pack_vl, vl_sequence


@pytest.fixture(scope="module")
def parts() -> tuple:
    tok = vl_tokenizer("arithmetic")
    return tok, image_processor(), tiny_qwen3_vl(tok).eval()


def _images(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.random((48 + 8 * i, 64, 3)) * 255).astype(np.uint8) for i in range(n)]


def test_packed_image_text_sequences_match_their_own_forwards_only_without_the_cache(parts: tuple) -> None:
    tok, proc, model = parts
    seqs = [
        vl_sequence(tok, proc, f"1+{IMAGE_PLACEHOLDER}2=3", _images(1, 0)),
        vl_sequence(tok, proc, "12+3=15", []),
        vl_sequence(tok, proc, f"{IMAGE_PLACEHOLDER}7{IMAGE_PLACEHOLDER}8", _images(2, 1)),
    ]
    assert int(seqs[0].mm_token_type_ids.sum()) == int(seqs[0].image_grid_thw.prod()) // 4  # type: ignore[union-attr]
    with torch.no_grad():
        alone = [
            model(
                input_ids=s.input_ids,
                pixel_values=s.pixel_values,
                image_grid_thw=s.image_grid_thw,
                mm_token_type_ids=s.mm_token_type_ids,
                use_cache=False,
            ).logits[0]
            for s in seqs
        ]
        packed = pack_vl(model, seqs)
        assert packed["position_ids"].shape == (4, 1, sum(s.input_ids.shape[1] for s in seqs))
        without = model(**packed, use_cache=False).logits[0]
        with_cache = model(**packed).logits[0]
    bounds = np.cumsum([0] + [a.shape[0] for a in alone])
    gaps = [float((without[a:b] - ref).abs().max()) for a, b, ref in zip(bounds[:-1], bounds[1:], alone, strict=True)]
    assert max(gaps) < 1e-5, gaps
    # with the default KV cache the packed mask is not used: later sequences attend to earlier ones
    later = float((with_cache[bounds[1] :] - torch.cat(alone[1:])).abs().max())
    assert later > 1e-3


def test_placeholders_must_match_the_images(parts: tuple) -> None:
    tok, proc, _ = parts
    with pytest.raises(ValueError, match="text: 2 <image> placeholders in the messages for 1 images"):
        vl_sequence(tok, proc, f"{IMAGE_PLACEHOLDER}{IMAGE_PLACEHOLDER}", _images(1, 0))


def test_tiny_vl_folder_loads_unchanged_in_transformers(tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    folder = write_tiny_vl(tmp_path / "vl", alphabet="arithmetic")
    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    proc = Qwen2VLImageProcessor.from_pretrained(folder, local_files_only=True)
    fresh = tiny_qwen3_vl(vl_tokenizer("arithmetic")).eval()
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    s = vl_sequence(tok, proc, f"{IMAGE_PLACEHOLDER}1+1=", _images(1, 2))
    with torch.no_grad():
        out = model(**pack_vl(model, [s]), use_cache=False).logits
    assert out.shape == (1, s.input_ids.shape[1], len(tok))
