"""The real vLLM engine on a GPU (the device machine; skipped where vLLM or CUDA is missing).

A tiny Qwen3 in bf16 on the GPU, the trainer's own layout: vLLM's sampled log-probs against the
trainer's teacher-forced pass of the same weights, the stop handling, and a weight sync that moves
vLLM's copy to perturbed weights (without the sync the gap would be the perturbation's). One vLLM per
process (vLLM sets up its distributed state once), so everything is in one test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cosmos_robot.text.chat import prompt_ids
from cosmos_robot.text.engines import SamplingParams, make_engine
from cosmos_robot.text.hf import load_causal_lm
from cosmos_robot.text.tiny import write_tiny


def _gaps(model: Any, groups: list, prompts: list[list[int]], temperature: float) -> torch.Tensor:
    gaps = []
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            ids = torch.tensor([prompt + c.ids], device="cuda")
            with torch.no_grad():
                logits = model(ids, use_cache=False).logits[0].float() / temperature
            ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, ids[0, len(prompt) :, None])[:, 0]
            gaps.append((ref.cpu() - torch.tensor(c.log_probs)).abs())
    return torch.cat(gaps)


@pytest.mark.gpu
def test_vllm_engine_log_probs_match_the_trainer_and_follow_weight_sync(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("vllm")
    folder = write_tiny(tmp_path / "qwen3", hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512)
    lm = load_causal_lm(folder)
    model = lm.model.to("cuda", torch.bfloat16)
    options = {"vllm": {"gpu_memory_utilization": 0.1, "enforce_eager": False, "max_model_len": 512}}
    engine = make_engine("vllm", model, lm.tokenizer, lm.stop_ids, lm.pad_id, options)
    prompts = [prompt_ids(lm.tokenizer, [{"role": "user", "content": q}]) for q in ("12+3=", "7+80=", "1+1=")]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)
    groups = engine.generate(prompts, 4, params)
    for group in groups:
        for c in group:
            assert len(c.ids) == len(c.log_probs) and 1 <= len(c.ids) <= 24
            assert c.stopped == (c.ids[-1] in lm.stop_ids) and (c.stopped or len(c.ids) == 24)
    before = _gaps(model, groups, prompts, 1.0)
    print(f"bf16 log-prob gap, vLLM vs trainer: mean {before.mean():.4f}, max {before.max():.4f}")
    assert before.mean() < 0.05 and before.max() < 0.5
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    stale = _gaps(model, groups, prompts, 1.0)  # the old samples scored by the new weights
    engine.sync_weights(model)
    groups = engine.generate(prompts, 4, params)
    after = _gaps(model, groups, prompts, 1.0)
    print(f"after a sync: mean {after.mean():.4f} (stale weights would give {stale.mean():.4f})")
    assert after.mean() < 0.05 and stale.mean() > 4 * after.mean()
