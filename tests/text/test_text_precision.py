"""float32 master weights for bfloat16 text models: small updates that plain AdamW on bf16 weights rounds away
accumulate, the model holds the rounded master, and a bf16 run resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from cosmos_robot.text.tiny import char_tokenizer, tiny_causal_lm
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.sft.config import OptimConfig
from cosmos_robot_trainers.sft.optim import build_optimizer
from cosmos_robot_trainers.text.grpo import run_text_grpo
from cosmos_robot_trainers.text.precision import MasterWeights, build_text_optimizer


def _model() -> torch.nn.Module:
    lm = tiny_causal_lm(char_tokenizer("arithmetic"), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)
    return lm.model.to(torch.bfloat16)


def _loss(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(12).view(2, 6) % 20
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def test_master_weights_keep_updates_that_bf16_weights_round_away() -> None:
    cfg = OptimConfig(lr=1e-6, warmup_steps=0, schedule="constant", weight_decay=0.0)
    plain = _model()
    before = {n: p.detach().clone() for n, p in plain.named_parameters()}
    opt, _ = build_optimizer(plain, cfg, 10)
    for _ in range(5):
        opt.zero_grad()
        _loss(plain).backward()
        opt.step()
    moved = sum(int((p != before[n]).sum()) for n, p in plain.named_parameters())
    total = sum(p.numel() for p in plain.parameters())
    assert moved < 0.05 * total  # bf16 AdamW at 1e-6: (nearly) every update rounds away
    model = _model()
    opt2, sched = build_text_optimizer(model, cfg, 10)
    assert isinstance(opt2, MasterWeights)
    start = {n: p.detach().float().clone() for n, p in opt2.master.named_parameters()}
    for _ in range(5):
        opt2.zero_grad()
        _loss(model).backward()
        opt2.step()
        sched.step()
    drift = [float((p.detach() - start[n]).abs().max()) for n, p in opt2.master.named_parameters()]
    assert max(drift) > 4e-6  # five steps of ~1e-6 each, kept in float32
    for p, m in opt2.pairs:
        assert torch.equal(p, m.to(torch.bfloat16))  # the model holds the rounded master weights


def test_a_bf16_run_resumes_exactly_from_its_master_weights(tmp_path: Path) -> None:
    def rows(out: Path) -> list[dict]:
        drop = {"steps_per_s", "iter_wall_s", "time/rollout", "time/update", "tokens_per_s"}
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in drop} for r in lines if "final_eval" not in r]

    common = ["output.tensorboard=false", "train.progress=false", "train.dtype=bfloat16", "optim.lr=1e-5"]
    _, straight = load_train_recipe("debug_text_grpo", [f"output.dir={tmp_path / 'a'}", *common])
    run_text_grpo(straight, log=lambda _: None)
    _, killed = load_train_recipe("debug_text_grpo", [f"output.dir={tmp_path / 'b'}", *common])
    run_text_grpo(killed, stop_at_step=1, log=lambda _: None)
    assert run_text_grpo(killed, log=lambda _: None).resumed_from == 1
    assert rows(tmp_path / "b") == rows(tmp_path / "a")
