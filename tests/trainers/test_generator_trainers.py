"""The generator trainers on a tiny real-format Cosmos3 pipeline: SFT, Flow-DPO and DiffusionNFT recipes run,
resume exactly, write a diffusers folder that loads and generates what the trained model does; the losses'
defining properties hold on the real model (DPO: log 2 and accuracy 1/2 at initialisation; NFT: at
theta = theta_old the gradient is beta (2r - 1) times the flow-matching gradient); LoRA trains only adapters."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from cosmos_robot.generation.cosmos3 import Cosmos3Generator, GenShape
from cosmos_robot_trainers.launch import launch, load_train_recipe

QUIET = ["output.tensorboard=false", "train.progress=false", "output.plot=false"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cosmos_robot.generation.tiny import build_tiny_generator

    return build_tiny_generator(tmp_path_factory.mktemp("gen") / "base", vae_steps=0)


def _metrics(run: Path) -> list[dict[str, Any]]:
    drop = {"rollout_s", "update_s"}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


def _overrides(out: Path, base: Path, *extra: str) -> list[str]:
    return [f"output.dir={out}", f'init="{base}"', *QUIET, *extra]


@pytest.mark.parametrize("recipe", ["debug_generator_sft", "debug_generator_dpo", "debug_generator_nft"])
def test_generator_recipes_run_resume_exactly_and_write_a_pipeline(recipe: str, base: Path, tmp_path: Path) -> None:
    from diffusers import Cosmos3OmniPipeline

    straight = tmp_path / "a"
    result = launch(recipe, _overrides(straight, base), log=lambda _: None)
    assert result.finished and result.final_dir is not None
    rows = _metrics(straight)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    killed = tmp_path / "b"
    name, config = load_train_recipe(recipe, _overrides(killed, base))
    module = __import__(f"cosmos_robot_trainers.generator.{name.split('_')[1]}", fromlist=["x"])
    run_fn = getattr(module, f"run_{name}")
    assert run_fn(config, resume=True, overwrite=False, log=lambda _: None, stop_at_step=2).final_dir is None
    resumed = run_fn(config, resume=True, overwrite=False, log=lambda _: None)
    assert resumed.resumed_from == 2 and resumed.finished
    assert _metrics(killed) == rows  # the same losses, rewards and evaluations, bit for bit
    # final/ is a diffusers folder that generates what the trained model generates
    pipe = Cosmos3OmniPipeline.from_pretrained(str(result.final_dir), enable_safety_checker=False)
    shape = GenShape(1, 64, 64)
    again = Cosmos3Generator.from_pretrained(resumed.final_dir).sample("a red circle", shape, 3, num_steps=2)
    assert torch.equal(Cosmos3Generator(pipe).sample("a red circle", shape, 3, num_steps=2), again)
    assert (straight / "report.html").read_text().count("data:image/png;base64") >= 3
    facts = json.loads((result.final_dir / "cosmos_robot_generator.json").read_text())
    assert facts["trainer"] == name and [e["step"] for e in facts["evals"]] == [0, 4]


def test_dpo_starts_at_log_2_and_half_accuracy_and_pairs_share_their_noise(base: Path, tmp_path: Path) -> None:
    result = launch("debug_generator_dpo", _overrides(tmp_path / "r", base, "train.steps=1"), log=lambda _: None)
    first = result.initial_eval
    assert first["heldout_implicit_acc"] == 0.5  # every logit is exactly 0 at theta = theta_ref
    assert first["heldout_dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
    row = _metrics(tmp_path / "r")[1]  # the first update: still at the reference when its loss was computed
    assert row["loss"] == pytest.approx(math.log(2), abs=1e-6) and row["implicit_acc"] == 0.5


def test_nft_gradient_at_the_old_policy_is_beta_2r_minus_1_times_flow_matching(base: Path) -> None:
    from cosmos_robot_trainers.algorithms import nft_loss
    from cosmos_robot_trainers.generator.flow import noised

    gen = Cosmos3Generator.from_pretrained(base)
    old = copy.deepcopy(gen.transformer)
    shape = GenShape(1, 64, 64)
    ids = [gen.prompt_ids(p, shape)[0] for p in ("a red circle", "a blue square")]
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, *gen.latent_shape(shape), generator=g)
    x_t, target = noised(x0, torch.randn(x0.shape, generator=g), torch.tensor([0.3, 0.7]))
    r, beta = torch.tensor([0.9, 0.2]), 0.7
    params = [p for p in gen.transformer.parameters() if p.requires_grad]

    def grads(loss: torch.Tensor) -> torch.Tensor:
        got = torch.autograd.grad(loss, params, allow_unused=True)  # e.g. the text pathway's last norms
        return torch.cat([(torch.zeros_like(p) if gr is None else gr).flatten() for p, gr in zip(params, got)])

    v = gen.velocities(x_t, torch.tensor([0.3, 0.7]), ids, shape)
    with gen.using(old):
        v_old = gen.velocities(x_t, torch.tensor([0.3, 0.7]), ids, shape).detach()
    assert gen.transformer is not old  # put back
    assert torch.equal(v.detach(), v_old)  # theta = theta_old
    loss, _ = nft_loss(v, v_old, target, r, beta=beta)
    g_nft = grads(loss)
    v = gen.velocities(x_t, torch.tensor([0.3, 0.7]), ids, shape)
    per_sample = ((v - target) ** 2).flatten(1).mean(1)
    g_fm = grads((beta * (2 * r - 1) * per_sample).mean())
    assert torch.allclose(g_nft, g_fm, rtol=1e-4, atol=1e-7)
    assert g_fm.abs().max() > 0


def test_lora_trains_only_adapters_and_final_merges_them(base: Path, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    extra = ["lora.rank=4", "optim.lr=1e-2"]
    result = launch("debug_generator_sft", _overrides(out, base, *extra), log=lambda _: None)
    assert result.final_dir is not None
    ck = sorted((out / "checkpoints").iterdir())[-1]
    from safetensors.torch import load_file

    keys = list(load_file(str(ck / "model.safetensors")))
    assert keys and all(".lora_" in k for k in keys)  # only the adapters are trained and saved
    merged = Cosmos3Generator.from_pretrained(result.final_dir)
    assert not any(".lora_" in k for k in merged.transformer.state_dict())
    untouched = Cosmos3Generator.from_pretrained(base)
    shape = GenShape(1, 64, 64)
    a, b = (m.sample("a red circle", shape, 1, num_steps=2) for m in (merged, untouched))
    assert not torch.equal(a, b)  # the merged weights carry the training
    with pytest.raises(ValueError, match=r"lora.targets: \['qkv'\] name no module"):
        launch("debug_generator_sft", _overrides(tmp_path / "bad", base, "lora.rank=4", 'lora.targets=["qkv"]'))


def test_recipe_errors_name_the_field(base: Path, tmp_path: Path) -> None:
    from cosmos_robot.config import ConfigError

    with pytest.raises(ConfigError, match="Did you mean 'color_match'"):
        load_train_recipe("debug_generator_nft", [*_overrides(tmp_path, base), 'reward.name="colour_match"'])
    with pytest.raises(ConfigError, match="train.batch_size \\(3\\) must divide"):
        load_train_recipe("debug_generator_nft", [*_overrides(tmp_path, base), "train.batch_size=3"])
    with pytest.raises(ConfigError, match="num_frames: expected 1"):
        load_train_recipe("debug_generator_sft", [*_overrides(tmp_path, base), "shape.num_frames=2"])
    with pytest.raises(ConfigError, match="preference JSONL holds images: shape.num_frames must be 1"):
        load_train_recipe(
            "debug_generator_dpo",
            [*_overrides(tmp_path, base), 'algo.pairs="jsonl"', 'algo.data_path="p.jsonl"', "shape.num_frames=5"],
        )
    with pytest.raises(ConfigError, match="algo.pairs = 'jsonl' needs algo.data_path"):
        load_train_recipe("debug_generator_dpo", [*_overrides(tmp_path, base), 'algo.pairs="jsonl"'])


def _write_png(path: Path, arr: Any) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def test_sft_reads_a_caption_folder_and_dpo_a_preference_jsonl(base: Path, tmp_path: Path) -> None:
    import numpy as np

    from cosmos_robot.generation.shapes import Scene, caption, draw

    folder = tmp_path / "captions"
    for i, color in enumerate(("red", "blue", "green", "yellow")):
        scene = Scene("circle", color, "gray", 0.5, 0.5, 0.25)
        _write_png(folder / f"img{i}.png", draw(scene, 64)[0])
        (folder / f"img{i}.txt").write_text(caption(scene))
    out = tmp_path / "sft"
    result = launch("debug_generator_sft", _overrides(out, base, f'data.source="{folder}"', "train.batch_size=2"))
    assert result.finished
    (folder / "img9.txt").write_text("an orphan caption")
    with pytest.raises(ValueError, match="img9.txt: no image img9.png beside the caption"):
        launch("debug_generator_sft", _overrides(tmp_path / "sft2", base, f'data.source="{folder}"'))

    bright = np.full((64, 64, 3), 230, np.uint8)
    dark = np.full((64, 64, 3), 20, np.uint8)
    _write_png(tmp_path / "prefs" / "bright.png", bright)
    _write_png(tmp_path / "prefs" / "dark.png", dark)
    lines = [
        json.dumps({"prompt": f"a bright picture {i}", "chosen": "bright.png", "rejected": "dark.png"})
        for i in range(6)
    ]
    (tmp_path / "prefs" / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    jsonl = ['algo.pairs="jsonl"', f'algo.data_path="{tmp_path / "prefs" / "pairs.jsonl"}"', "algo.heldout_pairs=2"]
    result = launch("debug_generator_dpo", _overrides(tmp_path / "dpo", base, *jsonl))
    assert result.finished and result.initial_eval["heldout_implicit_acc"] == 0.5
    missing = json.dumps({"prompt": "x", "chosen": "nope.png", "rejected": "dark.png"})
    (tmp_path / "prefs" / "pairs.jsonl").write_text(lines[0] + "\n" + missing + "\n")
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: chosen image .*nope.png does not exist"):
        launch("debug_generator_dpo", _overrides(tmp_path / "dpo2", base, *jsonl))


def test_a_run_stopped_by_the_wall_clock_exports_and_a_rerun_resumes_it(base: Path, tmp_path: Path) -> None:
    out = tmp_path / "clock"
    result = launch("debug_generator_sft", _overrides(out, base, "train.max_wall_minutes=0.0001"), log=lambda _: None)
    assert not result.finished and result.step == 1 and result.final_dir is not None
    assert result.final_eval["step"] == 1 and (out / "report.html").is_file()
    again = launch("debug_generator_sft", _overrides(out, base), log=lambda _: None)  # the cap is a runtime field
    assert again.finished and again.resumed_from == 1 and again.step == 4
