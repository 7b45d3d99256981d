"""On-policy distillation of an HF causal LM (``trainer = "text_opd"``): the student samples, a teacher scores.

Why on-policy: the student learns on its own completions, where its mistakes are, with the teacher's
judgement of every token (GKD, arXiv 2306.13649; Thinking Machines' on-policy distillation), instead
of imitating the teacher's completions. cosmos-framework's ``opd_qwen1p5b_countdown`` recipe is this
with a served teacher; here the teacher is a second model in the process (``[teacher] init``), frozen.

One iteration: ``prompts_per_iter`` task prompts, ``group_size`` completions each from the student
through the rollout engine (``sample_groups``, shared with GRPO; the task's reward is logged as
``train_accuracy`` and not trained on); the teacher's and the student's view of every completion
token; ``epochs`` passes of minibatches of one of two losses (``algo.loss``):

- ``"jsd"``: the generalised Jensen-Shannon divergence over the whole vocabulary at each completion
  position (``generalized_jsd``: ``beta`` 1 = reverse KL(student || teacher), 0 = forward KL, in between
  the mixture form), summed over tokens and divided by their number: TRL's
  ``GKDTrainer.generalized_jsd_loss`` (tests/text/test_text_opd.py checks it at beta 0, 0.5 and 1);
- ``"sampled_token"``: ``log p_teacher(x_t) - log p_student(x_t)`` of each sampled token (minus the
  per-token reverse-KL estimate) as a dense reward, its ``gamma``-discounted sum over the following
  tokens as the advantage of the PPO clipped surrogate (TRL's MiniLLM ``rkl_advantage``).

The teacher must share the student's tokenizer: both losses compare the two models token id by token
id, so ``check_shared_vocabulary`` refuses different vocabularies by name. Embedding tables padded past
the tokenizer may differ in width (the JSD compares the tokenizer's entries).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cosmos_robot.distributed import World, broadcast_parameters
from cosmos_robot.text.hf import CausalLM
from cosmos_robot.text.moe import with_router_aux_loss
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.common import fsdp
from cosmos_robot_trainers.text.config import TextOPDConfig
from cosmos_robot_trainers.text.driver import (
    TextResult,
    TextRun,
    accumulated_step,
    minibatch_epochs,
    score_rows,
    share_micro_batches,
)
from cosmos_robot_trainers.text.grpo import CompletionBatch, completion_batch, sample_groups, sequence_log_probs
from cosmos_robot_trainers.text.state import load_lm

__all__ = [
    "check_shared_vocabulary",
    "completion_logits",
    "generalized_jsd",
    "opd_iteration",
    "run_text_opd",
    "sampled_token_advantages",
]


def check_shared_vocabulary(student: CausalLM, teacher: CausalLM, where: str = "teacher") -> None:
    """Refuse a teacher whose tokenizer or logit width differs from the student's, naming the difference."""
    s_vocab, t_vocab = student.tokenizer.get_vocab(), teacher.tokenizer.get_vocab()
    if s_vocab != t_vocab:
        differ = sorted(set(s_vocab.items()) ^ set(t_vocab.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(
            f"{where}: its tokenizer differs from the student's ({len(t_vocab)} vs {len(s_vocab)} tokens; first "
            f"differences (token, id): {differ}). On-policy distillation compares the two models token id by "
            "token id, so they must share one vocabulary"
        )
    # embedding tables are often padded past the tokenizer (Qwen2.5-7B: 152,064 rows, 1.5B: 151,936); the JSD
    # compares the first len(tokenizer) logits, which both must have
    n, widths = len(student.tokenizer), (student.model.config.vocab_size, teacher.model.config.vocab_size)
    if min(widths) < n:
        raise ValueError(f"{where}: logits of {widths[1]} entries (student {widths[0]}) for {n} tokens")


def completion_logits(model: Any, batch: CompletionBatch) -> torch.Tensor:
    """Logits (N, C, V) that predict each completion column (C = the batch's completion width)."""
    keep = batch.input_ids.shape[1] - batch.prompt_width + 1
    out = model(**batch.forward_kwargs(model), logits_to_keep=keep)
    return out.logits[:, -keep:-1]


def generalized_jsd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float = 1.0
) -> torch.Tensor:
    """The generalised JSD of each position (..., V) -> (...), summed over the vocabulary (GKD eq. 1)::

    beta = 0: KL(T || S);  beta = 1: KL(S || T)
    else:     beta KL(T || M) + (1 - beta) KL(S || M),  M = beta T + (1 - beta) S
    """
    s = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    t = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0:
        return (t.exp() * (t - s)).sum(-1)
    if beta == 1:
        return (s.exp() * (s - t)).sum(-1)
    b = torch.tensor(beta, dtype=s.dtype, device=s.device)
    m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), dim=0)
    return b * (t.exp() * (t - m)).sum(-1) + (1 - b) * (s.exp() * (s - m)).sum(-1)


def sampled_token_advantages(
    teacher_lp: torch.Tensor, student_lp: torch.Tensor, mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """``A_t = sum_{i >= t} gamma^(i - t) r_i`` with ``r_i = log p_T(x_i) - log p_S(x_i)`` on completion tokens."""
    r = (teacher_lp - student_lp) * mask
    adv = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for col in reversed(range(r.shape[1])):
        running = r[:, col] + gamma * running * mask[:, col]
        adv[:, col] = running
    return adv * mask


def _loss_parts(
    config: TextOPDConfig,
    model: Any,
    teacher: Any,
    batch: CompletionBatch,
    scored: dict[str, torch.Tensor],
    vocab: int,
    world: World | None = None,
) -> Callable[[torch.Tensor], Iterator[tuple[torch.Tensor, float, dict[str, Any]]]]:
    """For a minibatch of rows: ``(loss, token share, metrics)`` per micro-batch of the recipe's loss
    (data parallel: this rank's rows only, ``driver.minibatch_share``)."""
    algo, rcfg, start = config.algo, config.rollout, batch.prompt_width

    def parts(mb: torch.Tensor) -> Iterator[tuple[torch.Tensor, float, dict[str, Any]]]:
        total = max(float(batch.mask[mb].sum()), 1e-9)
        for idx, factor in share_micro_batches(mb, config.optim.micro_batch_size, world, fsdp.is_sharded(model)):
            sub = batch.select(idx)
            share = factor * float(sub.mask.sum()) / total
            if algo.loss == "jsd":
                with torch.no_grad():
                    t_logits = completion_logits(teacher, sub)
                s_logits = completion_logits(model, sub)[..., :vocab]
                per_token = generalized_jsd(s_logits, t_logits[..., :vocab], algo.beta, algo.temperature)
                m = sub.mask[:, start:]
                loss = (per_token * m).sum() / m.sum().clamp(min=1)
                metrics = {"jsd": loss.detach()}
                yield with_router_aux_loss(model, loss, metrics), share, metrics
            else:
                logp = sequence_log_probs(model, sub, rcfg.temperature)
                loss, metrics = get_algorithm("loss", "ppo")(
                    logp, scored["old"][idx], scored["adv"][idx], sub.mask, clip=algo.clip, dual_clip=None
                )
                yield with_router_aux_loss(model, loss, metrics), share, metrics

    return parts


def opd_iteration(
    config: TextOPDConfig, lm: Any, teacher: Any, engine: Any, optimizer: Any, it: int, world: World | None = None
) -> dict:
    """One student rollout, the teacher's scoring, and the distillation update; the iteration's metrics
    (data parallel as GRPO: ``grpo.sample_groups``, ``driver.minibatch_share``)."""
    rcfg, algo, ocfg = config.rollout, config.algo, config.optim
    model = lm.model
    sampled = sample_groups(config, lm, engine, it, world)
    device = next(model.parameters()).device
    batch = completion_batch([c for g in sampled.groups for c in g], lm.pad_id).to(device)
    t1 = time.perf_counter()
    n = batch.mask.shape[0]

    def log_probs(net: Any) -> torch.Tensor:  # data parallel: each rank scores its share (driver.score_rows)
        return score_rows(
            lambda p: sequence_log_probs(net, batch.select(p), rcfg.temperature),
            n,
            ocfg.micro_batch_size,
            device,
            world,
            fsdp.is_sharded(net),
        )

    with torch.no_grad():
        old, t_lp = log_probs(model), log_probs(teacher)
    scored = {"old": old, "adv": sampled_token_advantages(t_lp, old, batch.mask, algo.gamma)}
    parts = _loss_parts(config, model, teacher, batch, scored, len(lm.tokenizer), world)

    def step(mb: torch.Tensor) -> dict[str, float]:
        loss_value, gnorm, m = accumulated_step(model, optimizer, ocfg.grad_clip, parts(mb), world)
        return {"loss": loss_value, "grad_norm": gnorm, **m}

    update = minibatch_epochs(
        n,
        ocfg.epochs,
        ocfg.minibatch_size,
        torch.Generator().manual_seed(config.train.seed * 104_729 + it),
        step,
        device,
    )
    engine.sync_weights(model)
    tokens = batch.mask.sum().clamp(min=1)
    return {
        **sampled.metrics,
        **update,
        # the per-token reverse-KL estimate of the sampled tokens, before the update: how far the student is
        "teacher_kl": float(((old - t_lp) * batch.mask).sum() / tokens),
        "teacher_log_prob": float((t_lp * batch.mask).sum() / tokens),
        "completion_tokens": float(batch.mask.sum(1).mean()),
        "time/update": time.perf_counter() - t1,
    }


def run_text_opd(
    config: TextOPDConfig,
    *,
    resume: bool = True,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    log: Callable[[str], None] = print,
) -> TextResult:
    """Run (or continue) the recipe; ``stop_at_step`` stops as a kill would (tests of exact resume)."""
    run = TextRun(config, resume=resume, overwrite=overwrite, log=log)
    lm, rc, algo, tcfg = run.lm, config.rollout, config.algo, config.train
    teacher = load_lm(config.teacher.init, config.model, tcfg.dtype, tcfg.device)
    check_shared_vocabulary(lm, teacher, where=f"teacher {config.teacher.init}")
    teacher_model = teacher.model.eval().requires_grad_(False)
    broadcast_parameters(teacher_model, run.world)  # a random tiny teacher: the same on every rank
    engine = run.rollout_engine()
    run.restore()
    how = f"JSD beta {algo.beta}" if algo.loss == "jsd" else f"sampled-token reverse KL, gamma {algo.gamma}"
    run.log(
        f"text_opd: student {lm.model.config.model_type} from {config.init}, teacher {config.teacher.init}; "
        f"{tcfg.steps} iterations of {rc.prompts_per_iter} prompts x {rc.group_size} completions ({how})"
    )
    return run.loop(
        lambda it: opd_iteration(config, lm, teacher_model, engine, run.optimizer, it, run.world),
        kind="text_opd",
        stop_at_step=stop_at_step,
        unit="iteration",
        show=("teacher_kl", "train_accuracy", "eval_accuracy"),
    )
