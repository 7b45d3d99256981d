"""Qwen3-MoE through the text trainers: the router load-balancing loss joins training forwards (and only those),
equals transformers' own ``aux_loss`` times ``router_aux_loss_coef``, trains the routers, and is logged by SFT
and GRPO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from cosmos_robot.text.moe import install_router_aux_loss, is_moe, last_router_aux_loss, router_aux_loss
from cosmos_robot.text.tiny import char_tokenizer, tiny_causal_lm
from cosmos_robot_trainers.launch import launch

SIZES = {"hidden": 16, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 32}


def _moe() -> Any:
    return tiny_causal_lm(char_tokenizer("arithmetic"), model_type="qwen3_moe", **SIZES).model


def test_the_balancing_loss_is_transformers_own_on_training_forwards_only() -> None:
    model = _moe()
    assert is_moe(model) and install_router_aux_loss(model) and install_router_aux_loss(model)  # once
    ids = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids)
        assert router_aux_loss(model) == 0.0  # scoring and rollouts are left alone
        want = model(input_ids=ids, output_router_logits=True).aux_loss
    model(input_ids=ids)
    got = router_aux_loss(model)
    assert isinstance(got, torch.Tensor)
    assert torch.allclose(got, model.config.router_aux_loss_coef * want, atol=1e-7)
    assert abs(float(last_router_aux_loss(model)) - float(want)) < 1e-6  # type: ignore[arg-type]
    assert router_aux_loss(model) == 0.0  # taken once
    model(input_ids=ids)
    router_aux_loss(model).backward()  # type: ignore[union-attr]
    gates = [p.grad for n, p in model.named_parameters() if "mlp.gate." in n]
    assert gates and all(g is not None and float(g.abs().sum()) > 0 for g in gates)
    dense = tiny_causal_lm(char_tokenizer("arithmetic"), model_type="qwen3", **SIZES).model
    assert not install_router_aux_loss(dense) and router_aux_loss(dense) == 0.0 and last_router_aux_loss(dense) is None


def test_sft_and_grpo_of_a_moe_model_log_the_router_loss(tmp_path: Path) -> None:
    common = ["output.tensorboard=false", "train.progress=false", "model.model_type=qwen3_moe", "eval.prompts=4"]
    for recipe in ("debug_text_sft", "debug_text_grpo"):
        out = tmp_path / recipe
        result = launch(recipe, [f"output.dir={out}", "train.steps=2", *common], log=lambda _: None)
        assert result.finished
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        aux = [r["router_aux_loss"] for r in rows if "router_aux_loss" in r]
        assert aux and all(a > 0 for a in aux), (recipe, rows[-1])
