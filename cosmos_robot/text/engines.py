"""Rollout engines: sample completions with per-token log-probs, behind one small interface.

Why an interface: the text trainers only need "G completions per prompt, their tokens, the
sampler's log-prob of each token, and whether they stopped", plus "take the trainer's new
weights". transformers' continuous batching (``generate_batch`` with ``return_logprobs``; the
embedded default, nothing else to install) and vLLM (an optional extra on a GPU) both fit, like the
env backends behind the vector layer.

``TransformersEngine`` runs the trainer's own model object with the paged attention kernel
(``paged|sdpa``) for the duration of a ``generate`` call and restores the training attention
after, so weight sync is free (same tensors). Sampling draws from a forked torch RNG seeded per
call: the same seed gives the same completions, and the trainer's own RNG stream is untouched.
``generate_batch`` logs and swallows a failed request; we check that every request came back
finished and raise ``EngineError`` naming the first one that did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = [
    "ENGINES",
    "Completion",
    "EngineError",
    "RolloutEngine",
    "SamplingParams",
    "TransformersEngine",
    "make_engine",
]


class EngineError(RuntimeError):
    """A rollout engine that could not produce every requested completion."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Completion:
    """One sampled completion: its tokens (with the stop token if it stopped), log-probs, and text."""

    prompt_ids: list[int]
    ids: list[int]
    log_probs: list[float]  # the sampler's log-prob of each token in ``ids`` (temperature applied)
    stopped: bool  # ended on a stop token (False: cut at max_new_tokens)
    text: str  # decoded without the stop token and special tokens


class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]: ...

    def sync_weights(self, model: Any) -> None: ...


class TransformersEngine:
    """transformers' continuous batching on the trainer's model (see the module docstring)."""

    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any, stop_ids: Sequence[int], pad_id: int) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids, self.pad_id = list(stop_ids), int(pad_id)

    def sync_weights(self, model: Any) -> None:
        if model is not self.model:  # a different module: share its tensors (no copy)
            self.model = model

    def generate(self, prompts: Sequence[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        if not prompts:
            return []
        greedy = params.temperature == 0
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy or params.top_p >= 1.0 else params.top_p,
            top_k=None,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
        )
        inputs = [list(p) for p in prompts for _ in range(n)]
        model = self.model
        cb = ContinuousBatchingConfig(return_logprobs=True)
        # size the paged KV cache to this batch: left to itself it takes 80% of the free memory (GPU) and
        # allocates it on every call (on the CPU that alone was 40% of a tiny model's rollout time)
        cb.num_blocks = 1 + sum(-(-(len(p) + params.max_new_tokens) // cb.block_size) for p in inputs)
        restore = model.config._attn_implementation
        was_training = model.training
        model.eval()
        try:
            model.set_attn_implementation("paged|sdpa")
            with torch.random.fork_rng(devices=[]), torch.inference_mode():
                torch.manual_seed(params.seed)
                out = model.generate_batch(
                    inputs,
                    generation_config=config,
                    continuous_batching_config=cb,
                    progress_bar=False,
                    warmup=False,
                )
        finally:
            model.set_attn_implementation(restore)
            model.train(was_training)
        results: list[list[Completion]] = []
        for i, prompt in enumerate(prompts):
            group = []
            for k in range(n):
                req = out.get(f"req_{i * n + k}")
                if req is None or getattr(req, "error", None) or not req.is_finished():
                    why = "missing" if req is None else (req.error or f"status {req.status}")
                    raise EngineError(f"transformers engine: request {i * n + k} (prompt {i}) did not finish ({why})")
                ids = [int(t) for t in req.generated_tokens]
                logps = [float(x) for x in (req.logprobs or [])]
                if len(logps) != len(ids):
                    raise EngineError(
                        f"transformers engine: request {i * n + k}: {len(logps)} log-probs for {len(ids)} tokens"
                    )
                stopped = bool(ids) and ids[-1] in self.stop_ids
                body = ids[:-1] if stopped else ids
                text = self.tokenizer.decode(body, skip_special_tokens=True)
                group.append(Completion(list(prompt), ids, logps, stopped, text))
            results.append(group)
        return results


ENGINES = {"transformers": TransformersEngine}


def make_engine(name: str, model: Any, tokenizer: Any, stop_ids: Sequence[int], pad_id: int) -> RolloutEngine:
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; known: {', '.join(ENGINES)}")
    return ENGINES[name](model, tokenizer, stop_ids, pad_id)
