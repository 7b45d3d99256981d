"""FP8 linear layers for serving on Hopper GPUs: weights and activations in ``float8_e4m3fn``.

Why: at batch 8 a released pi0.5 chunk is ~80% the VLM's and SigLIP's GEMMs over ~5,000 prefix tokens,
and those already run at ~660 TFLOP/s in bfloat16 on an H100 (docs/benchmarks.md, issue 19): the
only way to make them much faster is fewer bits. Hopper's tensor cores multiply FP8 at twice the
bfloat16 rate.

The scheme is the one inference engines use for FP8 checkpoints of bfloat16 models ("dynamic
row-wise"): every weight row (output channel) gets its own float32 scale, fixed at conversion;
every activation row (token) gets its own scale, computed at each call from its absolute maximum;
both are cast to e4m3 (3 mantissa bits, largest finite 448) and multiplied by ``torch._scaled_mm``,
which accumulates in float32 and applies both scales in its epilogue. Relative rounding of each
operand is at most 2^-4, so a product's error is a few percent of each element's magnitude before
the accumulation averages it down: an accuracy trade, measured against float32 beside bfloat16 by
``benchmarks/numerics_pi05.py`` and opt-in (``precision="fp8"``), never a default.

``torch._scaled_mm`` multiplies row-wise-scaled operands only on CUDA devices of compute capability
9.0 or newer; :func:`check_fp8_device` says so before a model is converted. :func:`fp8_reference_mm`
is the same product computed from the same quantised values in float32, on any device: what the CPU
tests compare the conversion against, and what the GPU check compares the kernel against.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = [
    "FP8_MAX",
    "Fp8Linear",
    "check_fp8_device",
    "convert_linears",
    "fp8_reference_mm",
    "fp8_shaped",
    "quantize_rows",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
_MIN_SCALE = 1e-12  # an all-zero row quantises to zeros with this scale instead of dividing by 0


def check_fp8_device(device: torch.device | str) -> None:
    """Raise ``ValueError`` unless ``device`` can run row-wise scaled FP8 GEMMs (CUDA, capability >= 9.0)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"precision 'fp8' needs a CUDA GPU of compute capability >= 9.0 (Hopper); got device {dev}")
    major, minor = torch.cuda.get_device_capability(dev)
    if major < 9:
        name = torch.cuda.get_device_name(dev)
        raise ValueError(
            f"precision 'fp8' needs compute capability >= 9.0 (Hopper) for row-wise scaled FP8 GEMMs; "
            f"{name} is {major}.{minor}: use precision 'bf16'"
        )


def quantize_rows(t: Tensor) -> tuple[Tensor, Tensor]:
    """``t`` (M, K) -> (``float8_e4m3fn`` values (M, K), float32 scales (M, 1)) with
    ``values.float() * scales ~= t``: each row scaled so its absolute maximum maps to 448."""
    amax = t.detach().abs().amax(dim=-1, keepdim=True).float()
    scale = amax.clamp(min=_MIN_SCALE) / FP8_MAX
    values = (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values, scale


def fp8_reference_mm(x_q: Tensor, x_scale: Tensor, w_q: Tensor, w_scale: Tensor) -> Tensor:
    """What ``torch._scaled_mm(x_q, w_q.t(), x_scale, w_scale.t())`` computes, in float32 from the
    same quantised values: (M, K) x (N, K) -> (M, N)."""
    return (x_q.float() * x_scale) @ (w_q.float() * w_scale).t()


class Fp8Linear(nn.Module):
    """``nn.Linear``'s forward with FP8 operands: the weight quantised once per output channel, the
    input per row at every call; output in ``out_dtype`` (the layer's original dtype). Not
    trainable: a serving conversion (:func:`convert_linears`)."""

    weight_q: Tensor
    weight_scale: Tensor
    bias: Tensor | None

    def __init__(self, weight_q: Tensor, weight_scale: Tensor, bias: Tensor | None, out_dtype: torch.dtype) -> None:
        super().__init__()
        n, k = weight_q.shape
        if k % 16 or n % 16:
            raise ValueError(f"FP8 GEMMs need both weight dims divisible by 16; got ({n}, {k})")
        self.in_features, self.out_features, self.out_dtype = k, n, out_dtype
        self.register_buffer("weight_q", weight_q)
        self.register_buffer("weight_scale", weight_scale.reshape(n, 1).float())
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        w_q, w_scale = quantize_rows(linear.weight.data)
        bias = None if linear.bias is None else linear.bias.data.clone()
        return cls(w_q, w_scale, bias, linear.weight.dtype)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        x_q, x_scale = quantize_rows(x.reshape(-1, self.in_features))
        if x.is_cuda:
            out = torch._scaled_mm(
                x_q, self.weight_q.t(), scale_a=x_scale, scale_b=self.weight_scale.t(), out_dtype=self.out_dtype
            )
        else:  # the same arithmetic in float32: tests on machines without a Hopper GPU
            out = fp8_reference_mm(x_q, x_scale, self.weight_q, self.weight_scale).to(self.out_dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=e4m3 row-wise"


def fp8_shaped(name: str, layer: nn.Linear) -> bool:
    """Whether ``layer``'s sizes allow an FP8 GEMM (both multiples of 16)."""
    return layer.in_features % 16 == 0 and layer.out_features % 16 == 0


def convert_linears(root: nn.Module, select: Callable[[str, nn.Linear], bool]) -> list[str]:
    """Replace every ``nn.Linear`` under ``root`` for which ``select(qualified name, layer)`` is true
    by its :class:`Fp8Linear`; returns the converted names (in module order)."""
    converted = []
    for name, module in list(root.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and select(full, child):
                setattr(module, child_name, Fp8Linear.from_linear(child))
                converted.append(full)
    return converted
