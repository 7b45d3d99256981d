"""``flow``: our own policy folder (``FlowPolicy.save_pretrained``: config.json, model.safetensors,
policy.json with transforms and stats) plus the manifest.

From a training run the checkpoint's weights go into the policy the run started from (RL: ``init``,
whose stats RL never changes; SFT: ``final/``, or a new model from the recipe's ``[model]`` table with
the data's stats). The flow folder keeps PPO's value head and the Flow-Noise head: they are part of
``FlowModel``, whose loader is strict, and serving never runs them (nothing is dropped). An RL run that
sampled with ``rollout.num_flow_steps`` exports that step count, as its ``final/`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmos_robot_exporters.base import PolicyFolderExporter, match_tensors
from cosmos_robot_exporters.sources import RunSource, load_trained_weights, sft_data_stats

__all__ = ["FlowExporter"]


class FlowExporter(PolicyFolderExporter):
    """Policy folder or training run -> a ``flow`` policy folder with a manifest."""

    name = "flow"
    targets: tuple[str, ...] = ("flow",)

    def from_folder(self, source: Path) -> tuple[Any, list[str]]:
        from cosmos_robot.policies.flow import FlowPolicy

        return FlowPolicy.from_pretrained(source), ["re-saved through FlowPolicy.save_pretrained (complete folder)"]

    def policy_from_run(self, run: RunSource, base: Path | None) -> tuple[Any, list[str], list[str]]:
        return _policy_from_run(run, base)

    def notes_for(self, out: Path) -> list[str]:
        return ["the flow format keeps the value and noise heads (FlowModel loads strictly); serving never runs them"]


def _policy_from_run(run: RunSource, base: Path | None) -> tuple[Any, list[str], list[str]]:
    import torch

    from cosmos_robot.policies.flow import FlowModel, FlowPolicy
    from cosmos_robot.policies.flow.configuration_flow import FlowConfig

    template = base or run.template()
    notes: list[str] = []
    if template is not None:
        policy = FlowPolicy.from_pretrained(template)
        notes.append(f"config, transforms and stats from {template}")
        if not run.is_rl and template != run.final:
            policy = FlowPolicy(policy.model, sft_data_stats(run))
            notes.append("stats recomputed from the run's data (the run has no final/ yet)")
    else:
        config = FlowConfig.model_validate(run.config.get("model") or {})
        policy = FlowPolicy(FlowModel(config), sft_data_stats(run))
        notes.append("a new model from the recipe's [model] table with its data's stats (the run has no final/ yet)")
    weights, weight_notes = load_trained_weights(run)
    notes += weight_notes
    expected = {k: tuple(v.shape) for k, v in policy.model.state_dict().items()}
    mapping, dropped = match_tensors(expected, weights, what=str(run.checkpoint))
    state = {name: weights[key] for name, key in mapping.items()}
    with torch.no_grad():
        policy.model.load_state_dict(state, strict=True)
    steps = (run.config.get("rollout") or {}).get("num_flow_steps") if run.is_rl else None
    if steps is not None and steps != policy.config.num_flow_steps:
        policy.model.config = policy.config = policy.config.model_copy(update={"num_flow_steps": int(steps)})
        notes.append(f"num_flow_steps {steps} (the run's rollout.num_flow_steps, as its final/ serves)")
    return policy, dropped, notes
