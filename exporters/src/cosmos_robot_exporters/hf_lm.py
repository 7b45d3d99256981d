"""``hf_causal_lm``: an HF causal-LM folder that ``transformers`` loads unchanged, plus the manifest.

Image-text models (Qwen3-VL) export the same way: their image processor is written beside the tokenizer.

From a folder the model and tokenizer are loaded (offline, checked) and saved again. From a text
training run (``text_sft``, ``text_grpo``, ``text_dpo``, ``text_ppo``, ``text_opd``) the checkpoint's
weights go into the model the run exports as (its ``final/``, else its ``init`` folder), matched tensor
by tensor (name and shape; nothing is dropped), so any checkpoint of a run, not only the last, becomes an HF folder.
"""

from __future__ import annotations

from pathlib import Path

from cosmos_robot_exporters.base import (
    ExportError,
    ExportResult,
    begin_export,
    match_tensors,
    staged_export,
    written_files,
)
from cosmos_robot_exporters.sources import load_trained_weights

__all__ = ["HFCausalLMExporter"]


class HFCausalLMExporter:
    """HF folder or text training run -> an HF causal-LM folder with a manifest."""

    name = "hf_causal_lm"
    targets: tuple[str, ...] = ("hf",)

    def export(self, source: Path, out: Path, *, target: str, base: Path | None, overwrite: bool) -> ExportResult:
        from cosmos_robot.text.hf import load_causal_lm, save_causal_lm

        source, run, info = begin_export(self, source, target)
        notes: list[str] = []
        if run is None:
            if base is not None:
                raise ExportError(f"{source} is a model folder: an hf_causal_lm export of it takes no --base")
            lm = load_causal_lm(source, require_chat_template=False)
            notes.append("re-saved through save_pretrained (model and tokenizer)")
        else:
            template = base or run.final
            if template is None and str(run.config.get("init", "")).startswith("tiny:"):
                from cosmos_robot.text.tiny import tiny_from_table

                lm = tiny_from_table(run.config.get("model") or {})  # the run's own random architecture
                template = f"the recipe's [model] table ({run.config.get('init')})"
            else:
                template = template or run.init
                if template is None or not Path(template).is_dir():
                    raise ExportError(f"{run.run_dir}: no model folder to export into; pass one with --base")
                lm = load_causal_lm(template, require_chat_template=False)
            weights, notes = load_trained_weights(run, use_ema=False)
            state = lm.model.state_dict()
            expected = {k: tuple(v.shape) for k, v in state.items()}
            mapping, _ = match_tensors(
                expected, weights, what=f"{run.describe()} -> {template}", droppable=lambda k: False
            )
            lm.model.load_state_dict({name: weights[key] for name, key in mapping.items()})
            notes.append(f"config and tokenizer from {template}")
        info["dropped"] = []
        with staged_export(Path(out), overwrite, info, protect=(source, base)) as tmp:
            save_causal_lm(lm, tmp)
        return ExportResult(Path(out), self.name, target, source, written_files(Path(out)), [], notes)
