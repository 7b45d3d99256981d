"""Safetensors I/O that checks the file against the model *before* loading.

Why check first: ``load_state_dict`` on a mismatched file fails with a wall of text (or, with
``strict=False``, silently keeps random weights). Reading only the safetensors header (names,
shapes, dtypes) costs nothing and lets the error name the tensor and both shapes, and list the
missing and unexpected names. Checked against a model built on the ``meta`` device (shapes, no
memory), a config that asks for ``expert_width=20000`` fails in about a second naming the tensor,
instead of allocating gigabytes first. Used by the flow family; any torch family can reuse it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from cosmos_robot.policies.registry import CheckpointError

__all__ = ["check_safetensors", "load_safetensors", "save_safetensors"]


def save_safetensors(module: nn.Module, path: str | Path) -> None:
    """Write every parameter and persistent buffer as contiguous CPU tensors."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in module.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def check_safetensors(module: nn.Module, path: str | Path) -> None:
    """Raise ``CheckpointError`` naming every tensor whose name, shape or dtype differs from ``module``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing weights file ({path.name})")
    expected = {name: t for name, t in module.state_dict().items()}
    try:
        with safe_open(str(path), framework="pt") as f:
            found = {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc
    problems = []
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing:
        problems.append(f"missing tensors {missing}")
    if unexpected:
        problems.append(f"unexpected tensors {unexpected} (not in this model; written by a different config?)")
    for name in sorted(set(expected) & set(found)):
        want_shape, want_dtype = tuple(expected[name].shape), expected[name].dtype
        got_shape, got_dtype = found[name]
        if got_shape != want_shape:
            problems.append(f"tensor {name!r} has shape {got_shape} in the file but the config builds {want_shape}")
        elif _dtype_name(want_dtype) != got_dtype:
            problems.append(
                f"tensor {name!r} has dtype {got_dtype} in the file, the model expects {_dtype_name(want_dtype)}"
            )
    if problems:
        raise CheckpointError(f"{path}: weights do not match the config:\n  " + "\n  ".join(problems))


def load_safetensors(module: nn.Module, path: str | Path, device: str | torch.device = "cpu") -> None:
    """Check then load ``path`` into ``module`` (strict: every tensor present, nothing extra)."""
    check_safetensors(module, path)
    try:
        tensors = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:  # a header that parses over a damaged body
        raise CheckpointError(f"{path}: the tensor data cannot be read ({exc})") from exc
    module.load_state_dict(tensors, strict=True)


def _dtype_name(dtype: torch.dtype) -> str:
    """safetensors' header spelling of a torch dtype (``torch.float32`` -> ``F32``)."""
    names = {
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.float64: "F64",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
    }
    return names.get(dtype, str(dtype))
