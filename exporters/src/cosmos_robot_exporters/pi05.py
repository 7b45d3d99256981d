"""``pi05`` -> a LeRobot 0.6.1 ``pi05`` folder (``PI05Policy.from_pretrained`` loads it), with the manifest.

What is written is what LeRobot's ``PI05Policy.save_pretrained`` and its processor pipelines write
(``config.json``, ``model.safetensors`` under LeRobot's names with the two LM heads its strict loader
wants, ``policy_{pre,post}processor.json`` and their stats), plus ``tokenizer/`` and, for sizes other
than the released gemma_2b + gemma_300m, ``pi05_architecture.json`` (``cosmos_robot.policies.pi05.checkpoint``).

- From a policy folder (a run's ``final/``, a LeRobot or openpi-converted download): loaded and
  written again, which normalises openpi-converted weight names to LeRobot's.
- From a training run: the checkpoint's pi0.5 tensors (under any wrapper prefix: ``pi05.`` for the RL
  and SFT models) go into the run's template folder (RL: ``init``; SFT: ``final/``, else ``init`` with
  the data's stats as the new processors' stats, LeRobot's fine-tuning convention). PPO's critic
  (``value_head.*``) has no place in LeRobot's model: it is dropped and listed. The EMA weights are
  exported when the run kept an EMA, and an RL run's ``rollout.num_flow_steps`` becomes
  ``num_inference_steps`` (the sampler the policy was trained for).

LeRobot 0.6.1 builds only the released sizes; a folder of other sizes loads in LeRobot inside
``cosmos_robot_exporters.lerobot_pi05.lerobot_pi05_sizes(folder)`` (see there), and the result says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmos_robot_exporters.base import ExportError, PolicyFolderExporter, match_tensors
from cosmos_robot_exporters.sources import RunSource, load_trained_weights, sft_data_stats

__all__ = ["Pi05Exporter"]


class Pi05Exporter(PolicyFolderExporter):
    """Policy folder or training run -> a LeRobot ``pi05`` folder with a manifest."""

    name = "pi05"
    targets: tuple[str, ...] = ("lerobot",)

    def from_folder(self, source: Path) -> tuple[Any, list[str]]:
        from cosmos_robot.policies.pi05.policy import Pi05Policy

        note = "re-saved through LeRobot's save_pretrained and processors (the folder loads and is complete)"
        return Pi05Policy.from_pretrained(source, cuda_graphs=False), [note]

    def policy_from_run(self, run: RunSource, base: Path | None) -> tuple[Any, list[str], list[str]]:
        return _policy_from_run(run, base)

    def notes_for(self, out: Path) -> list[str]:
        from cosmos_robot.policies.pi05.checkpoint import ARCH_FILE

        notes = []
        if (out / ARCH_FILE).is_file():
            notes.append(
                f"sizes other than the released gemma_2b + gemma_300m ({ARCH_FILE}): LeRobot 0.6.1 loads this folder "
                "inside cosmos_robot_exporters.lerobot_pi05.lerobot_pi05_sizes(folder)"
            )
        notes.append(
            "LeRobot's processors take the prompt tokenizer from tokenizer/ "
            "(preprocessor_overrides={'tokenizer_processor': {'tokenizer': ...}}), as for any offline pi05 folder"
        )
        return notes


def _policy_from_run(run: RunSource, base: Path | None) -> tuple[Any, list[str], list[str]]:
    import torch

    from cosmos_robot.policies.pi05.policy import Pi05Policy

    template = base or run.template()
    if template is None:
        raise ExportError(f"{run.run_dir}: a pi05 run names no init folder; pass it with --base")
    policy = Pi05Policy.from_pretrained(template, cuda_graphs=False)
    notes = [f"config, processors and tokenizer from {template}"]
    if not run.is_rl and template != run.final:
        stats = sft_data_stats(run)
        lerobot_stats = {"observation.state": stats["state"].to_dict(), "action": stats["actions"].to_dict()}
        num_steps = policy.num_steps
        policy = Pi05Policy.from_model(policy.model, policy.lerobot_config, lerobot_stats, policy.tokenizer)
        policy.num_steps = num_steps
        notes.append("processor stats recomputed from the run's data (the run has no final/ yet)")
    weights, weight_notes = load_trained_weights(run)
    notes += weight_notes
    model_state = policy.model.state_dict()
    expected = {k: tuple(v.shape) for k, v in model_state.items()}
    mapping, dropped = match_tensors(expected, weights, what=str(run.checkpoint))
    state = {name: weights[key].to(model_state[name].dtype) for name, key in mapping.items()}
    with torch.no_grad():
        policy.model.load_state_dict(state, strict=True)
    if dropped:
        notes.append(f"PPO's value head ({len(dropped)} tensors) is not part of LeRobot's pi05: dropped")
    steps = (run.config.get("rollout") or {}).get("num_flow_steps") if run.is_rl else None
    if steps is not None and int(steps) != int(policy.lerobot_config.num_inference_steps):
        policy.lerobot_config.num_inference_steps = int(steps)
        policy.num_steps = int(steps)
        notes.append(f"num_inference_steps {steps} (the run's rollout.num_flow_steps: the sampler it was trained for)")
    return policy, dropped, notes
