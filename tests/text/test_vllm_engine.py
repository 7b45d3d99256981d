"""The vLLM rollout engine's own logic on the CPU: its build, the outputs it converts, weight sync, errors.

vLLM itself needs a CUDA GPU; here it is replaced by a named test double of its offline API
(tests/text/vllm_double.py). The real vLLM runs in tests/text/test_vllm_gpu.py on the device machine.
"""

from __future__ import annotations

import copy
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from cosmos_robot.text.chat import prompt_ids
from cosmos_robot.text.engines import ENGINES, EngineError, SamplingParams, make_engine
from cosmos_robot.text.hf import load_causal_lm
from cosmos_robot.text.tiny import write_tiny
from cosmos_robot.text.vllm_engine import VLLMEngine
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.text.grpo import run_text_grpo
from tests.text import vllm_double


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    sizes = {"hidden": 16, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 32}
    folder = write_tiny(tmp_path_factory.mktemp("lm") / "qwen3", **sizes)
    return load_causal_lm(folder)


@pytest.fixture
def double(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setitem(sys.modules, "vllm", vllm_double.module())
    monkeypatch.setattr(VLLMEngine, "require_cuda", staticmethod(lambda device: None))  # the double runs on a CPU
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    vllm_double.BUILT.clear()
    return vllm_double


def _prompts(lm: Any) -> list[list[int]]:
    return [prompt_ids(lm.tokenizer, [{"role": "user", "content": q}]) for q in ("12+3=", "7+80=")]


def _teacher_forced(model: Any, prompt: list[int], ids: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids]), use_cache=False).logits[0].float() / temperature
    return torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, torch.tensor(ids)[:, None])[:, 0]


def test_vllm_is_a_registered_engine_and_its_absence_says_how_to_install_it(
    lm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "vllm" in ENGINES
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed: importing it raises ImportError
    engine = make_engine("vllm", lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    with pytest.raises(EngineError, match=r"pip install 'cosmos-robot\[vllm\]'"):
        engine.generate(_prompts(lm), 2, SamplingParams())
    with pytest.raises(ValueError, match="known: transformers, transformers_static, vllm"):
        make_engine("sglang", lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)


def test_a_cpu_model_or_a_separate_engine_process_is_refused_by_name(lm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", vllm_double.module())
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    with pytest.raises(EngineError, match="train.device = 'cuda'"):
        VLLMEngine(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id).generate(_prompts(lm), 2, SamplingParams())
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(EngineError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        VLLMEngine(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id).generate(_prompts(lm), 2, SamplingParams())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completions_carry_vllms_tokens_log_probs_and_stops(lm: Any, double: Any, temperature: float) -> None:
    options = {"vllm": {"gpu_memory_utilization": 0.25, "enforce_eager": True, "max_model_len": None}}
    engine = make_engine("vllm", lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id, options)
    prompts = _prompts(lm)
    groups = engine.generate(prompts, 3, SamplingParams(max_new_tokens=6, temperature=temperature, seed=5))
    (llm,) = double.BUILT
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs" and llm.kwargs["skip_tokenizer_init"] is True
    assert llm.kwargs["gpu_memory_utilization"] == 0.25 and llm.kwargs["enforce_eager"] is True
    assert "max_model_len" not in llm.kwargs and llm.kwargs["dtype"] == "float32" and llm.kwargs["seed"] == 5
    assert [len(g) for g in groups] == [3, 3]
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            assert c.prompt_ids == prompt and 1 <= len(c.ids) <= 6 and len(c.log_probs) == len(c.ids)
            assert c.stopped == (c.ids[-1] in lm.stop_ids)
            assert c.text == lm.tokenizer.decode(c.ids[:-1] if c.stopped else c.ids, skip_special_tokens=True)
            # the snapshot vLLM was built from holds the trainer's weights: its log-probs are the trainer's
            ref = _teacher_forced(lm.model, prompt, c.ids, temperature)
            assert float((ref - torch.tensor(c.log_probs)).abs().max()) < 1e-4
    assert not Path(llm.folder).exists() or (Path(llm.folder) / "config.json").exists()


def test_weight_sync_loads_the_trainers_tensors_and_resets_the_prefix_cache(lm: Any, double: Any) -> None:
    model = copy.deepcopy(lm.model)
    engine = VLLMEngine(model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    engine.sync_weights(model)  # nothing built yet: nothing to sync
    assert engine.syncs == 0 and not double.BUILT
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)
    engine.generate(_prompts(lm)[:1], 1, greedy)
    (llm,) = double.BUILT
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    engine.sync_weights(model)
    assert engine.syncs == 1 and llm.prefix_cache_resets == 1
    for name, tensor in model.state_dict().items():
        assert torch.equal(llm.hf.state_dict()[name], tensor), name
    prompt = _prompts(lm)[0]
    ((c,),) = engine.generate([prompt], 1, greedy)
    ref = model.generate(
        torch.tensor([prompt]), max_new_tokens=5, do_sample=False, eos_token_id=lm.stop_ids, pad_token_id=lm.pad_id
    )
    assert c.ids == ref[0, len(prompt) :].tolist() and len(double.BUILT) == 1


def _output(token_ids: list[int], reason: str, logprobs: Any = "auto") -> Any:
    lps = [{t: types.SimpleNamespace(logprob=-0.5)} for t in token_ids] if logprobs == "auto" else logprobs
    out = types.SimpleNamespace(token_ids=token_ids, logprobs=lps, finish_reason=reason, stop_reason=None)
    return types.SimpleNamespace(outputs=[out])


@pytest.mark.parametrize(
    ("output", "error"),
    [
        (_output([5, 6], "stop"), "without one of the stop tokens"),
        (_output([5, 6], "length", logprobs=None), "none log-probs for 2 tokens"),
        (_output([5, 6], "length", logprobs=[{5: types.SimpleNamespace(logprob=-1.0)}]), "1 log-probs for 2 tokens"),
        (_output([5, 6], "abort"), "finished with 'abort'"),
        (types.SimpleNamespace(outputs=[]), "returned no completion"),
    ],
)
def test_malformed_vllm_outputs_are_errors_naming_the_request(lm: Any, output: Any, error: str) -> None:
    engine = VLLMEngine(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    with pytest.raises(EngineError, match=f"request 3.*{error}"):
        engine._completion([1, 2], output, 3)


def test_grpo_runs_on_the_vllm_engine_and_syncs_after_each_update(tmp_path: Path, double: Any) -> None:
    _, config = load_train_recipe(
        "debug_text_grpo",
        [f"output.dir={tmp_path}", "output.tensorboard=false", "train.progress=false", "rollout.engine=vllm"],
    )
    assert config.rollout.vllm.gpu_memory_utilization == 0.3
    result = run_text_grpo(config, log=lambda _: None)
    assert result.finished
    (llm,) = double.BUILT
    assert llm.prefix_cache_resets == config.train.steps  # one weight sync per update
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "logprob_gap_max" in r]
    assert len(rows) == 2 and rows[0]["logprob_gap_max"] < 1e-4  # the double samples from the same fp32 weights
    with pytest.raises(Exception, match="gpu_memory_utilization"):
        load_train_recipe("debug_text_grpo", ["rollout.vllm.gpu_memory_utilization=1.5"])


def test_a_moe_models_weights_reach_vllm_in_the_checkpoint_layout(double: Any) -> None:
    """transformers 5 fuses a MoE layer's experts in memory; vLLM's load_weights reads checkpoint names."""
    from cosmos_robot.text.tiny import char_tokenizer, tiny_causal_lm

    lm = tiny_causal_lm(char_tokenizer("arithmetic"), model_type="qwen3_moe", hidden=16, layers=1, heads=2,
                        kv_heads=1, intermediate=32)  # fmt: skip
    assert any("experts.gate_up_proj" in k for k in lm.model.state_dict())  # fused in memory
    engine = VLLMEngine(lm.model, lm.tokenizer, lm.stop_ids, lm.pad_id)
    engine.generate([[1, 2]], 1, SamplingParams(max_new_tokens=2, temperature=0.0))
    with torch.no_grad():
        for p in lm.model.parameters():
            p.add_(0.1)
    engine.sync_weights(lm.model)
    (llm,) = double.BUILT
    for name, tensor in lm.model.state_dict().items():
        assert torch.equal(llm.hf.state_dict()[name], tensor), name
