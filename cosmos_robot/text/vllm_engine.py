"""vLLM as a colocated rollout engine: ``rollout.engine = "vllm"`` (the ``vllm`` extra, a CUDA GPU).

Why: on a GPU the rollout is most of a GRPO step, and vLLM's paged attention with CUDA graphs
samples far faster than transformers' ``generate`` (docs/benchmarks.md, issue 17). The trainer keeps
its own model; vLLM keeps a second copy of the weights in the same process and on the same GPU
(cosmos-framework's and TRL's "colocate" mode), refreshed after every update.

How it fits the ``RolloutEngine`` interface (``cosmos_robot.text.engines``):

- **Built lazily** at the first ``generate`` from a snapshot of the trainer's weights *at that
  moment*, saved as an HF folder in a temporary directory: a resumed, random-init or tiny model works
  the same as a hub checkpoint, and the restore that the trainers do after building the engine is
  seen.
- **In-process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): vLLM's engine core and its model live in the
  trainer's process, so ``sync_weights`` hands the trainer's tensors to the model's own
  ``load_weights`` (which fuses q/k/v and gate/up the way vLLM lays them out) through
  ``LLM.apply_model``: no files, no pickling, no second process. The prefix cache is reset after,
  since it holds keys and values of the old weights.
- **Log-probs as the trainer scores them**: ``logprobs_mode="processed_logprobs"`` returns each
  sampled token's log-prob after temperature and top-p, the distribution the trainer's teacher-forced
  pass evaluates; the GRPO trainer logs the difference (``logprob_gap``) and can correct it with
  truncated importance sampling (``algo.tis_cap``).
- **Token ids in, token ids out** (``skip_tokenizer_init``): vLLM never sees a tokenizer, so any
  tokenizer the trainer uses works (the character tokenizers of the tiny models included) and the
  text is decoded by the trainer's own.
- **Seeding**: vLLM is seeded once, when it is built (``seed`` of the first call); per-request seeds
  would make its sampler draw row by row. Completions are therefore not reproducible call for call as
  the transformers engines' are (vLLM's batching is not bitwise deterministic either).

Options (``[rollout.vllm]`` in a recipe): ``gpu_memory_utilization`` is the share of the whole GPU
that vLLM may take for weights, activations and KV cache: leave the trainer enough (0.3 of an H200
is 42 GiB). ``enforce_eager`` skips CUDA graph capture (faster start, slower decode).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from typing import Any

from cosmos_robot.text.engines import Completion, EngineError, SamplingParams, refuse_images

__all__ = ["VLLMEngine"]

INSTALL_HINT = (
    "rollout.engine = 'vllm' needs vLLM on a CUDA machine: pip install 'cosmos-robot[vllm]' "
    "(vLLM 0.22-0.26, the releases that pin torch 2.11)"
)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise EngineError(f"{INSTALL_HINT}; importing it failed: {e}") from e
    return vllm


class VLLMEngine:
    """vLLM's offline ``LLM`` colocated with the trainer (see the module docstring)."""

    name = "vllm"
    scores_by_forward = False  # log-probs come from vLLM's sampler

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        stop_ids: Sequence[int],
        pad_id: int,
        gpu_memory_utilization: float = 0.3,
        enforce_eager: bool = False,
        max_model_len: int | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids, self.pad_id = list(stop_ids), int(pad_id)
        self.options = {
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
            "max_model_len": max_model_len,
        }
        self.llm: Any = None
        self.syncs = 0  # weight syncs pushed into vLLM (tests and logs)

    @staticmethod
    def require_cuda(device: Any) -> None:
        if device.type != "cuda":
            raise EngineError(
                f"the vllm rollout engine runs beside the trainer on its GPU, but the model is on {device}: "
                "set train.device = 'cuda' (or use rollout.engine = 'transformers' on a CPU)"
            )

    def _build(self, seed: int) -> Any:
        vllm = _import_vllm()
        if os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            raise EngineError(
                "the vllm rollout engine syncs weights in place and needs vLLM's engine in this process: "
                "unset VLLM_ENABLE_V1_MULTIPROCESSING or set it to 0"
            )
        param = next(self.model.parameters())
        self.require_cuda(param.device)
        if importlib.util.find_spec("flashinfer") is None:
            # vLLM 0.26 imports FlashInfer's attention backend to decide on its top-p/top-k sampler and fails
            # without it, although the sampler has a PyTorch path: take that path when FlashInfer is absent
            os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        folder = tempfile.mkdtemp(prefix="cosmos_vllm_")
        weakref.finalize(self, shutil.rmtree, folder, True)
        self.model.save_pretrained(folder, safe_serialization=True)
        return vllm.LLM(
            model=folder,
            skip_tokenizer_init=True,
            dtype=str(param.dtype).removeprefix("torch."),
            seed=seed,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # the recipe's sampling parameters, not a generation_config.json's
            enable_prefix_caching=True,
            **{k: v for k, v in self.options.items() if v is not None},
        )

    def sync_weights(self, model: Any) -> None:
        """Copy ``model``'s weights into vLLM's copy (before the first ``generate`` there is none yet)."""
        self.model = model
        if self.llm is None:
            return
        # the checkpoint layout that vLLM's load_weights reads (save_pretrained's): transformers 5 keeps some
        # weights fused in memory (a MoE layer's experts as one gate_up_proj tensor), revert_weight_conversion
        # gives them back their checkpoint names and shapes (experts.{e}.gate_proj.weight, ...)
        from transformers.core_model_loading import revert_weight_conversion

        state = revert_weight_conversion(model, model.state_dict())
        weights = [(name, tensor.detach()) for name, tensor in state.items()]
        self.llm.apply_model(lambda vllm_model: vllm_model.load_weights(weights))
        self.llm.reset_prefix_cache()
        self.syncs += 1

    def generate(
        self, prompts: Sequence[list[int]], n: int, params: SamplingParams, images: Sequence[Any] | None = None
    ) -> list[list[Completion]]:
        refuse_images(self.name, images)  # vLLM's multimodal path needs its own processor: not wired here
        if not prompts:
            return []
        if self.llm is None:
            self.llm = self._build(params.seed)
        vllm = _import_vllm()
        sampling = vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # the sampled token's own log-prob
            stop_token_ids=self.stop_ids,
            detokenize=False,
        )
        requests = [vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(n)]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        if len(outputs) != len(requests):
            raise EngineError(f"vllm engine: {len(outputs)} outputs for {len(requests)} requests")
        return [
            [self._completion(prompts[i], outputs[i * n + k], i * n + k) for k in range(n)] for i in range(len(prompts))
        ]

    def _completion(self, prompt: list[int], output: Any, r: int) -> Completion:
        if not output.outputs:
            raise EngineError(f"vllm engine: request {r} returned no completion")
        out = output.outputs[0]
        ids = [int(t) for t in out.token_ids]
        if out.logprobs is None or len(out.logprobs) != len(ids):
            got = "none" if out.logprobs is None else len(out.logprobs)
            raise EngineError(f"vllm engine: request {r}: {got} log-probs for {len(ids)} tokens")
        log_probs = [float(position[token].logprob) for position, token in zip(out.logprobs, ids, strict=True)]
        stopped = bool(ids) and ids[-1] in self.stop_ids
        if out.finish_reason == "stop" and not stopped:
            raise EngineError(
                f"vllm engine: request {r} stopped (reason {out.stop_reason!r}) without one of the stop tokens "
                f"{self.stop_ids} at its end"
            )
        if out.finish_reason not in ("stop", "length"):
            raise EngineError(f"vllm engine: request {r} finished with {out.finish_reason!r}")
        text = self.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=True)
        return Completion(list(prompt), ids, log_probs, stopped, text)
