"""Policy families by name: one entry per family, everything about it imported lazily.

Why one registry: serving, the RL and SFT trainers and the exporters all need "the thing this family
does for me" (its serving policy, its RL adapter, its SFT adapter, its exporter, a tiny checkpoint for
debug recipes). Each ``Family`` entry names those as ``"module:attribute"`` strings resolved on first
use, so loading a flow policy never imports LeRobot's pi05 or diffusers' Cosmos3 (seconds of imports,
gigabytes of optional deps), and the core names trainer or exporter modules without importing them
(the distribution graph keeps pointing down). Nothing anywhere compares family names: callers ask
``family_of(folder)`` or ``get_family(name)`` and call what the entry supplies; an entry without a
capability answers with an error naming the families that have it.

The folder formats differ per family and each entry says how to recognise its own:

- ours (``flow``): ``config.json`` with ``"type": "flow"``, ``model.safetensors``, ``policy.json``
  (transforms and normalisation stats);
- LeRobot (``pi05``, ``groot``): ``config.json`` with LeRobot's ``"type"``, ``model.safetensors``,
  ``policy_preprocessor.json`` / ``policy_postprocessor.json``;
- diffusers (``cosmos3``): ``model_index.json`` naming the pipeline class.

Adding a family: docs/families.md, "Adding a family".
"""

from __future__ import annotations

import difflib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cosmos_robot.policies.interfaces import RLAdapter

__all__ = [
    "FAMILIES",
    "CheckpointError",
    "Family",
    "detect_family",
    "family_of",
    "get_family",
    "load_policy_class",
    "read_json",
    "register_family",
    "require_files",
]


@dataclass(frozen=True)
class Family:
    """One policy family; each capability is a ``"module:attribute"`` resolved when first asked for."""

    name: str
    policy: str | None  # the serving policy class (``from_pretrained(folder, **options)`` -> ``BatchPolicy``)
    config_types: tuple[str, ...] = ()  # ``config.json`` "type" values of its folders
    # ``"module:predicate"``: ``predicate(config_json) -> bool`` for folders whose config.json has no "type"
    # (Hugging Face folders carry ``model_type`` and ``architectures`` instead)
    config_match: str | None = None
    pipelines: tuple[str, ...] = ()  # ``model_index.json`` "_class_name" values (diffusers folders)
    rl: str | None = None  # an ``RLAdapter`` subclass (``from_checkpoint``): RL trainers
    sft: str | None = None  # an ``SFTAdapter`` class (cosmos_robot_trainers.sft.adapter): the SFT trainer
    export: str | None = None  # an ``Exporter`` class (cosmos_robot_exporters.base): ``cosmos-robot export``
    tiny: str | None = None  # ``write_tiny(out_dir) -> folder``: a tiny random checkpoint for debug recipes
    # loader options ``serve --ckpt`` and ``eval --ckpt`` pass unless ``-a`` says otherwise: what a server
    # needs and the library default must not do (GR00T: one token length for every prompt, see its policy)
    serve_options: tuple[tuple[str, Any], ...] = ()

    def policy_class(self) -> Any:
        """The serving policy class (a ``CheckpointError`` for a family that is not a robot policy)."""
        if self.policy is None:
            raise CheckpointError(
                f"the {self.name} family is not a robot policy: `serve --ckpt` streams action chunks; evaluate "
                "a text model with `cosmos-robot eval --ckpt DIR --suite text/<task>`"
            )
        return _resolve(self.policy)

    def rl_adapter(
        self, path: str | Path, *, device: Any = "cpu", noise_level: float | None = None, freeze_vlm: bool = False
    ) -> RLAdapter:
        """The RL adapter of the checkpoint folder ``path`` (of this family)."""
        from cosmos_robot.policies.interfaces import RLAdapter

        cls = self._capability("rl", "RL post-training")
        if not (isinstance(cls, type) and issubclass(cls, RLAdapter)):
            raise TypeError(f"family {self.name!r}: rl={self.rl!r} is not an RLAdapter subclass")
        return cls.from_checkpoint(str(path), device=device, noise_level=noise_level, freeze_vlm=freeze_vlm)

    def sft_adapter(self) -> object:
        """An instance of the family's SFT adapter (the SFT trainer checks it against its Protocol)."""
        return self._capability("sft", "supervised fine-tuning")()

    def exporter(self) -> object:
        """An instance of the family's exporter (``cosmos_robot_exporters`` checks it against its Protocol)."""
        return self._capability("export", "export")()

    def write_tiny(self, out: str | Path) -> Path:
        """Write a tiny random checkpoint of this family under ``out``; returns the folder to load."""
        return Path(self._capability("tiny", "tiny debug checkpoints")(Path(out)))

    def _capability(self, field: str, what: str) -> Any:
        target = getattr(self, field)
        if target is None:
            able = sorted(name for name, fam in FAMILIES.items() if getattr(fam, field) is not None)
            raise CheckpointError(
                f"the {self.name} family does not support {what} (families that do: {', '.join(able) or 'none'})"
            )
        return _resolve(target)


_CORE, _SFT, _EXPORT = "cosmos_robot.policies", "cosmos_robot_trainers.sft", "cosmos_robot_exporters"
FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            "flow",
            f"{_CORE}.flow.policy:FlowPolicy",
            config_types=("flow",),
            rl=f"{_CORE}.flow.rl:FlowRLAdapter",
            sft=f"{_SFT}.flow:FlowSFTAdapter",
            export=f"{_EXPORT}.flow:FlowExporter",
        ),
        Family(
            "pi05",
            f"{_CORE}.pi05.policy:Pi05Policy",
            ("pi05",),
            rl=f"{_CORE}.pi05.rl:Pi05RLAdapter",
            sft=f"{_SFT}.pi05:Pi05SFTAdapter",
            export=f"{_EXPORT}.pi05:Pi05Exporter",
            tiny=f"{_CORE}.pi05.tiny:write_tiny",
        ),
        Family(
            "groot",
            f"{_CORE}.groot.policy:Gr00tPolicy",
            ("groot",),
            rl=f"{_CORE}.groot.rl:Gr00tRLAdapter",
            sft=f"{_SFT}.groot:Gr00tSFTAdapter",
            export=f"{_EXPORT}.groot:Gr00tExporter",
            tiny=f"{_CORE}.groot.tiny:write_tiny",
            serve_options=(("text_tokens", 128),),
        ),
        Family(
            "cosmos3",
            f"{_CORE}.cosmos3.policy:Cosmos3Policy",
            pipelines=("Cosmos3OmniPipeline",),
            tiny=f"{_CORE}.cosmos3.tiny:write_tiny",
        ),
        Family(
            "hf_causal_lm",  # any AutoModelForCausalLM folder (Qwen2, Qwen3, Qwen3-MoE, ...): text post-training
            None,
            config_match="cosmos_robot.text.hf:is_causal_lm_config",
            export=f"{_EXPORT}.hf_lm:HFCausalLMExporter",
            tiny="cosmos_robot.text.tiny:write_tiny",
        ),
    )
}


def _resolve(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file, key or tensor."""


def register_family(family: Family) -> None:
    """Add (or replace) a family entry, e.g. from a plugin package."""
    for field in ("policy", "rl", "sft", "export", "tiny", "config_match"):
        target = getattr(family, field)
        if target is not None and ":" not in target:
            raise ValueError(f"register_family({family.name!r}): {field} must be 'module:attribute', got {target!r}")
    FAMILIES[family.name] = family


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint JSON file as a dict; a clear ``CheckpointError`` naming the file otherwise
    (missing, a folder, unreadable, not UTF-8 text, not JSON, not an object)."""
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, expected a JSON file")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (or not a regular file)")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not a text JSON file (byte {exc.start} is not UTF-8: binary data?)") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def require_files(root: Path, names: tuple[str, ...], what: str, note: str = "") -> None:
    """``root`` is a folder holding ``names``; else a ``CheckpointError`` listing what is missing and found."""
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a checkpoint folder (does not exist or is a file)")
    missing = [name for name in names if not (root / name).is_file()]
    if missing:
        found = sorted(p.name for p in root.iterdir())[:12]
        raise CheckpointError(
            f"{root}: missing {', '.join(missing)} (a {what} folder holds {', '.join(names)}{note}; "
            f"found {found or 'nothing'})"
        )


def torch_dtype(value: Any) -> Any:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or a ``torch.dtype``) as a ``torch.dtype``;
    anything else is a ``CheckpointError`` listing the choices."""
    import torch

    if isinstance(value, torch.dtype):
        return value
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if value not in table:
        raise CheckpointError(f"dtype must be one of {sorted(table)}, got {value!r}")
    return table[value]


def _unknown(what: str, name: str, known: list[str]) -> str:
    hint = difflib.get_close_matches(name, known, n=1)
    extra = f"; did you mean {hint[0]!r}?" if hint else f"; known: {sorted(known)}"
    return f"unknown {what} {name!r}{extra}"


def family_of(ckpt_dir: str | Path) -> Family:
    """The family of a checkpoint folder, from ``config.json``'s type or ``model_index.json``'s pipeline."""
    root = Path(ckpt_dir)
    if not root.exists():
        raise CheckpointError(f"checkpoint folder {root} does not exist")
    if not root.is_dir():
        raise CheckpointError(f"{root} is a file; pass the checkpoint folder that holds config.json")
    if (root / "model_index.json").exists():
        cls = str(read_json(root / "model_index.json").get("_class_name", ""))
        for family in FAMILIES.values():
            if cls in family.pipelines:
                return family
        raise CheckpointError(f"{root}/model_index.json: diffusers pipeline {cls!r} is not a supported policy family")
    config_path = root / "config.json"
    if not config_path.exists():
        present = sorted(p.name for p in root.iterdir())[:10]
        raise CheckpointError(f"{root}: missing config.json (found {present or 'nothing'})")
    config = read_json(config_path)
    kind = config.get("type")
    types = {t: family for family in FAMILIES.values() for t in family.config_types}
    if kind is None:
        for family in FAMILIES.values():
            if family.config_match is not None and _resolve(family.config_match)(config):
                return family
    if not isinstance(kind, str) or not kind:
        raise CheckpointError(f"{config_path}: missing the 'type' field naming the policy family ({sorted(types)})")
    if kind not in types:
        raise CheckpointError(f"{config_path}: {_unknown('policy type', kind, list(types))}")
    return types[kind]


def detect_family(ckpt_dir: str | Path) -> str:
    """The family name of a checkpoint folder (``family_of(...).name``)."""
    return family_of(ckpt_dir).name


def get_family(name: str) -> Family:
    """The registry entry called ``name``; a "did you mean" otherwise."""
    if name not in FAMILIES:
        raise CheckpointError(_unknown("policy family", name, list(FAMILIES)))
    return FAMILIES[name]


def load_policy_class(family: str) -> Any:
    """Import the serving policy class of ``family``."""
    return get_family(family).policy_class()
