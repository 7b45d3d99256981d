"""A test double of vLLM's offline API, for the CPU tests of ``cosmos_robot.text.vllm_engine``.

vLLM's wheels need a CUDA GPU, which this machine lacks; the real engine runs in
``tests/text/test_vllm_gpu.py`` on the device machine. This double is built from vLLM 0.26's
documented interface, the parts the engine uses:

- ``LLM(model=FOLDER, skip_tokenizer_init=..., dtype=..., seed=..., logprobs_mode=..., ...)`` loads the
  HF folder (here with transformers, on the CPU);
- ``LLM.generate(prompts: list[TokensPrompt], sampling_params, use_tqdm)`` returns one
  ``RequestOutput`` per prompt, in order, whose ``outputs[0]`` has ``token_ids``, ``logprobs`` (one
  ``{token_id: Logprob}`` dict per generated token, the sampled token included when ``logprobs=0``),
  ``finish_reason`` ("stop" or "length") and ``stop_reason``; with ``processed_logprobs`` they are
  after temperature; a stop token id stays in ``token_ids``;
- ``LLM.apply_model(fn)`` runs ``fn`` on the worker's model and returns ``[result]``; the model's
  ``load_weights(iterable of (name, tensor))`` copies them in and returns the loaded names;
- ``LLM.reset_prefix_cache()``; ``SamplingParams(**fields)``; ``TokensPrompt(prompt_token_ids=...)``.

Sampling here is a plain token-by-token loop over full forward passes, seeded from ``LLM(seed=...)``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch

BUILT: list[LLM] = []  # every LLM the double built, for the tests to inspect


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    logprobs: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    detokenize: bool = True
    seed: int | None = None


def TokensPrompt(prompt_token_ids: list[int]) -> dict[str, Any]:  # vLLM's TypedDict name
    return {"prompt_token_ids": list(prompt_token_ids)}


class _WorkerModel:
    """What ``apply_model`` hands to its function: the model, with vLLM's ``load_weights``, which takes
    weights by their checkpoint names and shapes (as in the folder's safetensors): the double writes them
    as a checkpoint beside the folder's config and loads that, so names in transformers' in-memory layout
    (fused MoE experts, say) fail here as they would in vLLM."""

    def __init__(self, hf: Any, folder: str) -> None:
        self.hf, self.folder = hf, folder

    def load_weights(self, weights: Any) -> set[str]:
        import shutil
        import tempfile
        from pathlib import Path

        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM

        state = {name: tensor.detach().contiguous().clone() for name, tensor in weights}
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(Path(self.folder) / "config.json", tmp)
            save_file(state, str(Path(tmp) / "model.safetensors"))
            loaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        missing = set(self.hf.state_dict()) - set(loaded.state_dict())
        if missing:
            raise KeyError(f"load_weights: no weights for {sorted(missing)[:3]}")
        self.hf.load_state_dict(loaded.state_dict(), strict=True)
        return set(state)


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        from transformers import AutoModelForCausalLM

        self.folder, self.kwargs = model, kwargs
        self.hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.generator = torch.Generator().manual_seed(int(kwargs.get("seed", 0)))
        self.prefix_cache_resets = 0
        BUILT.append(self)

    def apply_model(self, fn: Any) -> list[Any]:
        return [fn(_WorkerModel(self.hf, self.folder))]

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_resets += 1
        return True

    @torch.no_grad()
    def _one(self, prompt: list[int], sp: SamplingParams) -> Any:
        ids, logprobs, reason = list(prompt), [], "length"
        for _ in range(sp.max_tokens):
            logits = self.hf(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            if sp.temperature == 0:
                token = int(logits.argmax())
                logp = torch.log_softmax(logits, -1)
            else:
                logp = torch.log_softmax(logits / sp.temperature, -1)
                token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
            ids.append(token)
            logprobs.append({token: types.SimpleNamespace(logprob=float(logp[token]), rank=1)})
            if token in sp.stop_token_ids:
                reason = "stop"
                break
        out = types.SimpleNamespace(
            index=0,
            text="",
            token_ids=ids[len(prompt) :],
            logprobs=logprobs,
            finish_reason=reason,
            stop_reason=ids[-1] if reason == "stop" else None,
        )
        return types.SimpleNamespace(prompt_token_ids=prompt, outputs=[out])

    def generate(self, prompts: list[dict[str, Any]], sampling_params: SamplingParams, use_tqdm: bool = True) -> list:
        return [self._one(p["prompt_token_ids"], sampling_params) for p in prompts]


def module() -> types.ModuleType:
    """The double as a module, to stand in for ``vllm`` in ``sys.modules``."""
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams, mod.TokensPrompt = LLM, SamplingParams, TokensPrompt  # type: ignore[attr-defined]
    return mod
