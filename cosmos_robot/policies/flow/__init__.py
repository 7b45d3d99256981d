"""The embedded ``flow`` policy family: a compact flow-matching action-chunk policy.

- ``FlowConfig`` (``configuration_flow``): every size and convention, saved as ``config.json``;
- ``FlowModel`` (``modeling_flow``): encoder + trunk + action expert + value and noise heads,
  ``flow_loss(batch)`` for SFT;
- ``sample_actions`` / ``recompute_log_prob`` (``sampling``): ODE, Flow-SDE and Flow-Noise
  denoising with per-step log-probs for RL;
- ``FlowPolicy`` (``policy``): the served pipeline with ``save_pretrained`` / ``from_pretrained``.

SFT (state and actions normalised with the stats the policy will carry; see ``FlowModel``'s docstring)::

    model = FlowModel(FlowConfig(image_size=64, chunk_size=10))
    loss, metrics = model.flow_loss(batch, generator=gen)  # images, state, text_ids/offsets, actions, pad mask
    FlowPolicy(model, {"state": state_stats, "actions": action_stats}).save_pretrained("ckpt/")

RL (store ``chain`` and ``sde_step`` with the rollout; recompute under the current weights)::

    context = model.encode(batch)
    res = sample_actions(model, context, "flow_sde", generator=gen, replan_steps=replan_steps)
    value = model.value(context)
    new = recompute_log_prob(model, model.encode(batch), res.chain, "flow_sde", res.sde_step, replan_steps=replan_steps)
    ratio = torch.exp(new.log_prob - res.log_prob)
"""

from cosmos_robot.policies.flow.configuration_flow import FlowConfig
from cosmos_robot.policies.flow.modeling_flow import FlowModel
from cosmos_robot.policies.flow.policy import (
    FlowPolicy,
    collate_observations,
    default_input_transforms,
    default_output_transforms,
)
from cosmos_robot.policies.flow.sampling import LogProbResult, SampleResult, recompute_log_prob, sample_actions
from cosmos_robot.policies.flow.text import encode_prompts

__all__ = [
    "FlowConfig",
    "FlowModel",
    "FlowPolicy",
    "LogProbResult",
    "SampleResult",
    "collate_observations",
    "default_input_transforms",
    "default_output_transforms",
    "encode_prompts",
    "recompute_log_prob",
    "sample_actions",
]
