"""Load and save Hugging Face causal-LM folders (config, safetensors shards, tokenizer, chat template).

Why our own loader around ``AutoModelForCausalLM``: a folder that is missing its tokenizer, its chat
template or a weight shard should fail before training starts, with a message that names the file,
not deep inside ``transformers`` or (worse) after a silently random-initialised layer. Loading is
always offline (``local_files_only``); the hub is never contacted. ``save_causal_lm`` writes the
folder ``transformers`` loads unchanged (``save_pretrained`` of the model and tokenizer, the chat
template as ``chat_template.jinja``), which is also what the exporter copies.

Image-text models (Qwen3-VL: ``*ForConditionalGeneration`` with a ``vision_config``) load the same way, through
``AutoModelForImageTextToText``, with their image processor (``preprocessor_config.json``) in
``CausalLM.processor``; the text trainers then take prompts with images (``cosmos_robot.text.vision``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmos_robot.policies.registry import CheckpointError, read_json, torch_dtype

__all__ = [
    "CausalLM",
    "check_causal_lm_folder",
    "is_causal_lm_config",
    "is_image_text_config",
    "load_causal_lm",
    "save_causal_lm",
]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "qwen.tiktoken")


def is_causal_lm_config(config: dict[str, Any]) -> bool:
    """An HF ``config.json`` (``model_type``) of a ``*ForCausalLM`` architecture, or an image-text one."""
    archs = config.get("architectures") or []
    return isinstance(config.get("model_type"), str) and (
        any(str(a).endswith("ForCausalLM") for a in archs) or is_image_text_config(config)
    )


def is_image_text_config(config: dict[str, Any]) -> bool:
    """An image-text generator (Qwen3-VL and kin): ``*ForConditionalGeneration`` with a ``vision_config``."""
    archs = config.get("architectures") or []
    return "vision_config" in config and any(str(a).endswith("ForConditionalGeneration") for a in archs)


def check_causal_lm_folder(root: Path) -> dict[str, Any]:
    """The folder's ``config.json``; a ``CheckpointError`` naming what is missing otherwise."""
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a model folder (does not exist or is a file)")
    config = read_json(root / "config.json")
    if not is_causal_lm_config(config):
        raise CheckpointError(
            f"{root / 'config.json'}: not a causal-LM config (needs 'model_type' and an 'architectures' entry "
            "ending in 'ForCausalLM', or 'ForConditionalGeneration' with a 'vision_config'; got "
            f"model_type={config.get('model_type')!r}, architectures={config.get('architectures')!r})"
        )
    index = root / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        missing = [s for s in shards if not (root / s).is_file()]
        if not shards or missing:
            raise CheckpointError(
                f"{index}: weight shards missing from the folder: {missing or 'the weight_map is empty'}"
            )
    elif not (root / "model.safetensors").is_file():
        found = sorted(p.name for p in root.iterdir())[:12]
        raise CheckpointError(f"{root}: missing model.safetensors (or model.safetensors.index.json); found {found}")
    if not any((root / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{root}: no tokenizer (expected one of {', '.join(TOKENIZER_FILES)})")
    if is_image_text_config(config) and not (root / "preprocessor_config.json").is_file():
        raise CheckpointError(f"{root}: an image-text model without its image processor (preprocessor_config.json)")
    return config


@dataclass
class CausalLM:
    """A loaded causal LM: the ``transformers`` model, its tokenizer and the ids generation stops on; an
    image-text model also its image processor."""

    model: Any
    tokenizer: Any
    folder: Path | None
    processor: Any = None  # the image processor of an image-text model (None: text only)

    @property
    def stop_ids(self) -> list[int]:
        """Token ids that end a completion: the tokenizer's eos and the generation config's eos ids."""
        ids: list[int] = []
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        for value in (eos if isinstance(eos, list) else [eos]) + [self.tokenizer.eos_token_id]:
            if isinstance(value, int) and value not in ids:
                ids.append(value)
        return ids

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.stop_ids[0])


def load_causal_lm(
    folder: str | Path, *, dtype: Any = "float32", device: Any = "cpu", require_chat_template: bool = True
) -> CausalLM:
    """An HF causal-LM folder, offline; the chat template is required unless told otherwise."""
    from transformers import AutoImageProcessor, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    root = Path(folder)
    image_text = is_image_text_config(check_causal_lm_folder(root))
    try:
        tokenizer = AutoTokenizer.from_pretrained(root, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds; name the folder
        raise CheckpointError(f"{root}: the tokenizer does not load ({type(exc).__name__}: {exc})") from exc
    if require_chat_template and not getattr(tokenizer, "chat_template", None):
        raise CheckpointError(
            f"{root}: the tokenizer has no chat template (chat_template.jinja or tokenizer_config.json "
            "'chat_template'); conversation SFT and the text RL trainers format prompts with it"
        )
    processor = None
    try:
        if image_text:
            processor = AutoImageProcessor.from_pretrained(root, local_files_only=True)
        auto = AutoModelForImageTextToText if image_text else AutoModelForCausalLM
        model = auto.from_pretrained(root, local_files_only=True, dtype=torch_dtype(dtype), attn_implementation="sdpa")
    except Exception as exc:
        raise CheckpointError(f"{root}: the model does not load ({type(exc).__name__}: {exc})") from exc
    return CausalLM(model.to(device), tokenizer, root, processor)


def save_causal_lm(lm: CausalLM, out: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
    """Write an HF folder ``transformers`` loads unchanged; ``extra`` goes to ``cosmos_robot.json``."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    lm.model.save_pretrained(root, safe_serialization=True)
    lm.tokenizer.save_pretrained(root)
    if lm.processor is not None:
        lm.processor.save_pretrained(root)
    if extra is not None:
        (root / "cosmos_robot.json").write_text(json.dumps(extra, indent=2, sort_keys=True) + "\n")
    return root
