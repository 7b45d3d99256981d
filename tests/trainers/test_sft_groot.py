"""GR00T N1.7 action-head SFT (backbone frozen) through the shared SFT loop, against LeRobot's own loss.

Parity is checked on the tiny GR00T in float32 against LeRobot 0.6.1's ``GrootPolicy.forward`` on the
same frames and processors, with LeRobot's global seed and our generator seeded alike: the loss, the
action head's gradients, no backbone gradients, parameters after optimizer steps; and the cached
backbone features against the backbone run on the batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cosmos_robot.policies import load_policy_folder
from cosmos_robot.policies.groot.policy import Gr00tPolicy
from cosmos_robot.policies.groot.tiny import build_tiny_groot
from cosmos_robot.policies.groot.training import sample_groot_time
from cosmos_robot_exporters import ExportError, export_checkpoint
from cosmos_robot_trainers.common import read_metrics
from cosmos_robot_trainers.common.fsdp import clip_gradients
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.rl import run_rl
from cosmos_robot_trainers.sft import SFTConfig, run_sft
from cosmos_robot_trainers.sft.groot import TUNE_PARTS, Gr00tSFTAdapter, _backbone_of, load_groot_demos
from cosmos_robot_trainers.sft.optim import build_optimizer
from cosmos_robot_trainers.sft.trainer import heldout_loss
from tests.policies._pi05_helpers import libero_obs
from tests.trainers.test_rl import debug_config
from tests.trainers.test_sft import DETERMINISTIC, demo_root, quiet

__all__ = ["demo_root"]

HEAD = "_groot_model.action_head."


@pytest.fixture(scope="module")
def groot_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_groot(tmp_path_factory.mktemp("groot"))


def groot_config(folder: Path, demo_root: Path, out: Path, *overrides: str) -> SFTConfig:
    _, config = load_train_recipe(
        "debug_sft_groot",
        [
            f"init={json.dumps(str(folder))}",
            f"data.root={json.dumps(str(demo_root))}",
            f"output.dir={json.dumps(str(out))}",
            "train.progress=false",
            *overrides,
        ],
    )
    assert isinstance(config, SFTConfig)
    return config


def _prepared(folder: Path, demo_root: Path, out: Path, *overrides: str) -> tuple[SFTConfig, Gr00tSFTAdapter, Any, Any]:
    config = groot_config(folder, demo_root, out, *overrides)
    adapter = Gr00tSFTAdapter()
    adapter.load_base(config, folder)
    data = adapter.load_data(config)
    model = adapter.build_model(config, torch.device("cpu"))
    model.train()
    return config, adapter, data, model


def _reference(folder: Path, dropout: float) -> Any:
    from lerobot.policies.groot import GrootPolicy

    ref = GrootPolicy.from_pretrained(str(folder), local_files_only=True)
    ref.config.embodiment_tag = "new_embodiment"
    ref._groot_model.action_head.state_dropout_prob = dropout
    return ref.train()


def _lerobot_batch(adapter: Gr00tSFTAdapter, config: SFTConfig, data: Any, idx: torch.Tensor) -> dict[str, Any]:
    """LeRobot's training batch of the same frames through the same processors (its tokenizer pads)."""
    demo = load_groot_demos(config, adapter._base())
    raw = data.raw_batch(idx)
    raw["action"], raw["action_is_pad"] = demo.actions[idx].float(), demo.action_is_pad[idx].bool()
    return adapter.pre(raw)


FRAMES = torch.tensor([0, 70, 140, 200, 5, 100])  # frames of every task: prompts of different lengths


def _ours(adapter: Gr00tSFTAdapter, data: Any, model: Any, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    batch = data.batch(FRAMES.numpy(), None, g, 0)  # draws the state dropout last
    noise = torch.randn(batch["actions"].shape, generator=g)
    time = adapter.sample_time(model, len(FRAMES), g)
    return adapter.flow_loss(model, batch, noise, time)


def test_loss_and_gradients_equal_lerobots_forward(groot_folder: Path, demo_root: Path, tmp_path: Path) -> None:
    config, adapter, data, model = _prepared(groot_folder, demo_root, tmp_path)
    assert data.features is not None and data.features.pad_row is not None  # cached, prompts of several lengths
    dropout = 0.5  # the tiny model's is 0: turn it on to check its draw comes first, as in LeRobot
    data.state_dropout = model.action_head.state_dropout_prob = dropout
    ref = _reference(groot_folder, dropout)
    processed = _lerobot_batch(adapter, config, data, FRAMES)
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        ref_loss, _ = ref.forward({k: v.clone() if torch.is_tensor(v) else v for k, v in processed.items()})
        ours = _ours(adapter, data, model, seed)
        assert abs(float(ref_loss.detach()) - float(ours.detach())) <= 1e-6, (seed, float(ref_loss), float(ours))
    ref.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    ref.forward(dict(processed))[0].backward()
    _ours(adapter, data, model, 5).backward()
    ours_grads = {n: p.grad for n, p in model.named_parameters()}
    compared = 0
    for name, p in ref.named_parameters():
        if name.startswith("_groot_model.backbone."):
            assert p.grad is None, name
            continue
        assert p.grad is not None and ours_grads[name.removeprefix("_groot_model.")] is not None, name
        torch.testing.assert_close(ours_grads[name.removeprefix("_groot_model.")], p.grad, rtol=1e-5, atol=1e-7)
        compared += 1
    assert compared == len(ours_grads) > 50
    assert all(p.grad is None for p in adapter._base().policy._groot_model.backbone.parameters())


def test_parameters_after_optimizer_steps_equal_lerobots(groot_folder: Path, demo_root: Path, tmp_path: Path) -> None:
    """LeRobot's optimizer preset (AdamW 1e-4, wd 1e-5, no decay on biases and norms, clip 1.0) against the
    trainer's optimizer with the adapter's groups (fused AdamW: 1e-7-level rounding apart)."""
    overrides = ("optim.lr=1e-4", "optim.weight_decay=1e-5", "optim.warmup_steps=0", 'optim.schedule="constant"')
    config, adapter, data, model = _prepared(groot_folder, demo_root, tmp_path, *overrides)
    ref = _reference(groot_folder, float(model.action_head.state_dropout_prob))
    processed = _lerobot_batch(adapter, config, data, FRAMES)
    groups = adapter.param_groups(model, config)
    ref_groups = ref.get_optim_params()
    assert [len(g["params"]) for g in groups] == [len(g["params"]) for g in ref_groups]
    optimizer, _ = build_optimizer(model, config.optim, 3, groups)
    ref_opt = torch.optim.AdamW(ref_groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-5)
    for k in range(3):
        optimizer.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        torch.manual_seed(10 + k)
        ref.forward(dict(processed))[0].backward()
        _ours(adapter, data, model, 10 + k).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        clip_gradients(model.parameters(), 1.0)
        ref_opt.step()
        optimizer.step()
    ours = dict(model.named_parameters())
    moved = 0
    for name, p in ref.named_parameters():
        if name.startswith(HEAD):
            torch.testing.assert_close(ours[name.removeprefix("_groot_model.")], p, rtol=0, atol=2e-6)
            moved += 1
    assert moved == len(ours)


def test_cached_features_equal_the_backbone_on_the_batch(groot_folder: Path, demo_root: Path, tmp_path: Path) -> None:
    config, adapter, data, model = _prepared(groot_folder, demo_root, tmp_path)
    batch = data.batch(FRAMES.numpy(), None, torch.Generator().manual_seed(0), 0)
    fresh = _backbone_of(adapter._base(), adapter.pre, data.raw_batch(FRAMES))
    assert torch.equal(batch["backbone_attention_mask"], fresh["backbone_attention_mask"])
    assert torch.equal(batch["image_mask"], fresh["image_mask"])
    assert not bool(fresh["backbone_attention_mask"].all())  # the batch is padded: the pad feature is used
    torch.testing.assert_close(batch["backbone_features"], fresh["backbone_features"], rtol=0, atol=1e-6)
    # the recompute path (finetune.feature_cache = "off") gives the same loss
    off_config, off_adapter, off_data, off_model = _prepared(
        groot_folder, demo_root, tmp_path / "off", 'finetune.feature_cache="off"'
    )
    assert off_data.features is None
    cached = _ours(adapter, data, model, 3)
    recomputed = _ours(off_adapter, off_data, off_model, 3)
    assert abs(float(cached.detach()) - float(recomputed.detach())) <= 1e-6


def test_preprocessing_and_the_cache_report_progress(
    groot_folder: Path, demo_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both one-off passes over the data (minutes at a real dataset's size) print where they are."""
    config = groot_config(groot_folder, demo_root, tmp_path, "train.progress=true")
    adapter = Gr00tSFTAdapter()
    adapter.load_base(config, groot_folder)
    data = adapter.load_data(config)
    err = capsys.readouterr().err
    n = len(data.prompts)
    assert f"{config.name}: preprocess: frame {n}/{n} (100%)" in err, err
    assert f"{config.name}: backbone features: frame {n}/{n} (100%)" in err, err


def test_time_draw_is_lerobots_beta(groot_folder: Path) -> None:
    ref = _reference(groot_folder, 0.0)
    head = ref._groot_model.action_head
    for n in (1, 5, 64):
        torch.manual_seed(n)
        theirs = head.sample_time(n, device="cpu", dtype=torch.float32)
        ours = sample_groot_time(n, torch.Generator().manual_seed(n), head)
        assert torch.equal(ours, theirs)


def test_finetune_choices_are_checked(groot_folder: Path, demo_root: Path, tmp_path: Path) -> None:
    config = groot_config(groot_folder, demo_root, tmp_path, 'finetune.tune=["vision"]')
    with pytest.raises(ValueError, match=r"finetune.tune: \['vision'\] are not GR00T parts"):
        Gr00tSFTAdapter().load_base(config, groot_folder)
    config = groot_config(groot_folder, demo_root, tmp_path, 'finetune.feature_cache="on"', "augment.random_shift=2")
    adapter = Gr00tSFTAdapter()
    adapter.load_base(config, groot_folder)
    with pytest.raises(ValueError, match="finetune.feature_cache = 'on' caches .* \\[augment\\] changes"):
        adapter.load_data(config)
    from cosmos_robot_trainers.sft.trainer import sft_adapter  # the flow family has no such choice

    _, flow = load_train_recipe("debug", [f"data.root={json.dumps(str(demo_root))}", 'finetune.tune=["vlln"]'])
    with pytest.raises(ValueError, match="finetune.tune: the flow family has no such choice"):
        sft_adapter(flow, log=quiet)  # type: ignore[arg-type]


def test_only_the_tuned_parts_train(groot_folder: Path, demo_root: Path, tmp_path: Path) -> None:
    _, _, _, model = _prepared(groot_folder, demo_root, tmp_path, 'finetune.tune=["diffusion_model"]')
    trainable = {n.split(".")[1] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"model"}  # the DiT only: encoders, decoder and the VL layers frozen


@pytest.mark.slow
def test_groot_sft_resumes_exactly_exports_and_hands_off_to_ppo(
    groot_folder: Path, demo_root: Path, tmp_path: Path
) -> None:
    whole = run_sft(groot_config(groot_folder, demo_root, tmp_path / "whole"), log=quiet)
    split_cfg = groot_config(groot_folder, demo_root, tmp_path / "split")
    first = run_sft(split_cfg, stop_at_step=13, log=quiet)
    assert not first.finished
    second = run_sft(split_cfg, log=quiet)
    assert second.resumed_from == 10 and second.finished and whole.final_dir is not None
    a, b = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "split")
    for ra, rb in zip(a, b, strict=True):
        assert {k: ra[k] for k in DETERMINISTIC} == {k: rb[k] for k in DETERMINISTIC}
    wa = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    wb = load_file(str(tmp_path / "split" / "final" / "model.safetensors"))
    base = load_file(str(groot_folder / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert all(torch.equal(wa[k], base[k]) for k in wa if ".backbone." in k)  # frozen: bitwise the start
    assert any(not torch.equal(wa[k], base[k]) for k in wa if ".action_head." in k)
    ckpt = next((tmp_path / "whole" / "checkpoints").iterdir())
    saved = load_file(str(next(ckpt.glob("*.safetensors"))))
    assert saved and all(k.startswith("action_head.") for k in saved)  # checkpoints hold the head only
    policy = load_policy_folder(whole.final_dir)
    assert isinstance(policy, Gr00tPolicy)
    assert policy.policy.config.embodiment_tag == "new_embodiment"
    chunk = policy.infer(libero_obs(0))["actions"]
    assert chunk.shape == (8, 7) and np.isfinite(chunk).all()
    # scoring folders by the recipe's loss (benchmarks/sft_heldout_loss.py): the result fits better than the start
    scores = [
        heldout_loss(groot_config(folder, demo_root, tmp_path / "score"), batches=3, batch_size=16, log=quiet)
        for folder in (groot_folder, whole.final_dir)
    ]
    assert scores[1]["loss"] < scores[0]["loss"] and np.isfinite([s["sem"] for s in scores]).all()
    # the exporter's action-head export of the run: the base is final/ (processors with the data's statistics)
    exported = export_checkpoint(tmp_path / "whole", tmp_path / "export")
    assert exported.target == "lerobot" and not exported.dropped
    for name in ("config.json", "policy_preprocessor.json", "policy_postprocessor.json"):
        assert (exported.out / name).read_bytes() == (whole.final_dir / name).read_bytes(), name
    out = load_file(str(exported.out / "model.safetensors"))
    assert all(torch.equal(out[k], wa[k]) for k in wa)  # the last checkpoint is the final step's
    served = load_policy_folder(exported.out)
    np.testing.assert_array_equal(served.infer(libero_obs(0))["actions"], chunk)  # the same chunk, fixed noise
    with pytest.raises(ExportError, match="finetune.embodiment 'new_embodiment' has no statistics"):
        export_checkpoint(tmp_path / "whole", tmp_path / "raw", target="gr00t")

    # the hand-off round trip: joint PPO from the SFT result (backbone frozen), then GR00T's action-head export
    ppo = run_rl(
        debug_config("joint_ppo_groot", tmp_path / "ppo", f"init={json.dumps(str(whole.final_dir))}",
                     "optim.freeze_vlm=true", "train.iterations=1"),
        log=quiet,
    )  # fmt: skip
    assert ppo.final_dir is not None
    handed = export_checkpoint(tmp_path / "ppo", tmp_path / "handed")
    assert handed.dropped and all(k.startswith("value_head.") for k in handed.dropped)  # PPO's critic: not GR00T's
    for name in ("config.json", "policy_preprocessor.json", "policy_postprocessor.json"):  # the SFT result's
        assert (handed.out / name).read_bytes() == (whole.final_dir / name).read_bytes(), name
    out = load_file(str(handed.out / "model.safetensors"))
    assert all(torch.equal(out[k], base[k]) for k in out if ".backbone." in k)
    assert any(not torch.equal(out[k], wa[k]) for k in out if ".action_head." in k)  # PPO moved the head
    from lerobot.policies.groot import GrootPolicy  # LeRobot's own class loads the handed-off folder

    lerobot_sd = GrootPolicy.from_pretrained(str(handed.out), local_files_only=True).state_dict()
    assert all(torch.equal(lerobot_sd[k], out[k]) for k in out if ".action_head." in k)
    served = load_policy_folder(handed.out)
    trained = load_policy_folder(ppo.final_dir)
    np.testing.assert_array_equal(served.infer(libero_obs(1))["actions"], trained.infer(libero_obs(1))["actions"])


def test_the_groot_recipes_parse() -> None:
    for name in ("sft_groot_tabletop", "sft_groot_libero", "debug_sft_groot"):
        _, config = load_train_recipe(name, [])
        assert isinstance(config, SFTConfig) and config.finetune.tune in (None, list(TUNE_PARTS))


def test_servable_carries_the_ema_head_and_shares_the_backbone(
    groot_folder: Path, demo_root: Path, tmp_path: Path
) -> None:
    from cosmos_robot_trainers.common.export import EMA

    _, adapter, data, model = _prepared(groot_folder, demo_root, tmp_path)
    ema = EMA(model, 0.5)
    name = "action_head.action_decoder.layer2.W"
    ema.shadow[name] = ema.shadow[name] + 1.0
    served = adapter.servable(model, data, ema)
    assert torch.equal(served.policy._groot_model.action_head.state_dict()[name.removeprefix("action_head.")],
                       ema.shadow[name])  # fmt: skip
    assert not torch.equal(dict(model.named_parameters())[name], ema.shadow[name])  # training weights untouched
    assert served.policy._groot_model.backbone is model.lerobot._groot_model.backbone


def test_untrained_twin_puts_the_init_head_back_and_refuses_other_changes(groot_folder: Path, tmp_path: Path) -> None:
    """benchmarks/groot_untrained_twin.py: the baseline differs from the SFT folder only by the head."""
    import shutil

    from safetensors.torch import load_file, save_file

    from benchmarks.groot_untrained_twin import untrained_twin
    from cosmos_robot.manifest import verify_manifest, write_manifest
    from cosmos_robot.policies import load_policy_folder

    head = "_groot_model.action_head.action_decoder.layer2.W"
    trained = tmp_path / "trained"
    shutil.copytree(groot_folder, trained)
    weights = load_file(str(trained / "model.safetensors"))
    weights[head] = weights[head] + 0.5  # what SFT changes
    save_file(weights, str(trained / "model.safetensors"), metadata={"format": "pt"})
    (trained / "policy_preprocessor.json").write_text((trained / "policy_preprocessor.json").read_text() + "\n")
    write_manifest(trained)
    changed = untrained_twin(trained, groot_folder, tmp_path / "twin")
    assert changed == [head]
    twin, init = (
        load_file(str(tmp_path / "twin" / "model.safetensors")),
        load_file(str(groot_folder / "model.safetensors")),
    )
    assert all(torch.equal(twin[k], init[k]) for k in init)
    # the trained folder's processors are kept (the point of the twin), and the manifest is fresh
    assert (tmp_path / "twin" / "policy_preprocessor.json").read_text() == (
        trained / "policy_preprocessor.json"
    ).read_text()
    assert verify_manifest(tmp_path / "twin")
    assert isinstance(load_policy_folder(tmp_path / "twin"), Gr00tPolicy)
    backbone = next(k for k in weights if ".backbone." in k and weights[k].is_floating_point())
    weights[backbone] = weights[backbone] + 1.0
    save_file(weights, str(trained / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="outside the action head"):
        untrained_twin(trained, groot_folder, tmp_path / "twin2")
