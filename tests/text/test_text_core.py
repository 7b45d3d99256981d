"""The text core on real-format tiny models: HF folders, chat masks, packing, the rollout engine, tasks, rewards."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from cosmos_robot.policies.registry import CheckpointError, family_of
from cosmos_robot.text.chat import ChatError, prompt_ids, tokenize_conversation
from cosmos_robot.text.engines import SamplingParams, StaticGenerateEngine, TransformersEngine
from cosmos_robot.text.hf import load_causal_lm, save_causal_lm
from cosmos_robot.text.packing import collate_rows, pack_bfd, packed_logits
from cosmos_robot.text.rewards import HttpReward, RewardError, countdown, exact_match, get_reward, gsm8k
from cosmos_robot.text.tasks import get_task, task_examples
from cosmos_robot.text.tiny import char_tokenizer, tiny_causal_lm, write_tiny

SIZES = {"hidden": 16, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 32}
CONV = [
    {"role": "system", "content": "add"},
    {"role": "user", "content": "12+34="},
    {"role": "assistant", "content": "46"},
    {"role": "user", "content": "1+1="},
    {"role": "assistant", "content": "2"},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("lm") / "qwen3", **SIZES)


@pytest.fixture(scope="module")
def lm(tiny_dir: Path) -> Any:
    return load_causal_lm(tiny_dir)


# --- HF folders -----------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "qwen3_moe"])
def test_folder_round_trip_loads_unchanged_in_transformers(tmp_path: Path, model_type: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = write_tiny(tmp_path / "src", model_type=model_type, **SIZES)
    lm = load_causal_lm(src)
    assert family_of(src).name == "hf_causal_lm"
    out = save_causal_lm(lm, tmp_path / "out")
    again = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ids = torch.tensor([tok.apply_chat_template(CONV, tokenize=True, return_dict=True)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, again(ids).logits)
    assert again.config.model_type == model_type and tok.chat_template == lm.tokenizer.chat_template


def test_folder_errors_name_the_missing_piece(tmp_path: Path, tiny_dir: Path) -> None:
    import shutil

    broken = tmp_path / "b"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors"):
        load_causal_lm(broken)
    shutil.rmtree(broken)
    shutil.copytree(tiny_dir, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="no tokenizer"):
        load_causal_lm(broken)
    shutil.rmtree(broken)
    shutil.copytree(tiny_dir, broken)
    (broken / "chat_template.jinja").unlink()
    with pytest.raises(CheckpointError, match="no chat template"):
        load_causal_lm(broken)
    assert load_causal_lm(broken, require_chat_template=False).tokenizer.chat_template is None
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["Qwen3Model"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="not a causal-LM config"):
        load_causal_lm(broken)


def test_a_text_model_is_not_served_as_a_robot_policy(tiny_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="not a robot policy.*--suite text/"):
        family_of(tiny_dir).policy_class()


# --- chat masks -----------------------------------------------------------------------------------


def _decode_masked(tok: Any, ids: list[int], mask: list[int]) -> str:
    return tok.decode([i for i, m in zip(ids, mask) if m])


def test_assistant_mask_from_generation_tags_and_from_prefixes_agree() -> None:
    tagged = char_tokenizer()
    plain = char_tokenizer()
    # the same ChatML without {% generation %}: assistant tokens are found by prefix differences
    plain.chat_template = tagged.chat_template.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    a = tokenize_conversation(tagged, CONV)
    b = tokenize_conversation(plain, CONV)
    assert a.input_ids == b.input_ids and a.assistant_mask == b.assistant_mask
    assert _decode_masked(tagged, a.input_ids, a.assistant_mask) == "46<|im_end|>2<|im_end|>"
    cut = tokenize_conversation(tagged, CONV, max_length=len(a.input_ids) - 4)
    assert cut.truncated and cut.input_ids == a.input_ids[:-4] and cut.assistant_mask == a.assistant_mask[:-4]
    with pytest.raises(ChatError, match="no assistant token left after truncation to max_length=10"):
        tokenize_conversation(tagged, CONV, max_length=10)


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    tok = char_tokenizer()
    # renders only the LAST assistant turn's content in full: earlier ones change when a turn is added
    tok.chat_template = (
        "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' -}}"
        "{%- if m['role'] == 'assistant' and not loop.last -%}{{- 'x<|im_end|>\\n' -}}"
        "{%- else -%}{{- m['content'] + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
    with pytest.raises(ChatError, match=r"not prefix-consistent at messages\[2\].*generation"):
        tokenize_conversation(tok, CONV)


def test_bad_conversations_name_the_field() -> None:
    tok = char_tokenizer()
    with pytest.raises(ChatError, match=r"ex 3: messages\[1\].role"):
        tokenize_conversation(tok, [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}], where="ex 3")
    with pytest.raises(ChatError, match="no assistant message"):
        tokenize_conversation(tok, [{"role": "user", "content": "a"}])
    with pytest.raises(ChatError, match="content must be a string"):
        prompt_ids(tok, [{"role": "user", "content": 3}])
    ids = prompt_ids(tok, [{"role": "user", "content": "1+2="}])
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")


# --- packing --------------------------------------------------------------------------------------


def test_best_fit_decreasing_packs_every_sequence_once_within_capacity() -> None:
    lengths = [7, 5, 5, 4, 3, 3, 2, 1]
    rows = pack_bfd(lengths, 10)
    members = sorted(i for r in rows for i in r.members)
    assert members == list(range(len(lengths)))
    assert all(r.length == sum(lengths[i] for i in r.members) <= 10 for r in rows)
    # best fit: 7 then 3 fills a row exactly; the two 5s fill another; 4+3+2+1 the third
    assert sorted(sorted(lengths[i] for i in r.members) for r in rows) == [[1, 2, 3, 4], [3, 7], [5, 5]]
    with pytest.raises(ValueError, match=r"sequences \[0\] are longer than the packing capacity 6"):
        pack_bfd([7, 1], 6)


def test_packed_rows_give_each_sequence_its_own_logits_only_without_the_cache(lm: Any) -> None:
    convs = [tokenize_conversation(lm.tokenizer, CONV[:3]), tokenize_conversation(lm.tokenizer, CONV[1:])]
    batch = collate_rows([[(c.input_ids, c.assistant_mask) for c in convs]], lm.pad_id)
    n0 = len(convs[0].input_ids)
    with torch.no_grad():
        packed = packed_logits(lm.model, batch["input_ids"], batch["position_ids"])
        alone = [lm.model(torch.tensor([c.input_ids]), use_cache=False).logits[0] for c in convs]
        # what a packed forward with transformers' default cache does: the second sequence attends to the first
        leaky = lm.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    assert torch.allclose(packed[0, :n0], alone[0], atol=1e-5)
    assert torch.allclose(packed[0, n0:], alone[1], atol=1e-5)
    assert (leaky[0, n0:] - alone[1]).abs().max() > 1e-3
    labels = batch["labels"][0]
    assert labels[0] == -100 and labels[n0] == -100  # no sequence is trained to follow the previous one
    assert batch["position_ids"][0, n0] == 0


# --- rollout engine -------------------------------------------------------------------------------


ENGINE_CLASSES = [TransformersEngine, StaticGenerateEngine]


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_log_probs_match_a_teacher_forced_forward(lm: Any, temperature: float, engine_cls: Any) -> None:
    engine = engine_cls(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    prompts = [prompt_ids(lm.tokenizer, [{"role": "user", "content": q}]) for q in ("12+3=", "7+80=")]
    groups = engine.generate(prompts, 3, SamplingParams(max_new_tokens=6, temperature=temperature, seed=5))
    assert [len(g) for g in groups] == [3, 3]
    worst = 0.0
    for prompt, group in zip(prompts, groups):
        for c in group:
            ids = torch.tensor([prompt + c.ids])
            with torch.no_grad():
                logits = lm.model(ids, use_cache=False).logits[0].float() / temperature
            ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, torch.tensor(c.ids)[:, None])[:, 0]
            worst = max(worst, float((ref - torch.tensor(c.log_probs)).abs().max()))
            assert c.stopped == (c.ids[-1] in lm.stop_ids) and len(c.ids) <= 6
    assert worst < 1e-4
    again = engine.generate(prompts, 3, SamplingParams(max_new_tokens=6, temperature=temperature, seed=5))
    assert [[c.ids for c in g] for g in again] == [[c.ids for c in g] for g in groups]
    assert lm.model.config._attn_implementation == "sdpa"  # the training attention is restored


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_greedy_engine_equals_generate(lm: Any, engine_cls: Any) -> None:
    engine = engine_cls(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    prompt = prompt_ids(lm.tokenizer, [{"role": "user", "content": "5+5="}])
    ((c,),) = engine.generate([prompt], 1, SamplingParams(max_new_tokens=5, temperature=0.0))
    ref = lm.model.generate(
        torch.tensor([prompt]), max_new_tokens=5, do_sample=False, eos_token_id=lm.stop_ids, pad_token_id=lm.pad_id
    )
    assert c.ids == ref[0, len(prompt) :].tolist()


# --- tasks and rewards ----------------------------------------------------------------------------


def test_task_splits_are_disjoint_and_deterministic() -> None:
    train = task_examples("addition", "train", 400, seed=0)
    held = task_examples("addition", "eval", 300, seed=0)
    assert not {e.problem for e in train} & {e.problem for e in held}
    assert len({e.problem for e in held}) == 300
    assert [e.problem for e in task_examples("addition", "eval", 300, seed=0)] == [e.problem for e in held]
    ex = held[0]
    a, b = ex.problem.rstrip("=").split("+")
    assert ex.answer == str(int(a) + int(b)) and exact_match(ex.answer, ex.ground_truth()) == 1.0
    c = get_task("countdown").example(3)
    assert countdown(c.solution, c.ground_truth()) == 1.0
    with pytest.raises(ValueError, match="did you mean 'addition'"):
        get_task("additon")


def test_rule_rewards_follow_the_published_rules() -> None:
    assert gsm8k("so #### 1,234", {"answer": "1234"}) == 1.0
    assert gsm8k("so #### 72.0", {"answer": "72"}) == 0.0  # verl compares strings
    assert get_reward("gsm8k_flexible")("the answer is 72", {"answer": "72"}) == 1.0
    truth = {"numbers": [3, 4, 5], "target": 17}
    assert countdown("<answer>3*4+5</answer>", truth) == 1.0
    assert countdown("<answer>3*4-5</answer>", truth) == 0.1  # valid, wrong
    assert countdown("<answer>3*4+5+5</answer>", truth) == 0.1  # a number used twice
    assert countdown("<answer>__import__('os')</answer>", truth) == 0.1  # never evaluated
    assert countdown("no answer", truth) == 0.0
    with pytest.raises(RewardError, match="unknown reward 'exact'"):
        get_reward("exact")


class _Service(BaseHTTPRequestHandler):
    mode = "ok"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.mode == "slow":
            threading.Event().wait(1.0)
        rewards: Any = [float(len(c)) for c in body["completions"]]
        if self.mode == "short":
            rewards = rewards[:-1]
        reply = b"not json" if self.mode == "garbage" else json.dumps({"rewards": rewards}).encode()
        code = 500 if self.mode == "error" else 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("ok", None),
        ("short", "expected 2 rewards, got 1"),
        ("garbage", "not JSON"),
        ("error", "HTTP 500"),
        ("slow", "no answer within 0.2 s"),
    ],
)
def test_http_reward_service(mode: str, error: str | None) -> None:
    handler = type("H", (_Service,), {"mode": mode})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        scorer = HttpReward(f"http://127.0.0.1:{server.server_port}/score", timeout_s=0.2)
        if error is None:
            assert scorer.batch(["ab", "abc"], [{}, {}]) == [2.0, 3.0]
        else:
            with pytest.raises(RewardError, match=error):
                scorer.batch(["ab", "abc"], [{}, {}])
    finally:
        server.shutdown()
        server.server_close()


def test_tiny_model_has_the_requested_shape() -> None:
    lm = tiny_causal_lm(char_tokenizer(), model_type="qwen3_moe", **SIZES)
    assert lm.model.config.num_experts == 4 and lm.model.config.vocab_size == len(lm.tokenizer)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3_moe"])
def test_engine_log_probs_for_other_families(model_type: str) -> None:
    lm = tiny_causal_lm(char_tokenizer("arithmetic"), model_type=model_type, **SIZES)
    engine = TransformersEngine(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    prompt = prompt_ids(lm.tokenizer, [{"role": "user", "content": "1+2="}])
    (group,) = engine.generate([prompt], 2, SamplingParams(max_new_tokens=5, seed=1))
    for c in group:
        with torch.no_grad():
            logits = lm.model(torch.tensor([prompt + c.ids]), use_cache=False).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, torch.tensor(c.ids)[:, None])[:, 0]
        assert float((ref - torch.tensor(c.log_probs)).abs().max()) < 1e-4


# --- reasoning-gym tasks --------------------------------------------------------------------------


def test_reasoning_gym_tasks_generate_split_and_score_with_its_scorers() -> None:
    task = get_task("rg/gsm_symbolic")
    held = task_examples(task, "eval", 5, seed=0)
    train = task_examples(task, "train", 50, seed=0)
    assert not {e.problem for e in held} & {e.problem for e in train}
    assert [e.problem for e in task_examples(task, "eval", 5, seed=0)] == [e.problem for e in held]
    score = get_reward(task.reward)
    ex = held[0]
    assert ex.prompt[0]["role"] == "system" and "<answer>" in ex.prompt[0]["content"]
    assert ex.solution.endswith(f"<answer>{ex.answer}</answer>") and "####" in ex.solution  # worked solution first
    truth = ex.ground_truth()
    assert json.loads(json.dumps(truth)) == truth  # reward services get JSON
    assert score(ex.solution, truth) == 1.0
    assert score(f"<answer>{int(ex.answer) + 1}</answer>", truth) < 1.0
    assert score(ex.answer, truth) == 0.0  # no <answer> block
    cd = get_task("rg/countdown").example(1)
    assert score(cd.solution, cd.ground_truth()) == 1.0
    with pytest.raises(ValueError, match="did you mean rg/chain_sum"):
        get_task("rg/chain_summ")
    with pytest.raises(ValueError, match="rg_dataset"):
        score("<answer>1</answer>", {"answer": "1"})


def test_reasoning_gym_task_is_an_eval_suite(tiny_dir: Path, tmp_path: Path) -> None:
    from cosmos_robot.text.evaluate import run_text_eval

    results = run_text_eval(tiny_dir, "text/rg/chain_sum", tmp_path, episodes_per_task=4, max_new_tokens=4)
    assert results["suite"] == "text/rg/chain_sum" and results["totals"]["episodes"] == 4
    assert (tmp_path / "results.json").exists()


def test_jsonl_prompt_files_are_tasks(tmp_path: Path) -> None:
    gsm = tmp_path / "gsm8k.jsonl"
    n = 41
    rows = [
        {"question": f"Tom has {n} apples and buys 1,000 more. How many?", "answer": f"{n}+1000\n#### {n + 1000:,}"}
    ]
    gsm.write_text("".join(json.dumps(r | {"question": r["question"] + str(i)}) + "\n" for i in range(3) for r in rows))
    task = get_task(f"jsonl:{gsm}")
    assert task.reward == "gsm8k"
    held = task_examples(task, "eval", 3, seed=0)
    assert len(held) == 3 and {e.problem for e in held} == {e.problem for e in task_examples(task, "train", 3)}
    ex = held[0]
    assert (
        ex.answer == str(n + 1000) and 'final answer after "####"' in ex.problem and ex.solution.endswith("#### 1,041")
    )
    assert get_reward(task.reward)("so #### " + ex.answer, ex.ground_truth()) == 1.0
    plain = tmp_path / "cd.jsonl"
    plain.write_text(json.dumps({"prompt": "3 4 5 -> 17", "answer": "3*4+5", "numbers": [3, 4, 5], "target": 17}))
    ex = get_task(f"jsonl:{plain}").example(7)
    assert ex.ground_truth()["numbers"] == [3, 4, 5] and ex.solution == "3*4+5"
    assert countdown(f"<answer>{ex.solution}</answer>", ex.ground_truth()) == 1.0
    with pytest.raises(ValueError, match="does not exist"):
        get_task(f"jsonl:{tmp_path / 'missing.jsonl'}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"answer": "3"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: a task line needs"):
        get_task(f"jsonl:{bad}")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(gsm.read_text() + plain.read_text() + "\n")
    with pytest.raises(ValueError, match="one task per file"):
        get_task(f"jsonl:{mixed}")


# --- the committed tiny checkpoints ---------------------------------------------------------------

CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints"


def test_committed_grpo_checkpoint_beats_its_sft_start(tmp_path: Path) -> None:
    """checkpoints/qwen3_tiny_addition_{sft,grpo} (recipes sft_/grpo_qwen3_tiny_addition): RL from 500 SFT
    examples to fresh prompts with a verifier; docs/text.md has the 500-prompt numbers."""
    from cosmos_robot.text.evaluate import run_text_eval

    rates = {}
    for name in ("sft", "grpo"):
        out = tmp_path / name
        results = run_text_eval(
            CHECKPOINTS / f"qwen3_tiny_addition_{name}", "text/addition", out, episodes_per_task=100
        )
        rates[name] = results["totals"]["success_rate"]
    assert rates["sft"] < 0.5 and rates["grpo"] > rates["sft"] + 0.3


@pytest.mark.parametrize("engine_cls", ENGINE_CLASSES)
def test_engines_stop_at_the_end_of_a_trained_answer(engine_cls: Any) -> None:
    lm = load_causal_lm(CHECKPOINTS / "qwen3_tiny_addition_grpo")
    engine = engine_cls(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    examples = task_examples("addition", "eval", 6)
    prompts = [prompt_ids(lm.tokenizer, ex.prompt) for ex in examples]
    groups = engine.generate(prompts, 2, SamplingParams(max_new_tokens=8, temperature=0.0))
    for group in groups:
        for c in group:
            assert c.stopped and c.ids[-1] in lm.stop_ids and len(c.log_probs) == len(c.ids)
        assert group[0].text == group[1].text  # greedy
    assert sum(g[0].text == ex.answer for ex, g in zip(examples, groups)) >= 4
