"""Rollout engines: sample completions with per-token log-probs, behind one small interface.

Why an interface: the text trainers only need "G completions per prompt, their tokens, the
sampler's log-prob of each token, and whether they stopped", plus "take the trainer's new
weights". transformers' continuous batching (``generate_batch`` with ``return_logprobs``; the
embedded default, nothing else to install) and vLLM (an optional extra on a GPU) both fit, like the
env backends behind the vector layer. ``VLLMEngine`` (``cosmos_robot.text.vllm_engine``) is the third.

``TransformersEngine`` runs the trainer's own model object with the paged attention kernel
(``paged|sdpa``) for the duration of a ``generate`` call and restores the training attention
after, so weight sync is free (same tensors). Sampling draws from a forked torch RNG seeded per
call: the same seed gives the same completions, and the trainer's own RNG stream is untouched.
``generate_batch`` logs and swallows a failed request; we check that every request came back
finished and raise ``EngineError`` naming the first one that did not.

``StaticGenerateEngine`` (``rollout.engine = "transformers_static"``) is for a GPU: one padded
``generate`` call with a static KV cache, whose decode step transformers compiles (CUDA graphs); in
transformers 5.5.4 continuous batching runs the paged-SDPA kernel without CUDA graphs: for a
Qwen3-0.6B-shaped model on the H200 it sampled 1,153 tokens/s against 4,478 for TRL's padded
``generate`` and 9,721 for this engine (docs/benchmarks.md). On a CPU the continuous-batching engine
is the faster of the two.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = [
    "ENGINES",
    "Completion",
    "EngineError",
    "RolloutEngine",
    "SamplingParams",
    "StaticGenerateEngine",
    "TransformersEngine",
    "make_engine",
    "refuse_images",
]


class EngineError(RuntimeError):
    """A rollout engine that could not produce every requested completion."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0
    # False: leave Completion.log_probs empty when they would only be a teacher-forced pass of the caller's own
    # model (StaticGenerateEngine), which the trainer computes anyway; engines that get them from sampling ignore it
    log_probs: bool = True


@dataclass
class Completion:
    """One sampled completion: its tokens (with the stop token if it stopped), log-probs, and text."""

    prompt_ids: list[int]
    ids: list[int]
    log_probs: list[float]  # the sampler's log-prob of each token in ``ids`` (temperature applied); [] if not asked
    stopped: bool  # ended on a stop token (False: cut at max_new_tokens)
    text: str  # decoded without the stop token and special tokens
    images: Any = None  # the prompt's ImageInputs (cosmos_robot.text.vision) for an image-text prompt, else None


class RolloutEngine(Protocol):
    # True: the engine's log-probs would only be a teacher-forced pass of the trainer's own model, so a trainer
    # that scores the batch anyway asks for none (SamplingParams.log_probs=False) and uses its own
    scores_by_forward: bool

    def generate(
        self, prompts: Sequence[list[int]], n: int, params: SamplingParams, images: Sequence[Any] | None = None
    ) -> list[list[Completion]]: ...

    def sync_weights(self, model: Any) -> None: ...


def refuse_images(engine: str, images: Sequence[Any] | None) -> None:
    """An ``EngineError`` when an engine that samples text only is handed image prompts."""
    if images is not None and any(im is not None for im in images):
        raise EngineError(
            f"rollout engine {engine!r} samples text-only prompts; prompts with images need "
            "rollout.engine = 'transformers_static'"
        )


def generation_config(params: SamplingParams, stop_ids: Sequence[int], pad_id: int, **extra: Any) -> Any:
    """transformers' ``GenerationConfig`` for ``params`` (temperature 0: greedy; top-k off)."""
    from transformers import GenerationConfig

    greedy = params.temperature == 0
    return GenerationConfig(
        max_new_tokens=params.max_new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else params.temperature,
        top_p=None if greedy or params.top_p >= 1.0 else params.top_p,
        top_k=None,
        eos_token_id=list(stop_ids),
        pad_token_id=pad_id,
        **extra,
    )


class TransformersEngine:
    """transformers' continuous batching on the trainer's model (see the module docstring)."""

    name = "transformers"
    scores_by_forward = False  # log-probs come from sampling itself

    def __init__(self, model: Any, tokenizer: Any, stop_ids: Sequence[int], pad_id: int) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids, self.pad_id = list(stop_ids), int(pad_id)

    def sync_weights(self, model: Any) -> None:
        if model is not self.model:  # a different module: share its tensors (no copy)
            self.model = model

    def generate(
        self, prompts: Sequence[list[int]], n: int, params: SamplingParams, images: Sequence[Any] | None = None
    ) -> list[list[Completion]]:
        from transformers import ContinuousBatchingConfig

        refuse_images(self.name, images)
        if not prompts:
            return []
        config = generation_config(params, self.stop_ids, self.pad_id)
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


class StaticGenerateEngine:
    """transformers' ``generate`` over one left-padded batch with a static KV cache (module docstring).

    On a GPU the static cache makes transformers compile the decode step (CUDA graphs); prompts are
    left-padded to a multiple of ``PAD_TO`` so the cache shape, and with it the compiled graph, stays
    the same from one iteration to the next. ``generate`` returns tokens only, so the log-probs come
    from a teacher-forced pass of the same model at the sampling temperature (``micro_batch`` rows at
    a time), the numbers the trainer's own scoring computes."""

    name = "transformers_static"
    PAD_TO = 64
    scores_by_forward = True  # its log-probs are a teacher-forced pass (SamplingParams.log_probs=False skips it)

    def __init__(self, model: Any, tokenizer: Any, stop_ids: Sequence[int], pad_id: int, micro_batch: int = 32) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids, self.pad_id, self.micro_batch = list(stop_ids), int(pad_id), micro_batch

    def sync_weights(self, model: Any) -> None:
        if model is not self.model:
            self.model = model

    def _batch(self, inputs: list[list[int]], device: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
        width = -(-max(len(p) for p in inputs) // self.PAD_TO) * self.PAD_TO
        ids = torch.full((len(inputs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(inputs), width), dtype=torch.long)
        for i, p in enumerate(inputs):
            ids[i, width - len(p) :] = torch.tensor(p)
            attn[i, width - len(p) :] = 1
        return ids.to(device), attn.to(device), width

    def _log_probs(
        self, ids: torch.Tensor, attn: torch.Tensor, width: int, temperature: float, images: list[Any]
    ) -> torch.Tensor:
        from cosmos_robot.text.vision import image_kwargs

        out = []
        keep = ids.shape[1] - width + 1
        for i in range(0, ids.shape[0], self.micro_batch):
            rows = ids[i : i + self.micro_batch]
            logits = self.model(
                input_ids=rows,
                attention_mask=attn[i : i + self.micro_batch],
                use_cache=False,
                logits_to_keep=keep,
                **image_kwargs(self.model, rows, images[i : i + self.micro_batch]),
            ).logits[:, :-1]
            logp = torch.log_softmax(logits.float() / (temperature or 1.0), dim=-1)
            out.append(logp.gather(-1, ids[i : i + self.micro_batch, width:].unsqueeze(-1)).squeeze(-1))
        return torch.cat(out)

    def generate(
        self, prompts: Sequence[list[int]], n: int, params: SamplingParams, images: Sequence[Any] | None = None
    ) -> list[list[Completion]]:
        """``images``: each prompt's ``ImageInputs`` (or None) for an image-text model."""
        from cosmos_robot.text.vision import image_kwargs, vision_token_ids

        if not prompts:
            return []
        model = self.model
        device = next(model.parameters()).device
        inputs = [list(p) for p in prompts for _ in range(n)]
        row_images = [im for im in (images or [None] * len(prompts)) for _ in range(n)]
        ids, attn, width = self._batch(inputs, device)
        vision = image_kwargs(model, ids, row_images)
        extra: dict[str, Any] = {"cache_implementation": "static"}
        if vision:  # a sampled vision token would be an image without pixels: never sample them
            extra["suppress_tokens"] = vision_token_ids(model)
        config = generation_config(params, self.stop_ids, self.pad_id, **extra)
        was_training = model.training
        model.eval()
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
                torch.manual_seed(params.seed)
                out = model.generate(input_ids=ids, attention_mask=attn, generation_config=config, **vision)
                new = out[:, width:]
                stop = torch.isin(new, torch.tensor(self.stop_ids, device=device))
                # tokens after the first stop are padding: count each row's length up to its stop
                first = torch.where(
                    stop.any(1), stop.float().argmax(1) + 1, torch.full_like(stop[:, 0], new.shape[1], dtype=torch.long)
                )
                keep = torch.arange(new.shape[1], device=device)[None] < first[:, None]
                logp = None
                if params.log_probs:
                    full_attn = torch.cat([attn, keep.long()], dim=1)
                    logp = self._log_probs(out, full_attn, width, params.temperature, row_images).cpu()
        finally:
            model.train(was_training)
        return self._completions(prompts, n, new.cpu(), first.cpu(), stop.any(1).cpu(), logp, images)

    def _completions(
        self,
        prompts: Sequence[list[int]],
        n: int,
        new: torch.Tensor,
        lengths: torch.Tensor,
        stopped: torch.Tensor,
        logp: torch.Tensor | None,
        images: Sequence[Any] | None = None,
    ) -> list[list[Completion]]:
        results: list[list[Completion]] = []
        for i, prompt in enumerate(prompts):
            group = []
            for k in range(n):
                r = i * n + k
                length = int(lengths[r])
                tokens = [int(t) for t in new[r, :length]]
                did_stop = bool(stopped[r])
                text = self.tokenizer.decode(tokens[:-1] if did_stop else tokens, skip_special_tokens=True)
                lps = [] if logp is None else [float(x) for x in logp[r, :length]]
                group.append(Completion(list(prompt), tokens, lps, did_stop, text, images[i] if images else None))
            results.append(group)
        return results


# name -> "module:class"; imported when chosen, so an optional engine's package is only needed by its users
ENGINES = {
    "transformers": "cosmos_robot.text.engines:TransformersEngine",
    "transformers_static": "cosmos_robot.text.engines:StaticGenerateEngine",
    "vllm": "cosmos_robot.text.vllm_engine:VLLMEngine",
}


def make_engine(
    name: str,
    model: Any,
    tokenizer: Any,
    stop_ids: Sequence[int],
    pad_id: int,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> RolloutEngine:
    """The engine ``name`` on ``model``; ``options[name]`` (a recipe's ``[rollout.<name>]`` table) are its own
    keyword arguments, other engines' tables are ignored."""
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; known: {', '.join(ENGINES)}")
    module, _, attr = ENGINES[name].partition(":")
    engine = getattr(importlib.import_module(module), attr)
    return engine(model, tokenizer, stop_ids, pad_id, **dict((options or {}).get(name, {})))
