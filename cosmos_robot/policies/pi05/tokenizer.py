"""A byte-level prompt tokenizer for tiny offline pi0.5 models.

Why: the released checkpoints use PaliGemma's SentencePiece tokenizer (``google/paligemma-3b-pt-224``,
257,152 tokens, gated on the hub), which tests and offline machines cannot fetch. This is a real
``transformers`` fast tokenizer with PaliGemma's special-token layout (``<pad>`` 0, ``<eos>`` 1,
``<bos>`` 2, ``<unk>`` 3, a BOS prepended to every prompt) over the 256 byte symbols, so it saves,
reloads and pads exactly like the real one while keeping the embedding table small (260 rows).
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_byte_tokenizer"]

SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")


def make_byte_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast``: 4 specials + 256 byte tokens, BOS-prefixed, right padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for sym in sorted(alphabet):
        vocab[sym] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        padding_side="right",
    )
