"""Our text GRPO-family losses, group advantages and SFT loss against TRL 1.16's own code paths.

TRL is a test-only dependency. Both sides see the same tiny random Qwen3 (fp32, one thread), the same
prompts (three, of different lengths) and completions (nine, 1-6 tokens, some ending on the stop token,
padded), and the same rewards (one mixed group, one constant group, one more mixed group).

How the TRL side is driven (no private patching of its loss): a real ``GRPOTrainer`` is built from a
saved tiny model folder with a ``rollout_func`` that returns our hand-built prompt/completion ids instead
of sampling, and a reward function that returns fixed rewards. ``_generate_and_score_completions`` then
builds TRL's own batch (left-padded prompts, right-padded completions, masks, ``num_items_in_batch``,
the "old" log-probs when ``num_iterations > 1``, the reference log-probs when ``beta > 0``, and the
group advantages), and ``compute_loss`` (-> ``_compute_loss``) gives the loss we backpropagate. Off
policy, the policy's weights are perturbed after scoring (as an optimizer step between the iterations
of one generation would), so ratios move well away from 1 and clipping is active on some tokens.
On policy (``num_iterations=1``) TRL leaves ``old_per_token_logps`` out of the batch and uses
``per_token_logps.detach()``; we pass our own no-grad log-probs of the same weights. Our side builds
its batch with ``completion_batch`` (prompts left-padded, completions right-padded: TRL's layout) and
scores it with ``sequence_log_probs`` (logits of the completion columns only).

Aggregation mapping (our ``TextAlgoConfig`` <-> TRL ``GRPOConfig``), all with
``gradient_accumulation_steps=1`` (TRL divides the "grpo", "bnpo" and "dr_grpo" losses by the
accumulation steps; "dapo" by ``num_items_in_batch`` of the whole generation batch):

- ``loss_agg="seq_mean_token_mean"`` = ``loss_type="grpo"``: mean over sequences of each sequence's
  token mean.
- ``loss_agg="token_mean"`` = ``loss_type="bnpo"`` (token mean over the local batch) and = ``"dapo"``
  on one process with one minibatch per generation batch (``num_items_in_batch`` = the batch's
  completion tokens); DAPO's clip-higher is our ``clip_high=0.28`` = TRL ``epsilon_high=0.28``.
- ``loss_agg="seq_mean_token_sum_norm"`` with ``norm_constant = max_new_tokens`` = ``loss_type="dr_grpo"``
  (sum over all tokens / (B * ``max_completion_length``)); with ``advantage="dr_grpo"`` =
  ``scale_rewards="none"``.
- ``policy_loss="gspo"`` (``gspo_clip_low/high``) = ``importance_sampling_level="sequence"`` with
  ``loss_type="grpo"`` (``epsilon``/``epsilon_high``): one length-normalised ratio per sequence.
- ``advantage="grpo"`` with ``std_eps=1e-4`` = ``scale_rewards="group"`` ((r - mean) / (std + 1e-4),
  Bessel std); the registry function's own default eps (1e-6) does not match, the recipe default does.
- ``kl_coef`` x k3 aggregated like the policy loss = ``beta`` x k3 added per token, BUT only with
  ``use_bias_correction_kl=False``: TRL 1.16 defaults to True and multiplies the per-token k3 by the
  (differentiable) ratio, which changes the gradient even on policy (see
  ``test_trl_default_kl_bias_correction_differs``).
- ``dual_clip=None`` (our default): TRL has no dual clip. ``tis=None``: TRL applies its importance
  weight only with vLLM.

SFT: our ``sft_loss`` on ``collate_rows`` packed rows = TRL ``SFTTrainer.compute_loss`` on TRL's own
tokenization (``assistant_only_loss=True``), best-fit-decreasing packing and padding-free collation =
transformers' ``ForCausalLMLoss`` with ``num_items_in_batch`` = the conversations run one at a time
(sum of the assistant tokens' NLL / their count).

Every comparison has a control that must fail (a different aggregation, epsilon, normaliser or
attention layout gives a number outside the tolerance), so a vacuous pass would show.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from cosmos_robot.text.chat import prompt_ids, tokenize_conversation
from cosmos_robot.text.engines import Completion
from cosmos_robot.text.hf import save_causal_lm
from cosmos_robot.text.packing import collate_rows, pack_bfd
from cosmos_robot.text.tiny import char_tokenizer, tiny_causal_lm
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.text.config import TextAlgoConfig
from cosmos_robot_trainers.text.grpo import CompletionBatch, completion_batch, grpo_loss, sequence_log_probs
from cosmos_robot_trainers.text.sft import sft_loss

TOL = 1e-6  # losses and every parameter's gradient (max abs difference)
MUST_DIFFER = 1e-4  # what a deliberately wrong mapping must miss by

TINY = {"hidden": 16, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 32}
PROMPTS = ["1+2=?", "what is 12*3? answer briefly", "hi"]
# every other completion ends on the stop token (<|im_end|>); lengths 1..6 with the stop token
COMPLETIONS = ["3", "36 ok", "hello", "a", "bb", "ccc", "x", "yy", "zzzz"]
REWARDS = [1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0, 0.3]  # group 1 is constant (advantage 0)
G = 3
N = len(COMPLETIONS)
MAX_NEW = 8  # max_new_tokens = max_completion_length; longer than any completion, so Dr-GRPO's constant shows
POLICY_NOISE = 0.08  # the "optimizer step" between scoring and the loss (off-policy cases)
REF_NOISE = 0.05  # how far the reference model is from the initial policy (KL cases)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny model folder: TRL loads the policy and (beta > 0) the reference from a path."""
    lm = tiny_causal_lm(char_tokenizer(), **TINY)
    return save_causal_lm(lm, tmp_path_factory.mktemp("trl_parity") / "tiny")


def _ids(tok: Any) -> tuple[list[list[int]], list[list[int]]]:
    eos = tok.eos_token_id
    prompts = [prompt_ids(tok, [{"role": "user", "content": p}]) for p in PROMPTS]
    completions = [tok.encode(c) + ([eos] if i % 2 == 0 else []) for i, c in enumerate(COMPLETIONS)]
    return [prompts[i // G] for i in range(N)], completions


def _perturb(model: Any, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def _grads(model: Any) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
    }


def _max_grad_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@dataclass
class Scored:
    """One TRL generation batch and ours, built from the same ids."""

    trainer: Any
    inputs: dict[str, Any]  # TRL's batch from _generate_and_score_completions
    batch: CompletionBatch  # ours
    old: torch.Tensor  # our no-grad log-probs before the perturbation (N, L)
    ref: torch.Tensor | None  # our reference log-probs (N, L)
    prompt_lens: list[int]
    completion_lens: list[int]

    @property
    def model(self) -> Any:
        return self.trainer.model

    def to_completion_layout(self, x: torch.Tensor) -> torch.Tensor:
        """Our (N, L) per-token tensor -> TRL's (N, C) completion layout."""
        out = torch.zeros(self.inputs["completion_ids"].shape, dtype=x.dtype)
        start = self.batch.prompt_width  # our prompts are left-padded to this column, like TRL's
        for i, k in enumerate(self.completion_lens):
            out[i, :k] = x[i, start : start + k]
        return out


def _score(tiny_dir: Path, tmp_path: Path, *, off_policy: bool, ref_noise: float = 0.0, **trl_args: Any) -> Scored:
    tok = char_tokenizer()
    p_ids, c_ids = _ids(tok)

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:  # TRL's rollout_func hook: no sampling
        assert len(prompts) == N
        return {"prompt_ids": p_ids, "completion_ids": c_ids, "logprobs": None}

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return list(REWARDS)

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl_out"),
        per_device_train_batch_size=N,
        num_generations=G,
        max_completion_length=MAX_NEW,
        gradient_accumulation_steps=1,
        num_iterations=2 if off_policy else 1,  # > 1: TRL scores and keeps old_per_token_logps itself
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        **trl_args,
    )
    trainer = GRPOTrainer(
        model=str(tiny_dir),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["(ids come from rollout_func)"] * N}),
        processing_class=tok,
        rollout_func=rollout,
    )
    # Trainer's loop sets this per accumulation window; we call compute_loss outside the loop
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    trainer.model.train()
    if ref_noise:
        _perturb(trainer.ref_model, ref_noise, seed=1)
    inputs = trainer._generate_and_score_completions([{"prompt": "(ids come from rollout_func)"}] * N)
    comps = [Completion(p, c, [0.0] * len(c), c[-1] == tok.eos_token_id, "") for p, c in zip(p_ids, c_ids)]
    batch = completion_batch(comps, int(tok.pad_token_id))
    with torch.no_grad():
        old = sequence_log_probs(trainer.model, batch)
        ref = sequence_log_probs(trainer.ref_model, batch) if trainer.ref_model is not None else None
    scored = Scored(trainer, inputs, batch, old, ref, [len(p) for p in p_ids], [len(c) for c in c_ids])
    assert ("old_per_token_logps" in inputs) == off_policy  # on policy TRL uses per_token_logps.detach()
    if off_policy:  # same weights, same layout
        assert float((scored.to_completion_layout(old) - inputs["old_per_token_logps"]).abs().max()) < 1e-5
    if ref is not None:
        assert float((scored.to_completion_layout(ref) - inputs["ref_per_token_logps"]).abs().max()) < 1e-5
    if off_policy:
        _perturb(trainer.model, POLICY_NOISE, seed=0)
    return scored


def _trl_loss(s: Scored) -> tuple[float, dict[str, torch.Tensor]]:
    s.model.zero_grad(set_to_none=True)
    loss = s.trainer.compute_loss(s.model, s.inputs)  # -> GRPOTrainer._compute_loss
    loss.backward()
    return float(loss.detach()), _grads(s.model)


def _our_advantages(algo: TextAlgoConfig, rewards: list[float] = REWARDS) -> torch.Tensor:
    r = torch.tensor(rewards, dtype=torch.float32)
    groups = torch.arange(len(rewards)) // G  # the text trainer's group ids: prompt index per completion
    if algo.advantage == "grpo":
        return get_algorithm("advantage", "grpo")(r, groups, eps=algo.std_eps)
    return get_algorithm("advantage", "dr_grpo")(r, groups)


def _our_loss(
    s: Scored, algo: TextAlgoConfig, max_new: int = MAX_NEW
) -> tuple[float, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    s.model.zero_grad(set_to_none=True)
    logp = sequence_log_probs(s.model, s.batch)
    loss, metrics = grpo_loss(logp, s.old, _our_advantages(algo), s.batch.mask, algo, max_new, ref_logp=s.ref)
    loss.backward()
    return float(loss.detach()), _grads(s.model), metrics


# (id, TRL GRPOConfig kwargs, our TextAlgoConfig kwargs, a wrong TextAlgoConfig that must not match, off policy)
POLICY_CASES = [
    ("grpo", {"loss_type": "grpo"}, {"loss_agg": "seq_mean_token_mean"}, {"loss_agg": "token_mean"}, True),
    ("grpo_on_policy", {"loss_type": "grpo"}, {"loss_agg": "seq_mean_token_mean"}, {"loss_agg": "token_mean"}, False),
    (
        "bnpo_clip_higher",
        {"loss_type": "bnpo", "epsilon_high": 0.28},
        {"loss_agg": "token_mean", "clip_high": 0.28},
        {"loss_agg": "seq_mean_token_mean", "clip_high": 0.28},
        True,
    ),
    (
        "dapo_clip_higher",
        {"loss_type": "dapo", "epsilon_high": 0.28},
        {"loss_agg": "token_mean", "clip_high": 0.28},
        {"loss_agg": "seq_mean_token_mean", "clip_high": 0.28},
        True,
    ),
    (
        "dr_grpo",
        {"loss_type": "dr_grpo", "scale_rewards": "none"},
        {"advantage": "dr_grpo", "loss_agg": "seq_mean_token_sum_norm"},
        {"advantage": "dr_grpo", "loss_agg": "seq_mean_token_mean"},
        True,
    ),
    (
        "gspo",
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
        {"policy_loss": "gspo", "gspo_clip_low": 3e-4, "gspo_clip_high": 4e-4},
        {"policy_loss": "ppo", "loss_agg": "seq_mean_token_mean", "clip": 3e-4, "clip_high": 4e-4},  # token ratio
        True,
    ),
]


@pytest.mark.parametrize(
    ("trl_args", "ours", "wrong", "off_policy"), [c[1:] for c in POLICY_CASES], ids=[c[0] for c in POLICY_CASES]
)
def test_policy_loss_matches_trl(
    tiny_dir: Path, tmp_path: Path, trl_args: dict, ours: dict, wrong: dict, off_policy: bool
) -> None:
    s = _score(tiny_dir, tmp_path, off_policy=off_policy, **trl_args)
    algo = TextAlgoConfig(**ours)
    assert algo.dual_clip is None and algo.kl_coef == 0.0  # TRL has no dual clip; no KL here
    trl_loss, trl_grads = _trl_loss(s)
    our_loss, our_grads, metrics = _our_loss(s, algo)
    assert abs(trl_loss - our_loss) <= TOL, (trl_loss, our_loss)
    assert _max_grad_diff(trl_grads, our_grads) <= TOL
    assert max(float(g.abs().max()) for g in our_grads.values()) > 1e-2  # the gradients are not trivially 0
    if off_policy:  # ratio != 1 and clipping active on some (not all) tokens / sequences
        assert abs(float(metrics["approx_kl_k1"])) > 1e-3
        assert 0.0 < float(metrics["clip_fraction"]) < 1.0
        assert s.trainer._metrics["train"]["clip_ratio/region_mean"][-1] > 0.0
    else:
        assert float(metrics["clip_fraction"]) == 0.0
    _, wrong_grads, _ = _our_loss(s, TextAlgoConfig(**wrong))
    assert _max_grad_diff(trl_grads, wrong_grads) > MUST_DIFFER


def test_dr_grpo_normaliser_is_max_new_tokens(tiny_dir: Path, tmp_path: Path) -> None:
    """TRL's dr_grpo divides by max_completion_length, not by the longest completion in the batch."""
    s = _score(tiny_dir, tmp_path, off_policy=True, loss_type="dr_grpo", scale_rewards="none")
    algo = TextAlgoConfig(advantage="dr_grpo", loss_agg="seq_mean_token_sum_norm")
    trl_loss, _ = _trl_loss(s)
    assert abs(_our_loss(s, algo)[0] - trl_loss) <= TOL
    longest = max(s.completion_lens)
    assert longest < MAX_NEW
    wrong_loss = _our_loss(s, algo, max_new=longest)[0]
    assert abs(wrong_loss - trl_loss) > MUST_DIFFER * abs(trl_loss)


@pytest.mark.parametrize(
    ("scale_rewards", "advantage"), [("group", "grpo"), ("none", "dr_grpo")], ids=["group_std", "no_std"]
)
def test_group_advantages_match_trl(tiny_dir: Path, tmp_path: Path, scale_rewards: str, advantage: str) -> None:
    """TRL's advantages come out of its own _generate_and_score_completions (scale_rewards, eps 1e-4)."""
    s = _score(tiny_dir, tmp_path, off_policy=False, loss_type="grpo", scale_rewards=scale_rewards)
    trl_adv = s.inputs["advantages"].float()
    algo = TextAlgoConfig(advantage=advantage)
    assert algo.std_eps == 1e-4  # the recipe default is TRL's epsilon
    ours = _our_advantages(algo)
    assert float((trl_adv - ours).abs().max()) <= TOL
    assert float(trl_adv[G : 2 * G].abs().max()) == 0.0  # the constant group
    assert float(trl_adv.abs().max()) > 0.5
    if advantage == "grpo":  # the registry's own default eps (1e-6) is not TRL's
        wrong = get_algorithm("advantage", "grpo")(torch.tensor(REWARDS), torch.arange(N) // G)
    else:  # std-scaled advantages are not Dr-GRPO's
        wrong = _our_advantages(TextAlgoConfig(advantage="grpo"))
    assert float((trl_adv - wrong).abs().max()) > MUST_DIFFER


# (id, TRL kwargs, our kwargs); beta = kl_coef = 0.04 on top
KL_CASES = [
    ("grpo", {"loss_type": "grpo"}, {"loss_agg": "seq_mean_token_mean"}),
    ("bnpo", {"loss_type": "bnpo"}, {"loss_agg": "token_mean"}),
    (
        "dr_grpo",
        {"loss_type": "dr_grpo", "scale_rewards": "none"},
        {"advantage": "dr_grpo", "loss_agg": "seq_mean_token_sum_norm"},
    ),
    (
        "gspo",
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
        {"policy_loss": "gspo"},
    ),
]


@pytest.mark.parametrize(("trl_args", "ours"), [c[1:] for c in KL_CASES], ids=[c[0] for c in KL_CASES])
def test_kl_term_matches_trl(tiny_dir: Path, tmp_path: Path, trl_args: dict, ours: dict) -> None:
    """beta=0.04 (k3 to a reference model, no bias correction) = our kl_coef=0.04, off policy."""
    s = _score(
        tiny_dir, tmp_path, off_policy=True, ref_noise=REF_NOISE, beta=0.04, use_bias_correction_kl=False, **trl_args
    )
    assert s.ref is not None
    trl_loss, trl_grads = _trl_loss(s)
    our_loss, our_grads, metrics = _our_loss(s, TextAlgoConfig(kl_coef=0.04, **ours))
    assert float(metrics["kl_ref"]) > 1e-3  # the reference differs from the policy
    assert abs(trl_loss - our_loss) <= TOL, (trl_loss, our_loss)
    assert _max_grad_diff(trl_grads, our_grads) <= TOL
    no_kl_loss, no_kl_grads, _ = _our_loss(s, TextAlgoConfig(kl_coef=0.0, **ours))
    assert abs(no_kl_loss - trl_loss) > MUST_DIFFER
    assert _max_grad_diff(trl_grads, no_kl_grads) > MUST_DIFFER


def test_trl_default_kl_bias_correction_differs(tiny_dir: Path, tmp_path: Path) -> None:
    """TRL 1.16's default use_bias_correction_kl=True weighs k3 by the differentiable ratio: on policy the loss
    value is ours, the gradient is not (it gains k3 * grad log p). Our k3 is TRL's with the correction off."""
    s = _score(tiny_dir, tmp_path, off_policy=False, ref_noise=REF_NOISE, beta=0.04, loss_type="grpo")
    assert s.trainer.args.use_bias_correction_kl
    trl_loss, trl_grads = _trl_loss(s)
    our_loss, our_grads, _ = _our_loss(s, TextAlgoConfig(kl_coef=0.04))
    assert abs(trl_loss - our_loss) <= TOL
    assert _max_grad_diff(trl_grads, our_grads) > MUST_DIFFER
    s.trainer.args.use_bias_correction_kl = False  # read at loss time: the same batch, the correction off
    trl_loss, trl_grads = _trl_loss(s)
    assert abs(trl_loss - our_loss) <= TOL
    assert _max_grad_diff(trl_grads, our_grads) <= TOL


# SFT: multi-turn, system turns and very different assistant lengths
CONVERSATIONS = [
    [{"role": "user", "content": "1+2=?"}, {"role": "assistant", "content": "3"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is 12*3?"},
        {"role": "assistant", "content": "36, since 12*3 = 36."},
    ],
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello!"},
        {"role": "user", "content": "and 2+2?"},
        {"role": "assistant", "content": "4"},
    ],
    [{"role": "user", "content": "count to five"}, {"role": "assistant", "content": "1 2 3 4 5"}],
]


def _sequences(batch: dict[str, torch.Tensor], lengths: list[int]) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) of each packed sequence (split where position ids restart), sorted; ``lengths``: real tokens
    per row (padding dropped)."""
    out = []
    for b, n in enumerate(lengths):
        ids, lab, pos = (batch[k][b, :n].tolist() for k in ("input_ids", "labels", "position_ids"))
        starts = [j for j, q in enumerate(pos) if q == 0] + [n]
        out += [(ids[a:e], lab[a:e]) for a, e in zip(starts[:-1], starts[1:])]
    return sorted(out)


def test_sft_loss_matches_trl_and_unpacked(tmp_path: Path) -> None:
    lm = tiny_causal_lm(char_tokenizer(), **TINY)
    model, tok = lm.model, lm.tokenizer
    model.train()
    convs = [tokenize_conversation(tok, m) for m in CONVERSATIONS]
    lengths = sorted(len(c.input_ids) for c in convs)
    pack = lengths[-1] + lengths[0]  # the longest conversation shares a row with the shortest
    rows = pack_bfd([len(c.input_ids) for c in convs], pack)
    assert len(rows) < len(convs)  # at least one row holds several conversations
    batch = collate_rows([[(convs[i].input_ids, convs[i].assistant_mask) for i in r.members] for r in rows], lm.pad_id)

    # TRL: its own tokenization, assistant masks, BFD packing and padding-free collation of the raw conversations
    cfg = SFTConfig(
        output_dir=str(tmp_path / "sft_out"),
        assistant_only_loss=True,
        packing=True,
        max_length=pack,
        per_device_train_batch_size=len(rows),
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
    )
    trainer = SFTTrainer(
        model=model, args=cfg, train_dataset=Dataset.from_dict({"messages": CONVERSATIONS}), processing_class=tok
    )
    trl_batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    # the same sequences with the same trained tokens (TRL: one flat padding-free row; ours: padded rows)
    assert int(trl_batch["input_ids"].numel()) == sum(r.length for r in rows)
    ours_seqs = _sequences(batch, [r.length for r in rows])
    assert len(ours_seqs) == len(convs)
    assert _sequences(trl_batch, [int(trl_batch["input_ids"].numel())]) == ours_seqs

    model.zero_grad(set_to_none=True)
    trl_loss_t = trainer.compute_loss(model, dict(trl_batch))
    trl_loss_t.backward()
    trl_loss = float(trl_loss_t.detach())
    trl_grads = _grads(model)

    model.zero_grad(set_to_none=True)
    our_loss_t, count = sft_loss(model, batch)
    our_loss_t.backward()
    our_grads = _grads(model)
    our_loss = float(our_loss_t.detach())
    assert count == sum(sum(c.assistant_mask[1:]) for c in convs) == int((trl_batch["labels"] != -100).sum())
    assert abs(trl_loss - our_loss) <= TOL, (trl_loss, our_loss)
    assert _max_grad_diff(trl_grads, our_grads) <= TOL

    # one conversation at a time: sum of the assistant tokens' NLL / their count
    model.zero_grad(set_to_none=True)
    total = torch.zeros(())
    per_conv = []
    for c in convs:
        ids = torch.tensor([c.input_ids])
        logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].float(), dim=-1)
        tok_logp = logp.gather(-1, ids[0, 1:, None])[:, 0]
        m = torch.tensor(c.assistant_mask[1:], dtype=torch.bool)
        total = total - tok_logp[m].sum()
        per_conv.append(float(-tok_logp[m].detach().mean()))
    unpacked = total / count
    unpacked.backward()
    assert abs(float(unpacked.detach()) - our_loss) <= TOL
    assert _max_grad_diff(_grads(model), our_grads) <= TOL

    with torch.no_grad():
        # transformers' ForCausalLMLoss with num_items_in_batch (sum over the batch / trained tokens)
        hf = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            labels=batch["labels"],
            num_items_in_batch=torch.tensor(count),
            use_cache=False,
        ).loss
        assert abs(float(hf) - our_loss) <= TOL
        # controls: a mean of per-conversation means, and packed rows that attend across their sequences
        assert abs(sum(per_conv) / len(per_conv) - our_loss) > MUST_DIFFER
        leaky = model(
            input_ids=batch["input_ids"],
            labels=batch["labels"],
            num_items_in_batch=torch.tensor(count),
            use_cache=False,
        ).loss
        assert abs(float(leaky) - our_loss) > 10 * TOL
