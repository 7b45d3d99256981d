"""The groot exporter: the trained action head into a matching base, everything else of the base kept
byte for byte; LeRobot's GR00T classes load the result and our Gr00tPolicy serves it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cosmos_robot.manifest import verify_manifest
from cosmos_robot.policies import load_policy_folder
from cosmos_robot.policies.groot.policy import Gr00tPolicy
from cosmos_robot.policies.groot.tiny import build_tiny_groot
from cosmos_robot.policies.registry import get_family
from cosmos_robot_exporters import ExportError, export_checkpoint
from cosmos_robot_exporters.groot import Gr00tExporter
from tests.exporters._runs import perturbed, write_run
from tests.policies._pi05_helpers import libero_obs

HEAD, BACKBONE = "_groot_model.action_head.", "_groot_model.backbone."


@pytest.fixture(scope="module")
def policy_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_groot(tmp_path_factory.mktemp("groot"))  # .../{backbone,base,policy}; returns policy


@pytest.fixture(scope="module")
def rl_state(policy_folder: Path) -> dict[str, torch.Tensor]:
    """The RL trainer's model for this init (GR00T + value head), with the action head and critic trained."""
    state = get_family("groot").rl_adapter(policy_folder).model.state_dict()
    moved = perturbed(state, 1, scale=0.05)
    return {k: (moved[k] if ".action_head." in k or k.startswith("value_head.") else v) for k, v in state.items()}


@pytest.fixture(scope="module")
def rl_run(policy_folder: Path, rl_state: dict[str, torch.Tensor], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs") / "ppo"
    return write_run(root, {"trainer": "joint_ppo", "init": str(policy_folder)}, {2: rl_state})


def _trained(state: dict[str, torch.Tensor], rel: str) -> torch.Tensor:
    return next(v for k, v in state.items() if k.endswith("action_head." + rel))


def _actions(policy: Gr00tPolicy) -> np.ndarray:
    return np.stack([r["actions"] for r in policy.infer_batch([libero_obs(0), libero_obs(1)])])


def test_lerobot_target_replaces_the_action_head_and_keeps_the_rest(
    policy_folder: Path, rl_state: dict[str, torch.Tensor], rl_run: Path, tmp_path: Path
) -> None:
    result = export_checkpoint(rl_run, tmp_path / "out")  # default target 'lerobot', base = the run's init
    assert result.family == "groot" and result.target == "lerobot" and verify_manifest(result.out)
    assert result.dropped == sorted(k for k in rl_state if k.startswith("value_head.")) and result.dropped
    for name in ("config.json", "policy_preprocessor.json", "policy_postprocessor.json",
                 "policy_preprocessor_step_2_groot_n1_7_pack_inputs_v1.safetensors"):  # fmt: skip
        assert (result.out / name).read_bytes() == (policy_folder / name).read_bytes(), name
    base, out = load_file(str(policy_folder / "model.safetensors")), load_file(str(result.out / "model.safetensors"))
    assert set(out) == set(base)
    heads = [k for k in base if k.startswith(HEAD)]
    backbone = [k for k in base if k.startswith(BACKBONE)]
    assert heads and backbone and len(heads) + len(backbone) == len(base)
    assert all(torch.equal(out[k], base[k]) for k in backbone)  # bitwise the base's
    assert all(torch.equal(out[k], _trained(rl_state, k[len(HEAD) :])) for k in heads)
    # LeRobot's own class loads it; our Gr00tPolicy serves it with the trained head
    from lerobot.policies.groot import GrootPolicy

    lerobot = GrootPolicy.from_pretrained(str(result.out), local_files_only=True)
    sd = lerobot.state_dict()
    assert all(torch.equal(sd[k], out[k]) for k in heads)
    served = load_policy_folder(result.out)
    assert isinstance(served, Gr00tPolicy)
    reference = load_policy_folder(policy_folder)
    assert isinstance(reference, Gr00tPolicy)
    start = _actions(reference)
    missing, unexpected = reference.policy.load_state_dict({k: out[k] for k in heads}, strict=False)
    assert not unexpected
    np.testing.assert_allclose(_actions(served), _actions(reference), atol=1e-6)  # = the trained head in memory
    assert float(np.abs(_actions(served) - start).max()) > 1e-4


def test_gr00t_target_writes_the_raw_base_with_the_trained_head(
    policy_folder: Path, rl_state: dict[str, torch.Tensor], rl_run: Path, tmp_path: Path
) -> None:
    raw_base = Path(json.loads((policy_folder / "config.json").read_text())["base_model_path"])
    result = export_checkpoint(rl_run, tmp_path / "raw", target="gr00t")  # base: the init's base_model_path
    for name in ("config.json", "processor_config.json", "statistics.json", "embodiment_id.json"):
        assert (result.out / name).read_bytes() == (raw_base / name).read_bytes(), name
    base, out = load_file(str(raw_base / "model.safetensors")), load_file(str(result.out / "model.safetensors"))
    assert set(out) == set(base)
    assert all(torch.equal(out[k], base[k]) for k in base if k.startswith("backbone."))
    assert all(
        torch.equal(out[k], _trained(rl_state, k[len("action_head.") :])) for k in base if k.startswith("action_head.")
    )
    # LeRobot takes it as a GR00T N1.7 base model: GrootConfig(base_model_path=...)
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.groot import GrootPolicy

    config = PreTrainedConfig.from_pretrained(str(policy_folder), local_files_only=True)
    config.base_model_path = str(result.out)
    sd = GrootPolicy(config).state_dict()
    assert all(torch.equal(sd["_groot_model." + k], out[k]) for k in base if k.startswith("action_head."))


def test_policy_folder_source_with_an_explicit_base(policy_folder: Path, tmp_path: Path) -> None:
    """A LeRobot GR00T folder (e.g. an RL run's final/) into another base of the same shapes."""
    other = tmp_path / "other_base"
    shutil.copytree(policy_folder, other)
    weights = load_file(str(other / "model.safetensors"))
    save_file({k: (v + 1.0 if k.startswith(BACKBONE) and v.is_floating_point() else v) for k, v in weights.items()},
              str(other / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    result = Gr00tExporter().export(policy_folder, tmp_path / "out", target="lerobot", base=other, overwrite=False)
    out = load_file(str(result.out / "model.safetensors"))
    assert all(torch.equal(out[k], weights[k]) for k in weights if k.startswith(HEAD))
    assert all(
        torch.equal(out[k], weights[k] + 1.0)
        for k in weights
        if k.startswith(BACKBONE) and weights[k].is_floating_point()
    )
    assert any("differs from the base's" in n for n in result.notes)  # the source's backbone is not the base's


def test_a_mismatched_base_is_refused_naming_the_keys(policy_folder: Path, rl_run: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad_base"
    shutil.copytree(policy_folder, bad)
    weights = load_file(str(bad / "model.safetensors"))
    del weights[HEAD + "action_decoder.layer2.b"]
    weights[HEAD + "action_decoder.layer2.W"] = torch.zeros(3, 3)
    weights[HEAD + "extra_embodiment.W"] = torch.zeros(2)
    save_file(weights, str(bad / "model.safetensors"))
    with pytest.raises(ExportError) as err:
        export_checkpoint(rl_run, tmp_path / "out", base=bad)
    msg = str(err.value)
    assert "missing keys (in the base, not trained): action_head.extra_embodiment.W" in msg
    assert "unexpected keys (trained, not in the base): action_head.action_decoder.layer2.b" in msg
    assert "shape of action_head.action_decoder.layer2.W: (" in msg and "trained vs (3, 3) in the base" in msg
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
    with pytest.raises(ExportError, match="is not a raw GR00T N1.7 checkpoint .*LeRobot GrootPolicy folder"):
        export_checkpoint(rl_run, tmp_path / "out", target="gr00t", base=policy_folder)


def test_a_trained_backbone_is_reported(policy_folder: Path, rl_state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    state = {k: (v + 0.01 if ".backbone." in k and v.is_floating_point() else v) for k, v in rl_state.items()}
    run = write_run(tmp_path / "run", {"trainer": "joint_ppo", "init": str(policy_folder)}, {1: state})
    result = export_checkpoint(run, tmp_path / "out")
    assert any("trained backbone differs from the base's" in n and "freeze_vlm" in n for n in result.notes)
    out, base = load_file(str(result.out / "model.safetensors")), load_file(str(policy_folder / "model.safetensors"))
    assert all(torch.equal(out[k], base[k]) for k in base if k.startswith(BACKBONE))
