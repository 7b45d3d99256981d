"""LeRobot ``pi05`` checkpoint folders: read, check and write them.

A folder as LeRobot 0.6.1 writes it (``PI05Policy.save_pretrained`` + the processor pipelines):

- ``config.json``: LeRobot's ``PI05Config`` (``"type": "pi05"``, variants, chunk, features, ...);
- ``model.safetensors``: ``PI05Pytorch`` weights under ``model.*`` (openpi-converted files without
  the prefix and with ``action_time_mlp_*`` names load too, as in LeRobot);
- ``policy_preprocessor.json`` + ``..._normalizer_processor.safetensors`` and
  ``policy_postprocessor.json`` + ``..._unnormalizer_processor.safetensors``: LeRobot's processor
  pipelines (rename, batch, normalise with quantiles, state-in-prompt, tokenise; unnormalise).

Two optional additions that LeRobot ignores:

- ``tokenizer/``: the prompt tokenizer. Released checkpoints name
  ``google/paligemma-3b-pt-224`` (gated); it must be in the folder, at a local path, or in the HF
  cache: it is fetched from the hub only when asked (``allow_download``, ``serve --allow-download``),
  so serving never reaches the network by surprise, and the error names the missing tokenizer;
- ``pi05_architecture.json``: explicit sizes for models that are not the released
  ``gemma_2b`` + ``gemma_300m`` (LeRobot's config can only name those two), e.g. tiny test models.

Every check runs on the safetensors header before any tensor is read, so a wrong folder fails in
milliseconds with the file, tensor and both shapes named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from cosmos_robot.policies.pi05.modeling import VARIANTS, Pi05Architecture, Pi05Model, VisionSpec
from cosmos_robot.policies.registry import CheckpointError, read_json, require_files

__all__ = [
    "ARCH_FILE",
    "CONFIG_FILE",
    "POSTPROCESSOR_FILE",
    "PREPROCESSOR_FILE",
    "TOKENIZER_DIR",
    "WEIGHTS_FILE",
    "architecture_from_config",
    "find_tokenizer",
    "load_weights",
    "param_dtype",
    "read_config",
    "save_weights",
    "tokenizer_name",
]

CONFIG_FILE, WEIGHTS_FILE, ARCH_FILE = "config.json", "model.safetensors", "pi05_architecture.json"
PREPROCESSOR_FILE, POSTPROCESSOR_FILE = "policy_preprocessor.json", "policy_postprocessor.json"
TOKENIZER_DIR = "tokenizer"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, PREPROCESSOR_FILE, POSTPROCESSOR_FILE)
# present in LeRobot's files, unused for actions (PaliGemma's tied LM head, the expert's LM head)
_SKIPPED = ("paligemma_with_expert.paligemma.lm_head.weight", "paligemma_with_expert.gemma_expert.lm_head.weight")
_RENAMES = (("action_time_mlp_in.", "time_mlp_in."), ("action_time_mlp_out.", "time_mlp_out."))


def check_folder(root: Path) -> None:
    """The folder exists and holds LeRobot's four pi05 files."""
    require_files(root, REQUIRED_FILES, "LeRobot pi05", " and the processors' .safetensors stats")


def read_config(root: Path) -> dict[str, Any]:
    """``config.json`` with the fields the native model needs checked for type and range."""
    path = root / CONFIG_FILE
    cfg = read_json(path)
    if cfg.get("type") != "pi05":
        raise CheckpointError(f"{path}: 'type' is {cfg.get('type')!r}, expected 'pi05'")
    for key in ("chunk_size", "n_action_steps", "max_action_dim", "max_state_dim", "num_inference_steps"):
        value = cfg.get(key)
        if not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{path}: '{key}' must be a positive integer, got {value!r}")
    if cfg["n_action_steps"] > cfg["chunk_size"]:
        raise CheckpointError(
            f"{path}: n_action_steps ({cfg['n_action_steps']}) is larger than chunk_size ({cfg['chunk_size']})"
        )
    for key in ("input_features", "output_features"):
        if not isinstance(cfg.get(key), dict) or not cfg[key]:
            raise CheckpointError(f"{path}: '{key}' must be a non-empty table of features")
    action = cfg["output_features"].get("action")
    if not isinstance(action, dict) or not isinstance(action.get("shape"), list) or len(action["shape"]) != 1:
        raise CheckpointError(f"{path}: output_features.action must have a 1-D 'shape', got {action!r}")
    if action["shape"][0] > cfg["max_action_dim"]:
        raise CheckpointError(
            f"{path}: the action has {action['shape'][0]} dims but max_action_dim is {cfg['max_action_dim']}"
        )
    images = [k for k, f in cfg["input_features"].items() if isinstance(f, dict) and f.get("type") == "VISUAL"]
    if not images:
        raise CheckpointError(f"{path}: input_features has no VISUAL feature (pi05 needs at least one camera)")
    res = cfg.get("image_resolution", [224, 224])
    if not (isinstance(res, list) and len(res) == 2 and res[0] == res[1] and isinstance(res[0], int)):
        raise CheckpointError(f"{path}: image_resolution must be a square [H, W], got {res!r}")
    return cfg


def architecture_from_config(root: Path, cfg: dict[str, Any]) -> Pi05Architecture:
    """Sizes from ``pi05_architecture.json`` when present, else from LeRobot's variant names."""
    common = {
        "chunk_size": cfg["chunk_size"],
        "max_action_dim": cfg["max_action_dim"],
        "min_period": float(cfg.get("min_period", 4e-3)),
        "max_period": float(cfg.get("max_period", 4.0)),
    }
    arch_path = root / ARCH_FILE
    if arch_path.is_file():
        data = read_json(arch_path)
        for key, value in common.items():
            if key in data and data[key] != value:
                raise CheckpointError(f"{arch_path}: {key} is {data[key]!r} but {CONFIG_FILE} says {value!r}")
        try:
            return Pi05Architecture.from_dict({**data, **common})
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"{arch_path}: {exc}") from exc
    variants = {}
    for key in ("paligemma_variant", "action_expert_variant"):
        name = cfg.get(key)
        if name not in VARIANTS:
            raise CheckpointError(
                f"{root / CONFIG_FILE}: {key} {name!r} is not a released size ({sorted(VARIANTS)}); "
                f"give other sizes in {ARCH_FILE}"
            )
        variants[key] = VARIANTS[name]
    vision = VisionSpec(image_size=int(cfg.get("image_resolution", [224, 224])[0]))
    return Pi05Architecture(
        vlm=variants["paligemma_variant"], expert=variants["action_expert_variant"], vision=vision, **common
    )


def _file_name(key: str) -> str:
    for old, new in _RENAMES:
        if key.startswith(old):
            key = new + key[len(old) :]
    return key


def _header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc


# LeRobot's PI05 in bfloat16 keeps these in float32 (``to_bfloat16_for_selected_params``): the whole
# vision path, every RMSNorm (adaptive ones included) and everything outside ``paligemma_with_expert``
_FP32_SELECTORS = ("vision_tower", "multi_modal_projector", "input_layernorm", "post_attention_layernorm", "model.norm")


PRECISIONS = ("mixed", "bf16", "fp8")


def param_dtype(name: str, dtype: torch.dtype, precision: str = "mixed") -> torch.dtype:
    """The dtype parameter ``name`` gets: ``dtype``, except float32 where LeRobot keeps it (``mixed``).

    ``precision="bf16"`` casts everything (fastest on a GPU; not LeRobot's numerics); ``"fp8"`` loads
    as ``"bf16"`` does, the policy then converts the prefix's linear layers (``Pi05Model.to_fp8``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if dtype != torch.bfloat16 or precision != "mixed":
        return dtype
    if not name.startswith("paligemma_with_expert.") or any(sel in name for sel in _FP32_SELECTORS):
        return torch.float32
    return dtype


def load_weights(model: Pi05Model, path: Path, dtype: torch.dtype | None = None, precision: str = "mixed") -> None:
    """Load LeRobot's ``model.safetensors`` into ``model`` strictly (lm_heads skipped), checking the header first."""
    header = _header(path)
    prefixed = any(k.startswith("model.") for k in header)
    by_name: dict[str, str] = {}
    for key in header:
        name = key[len("model.") :] if prefixed and key.startswith("model.") else key
        by_name[_file_name(name)] = key
    expected = model.state_dict()
    problems = []
    missing = sorted(set(expected) - set(by_name))
    unexpected = sorted(set(by_name) - set(expected) - set(_SKIPPED))
    if missing:
        head = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        problems.append(f"missing tensors: {head}")
    if unexpected:
        head = ", ".join(unexpected[:6]) + (f" and {len(unexpected) - 6} more" if len(unexpected) > 6 else "")
        problems.append(f"unexpected tensors (not part of pi05 at these sizes): {head}")
    for name in sorted(set(expected) & set(by_name)):
        got, want = header[by_name[name]][0], tuple(expected[name].shape)
        if got != want:
            problems.append(f"tensor {by_name[name]!r} has shape {got} in the file, the architecture needs {want}")
    if problems:
        raise CheckpointError(f"{path}: weights do not match the pi05 architecture:\n  " + "\n  ".join(problems[:12]))
    state = {}
    with safe_open(str(path), framework="pt") as f:
        for name in expected:
            t = f.get_tensor(by_name[name])
            state[name] = (
                t.to(param_dtype(name, dtype, precision)) if dtype is not None and t.is_floating_point() else t
            )
    model.load_state_dict(state, strict=True, assign=True)


def save_weights(model: Pi05Model, path: Path) -> None:
    """Write LeRobot's layout: ``model.*`` keys plus the two LM heads its loader requires.

    PaliGemma's head is tied to the token embedding; the expert's is never used for actions and is
    written as zeros so that LeRobot's strict loader accepts the file. An FP8-converted model
    (``Pi05Model.to_fp8``, a serving conversion) is refused: its quantised layers have no LeRobot key.
    """
    if model.fp8_layers():
        raise ValueError(
            f"cannot save a pi05 model served in FP8 ({len(model.fp8_layers())} converted layers): LeRobot's "
            "format holds bf16/float32 weights; save the model loaded without precision='fp8'"
        )
    sd = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    embed = model.state_dict()["paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"]
    sd["model.paligemma_with_expert.paligemma.lm_head.weight"] = embed.detach().cpu().clone()
    sd["model.paligemma_with_expert.gemma_expert.lm_head.weight"] = torch.zeros(
        embed.shape[0], model.arch.expert.width, dtype=embed.dtype
    )
    save_file(sd, str(path), metadata={"format": "pt"})


def find_tokenizer(root: Path, allow_download: bool = False) -> Any:
    """The prompt tokenizer: ``DIR/tokenizer``, else the preprocessor's ``tokenizer_name`` (a local
    path, or a hub id from the HF cache; fetched from the hub only with ``allow_download``)."""
    from transformers import AutoTokenizer

    local = root / TOKENIZER_DIR
    if local.is_dir():
        try:
            return AutoTokenizer.from_pretrained(str(local), local_files_only=True)
        except (OSError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{local}: not a loadable tokenizer folder ({exc})") from exc
    name = tokenizer_name(root)
    if name.startswith(("/", ".", "~")) and not Path(name).expanduser().is_dir():
        raise CheckpointError(
            f"{root / PREPROCESSOR_FILE}: names the tokenizer folder {name!r}, which does not exist; "
            f"put the tokenizer in {local}"
        )
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=not allow_download)
    except (OSError, ValueError) as exc:
        if allow_download:
            raise CheckpointError(
                f"{root}: the pi05 tokenizer {name!r} named in {PREPROCESSOR_FILE} could not be fetched ({exc}); "
                f"save it into {local} (AutoTokenizer.from_pretrained({name!r}).save_pretrained(...))"
            ) from exc
        raise CheckpointError(_missing_tokenizer(root, name)) from exc


def tokenizer_name(root: Path) -> str:
    """The ``tokenizer_name`` of the preprocessor's tokenizer step (a hub id or a local path)."""
    name = None
    for step in read_json(root / PREPROCESSOR_FILE).get("steps", []):
        if isinstance(step, dict) and isinstance(step.get("config"), dict) and "tokenizer_name" in step["config"]:
            name = step["config"]["tokenizer_name"]
    if not isinstance(name, str) or not name:
        raise CheckpointError(
            f"{root}: no tokenizer: put the tokenizer files in {root / TOKENIZER_DIR} "
            f"(its {PREPROCESSOR_FILE} names none)"
        )
    return name


def _missing_tokenizer(root: Path, name: str) -> str:
    """Which tokenizer is missing, where it was looked for, and the two ways to provide it."""
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE) / ("models--" + name.replace("/", "--"))
    return (
        f"pi05 tokenizer {name!r} (named in {root / PREPROCESSOR_FILE}) is not in the local Hugging Face cache "
        f"(looked for tokenizer.json/tokenizer.model under {cache}); pass --allow-download to fetch it "
        f"(Python: allow_download=True), or put the tokenizer in the checkpoint folder ({root / TOKENIZER_DIR})"
    )


def write_architecture(root: Path, arch: Pi05Architecture) -> None:
    """``pi05_architecture.json`` for sizes LeRobot's config cannot name (skipped for the released sizes)."""
    if (
        arch.vlm == VARIANTS["gemma_2b"]
        and arch.expert == VARIANTS["gemma_300m"]
        and arch.vision == VisionSpec(image_size=arch.vision.image_size)
        and arch.vocab_size == 257_152
    ):
        (root / ARCH_FILE).unlink(missing_ok=True)
        return
    (root / ARCH_FILE).write_text(json.dumps(arch.to_dict(), indent=2) + "\n")
