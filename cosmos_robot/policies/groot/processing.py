"""GR00T's Qwen3-VL processor call without redoing, every step, what only depends on the prompt.

Why: LeRobot's VLM encode step calls transformers' ``Qwen3VLProcessor`` once per batch. Besides the
image processing, that call re-validates its keyword arguments (``_merge_kwargs`` builds typed
dataclasses on every call), expands the image placeholders and tokenises the rendered prompts. For
a robot the prompt and the cameras do not change from one step to the next, so all of that gives
the same token ids every time; on this CPU it was a third of the preprocessor at batch 8.

:class:`CachingVLProcessor` wraps the step's processor: the merged keyword arguments are kept per
call signature, the images go to the image processor itself, and the text outputs (``input_ids``,
``attention_mask``, ``mm_token_type_ids``) are kept per (rendered prompts, image grids, call
arguments). A prompt it has not seen goes through the wrapped processor as before. The outputs are
those of the processor (a test compares them over changing batches).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

__all__ = ["CachingVLProcessor", "install_caching_processor"]

IMAGE_KEYS = ("pixel_values", "image_grid_thw")


class CachingVLProcessor:
    """Stands in for a ``Qwen3VLProcessor``: ``__call__`` cached as described above, the rest delegated."""

    def __init__(self, processor: Any, max_prompts: int = 256) -> None:
        self._processor = processor
        self._max_prompts = max_prompts
        self._merged: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
        self._text: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self.hits = 0

    def __getattr__(self, name: str) -> Any:  # apply_chat_template, tokenizer, image_processor, ...
        inner = self.__dict__.get("_processor")  # absent while copy/pickle rebuild the object
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    def __call__(self, images: Any = None, text: Any = None, videos: Any = None, **kwargs: Any) -> Any:
        if images is None or text is None or videos is not None or not isinstance(text, list):
            return self._processor(images=images, text=text, videos=videos, **kwargs)
        call_key = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
        merged = self._merged.get(call_key)
        if merged is None:
            from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessorKwargs

            merged = self._processor._merge_kwargs(
                Qwen3VLProcessorKwargs, tokenizer_init_kwargs=self._processor.tokenizer.init_kwargs, **kwargs
            )
            self._merged[call_key] = merged
        image_inputs = self._processor.image_processor(images=images, **copy.copy(merged["images_kwargs"]))
        grids = tuple(int(x) for x in image_inputs["image_grid_thw"].flatten().tolist())
        key = (tuple(text), grids, call_key)
        cached = self._text.get(key)
        if cached is None:
            full = self._processor(images=images, text=text, **kwargs)
            self._text[key] = {k: v.clone() for k, v in full.items() if k not in IMAGE_KEYS}
            while len(self._text) > self._max_prompts:
                self._text.popitem(last=False)
            return full
        self._text.move_to_end(key)
        self.hits += 1
        from transformers.feature_extraction_utils import BatchFeature

        data = {k: v.clone() for k, v in cached.items()}
        data.update({k: image_inputs[k] for k in IMAGE_KEYS})
        return BatchFeature(data=data, tensor_type=merged["text_kwargs"].get("return_tensors"))


def install_caching_processor(preprocessor: Any) -> int:
    """Put a :class:`CachingVLProcessor` into LeRobot's GR00T VLM encode steps of ``preprocessor``;
    returns how many steps got one."""
    count = 0
    for step in getattr(preprocessor, "steps", []):
        if type(step).__name__ == "GrootN17VLMEncodeStep" and not isinstance(step.proc, CachingVLProcessor):
            step._proc = CachingVLProcessor(step.proc)
            count += 1
    return count
