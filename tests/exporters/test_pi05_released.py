"""At the released sizes (gemma_2b + gemma_300m + SigLIP so400m, 4.1 B parameters) a pi05 export is a folder
that stock LeRobot 0.6.1 loads with no help (no sizes file) and that predicts what our Pi05Policy predicts.
Random weights; 2 x 18 GB on disk; run on the GPU machine (`pytest -m gpu tests/exporters`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_robot.policies.pi05.modeling import Pi05Architecture, Pi05Model
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot.policies.pi05.tiny import quantile_stats, tiny_lerobot_config
from cosmos_robot.policies.pi05.tokenizer import make_byte_tokenizer
from cosmos_robot_exporters.pi05 import Pi05Exporter
from tests.exporters.test_pi05 import lerobot_actions
from tests.policies._pi05_helpers import libero_obs


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(580)
def test_released_size_export_loads_in_stock_lerobot(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA and ~40 GB of disk (4.1 B parameters, float32)")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    root = Path(os.environ.get("EXPORT_TMP", tmp_path))
    t0 = time.perf_counter()
    arch = Pi05Architecture(chunk_size=10, max_action_dim=32)  # the released widths and depths
    with torch.device("cuda"):
        model = Pi05Model(arch)
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():  # every parameter random: no wiring hides behind LeRobot's zero inits
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, device="cuda") * 0.02)
    config = tiny_lerobot_config(arch, n_action_steps=5)
    config.image_resolution = (224, 224)
    stats = {"observation.state": quantile_stats(8, 0), "action": quantile_stats(7, 1)}
    src = Pi05Policy.from_model(model, config, stats, make_byte_tokenizer(), cuda_graphs=False).save_pretrained(
        root / "src"
    )
    del model
    torch.cuda.empty_cache()
    result = Pi05Exporter().export(src, root / "out", target="lerobot", base=None, overwrite=True)
    t_export = time.perf_counter() - t0
    assert not (result.out / "pi05_architecture.json").exists()  # the released sizes need no sizes file
    assert not any("lerobot_pi05_sizes" in n for n in result.notes)
    ours = Pi05Policy.from_pretrained(result.out, device="cuda", cuda_graphs=False)
    obs = [libero_obs(0, size=224), libero_obs(1, size=224, prompt="open the top drawer")]
    noise = torch.randn((2, arch.chunk_size, arch.max_action_dim), generator=torch.Generator().manual_seed(11))
    mine = np.stack([r["actions"] for r in ours.infer_batch(obs, noise=noise)])
    del ours
    torch.cuda.empty_cache()
    ref = lerobot_actions(result.out, obs, noise, device="cuda")  # stock LeRobot: the sizes context is a no-op here
    diff, scale = float(np.abs(ref - mine).max()), float(np.abs(ref).max())
    print(f"released pi05: export {t_export:.0f} s, total {time.perf_counter() - t0:.0f} s, "
          f"max |LeRobot - ours| {diff:.3g} on actions of scale {scale:.3g}")  # fmt: skip
    assert diff < 1e-3 < scale
