"""bf16 numerics yardstick for GR00T N1.7, independent of trained weights: each path against float32.

The pi0.5 counterpart's question (``numerics_pi05.py``) for GR00T: on the same observations and the
same initial noise, how far is each path's chunk from LeRobot's float32 chunk?

- ``lerobot fp32``: LeRobot's ``predict_action_chunk`` with ``use_bf16=False``: the reference;
- ``lerobot bf16``: the same weights under LeRobot's own ``use_bf16=True`` (bf16 autocast, its default
  for the released model);
- ``ours fp32``, ``ours bf16 autocast`` (LeRobot's setting through our fast path), ``ours bf16 weights``
  (``dtype=bfloat16``: the weights cast, as served for speed); on CUDA the fast path is graphed.

GR00T draws its initial noise inside ``get_action`` in the features' dtype, so a bf16 run would start
from other noise than a float32 one. Here the noise is an input: one float32 draw, handed to every path
through ``torch.randn`` while the chunk is computed (cast to the dtype the path asks for), so what
differs between the rows is the arithmetic alone. Exits 1 when ``ours fp32`` is more than 1e-4 from
LeRobot's float32 chunk or ``ours bf16 autocast`` has a larger mean error than LeRobot's bf16.

    .venv/bin/python benchmarks/numerics_groot.py --size tiny                    # CPU, seconds
    python benchmarks/numerics_groot.py --size released --device cuda --batch 4   # H200
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from numerics_pi05 import error, verdict
from parity_pi05 import observations


@contextlib.contextmanager
def fixed_noise(noise: torch.Tensor) -> Iterator[None]:
    """``torch.randn`` of ``noise``'s shape returns ``noise`` (in the requested dtype and device)."""
    real = torch.randn

    def randn(*size: Any, **kwargs: Any) -> torch.Tensor:
        shape = tuple(kwargs.get("size", size[0] if len(size) == 1 and not isinstance(size[0], int) else size))
        if shape == tuple(noise.shape):
            return noise.to(dtype=kwargs.get("dtype") or noise.dtype, device=kwargs.get("device") or noise.device)
        return real(*size, **kwargs)

    torch.randn = randn  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.randn = real  # type: ignore[assignment]


def lerobot_chunk(policy: Any, obs: list[dict[str, Any]], noise: torch.Tensor, use_bf16: bool) -> np.ndarray:
    """LeRobot's own pipeline (preprocessor, ``predict_action_chunk``, postprocessor) of our loaded folder."""
    policy.policy.config.use_bf16 = use_bf16
    with torch.inference_mode(), fixed_noise(noise):
        out = policy.postprocessor(policy.policy.predict_action_chunk(policy.preprocessor(policy.io.batch(obs))))
    return np.asarray(out.float().cpu().numpy())


def float32_floor(
    policy: Any, obs: list[dict[str, Any]], noise: torch.Tensor, reference: np.ndarray
) -> dict[str, float]:
    """LeRobot's float32 chunk of each sample alone against the batched one: the same arithmetic with
    other matrix shapes, hence other kernels and summation orders. On random weights this float32 floor
    is what any second implementation can be expected to match, not zero."""
    alone = [lerobot_chunk(policy, [o], noise[i : i + 1], use_bf16=False)[0] for i, o in enumerate(obs)]
    return error(np.stack(alone), reference)


def ours_chunk(policy: Any, obs: list[dict[str, Any]], noise: torch.Tensor) -> np.ndarray:
    with fixed_noise(noise):
        return np.stack([r["actions"] for r in policy.infer_batch(obs)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "released"], default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folder", type=Path, default=None, help="reuse or build the GR00T folders here")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from cosmos_robot.policies.groot.policy import Gr00tPolicy
    from cosmos_robot.policies.groot.tiny import build_tiny_groot

    with tempfile.TemporaryDirectory() as tmp:
        root = args.folder or Path(tmp)
        folder = (
            root / "policy" if (root / "policy" / "config.json").is_file() else build_tiny_groot(root, size=args.size)
        )
        graphs = args.device.startswith("cuda")
        loaded = Gr00tPolicy.from_pretrained(folder, device=args.device, cuda_graphs=graphs)
        # the served policy reads use_bf16 when it is built (its graphs' autocast), so each precision
        # gets a policy built after setting it (the released config says use_bf16=True)
        loaded.policy.config.use_bf16 = False
        ours32 = Gr00tPolicy(loaded.policy, loaded.preprocessor, loaded.postprocessor, cuda_graphs=graphs)
        del loaded
        head = ours32.policy._groot_model.action_head
        gen = torch.Generator().manual_seed(args.seed + 7)
        noise = torch.randn((args.batch, head.config.action_horizon, head.action_dim), generator=gen)
        obs = observations(args.batch, args.seed)
        reference = lerobot_chunk(ours32, obs, noise, use_bf16=False)
        rows = {
            "lerobot fp32": error(reference, reference),
            "lerobot bf16": error(lerobot_chunk(ours32, obs, noise, use_bf16=True), reference),
        }
        ours32.policy.config.use_bf16 = False
        rows["ours fp32"] = error(ours_chunk(ours32, obs, noise), reference)
        rows["lerobot fp32, one sample at a time"] = float32_floor(ours32, obs, noise, reference)
        ours32.policy.config.use_bf16 = True  # read when the served policy (its graphs' autocast) is built
        autocast = Gr00tPolicy(ours32.policy, ours32.preprocessor, ours32.postprocessor, cuda_graphs=graphs)
        rows["ours bf16 autocast"] = error(ours_chunk(autocast, obs, noise), reference)
        del ours32, autocast
        ours16 = Gr00tPolicy.from_pretrained(folder, device=args.device, dtype="bfloat16", cuda_graphs=graphs)
        rows["ours bf16 weights"] = error(ours_chunk(ours16, obs, noise), reference)
    return verdict(f"GR00T N1.7 {args.size}", args, rows, reference, "ours bf16 autocast")


if __name__ == "__main__":
    raise SystemExit(main())
