"""Rollout samplers against serving: the serving sampler reproduces ``FlowPolicy`` exactly, each start-noise
mode starts chunks where it says, camera-free policies roll out on unrendered envs, and the sampler gate
counts paired episodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos_robot.config import ConfigError
from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot.policies.flow.rl import FlowRLAdapter
from cosmos_robot_envs.episodes import obs_row
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.rl import RLConfig
from cosmos_robot_trainers.rl.rollout import RolloutWorker, episode_specs
from cosmos_robot_trainers.rl.sampler_gate import gate_specs, sampler_gap, serving_sampler
from tests.policies._flow_helpers import scrambled_model, tiny_config, tiny_stats
from tests.trainers.test_rl import CKPT, ROOT, debug_config

STATE_CKPT = ROOT / "checkpoints" / "flow_tabletop_state_weak"


def _state_adapter() -> FlowRLAdapter:
    """A tiny camera-free flow policy (random weights) reading state + object_state."""
    cfg = tiny_config(cameras=(), state_keys=("state", "object_state"), state_dim=23, chunk_size=10)
    return FlowRLAdapter(FlowPolicy(scrambled_model(cfg), tiny_stats(cfg)))


def _config(*overrides: str) -> RLConfig:
    return debug_config("joint_ppo", Path("/nonexistent"), "env.max_steps=12", *overrides)


def test_serving_sampler_rollout_reproduces_the_served_actions() -> None:
    """ODE from the serving noise inside the rollout worker == ``FlowPolicy.infer_batch`` on the same obs."""
    policy = FlowPolicy.from_pretrained(CKPT)
    adapter = FlowRLAdapter(policy)
    config = serving_sampler(_config("rollout.num_flow_steps=10"))
    assert (config.sample_mode, config.start_noise) == ("ode", "serving")
    worker = RolloutWorker(config, adapter)
    try:
        obs, _ = worker.venv.reset(seeds=[5, 6], options=[{"task": "reach"}, {"task": "open_drawer"}])
        rows = [obs_row(obs, i) for i in range(2)]
        batch = worker._model_batch(rows)
        _, _, chunk = worker._decide(batch, torch.Generator().manual_seed(0), adapter.serving_noise(2))
    finally:
        worker.close()
    wire = [
        {
            "observation/image": r["image"],
            "observation/wrist_image": r["wrist_image"],
            "observation/state": r["state"],
            "prompt": r["prompt"],
        }
        for r in rows
    ]
    served = np.stack([out["actions"] for out in policy.infer_batch(wire)])
    np.testing.assert_allclose(chunk, np.clip(served[:, : config.rollout.replan_steps], -1, 1), atol=1e-5)


@pytest.mark.parametrize("mode", ["serving", "episode", "fresh"])
def test_start_noise_modes_start_chunks_where_they_say(mode: str) -> None:
    adapter = _state_adapter()
    config = _config(f"rollout.start_noise={mode}", "rollout.episodes_per_iter=4")
    assert config.start_noise == mode
    worker = RolloutWorker(config, adapter)
    try:
        assert "image" not in worker.venv.single_observation_space.spaces  # camera-free: nothing rendered
        r = worker.collect(episode_specs(config, 0), seed=1)
    finally:
        worker.close()
    starts = r.chain[:, 0]
    assert r.num_decisions > r.num_episodes  # episodes span several decisions
    if mode == "serving":
        assert torch.equal(starts, adapter.serving_noise(r.num_decisions))
        return
    same_episode = r.episode[:, None] == r.episode[None, :]
    equal = (starts[:, None] == starts[None, :]).flatten(2).all(-1)
    if mode == "episode":
        assert torch.equal(equal, same_episode)  # one draw per episode, a different one per episode
    else:
        assert torch.equal(equal, torch.eye(r.num_decisions, dtype=torch.bool))  # a new draw per chunk


def test_deterministic_groups_are_refused() -> None:
    with pytest.raises(ConfigError, match="start_noise 'serving' is deterministic"):
        debug_config("nft", Path("/x"), "rollout.start_noise=serving")
    nft = debug_config("nft", Path("/x"))
    assert (nft.sample_mode, nft.start_noise) == ("ode", "episode")


def test_sampler_gap_pairs_the_same_episodes() -> None:
    adapter = _state_adapter()
    config = _config("env.max_steps=10")
    specs = gate_specs(config, 3, seed=1000)
    assert [(s.task, s.seed) for s in specs] == [(t, 1000 + i) for t in config.env.tasks for i in range(3)]
    gap = sampler_gap(serving_sampler(config), adapter, episodes_per_task=3)
    # the serving sampler against itself: deterministic, so the very same outcomes
    assert gap.rollout_successes == gap.serving_successes and gap.gap_points == 0.0
    assert sum(n for n, _, _ in gap.per_task.values()) == gap.episodes == len(specs)
    assert gap.summary()["serving"]["wilson_high"] > 0.0


@pytest.mark.slow
@pytest.mark.timeout(900)  # 800 episodes: about 2.5 minutes alone, past 300 s on a shared CPU
def test_the_state_recipe_sampler_is_within_3_points_of_serving() -> None:
    """The gate on 100 episodes per task: joint_ppo_flow_tabletop_state's rollout sampler (Flow-SDE from
    the serving noise) against the served policy, on the committed few-shot state checkpoint."""
    _, config = load_train_recipe("joint_ppo_flow_tabletop_state", [f"init={json.dumps(str(STATE_CKPT))}"])
    assert isinstance(config, RLConfig) and (config.sample_mode, config.start_noise) == ("flow_sde", "serving")
    config = config.model_copy(update={"env": config.env.model_copy(update={"num_envs": 8})})
    adapter = FlowRLAdapter(FlowPolicy.from_pretrained(STATE_CKPT))
    adapter.set_num_flow_steps(config.rollout.num_flow_steps or adapter.model.config.num_flow_steps)
    gap = sampler_gap(config, adapter, episodes_per_task=100)
    assert gap.episodes == 400
    assert gap.gap_points <= 3.0, gap.summary()  # the rollout sampler trails serving by at most 3 points


@pytest.mark.parametrize("level", ["chunk", "action", "element"])
def test_ratio_levels_start_at_one_and_shape_the_advantage(level: str) -> None:
    """Each ratio level recomputes the stored per-element log-probs exactly (ratio 1 before a step) and
    broadcasts one decision's advantage over its rows / elements."""
    from cosmos_robot_trainers.rl.advantage import ppo_advantages
    from cosmos_robot_trainers.rl.learner import policy_gradient

    adapter = _state_adapter()
    config = _config(f"algo.ratio_level={level}", "env.max_steps=10")
    worker = RolloutWorker(config, adapter)
    try:
        r = worker.collect(episode_specs(config, 0), seed=2)
    finally:
        worker.close()
    assert r.elem_log_prob is not None and r.elem_log_prob.shape == (r.num_decisions, 5, 5)  # rows x logprob_dims
    torch.testing.assert_close(r.elem_log_prob.sum((1, 2)), r.log_prob)
    adv = ppo_advantages(r, config.algo)
    pg = policy_gradient(adapter.model, r, adv, config, sample_mode="flow_sde", noise_level=0.5)
    mb = torch.arange(r.num_decisions)
    loss, metrics, lp, _, _ = pg.surrogate(mb)
    new, old, a = pg.ratio_terms(lp, mb)
    want = {"chunk": (r.num_decisions,), "action": (r.num_decisions, 5), "element": (r.num_decisions, 5, 5)}[level]
    assert new.shape == old.shape == want and a.shape[0] == r.num_decisions and a.ndim == len(want)
    assert float((new - old).detach().abs().max()) < 1e-4 and metrics["clip_fraction"] == 0.0
    assert torch.isfinite(loss)
