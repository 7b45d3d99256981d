"""The privileged critic: joint PPO's value reads the env's state + object_state through its own MLP, the
actor never sees it, the export is a plain policy folder, and recipes that cannot feed it are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cosmos_robot.config import ConfigError
from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot.policies.flow.rl import FlowRLAdapter
from cosmos_robot_trainers.common import read_metrics
from cosmos_robot_trainers.rl import run_rl
from cosmos_robot_trainers.rl.critic import CRITIC_OBS, attach_privileged_critic
from cosmos_robot_trainers.rl.rollout import RolloutWorker
from tests.trainers.test_rl import CKPT, debug_config, quiet


def test_value_comes_from_the_privileged_vector_only() -> None:
    adapter = FlowRLAdapter(FlowPolicy.from_pretrained(CKPT))
    model = attach_privileged_critic(adapter, obs_dim=23)
    assert adapter.model is model and adapter.reads_object_state
    with torch.no_grad():
        for p in model.value_head.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    config = debug_config("joint_ppo", Path("/x"), "env.max_steps=6", "algo.critic_inputs=privileged")
    worker = RolloutWorker(config, adapter)
    try:
        obs, _ = worker.venv.reset(seeds=[1, 2], options=[{"task": "push"}, {"task": "reach"}])
        rows = [{k: v[i] for k, v in obs.items()} for i in range(2)]
        batch = worker._model_batch(rows)
    finally:
        worker.close()
    assert batch[CRITIC_OBS].shape == (2, 23)  # the env ran in obs_mode "all": cameras + object_state
    context = model.encode(batch)
    inner_context = model.inner.encode(batch)
    assert torch.equal(context[:, :-23], inner_context)  # the actor's context is untouched
    x, t = torch.randn(2, 10, 7), torch.full((2,), 0.5)
    torch.testing.assert_close(model.velocity(x, t, context), model.inner.velocity(x, t, inner_context))
    moved = dict(batch, **{CRITIC_OBS: batch[CRITIC_OBS] + 1.0})
    assert not torch.allclose(model.value(model.encode(moved)), model.value(context))  # it reads the vector
    blind = dict(batch, images=torch.zeros_like(batch["images"]))
    assert torch.equal(model.value(model.encode(blind)), model.value(context))  # and nothing the actor sees


def test_privileged_joint_ppo_trains_the_critic_and_exports_a_plain_policy(tmp_path: Path) -> None:
    config = debug_config("joint_ppo", tmp_path, "algo.critic_inputs=privileged", "train.iterations=1")
    result = run_rl(config, log=quiet)
    (record,) = read_metrics(tmp_path)
    assert record["ratio_dev_first_mb"] < 1e-3 and record["value_loss"] > 0
    assert result.final_dir is not None
    exported = FlowPolicy.from_pretrained(result.final_dir)  # no critic tensors leak into the folder
    assert set(exported.model.state_dict()) == set(FlowPolicy.from_pretrained(CKPT).model.state_dict())


def test_recipes_that_cannot_feed_it_are_refused() -> None:
    with pytest.raises(ConfigError, match="critic_inputs 'privileged'"):
        debug_config("grpo", Path("/x"), "algo.critic_inputs=privileged")
