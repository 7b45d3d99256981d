"""The text trainers end to end on tiny real-format models: SFT, GRPO and DPO recipes run, resume exactly,
export HF folders that transformers loads, and the eval command scores them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from cosmos_robot.cli import app
from cosmos_robot.config import ConfigError
from cosmos_robot_trainers.launch import launch, load_train_recipe
from cosmos_robot_trainers.text.dpo import load_pairs, sampled_pairs
from cosmos_robot_trainers.text.grpo import run_text_grpo
from cosmos_robot_trainers.text.sft import run_text_sft

runner = CliRunner()


def _records(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    drop = {"steps_per_s", "iter_wall_s", "time/rollout", "time/update", "tokens_per_s"}
    return [{k: v for k, v in r.items() if k not in drop} for r in rows if "final_eval" not in r]


def _config(recipe: str, out: Path, *overrides: str) -> Any:
    return load_train_recipe(
        recipe, [f"output.dir={out}", "output.tensorboard=false", "train.progress=false", *overrides]
    )[1]


def test_text_sft_learns_resumes_exactly_and_exports(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    straight = tmp_path / "a"
    result = run_text_sft(_config("debug_text_sft", straight), log=lambda _: None)
    assert result.finished and result.final_dir is not None
    losses = [r["loss"] for r in _records(straight) if "loss" in r]
    assert losses[-1] < 0.8 * losses[0]
    killed = tmp_path / "b"
    config = _config("debug_text_sft", killed)
    assert run_text_sft(config, stop_at_step=10, log=lambda _: None).final_dir is None
    resumed = run_text_sft(config, log=lambda _: None)
    assert resumed.resumed_from == 10
    assert _records(killed) == _records(straight)
    model = AutoModelForCausalLM.from_pretrained(result.final_dir, local_files_only=True)
    assert model.config.model_type == "qwen3" and (result.final_dir / "manifest.json").is_file()
    out = runner.invoke(
        app,
        [
            "eval",
            "--ckpt",
            str(result.final_dir),
            "--suite",
            "text/addition",
            "--episodes-per-task",
            "20",
            "--out",
            str(tmp_path / "e"),
        ],
    )
    assert out.exit_code == 0, out.output
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert results["suite"] == "text/addition" and results["totals"]["episodes"] == 20
    assert {"success_rate", "ci95_low", "ci95_high"} <= set(results["tasks"]["addition"])
    assert len((tmp_path / "e" / "completions.jsonl").read_text().splitlines()) == 20
    args = ["eval", "--ckpt", str(result.final_dir), "--suite", "text/addition", "--episodes-per-task", "10"]
    sampled = runner.invoke(app, [*args, "-a", "temperature=1.0", "--out", str(tmp_path / "s")])
    assert sampled.exit_code == 0, sampled.output
    assert json.loads((tmp_path / "s" / "results.json").read_text())["config"]["temperature"] == 1.0
    bad = runner.invoke(app, [*args, "-a", "top_k=3", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "-a top_k: a text eval takes -a temperature=T" in bad.output


def test_text_eval_refuses_a_server_and_a_robot_checkpoint(tmp_path: Path) -> None:
    out = runner.invoke(
        app, ["eval", "--policy", "ws://127.0.0.1:1", "--suite", "text/addition", "--out", str(tmp_path)]
    )
    assert out.exit_code == 2 and "pass --ckpt DIR" in out.output
    robot = Path(__file__).resolve().parents[2] / "checkpoints" / "flow_tabletop_state_weak"
    out = runner.invoke(app, ["eval", "--ckpt", str(robot), "--suite", "text/addition", "--out", str(tmp_path)])
    assert out.exit_code == 2 and "not a causal-LM config" in out.output


@pytest.mark.parametrize("recipe", ["debug_text_grpo", "debug_text_dpo"])
def test_text_rl_recipes_run_resume_exactly_and_export(recipe: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    straight = tmp_path / "a"
    result = launch(
        recipe, [f"output.dir={straight}", "output.tensorboard=false", "train.progress=false"], log=lambda _: None
    )
    assert result.finished and result.final_dir is not None
    rows = _records(straight)
    assert len(rows) == 2 and all("loss" in r for r in rows), rows
    killed = tmp_path / "b"
    overrides = [f"output.dir={killed}", "output.tensorboard=false", "train.progress=false"]
    name, config = load_train_recipe(recipe, overrides)
    runner_fn = (
        run_text_grpo
        if name == "text_grpo"
        else __import__("cosmos_robot_trainers.text.dpo", fromlist=["run_text_dpo"]).run_text_dpo
    )
    runner_fn(config, stop_at_step=1, log=lambda _: None)
    assert runner_fn(config, log=lambda _: None).resumed_from == 1
    assert _records(killed) == rows
    AutoModelForCausalLM.from_pretrained(result.final_dir, local_files_only=True)
    if name == "text_grpo":
        assert rows[0]["logprob_gap_max"] < 1e-4 and abs(rows[0]["tis_mean"] - 1.0) < 1e-4
        assert rows[0]["kl_ref"] == 0.0  # the first update starts at the reference


def test_shuffled_rewards_keep_their_values_but_not_their_owners(tmp_path: Path) -> None:
    from cosmos_robot.text.engines import Completion

    comps = [[Completion([1], [2], [0.0], True, str(i)) for i in range(4)] for _ in range(2)]
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0])
    pairs = sampled_pairs(comps, rewards, per_prompt=10, generator=torch.Generator().manual_seed(0))
    # group 0: 1 > 0.5 > 0 = 0 gives 5 ordered pairs; group 1 is unanimous: none
    assert len(pairs) == 5 and all(w.text != lo.text for w, lo in pairs)
    a = launch(
        "debug_text_grpo",
        [f"output.dir={tmp_path / 'a'}", "train.steps=1", "output.tensorboard=false", "train.progress=false"],
        log=lambda _: None,
    )
    b = launch(
        "debug_text_grpo",
        [
            f"output.dir={tmp_path / 'b'}",
            "train.steps=1",
            "reward.shuffle=true",
            "output.tensorboard=false",
            "train.progress=false",
        ],
        log=lambda _: None,
    )
    ra, rb = _records(a.out_dir)[0], _records(b.out_dir)[0]
    assert ra["reward_mean"] == rb["reward_mean"]  # the same samples and the same true rewards
    # trained on permuted rewards: another gradient. (Not the loss: with one update per batch the ratio is
    # exactly 1, so the loss is the mean advantage, 0 up to rounding, for any rewards; it passed on residues.)
    assert ra["grad_norm"] != pytest.approx(rb["grad_norm"], rel=1e-4)


def test_dpo_pairs_file_errors_name_the_line(tmp_path: Path) -> None:
    from cosmos_robot.text.tiny import char_tokenizer

    tok = char_tokenizer("arithmetic")
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n" + json.dumps({"prompt": "x"}))
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: missing 'chosen'"):
        load_pairs(path, tok, tok.eos_token_id)
    path.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n")
    ((chosen, rejected),) = load_pairs(path, tok, tok.eos_token_id)
    assert tok.decode(chosen.ids) == "2<|im_end|>" and chosen.prompt_ids == rejected.prompt_ids


def test_export_of_a_text_run_checkpoint_is_an_hf_folder(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from cosmos_robot_exporters.base import export_checkpoint

    run = tmp_path / "run"
    result = run_text_sft(_config("debug_text_sft", run), log=lambda _: None)
    out = export_checkpoint(run / "checkpoints" / "step_000010", tmp_path / "hf")
    assert out.family == "hf_causal_lm" and (tmp_path / "hf" / "manifest.json").is_file()
    ten = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    final = AutoModelForCausalLM.from_pretrained(result.final_dir, local_files_only=True)
    w10 = dict(ten.named_parameters())["model.norm.weight"]
    assert not torch.equal(w10, dict(final.named_parameters())["model.norm.weight"])  # step 10, not step 20


def test_sft_conversation_file_is_read_and_bad_lines_are_named(tmp_path: Path) -> None:
    from cosmos_robot.text.tiny import char_tokenizer
    from cosmos_robot_trainers.text.sft import load_conversations

    path = tmp_path / "chats.jsonl"
    chat = {"messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]}
    path.write_text(json.dumps(chat) + "\n\n" + json.dumps(chat) + "\n")
    base = _config("debug_text_sft", tmp_path / "r")
    config = base.model_copy(update={"data": base.data.model_copy(update={"task": None, "path": str(path)})})
    convs, images = load_conversations(config, char_tokenizer("arithmetic"), lambda _: None)
    assert images is None
    assert len(convs) == 2 and sum(convs[0].assistant_mask) == 2  # "2" and <|im_end|>
    path.write_text(json.dumps(chat) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"chats.jsonl:2: expected a JSON object"):
        load_conversations(config, char_tokenizer("arithmetic"), lambda _: None)


def test_chunked_selective_log_softmax_equals_the_full_one_with_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    from cosmos_robot_trainers.text import grpo

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50, requires_grad=True)
    targets = torch.randint(0, 50, (3, 5))
    full = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    (g_full,) = torch.autograd.grad(full.sum(), logits)
    monkeypatch.setattr(grpo, "LOGSOFTMAX_CHUNK_ELEMENTS", 120)  # 2 rows per chunk: 8 checkpointed chunks
    chunked = grpo.selective_log_softmax(logits, targets, 0.7)
    (g_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    assert torch.equal(chunked, full) and torch.equal(g_chunked, g_full)


@pytest.mark.parametrize(
    ("recipe", "extra"),
    [
        ("debug_text_grpo", ["optim.minibatch_size=4"]),  # several updates: a scoring pass gives "old"
        ("debug_text_grpo", ["optim.minibatch_size=16"]),  # one update per batch: old = its own, detached
        ("debug_text_dpo", []),
    ],
)
def test_micro_batches_accumulate_to_the_whole_minibatch_step(recipe: str, extra: list[str], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    weights = []
    for micro in ([], ["optim.micro_batch_size=3"]):
        out = tmp_path / str(len(micro))
        overrides = [f"output.dir={out}", "output.tensorboard=false", "train.progress=false", "train.steps=1"]
        launch(recipe, [*overrides, *extra, *micro, "eval.final=false"], overwrite=True)
        if extra:  # with one update per batch every ratio is exactly 1 (TRL's num_iterations = 1)
            assert (_records(out)[-1]["ratio_mean"] == 1.0) == (extra == ["optim.minibatch_size=16"])
        weights.append(load_file(out / "checkpoints" / "step_000001" / "model.safetensors"))
        assert _records(out)[-1]["loss"] == pytest.approx(_records(tmp_path / "0")[-1]["loss"], abs=1e-6)
    assert weights[0].keys() == weights[1].keys()
    for name, a in weights[0].items():
        assert torch.allclose(a, weights[1][name], atol=1e-6), name


GPU_RECIPES = [
    "sft_qwen3_gsm8k",
    "grpo_qwen3_gsm8k",
    "dr_grpo_qwen3_gsm8k",
    "dapo_qwen3_gsm8k",
    "gspo_qwen3_gsm8k",
    "ppo_qwen3_gsm8k",
]


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipes_run_on_a_tiny_model_and_a_gsm8k_file(recipe: str, tmp_path: Path) -> None:
    """The GPU recipes as written, shrunk only in size and moved to the CPU: their data source (GSM8K's
    JSONL format), engine, losses and micro-batching run end to end."""
    from cosmos_robot.text.tiny import write_tiny

    model = write_tiny(tmp_path / "qwen3", hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "question": f"Tom has {n} pens and buys {n + 1}. How many?",
                    "answer": f"{n}+{n + 1}\n#### {2 * n + 1}",
                }
            )
            + "\n"
            for n in range(12)
        )
    )
    shrink = [
        f"init={model}",
        f"data.task=jsonl:{data}",
        f"eval.task=jsonl:{data}",
        "eval.prompts=2",
        "eval.max_new_tokens=4",
        "train.device=cpu",
        "train.dtype=float32",
        "train.num_threads=1",
        "train.steps=2",
        "train.ckpt_every=1" if recipe != "sft_qwen3_gsm8k" else "train.ckpt_every=2",
        "train.log_every=1",
        "optim.warmup_steps=0",
    ]
    if recipe == "sft_qwen3_gsm8k":
        shrink += ["data.examples=12", "data.max_length=256", "data.pack_length=256", "train.batch_size=2"]
    else:
        shrink += ["rollout.prompts_per_iter=2", "rollout.group_size=4", "rollout.max_new_tokens=4"]
        shrink += ["optim.minibatch_size=4", "optim.micro_batch_size=2", "eval.initial=false"]
    if recipe == "ppo_qwen3_gsm8k":  # its vLLM engine needs a GPU (tests/text/test_vllm_gpu.py)
        shrink.append("rollout.engine=transformers_static")
    out = [f"output.dir={tmp_path / 'run'}", "output.tensorboard=false", "train.progress=false"]
    result = launch(recipe, [*out, *shrink], overwrite=True)
    assert result.final_dir is not None and (Path(result.final_dir) / "config.json").exists()


@pytest.mark.slow
def test_a_rollout_engine_in_a_ray_actor_samples_the_in_process_engine_completions(tmp_path: Path) -> None:
    """``rollout.placement = "ray"``: the engine runs in a Ray actor on its own copy of the model, synced
    after every update through the object store or by a gloo broadcast; seeded sampling on the same
    weights makes both runs the in-process run, iteration for iteration (iteration 2 samples from the
    weights iteration 1 trained, so a missed sync shows)."""
    pytest.importorskip("ray")
    runs = {}
    for name, sets in {
        "local": (),
        "ray": ('rollout.placement="ray"',),
        "collective": ('rollout.placement="ray"', 'rollout.weight_sync="collective"'),
    }.items():
        config = _config("debug_text_grpo", tmp_path / name, "eval.final=false", *sets)
        assert run_text_grpo(config, log=lambda _: None).finished
        runs[name] = _records(tmp_path / name)
    assert len(runs["local"]) == 2 and runs["local"][0]["grad_norm"] > 0
    assert runs["ray"] == runs["local"] and runs["collective"] == runs["local"]
    with pytest.raises(ConfigError, match=r"rollout\.weight_sync and rollout\.engine_gpus apply to an engine"):
        _config("debug_text_grpo", tmp_path / "x", 'rollout.weight_sync="collective"')


@pytest.mark.parametrize("recipe", ["debug_text_sft", "debug_text_sft_vl"])
def test_text_sft_micro_batches_take_the_same_steps(recipe: str, tmp_path: Path) -> None:
    """``optim.micro_batch_size = 1``: every row its own forward/backward, weighted by its share of the
    batch's trained tokens: the same losses and gradient norms as the whole batch at once."""
    curves = {}
    for name, sets in {"whole": (), "micro": ("optim.micro_batch_size=1",)}.items():
        config = _config(recipe, tmp_path / name, "train.steps=4", "eval.final=false", *sets)
        assert run_text_sft(config, log=lambda _: None).finished
        curves[name] = [(r["loss"], r["grad_norm"]) for r in _records(tmp_path / name) if "loss" in r]
    assert len(curves["whole"]) >= 1 and len(curves["whole"]) == len(curves["micro"])
    for (la, ga), (lb, gb) in zip(curves["whole"], curves["micro"], strict=True):
        assert la == pytest.approx(lb, abs=1e-5) and ga == pytest.approx(gb, rel=1e-4)
