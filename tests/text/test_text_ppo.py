"""Token PPO with a critic: its maths on a hand-built batch (rewards with the KL penalty, GAE over tokens,
the clipped value loss, written out scalar by scalar as TRL 1.12's PPOTrainer defines them), the critic's
alignment and construction, and the recipe end to end (kill, resume exactly, export)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cosmos_robot.text.hf import load_causal_lm
from cosmos_robot.text.tiny import write_tiny
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.text.grpo import completion_batch
from cosmos_robot_trainers.text.ppo import build_critic, critic_values, ppo_advantages, run_text_ppo, token_rewards

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LOGP = torch.tensor([[-1.0, -0.5, -0.2], [-0.3, -0.1, 0.0]])
REF = torch.tensor([[-1.2, -0.5, -0.1], [-0.3, -0.4, 0.0]])
SCORES = torch.tensor([1.0, 0.5])
VALUES = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 0.0]])


def test_rewards_carry_the_kl_penalty_on_every_token_and_the_score_on_the_last() -> None:
    rewards, kl = token_rewards(SCORES, LOGP, REF, MASK, kl_coef=0.1, estimator="k1")
    # k1 = logp - ref: [0.2, 0, -0.1], [0, 0.3, -]; r = -0.1 k1, + score on the last completion token
    expected = [[-0.02, 0.0, 0.01 + 1.0], [0.0, -0.03 + 0.5, 0.0]]
    assert torch.allclose(rewards, torch.tensor(expected), atol=1e-7)
    assert torch.allclose(kl, torch.tensor([[0.2, 0.0, -0.1], [0.0, 0.3, 0.0]]), atol=1e-7)
    _, k3 = token_rewards(SCORES, LOGP, REF, MASK, kl_coef=0.1, estimator="k3")
    d = -0.2  # ref - logp of the first token
    assert abs(float(k3[0, 0]) - (torch.exp(torch.tensor(d)).item() - 1 - d)) < 1e-7
    no_ref, zero = token_rewards(SCORES, LOGP, None, MASK, kl_coef=0.1)
    assert float(zero.abs().sum()) == 0 and torch.equal(no_ref.sum(1), SCORES)


def test_gae_over_tokens_equals_the_recursion_written_out() -> None:
    rewards = torch.tensor([[-0.02, 0.0, 1.01], [0.0, 0.47, 0.0]])
    adv, ret = ppo_advantages(rewards, VALUES, MASK, gamma=1.0, lam=0.95, whiten=False)
    # row 0: deltas from the end (V after the last token = 0)
    d2 = 1.01 + 0.0 - 0.7
    d1 = 0.0 + 0.7 - 0.6
    d0 = -0.02 + 0.6 - 0.5
    a2, a1 = d2, d1 + 0.95 * d2
    a0 = d0 + 0.95 * a1
    # row 1: the masked third column is transparent
    b1 = 0.47 + 0.0 - 0.4
    b0 = 0.0 + 0.4 - 0.2 + 0.95 * b1
    assert torch.allclose(adv, torch.tensor([[a0, a1, a2], [b0, b1, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[a0 + 0.5, a1 + 0.6, a2 + 0.7], [b0 + 0.2, b1 + 0.4, 0.0]]), atol=1e-6)
    white, _ = ppo_advantages(rewards, VALUES, MASK, gamma=1.0, lam=0.95, whiten=True)
    flat = torch.tensor([a0, a1, a2, b0, b1])
    assert torch.allclose(white[MASK.bool()], (flat - flat.mean()) / (flat.std() + 1e-8), atol=1e-6)
    gamma_half, _ = ppo_advantages(rewards, VALUES, MASK, gamma=0.5, lam=1.0, whiten=False)
    assert abs(float(gamma_half[1, 0]) - (0.0 + 0.5 * 0.4 - 0.2 + 0.5 * b1)) < 1e-6


def test_clipped_value_loss_is_half_the_larger_squared_error() -> None:
    returns = torch.tensor([[0.95, 0.99, 1.01], [0.47, 0.47, 0.0]])
    new = torch.tensor([[0.8, 0.6, 0.7], [0.5, 0.4, 3.0]])  # the masked 3.0 must not count
    loss, m = get_algorithm("loss", "value")(new, VALUES, returns, MASK, clip=0.2, huber_delta=float("inf"))
    terms = []
    for v, old, r in [(0.8, 0.5, 0.95), (0.6, 0.6, 0.99), (0.7, 0.7, 1.01), (0.5, 0.2, 0.47), (0.4, 0.4, 0.47)]:
        clipped = old + max(-0.2, min(0.2, v - old))
        terms.append(0.5 * max((v - r) ** 2, (clipped - r) ** 2))
    assert abs(float(loss) - sum(terms) / 5) < 1e-7
    # the clipped error is larger where the new value moved past the clip: (0.8 from 0.5) and (0.5 from 0.2)
    assert abs(float(m["value_clip_fraction"]) - 2 / 5) < 1e-6


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> object:
    sizes = {"hidden": 16, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 32}
    return load_causal_lm(write_tiny(tmp_path_factory.mktemp("lm") / "qwen3", **sizes))


def test_the_critic_values_each_token_from_the_position_that_predicts_it(lm: object, tmp_path: Path) -> None:
    from cosmos_robot.text.engines import Completion

    _, config = load_train_recipe("debug_text_ppo", [f"output.dir={tmp_path}"])
    critic = build_critic(config, lm.model)  # type: ignore[attr-defined]
    for name, tensor in lm.model.state_dict().items():  # type: ignore[attr-defined]
        if name.startswith("model."):
            assert torch.equal(critic.state_dict()[name], tensor), name
    comps = [Completion([3, 4, 5], [6, 7], [], True, ""), Completion([3], [8, 9, 10], [], False, "")]
    batch = completion_batch(comps, pad_id=0)
    with torch.no_grad():
        values = critic_values(critic, batch)
        for row, c in enumerate(comps):
            alone = critic(input_ids=torch.tensor([c.prompt_ids + c.ids])).logits[0, :, 0]
            want = alone[len(c.prompt_ids) - 1 : -1]
            got = values[row, batch.prompt_width : batch.prompt_width + len(c.ids)]
            assert torch.allclose(got, want, atol=1e-5)
    assert float(values[0, batch.prompt_width + 2 :].abs().sum()) == 0  # padding has no value
    folder = tmp_path / "policy_folder"
    lm.model.save_pretrained(folder)  # type: ignore[attr-defined]
    lm.tokenizer.save_pretrained(folder)  # type: ignore[attr-defined]
    from_folder = build_critic(
        config.model_copy(update={"critic": config.critic.model_copy(update={"init": str(folder)})}), lm.model
    )  # type: ignore[attr-defined]
    assert torch.equal(from_folder.state_dict()["model.norm.weight"], lm.model.state_dict()["model.norm.weight"])  # type: ignore[attr-defined]
    from cosmos_robot.policies.registry import CheckpointError

    missing = config.critic.model_copy(update={"init": str(tmp_path / "nowhere")})
    with pytest.raises(CheckpointError, match=r"critic.init: .*nowhere does not load as a value model"):
        build_critic(config.model_copy(update={"critic": missing}), lm.model)  # type: ignore[attr-defined]


def test_ppo_recipe_learns_nothing_wrong_resumes_exactly_and_exports(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    def rows(out: Path) -> list[dict]:
        drop = {"steps_per_s", "iter_wall_s", "time/rollout", "time/update", "tokens_per_s"}
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in drop} for r in lines if "final_eval" not in r]

    common = ["output.tensorboard=false", "train.progress=false"]
    _, straight = load_train_recipe("debug_text_ppo", [f"output.dir={tmp_path / 'a'}", *common])
    result = run_text_ppo(straight, log=lambda _: None)
    assert result.finished and result.final_dir is not None
    first = rows(tmp_path / "a")
    assert len(first) == 2 and all("value_loss" in r and "explained_variance" in r for r in first)
    assert first[0]["logprob_gap_max"] < 1e-4 and first[0]["kl_ref"] == 0.0  # the first rollout is the reference
    _, killed = load_train_recipe("debug_text_ppo", [f"output.dir={tmp_path / 'b'}", *common])
    run_text_ppo(killed, stop_at_step=1, log=lambda _: None)
    assert run_text_ppo(killed, log=lambda _: None).resumed_from == 1
    assert rows(tmp_path / "b") == first  # critic, its optimizer and schedule restored with the policy
    AutoModelForCausalLM.from_pretrained(result.final_dir, local_files_only=True)
    AutoModelForTokenClassification.from_pretrained(tmp_path / "a" / "critic_final", local_files_only=True)
    from typer.testing import CliRunner

    from cosmos_robot.cli import app

    exported = CliRunner().invoke(app, ["export", str(tmp_path / "a"), "--out", str(tmp_path / "exp")])
    assert exported.exit_code == 0, exported.output
    AutoModelForCausalLM.from_pretrained(tmp_path / "exp", local_files_only=True)  # the policy, as an HF folder
