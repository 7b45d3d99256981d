"""Qwen3-VL through the text trainers: visual questions as a text task, image prompts in the rollout engine,
packed image-text SFT rows, left-padded scoring for GRPO / PPO, and the three debug recipes end to end (kill,
resume exactly, export, evaluate). Every comparison is against the model's own unpacked, unpadded forward of
one sequence, the reference a packing or padding bug would break."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cosmos_robot.policies.registry import CheckpointError
from cosmos_robot.text.engines import EngineError, SamplingParams, StaticGenerateEngine, TransformersEngine
from cosmos_robot.text.hf import load_causal_lm, save_causal_lm
from cosmos_robot.text.tasks import get_task, task_examples
from cosmos_robot.text.tiny import tiny_from_table
from cosmos_robot.text.vision import (
    collate_vl_rows,
    example_conversation,
    example_prompt,
    expand_images,
    image_kwargs,
    vision_token_ids,
)
from cosmos_robot.text.visual_tasks import render
from cosmos_robot_trainers.launch import load_train_recipe

SIZES = {"model_type": "qwen3_vl", "hidden": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64}


@pytest.fixture(scope="module")
def lm() -> object:
    lm = tiny_from_table({**SIZES, "vision_hidden": 16, "seed": 3})
    lm.model.eval()
    return lm


def _alone(model: object, prompt: list[int], ids: list[int], images: object) -> torch.Tensor:
    """Log-probs (len(ids),) of ``ids`` after ``prompt`` from one unpadded forward."""
    row = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = model(input_ids=row, use_cache=False, **image_kwargs(model, row, [images])).logits[0]  # type: ignore[operator]
    logp = torch.log_softmax(logits.float(), -1)
    return torch.stack([logp[len(prompt) - 1 + i, t] for i, t in enumerate(ids)])


def test_visual_questions_are_a_text_task_with_scene_keyed_splits() -> None:
    task = get_task("shapes/count")
    ex = task.example(5)
    assert ex == task.example(5) and ex.images[0].shape == (64, 64, 3)
    assert (ex.images[0] == render(ex.fields["scene"])).all()  # the image is the ground truth's scene
    assert ex.ground_truth()["answer"] == ex.answer and json.dumps(ex.ground_truth())
    train, held = task_examples(task, "train", 300), task_examples(task, "eval", 60)
    assert {e.key for e in train}.isdisjoint({e.key for e in held})  # same question text, different scenes
    assert len({e.problem for e in held}) <= 3 < len({e.key for e in held})
    mixed = {e.answer for e in task_examples("shapes/mixed", "eval", 60)}
    assert {"left", "right"} <= mixed and mixed & {"0", "1", "2", "3", "4"}
    with pytest.raises(ValueError, match="unknown visual question .shapes/size."):
        get_task("shapes/size")


def test_image_placeholders_expand_to_the_vision_tokens_of_their_grid(lm: object) -> None:
    ex = get_task("shapes/left_right").example(0)
    ids, images = example_prompt(lm.tokenizer, lm.processor, ex)  # type: ignore[attr-defined]
    pads = ids.count(int(lm.model.config.image_token_id))  # type: ignore[attr-defined]
    assert images is not None and pads == int(images.image_grid_thw.prod()) // 4 > 0
    with pytest.raises(ValueError, match="1 <image> placeholders in the messages for 2 images"):
        expand_images(ex.prompt, lm.processor, ex.images * 2, where="x")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="has no image processor"):
        expand_images(ex.prompt, None, ex.images)


def test_the_static_engine_samples_with_images_and_its_log_probs_are_the_unpadded_forwards(lm: object) -> None:
    examples = task_examples("shapes/count", "train", 3)
    inputs = [example_prompt(lm.tokenizer, lm.processor, ex) for ex in examples]  # type: ignore[attr-defined]
    engine = StaticGenerateEngine(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)  # type: ignore[attr-defined]
    groups = engine.generate([p for p, _ in inputs], 2, SamplingParams(6, 1.0, seed=1), images=[i for _, i in inputs])
    vision = set(vision_token_ids(lm.model))  # type: ignore[attr-defined]
    for group, (prompt, images) in zip(groups, inputs, strict=True):
        for c in group:
            assert c.images is images and not vision & set(c.ids)  # a random model never samples an image token
            gap = (_alone(lm.model, prompt, c.ids, images) - torch.tensor(c.log_probs)).abs().max()  # type: ignore[attr-defined]
            assert float(gap) < 1e-4
    text_engine = TransformersEngine(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match="rollout.engine = 'transformers_static'"):
        text_engine.generate([inputs[0][0]], 1, SamplingParams(2), images=[inputs[0][1]])


def test_packed_image_text_rows_give_each_conversation_its_own_loss(lm: object) -> None:
    from cosmos_robot_trainers.text.sft import sft_loss

    model = lm.model  # type: ignore[attr-defined]
    examples = task_examples("shapes/mixed", "train", 5)
    made = [example_conversation(lm.tokenizer, lm.processor, ex) for ex in examples]  # type: ignore[attr-defined]
    seqs = [(c.input_ids, c.assistant_mask, im) for c, im in made]
    batch = collate_vl_rows(model, [seqs[:3], seqs[3:]], lm.pad_id)  # type: ignore[attr-defined]
    assert batch["position_ids"].shape == (4, 2, batch["input_ids"].shape[1])
    with torch.no_grad():
        packed, count = sft_loss(model, batch)
        nll, tokens = 0.0, 0
        for ids, mask, im in seqs:
            trained = [t for t, m in zip(ids[1:], mask[1:]) if m]
            lp = _alone(model, ids[:1], ids[1:], im)
            nll -= float(sum(v for v, m in zip(lp, mask[1:]) if m))
            tokens += len(trained)
    assert count == tokens and abs(float(packed) - nll / tokens) < 1e-5


def test_left_padded_scoring_with_images_equals_each_rows_own_forward(lm: object) -> None:
    from cosmos_robot.text.engines import Completion
    from cosmos_robot_trainers.text.grpo import completion_batch, sequence_log_probs

    examples = task_examples("shapes/mixed", "train", 3)
    inputs = [example_prompt(lm.tokenizer, lm.processor, ex) for ex in examples]  # type: ignore[attr-defined]
    answers = [lm.tokenizer(t).input_ids for t in ("3", "left", "12")]  # type: ignore[attr-defined]
    rows = [Completion(p, a, [], True, "", im) for (p, im), a in zip(inputs, answers, strict=True)]
    batch = completion_batch(rows, lm.pad_id)  # type: ignore[attr-defined]
    assert batch.images is not None and len({len(p) for p, _ in inputs}) > 1  # prompts of different lengths
    with torch.no_grad():
        scored = sequence_log_probs(lm.model, batch)  # type: ignore[attr-defined]
        picked = batch.select(torch.tensor([2, 0]))
        again = sequence_log_probs(lm.model, picked)  # type: ignore[attr-defined]
    for r, ((prompt, im), ids) in enumerate(zip(inputs, answers, strict=True)):
        got = scored[r][batch.mask[r].bool()]
        assert float((got - _alone(lm.model, prompt, ids, im)).abs().max()) < 1e-4  # type: ignore[attr-defined]
    assert torch.allclose(again[1], scored[0], atol=1e-5)  # select keeps each row's images


def test_an_image_text_folder_loads_with_its_processor_and_is_refused_without_it(lm: object, tmp_path: Path) -> None:
    folder = save_causal_lm(lm, tmp_path / "vl")  # type: ignore[arg-type]
    loaded = load_causal_lm(folder, require_chat_template=True)
    assert loaded.processor is not None and type(loaded.model).__name__ == "Qwen3VLForConditionalGeneration"
    (folder / "preprocessor_config.json").unlink()
    with pytest.raises(CheckpointError, match="without its image processor"):
        load_causal_lm(folder)


@pytest.mark.parametrize("recipe", ["debug_text_sft_vl", "debug_text_grpo_vl", "debug_text_ppo_vl"])
def test_vl_recipes_resume_exactly_export_and_evaluate(recipe: str, tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText
    from typer.testing import CliRunner

    from cosmos_robot.cli import app
    from cosmos_robot.text.evaluate import run_text_eval
    from cosmos_robot_trainers.text import ppo, sft
    from cosmos_robot_trainers.text.grpo import run_text_grpo

    run = {"debug_text_sft_vl": sft.run_text_sft, "debug_text_grpo_vl": run_text_grpo}.get(recipe, ppo.run_text_ppo)

    def rows(out: Path) -> list[dict]:
        drop = {"steps_per_s", "time/rollout", "time/update", "tokens_per_s"}
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in drop} for r in lines if "final_eval" not in r]

    common = ["output.tensorboard=false", "train.progress=false", "output.plot=false"]
    _, straight = load_train_recipe(recipe, [f"output.dir={tmp_path / 'a'}", *common])
    result = run(straight, log=lambda _: None)
    assert result.finished and result.final_dir is not None and result.eval_accuracy is not None
    _, killed = load_train_recipe(recipe, [f"output.dir={tmp_path / 'b'}", *common])
    kill = straight.train.ckpt_every
    run(killed, stop_at_step=kill, log=lambda _: None)
    assert run(killed, log=lambda _: None).resumed_from == kill
    assert rows(tmp_path / "b") == rows(tmp_path / "a")
    AutoModelForImageTextToText.from_pretrained(result.final_dir, local_files_only=True)
    exported = CliRunner().invoke(app, ["export", str(tmp_path / "a"), "--out", str(tmp_path / "exp")])
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "exp" / "preprocessor_config.json").is_file()
    results = run_text_eval(tmp_path / "exp", "text/shapes/count", tmp_path / "eval", episodes_per_task=12)
    assert results["totals"]["episodes"] == 12 and results["complete"]
    if recipe == "debug_text_ppo_vl":
        from safetensors.torch import load_file

        head = load_file(str(tmp_path / "a" / "critic_final" / "model.safetensors"))
        assert head["score.weight"].shape == (1, 32) and any(k.startswith("backbone.visual.") for k in head)
