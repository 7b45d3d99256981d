"""The pi05 exporter: a LeRobot pi05 folder that LeRobot 0.6.1's own PI05Policy loads and that predicts
what our Pi05Policy predicts (same observation, same noise), the value head dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cosmos_robot.manifest import verify_manifest
from cosmos_robot.policies import load_policy_folder
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot.policies.pi05.tiny import build_tiny_pi05
from cosmos_robot.policies.registry import get_family
from cosmos_robot_exporters import export_checkpoint
from cosmos_robot_exporters.lerobot_pi05 import lerobot_pi05_sizes
from cosmos_robot_exporters.pi05 import Pi05Exporter
from tests.exporters._runs import perturbed, write_run
from tests.policies._pi05_helpers import libero_obs


@pytest.fixture(scope="module")
def init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_pi05(seed=3).save_pretrained(tmp_path_factory.mktemp("pi05") / "init")


def lerobot_actions(folder: Path, obs: list[dict[str, Any]], noise: torch.Tensor, device: str = "cpu") -> np.ndarray:
    """LeRobot's own pipeline on the folder: its processors, PI05Policy.predict_action_chunk, first n_action_steps."""
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi05 import PI05Policy
    from transformers import AutoTokenizer

    with lerobot_pi05_sizes(folder), torch.device(device):  # built on the device (seconds, not minutes, at 4 B)
        policy = PI05Policy.from_pretrained(str(folder), local_files_only=True).eval()
    policy.to(device)
    policy.config.device = device
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"))
    overrides = {"tokenizer_processor": {"tokenizer": tokenizer}, "device_processor": {"device": device}}
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(folder), preprocessor_overrides=overrides)

    def chw(img: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(img.astype(np.float32) / 255.0).permute(2, 0, 1)

    batch = {
        "observation.images.image": torch.stack([chw(o["observation/image"]) for o in obs]),
        "observation.images.image2": torch.stack([chw(o["observation/wrist_image"]) for o in obs]),
        "observation.state": torch.from_numpy(np.stack([o["observation/state"] for o in obs])).float(),
        "task": [o["prompt"] for o in obs],
    }
    with torch.no_grad():
        chunk = policy.predict_action_chunk(pre(batch), noise=noise.to(device))
        actions = post(chunk[:, : policy.config.n_action_steps]).float().cpu().numpy()
    return np.asarray(actions)


def _noise(policy: Pi05Policy, batch: int) -> torch.Tensor:
    arch = policy.arch
    return torch.randn((batch, arch.chunk_size, arch.max_action_dim), generator=torch.Generator().manual_seed(11))


def _assert_lerobot_parity(folder: Path) -> np.ndarray:
    ours = load_policy_folder(folder)
    assert isinstance(ours, Pi05Policy)
    obs = [libero_obs(0), libero_obs(1, prompt="open the top drawer")]
    noise = _noise(ours, len(obs))
    mine = np.stack([r["actions"] for r in ours.infer_batch(obs, noise=noise)])
    ref = lerobot_actions(folder, obs, noise)
    assert ref.shape == mine.shape == (2, 5, 7)
    assert float(np.abs(ref - mine).max()) < 1e-4 < float(np.abs(ref).max()), (ref, mine)
    return mine


def test_rl_run_exports_a_lerobot_folder_without_the_value_head(init: Path, tmp_path: Path) -> None:
    model = get_family("pi05").rl_adapter(init).model  # the RL trainer's model: pi0.5 + value head
    state = perturbed(model.state_dict(), 1, scale=0.02)
    run = write_run(tmp_path / "run", {"trainer": "joint_ppo", "init": str(init)}, {3: state})
    result = export_checkpoint(run, tmp_path / "out")
    assert result.family == "pi05" and result.target == "lerobot" and verify_manifest(result.out)
    assert result.dropped and all(k.startswith("value_head.") for k in result.dropped)
    assert {k for k in state if k.startswith("value_head.")} == set(result.dropped)
    saved = load_file(str(result.out / "model.safetensors"))
    assert not any("value_head" in k for k in saved)
    key = "paligemma_with_expert.gemma_expert.model.layers.0.mlp.up_proj.weight"
    prefix = next(k[: -len(key)] for k in state if k.endswith(key))
    assert torch.equal(saved["model." + key], state[prefix + key])  # the trained tensors, under LeRobot's names
    exported = _assert_lerobot_parity(result.out)
    obs = [libero_obs(0), libero_obs(1, prompt="open the top drawer")]
    start = Pi05Policy.from_pretrained(init, cuda_graphs=False)
    before = np.stack([r["actions"] for r in start.infer_batch(obs, noise=_noise(start, 2))])
    assert float(np.abs(before - exported).max()) > 1e-3  # the export is the trained policy, not the init


def test_policy_folder_export_loads_in_lerobot(init: Path, tmp_path: Path) -> None:
    result = Pi05Exporter().export(init, tmp_path / "out", target="lerobot", base=None, overwrite=False)
    assert result.dropped == [] and any("lerobot_pi05_sizes" in n for n in result.notes)
    assert {"config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json",
            "pi05_architecture.json", "tokenizer/tokenizer.json", "manifest.json"} <= set(result.files)  # fmt: skip
    _assert_lerobot_parity(result.out)


def test_stock_lerobot_cannot_build_tiny_sizes_without_the_size_context(init: Path) -> None:
    """Why ``lerobot_pi05_sizes`` exists: LeRobot 0.6.1 builds only the released sizes (the 4 B model
    would be built, and its first tensor would not fit); a variant name of our own is refused by its config."""
    from lerobot.policies.pi05 import PI05Config

    with pytest.raises(ValueError, match="Invalid paligemma_variant"):
        PI05Config(paligemma_variant="gemma_tiny")
    import lerobot.policies.pi05.modeling_pi05 as m

    stock = m.get_gemma_config
    with lerobot_pi05_sizes(init):
        assert m.get_gemma_config("gemma_300m").width == 32 and m.get_gemma_config("gemma_2b").width == 64
    assert m.get_gemma_config is stock and m.get_gemma_config("gemma_2b").width == 2048
