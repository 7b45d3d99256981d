"""On-policy distillation: the generalised JSD equals TRL's GKDTrainer.generalized_jsd_loss, the sampled-token
advantages follow their recursion, mismatched vocabularies are refused, and the recipe runs, resumes exactly
and exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cosmos_robot.text.hf import load_causal_lm
from cosmos_robot.text.tiny import write_tiny
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.text.opd import (
    check_shared_vocabulary,
    generalized_jsd,
    run_text_opd,
    sampled_token_advantages,
)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_generalized_jsd_equals_trls_gkd_loss_with_gradients(beta: float) -> None:
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

    g = torch.Generator().manual_seed(int(beta * 10))
    student = torch.randn(3, 5, 11, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(3, 5, 11, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 11, (3, 5), generator=g)
    labels[0, 3:] = -100
    labels[2, :1] = -100
    mask = (labels != -100).double()
    ours = (generalized_jsd(student, teacher, beta, temperature=0.9).double() * mask).sum() / mask.sum()
    (grad_ours,) = torch.autograd.grad(ours, student)
    theirs = GKDTrainer.generalized_jsd_loss(student, teacher, labels=labels, beta=beta, temperature=0.9)
    (grad_theirs,) = torch.autograd.grad(theirs, student)
    # ours computes in float32 (the trainer's precision); TRL keeps the inputs' float64
    assert abs(float(ours.detach()) - float(theirs.detach())) < 1e-6
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-6)


def test_sampled_token_advantages_are_discounted_sums_of_teacher_minus_student() -> None:
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    teacher = torch.tensor([[0.0, -1.0, -0.5, -0.2], [0.0, -0.3, -2.0, 0.0]])
    student = torch.tensor([[0.0, -0.8, -0.9, -0.1], [0.0, -0.5, -1.0, 0.0]])
    r = [[-0.2, 0.4, -0.1], [0.2, -1.0]]
    own = sampled_token_advantages(teacher, student, mask, gamma=0.0)
    assert torch.allclose(own, torch.tensor([[0.0, *r[0]], [0.0, *r[1], 0.0]]), atol=1e-6)
    half = sampled_token_advantages(teacher, student, mask, gamma=0.5)
    row0 = [r[0][0] + 0.5 * r[0][1] + 0.25 * r[0][2], r[0][1] + 0.5 * r[0][2], r[0][2]]
    row1 = [r[1][0] + 0.5 * r[1][1], r[1][1]]
    assert torch.allclose(half, torch.tensor([[0.0, *row0], [0.0, *row1, 0.0]]), atol=1e-6)


def test_a_teacher_with_another_vocabulary_is_refused_by_name(tmp_path: Path) -> None:
    sizes = {"hidden": 16, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 32}
    student = load_causal_lm(write_tiny(tmp_path / "s", alphabet="arithmetic", **sizes))
    other = load_causal_lm(write_tiny(tmp_path / "t", alphabet="printable", **sizes))
    with pytest.raises(ValueError, match=r"teacher .*/t: its tokenizer differs from the student's"):
        check_shared_vocabulary(student, other, where=f"teacher {tmp_path / 't'}")
    check_shared_vocabulary(student, load_causal_lm(write_tiny(tmp_path / "u", alphabet="arithmetic", **sizes)))


@pytest.mark.parametrize("loss", ["jsd", "sampled_token"])
def test_opd_recipe_runs_resumes_exactly_and_exports(loss: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    def rows(out: Path) -> list[dict]:
        drop = {"steps_per_s", "iter_wall_s", "time/rollout", "time/update", "tokens_per_s"}
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in drop} for r in lines if "final_eval" not in r]

    common = ["output.tensorboard=false", "train.progress=false", f"algo.loss={loss}"]
    _, straight = load_train_recipe("debug_text_opd", [f"output.dir={tmp_path / 'a'}", *common])
    result = run_text_opd(straight, log=lambda _: None)
    assert result.finished and result.final_dir is not None
    first = rows(tmp_path / "a")
    assert len(first) == 2 and all(r["teacher_kl"] > 0 for r in first)  # the SFT student is not its teacher
    _, killed = load_train_recipe("debug_text_opd", [f"output.dir={tmp_path / 'b'}", *common])
    run_text_opd(killed, stop_at_step=1, log=lambda _: None)
    assert run_text_opd(killed, log=lambda _: None).resumed_from == 1
    assert rows(tmp_path / "b") == first
    AutoModelForCausalLM.from_pretrained(result.final_dir, local_files_only=True)
