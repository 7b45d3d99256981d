"""Tiny real-format causal LMs for tests, debug recipes and the CPU learning runs.

There is no hub here, so the text stack is exercised on models built from configs: a character-level
tokenizer (``tokenizers`` WordLevel over single characters plus the ChatML specials, wrapped as a
``PreTrainedTokenizerFast`` with a ChatML chat template that marks assistant turns with
``{% generation %}``) and a random-init ``Qwen3ForCausalLM`` (or Qwen2 / Qwen3-MoE) saved with
``save_pretrained``. The folder is an ordinary HF folder: ``AutoModelForCausalLM`` and
``AutoTokenizer`` load it, and so does everything in this project that loads real checkpoints.
Character tokens keep arithmetic tasks learnable by a ~100k-parameter model in minutes.

``tiny_qwen3_vl`` builds a random ``Qwen3VLForConditionalGeneration`` the same way (TRL's tiny-model recipe:
M-RoPE sections summing to half the head dimension, a small vision tower with one deepstack layer) over the
character tokenizer plus the vision tokens (``vl_tokenizer``); ``write_tiny_vl`` saves it with its image
processor as an HF folder that ``AutoModelForImageTextToText`` loads unchanged.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from cosmos_robot.text.hf import CausalLM, save_causal_lm

__all__ = [
    "CHATML_TEMPLATE",
    "SPECIAL_TOKENS",
    "char_tokenizer",
    "tiny_causal_lm",
    "tiny_from_table",
    "tiny_qwen3_vl",
    "vl_tokenizer",
    "write_tiny",
    "write_tiny_vl",
]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML as Qwen formats it; assistant content and its <|im_end|> are inside {% generation %} so
# apply_chat_template(return_assistant_tokens_mask=True) marks exactly the tokens SFT trains on.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}{{- message['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

DEFAULT_ALPHABET = string.digits + string.ascii_letters + " +-*/=()?.,:;!'\"#<>_\n"
# arithmetic tasks: digits, operators and newline only; the role names are whole tokens (ROLE_WORDS), so a
# 25-token vocabulary still renders ChatML. A small vocabulary keeps a tiny model's samples on-task,
# which is what makes RL from its own samples work at this scale.
ARITHMETIC_ALPHABET = string.digits + "+-*/=() \n"
ALPHABETS = {"printable": DEFAULT_ALPHABET, "arithmetic": ARITHMETIC_ALPHABET}
ROLE_WORDS = ("system", "user", "assistant", "tool")


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET, vocab_size: int | None = None) -> Any:
    """A ``PreTrainedTokenizerFast``: one token per character of ``alphabet`` (or a name in ``ALPHABETS``),
    the role names as whole tokens, ChatML specials and the chat template.

    ``vocab_size`` pads the vocabulary with filler tokens ``<|xN|>`` (never produced by encoding, decoded
    as themselves) so a model shaped like a real one (e.g. Qwen3's 151,936 rows) can be built and
    sampled: the GPU benchmarks' stand-in for a real tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = ALPHABETS.get(alphabet, alphabet)
    chars = sorted(set(alphabet))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab["<unk>"] = len(vocab)
    for word in ROLE_WORDS:
        vocab[word] = len(vocab)
    for ch in chars:
        vocab[ch] = len(vocab)
    if vocab_size is not None:
        if vocab_size < len(vocab):
            raise ValueError(f"vocab_size {vocab_size} is below the {len(vocab)} tokens the alphabet needs")
        for i in range(vocab_size - len(vocab)):
            vocab[f"<|x{i}|>"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS),
    )
    tok.add_tokens(list(ROLE_WORDS))  # matched whole, before the per-character split
    tok.chat_template = CHATML_TEMPLATE
    return tok


def tiny_causal_lm(
    tokenizer: Any,
    *,
    model_type: str = "qwen3",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    experts: int = 4,
    max_positions: int = 512,
    seed: int = 0,
) -> CausalLM:
    """A random-init ``*ForCausalLM`` of ``model_type`` (qwen3, qwen2, qwen3_moe) sized for ``tokenizer``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if model_type in ("qwen3", "qwen3_moe"):
        common["head_dim"] = hidden // heads
    if model_type == "qwen3_moe":
        common.update(
            num_experts=experts,
            num_experts_per_tok=2,
            moe_intermediate_size=intermediate // 2,
            decoder_sparse_step=1,
            output_router_logits=False,
        )
    config = AutoConfig.for_model(model_type, **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return CausalLM(model, tokenizer, None)


def vl_tokenizer(alphabet: str = "printable", vocab_size: int | None = None) -> Any:
    """``char_tokenizer`` with Qwen-VL's vision tokens as specials (``vocab_size``: the whole vocabulary's, the
    vision tokens included)."""
    from cosmos_robot.text.vision import VISION_TOKENS

    tok = char_tokenizer(alphabet, None if vocab_size is None else vocab_size - len(VISION_TOKENS))
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    return tok


def tiny_qwen3_vl(
    tokenizer: Any,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    max_positions: int = 1024,
    vision_hidden: int = 16,
    vision_depth: int = 2,
    seed: int = 0,
    head_dim: int | None = None,
    mrope_section: list[int] | None = None,
    rope_theta: float | None = None,
    vision_heads: int = 4,
    vision_intermediate: int | None = None,
    deepstack: list[int] | None = None,
    vision_positions: int = 64,
) -> Any:
    """A random ``Qwen3VLForConditionalGeneration`` over ``tokenizer`` (which must have ``VISION_TOKENS``).

    The defaults make a tiny one; the keyword arguments after ``seed`` shape a real size (the GPU benchmark's
    Qwen3-VL-2B stand-in: head_dim 128, M-RoPE sections 24 / 20 / 20, 16 vision heads, deepstack 5, 11, 17)."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from cosmos_robot.text.vision import VISION_TOKENS

    missing = [t for t in VISION_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        raise ValueError(f"the tokenizer lacks the vision tokens {missing} (use vl_tokenizer)")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    head_dim = head_dim or hidden // heads
    if head_dim < 8 or head_dim % 2:
        raise ValueError(f"head dimension {head_dim}: M-RoPE needs an even head dimension of at least 8")
    half = head_dim // 2  # the M-RoPE sections (time, height, width) sum to head_dim / 2
    sections = mrope_section or [half - 2 * (half // 4), half // 4, half // 4]
    if sum(sections) != half:
        raise ValueError(f"mrope_section {sections} must sum to head_dim / 2 = {half}")
    rope: dict[str, Any] = {"rope_type": "default", "mrope_section": sections, "mrope_interleaved": True}
    if rope_theta is not None:
        rope["rope_theta"] = rope_theta
    settings: dict[str, Any] = dict(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden,
            "intermediate_size": intermediate or 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads or max(1, heads // 2),
            "head_dim": head_dim,
            "rope_scaling": rope,
            "max_position_embeddings": max_positions,
            "tie_word_embeddings": True,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden,
            "intermediate_size": vision_intermediate or 2 * vision_hidden,
            "num_heads": vision_heads,
            "out_hidden_size": hidden,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "deepstack_visual_indexes": deepstack or [vision_depth - 1],
            "num_position_embeddings": vision_positions,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    config = Qwen3VLConfig(**settings)  # transformers' config takes these as keyword arguments
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def write_tiny_vl(out: str | Path, *, alphabet: str = "printable", **sizes: Any) -> Path:
    """Save a tiny random Qwen3-VL, its tokenizer and image processor as an HF folder under ``out``."""
    from cosmos_robot.text.vision import image_processor

    tok = vl_tokenizer(alphabet)
    return save_causal_lm(CausalLM(tiny_qwen3_vl(tok, **sizes), tok, None, image_processor()), Path(out))


def tiny_from_table(table: dict[str, Any]) -> CausalLM:
    """A tiny model from a recipe's ``[model]`` table (``model_type``, ``alphabet`` and the sizes)."""
    sizes = dict(table)
    alphabet, model_type = sizes.pop("alphabet", "printable"), sizes.pop("model_type", "qwen3")
    vision = {k: sizes.pop(k) for k in ("vision_hidden", "vision_depth", "image_side") if k in sizes}
    if model_type == "qwen3_vl":  # an image-text model: cosmos_robot.text.vision
        from cosmos_robot.text.vision import image_processor

        sizes.pop("experts", None)
        side = vision.pop("image_side", 64)
        tokenizer = vl_tokenizer(alphabet)
        return CausalLM(tiny_qwen3_vl(tokenizer, **sizes, **vision), tokenizer, None, image_processor(side))
    return tiny_causal_lm(char_tokenizer(alphabet), model_type=model_type, **sizes)


def write_tiny(out: str | Path, *, model_type: str = "qwen3", alphabet: str = DEFAULT_ALPHABET, **sizes: Any) -> Path:
    """Save a tiny random causal LM with a character tokenizer as an HF folder under ``out``."""
    lm = tiny_causal_lm(char_tokenizer(alphabet), model_type=model_type, **sizes)
    return save_causal_lm(lm, Path(out))
