"""Training a driving planner (issue 20): demonstrations, prompt-free flow planners, reward providers, GRPO.

Real parts: highway-env episodes through the vector layer, LeRobot's dataset writer and reader, the flow
family, and the GRPO trainer on the committed SFT planner (``checkpoints/driving_planner_sft``). Proved
here: `record --suite driving` writes the driving layout with the expert's plans as labels (also under
DART perturbation, which changes the executed plans but not the labels' source); a prompt-free planner
ignores instructions; the reward providers equal the env's own preset rewards tick by tick; groups
compare episodes by return when asked (AlpaGym); the debug recipe trains, keeps the first minibatch's
ratio within 1e-3 of 1 and resumes exactly after a stop."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("highway_env")

from cosmos_robot.config import ConfigError
from cosmos_robot.data import load_demonstrations
from cosmos_robot.data.record import RecordConfig, record_demonstrations
from cosmos_robot.data.schema import DRIVING, STATE
from cosmos_robot.normalize import FeatureStats
from cosmos_robot.policies import load_policy_folder
from cosmos_robot.policies.flow import FlowConfig, FlowModel, FlowPolicy
from cosmos_robot_envs.driving import DrivingEnv
from cosmos_robot_envs.driving.expert_policy import plan_from_state
from cosmos_robot_envs.episodes import obs_row
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.common import read_metrics
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.rl import RLConfig, run_rl
from cosmos_robot_trainers.rl.advantage import dpo_pairs, group_advantages
from cosmos_robot_trainers.rl.config import AlgoConfig
from cosmos_robot_trainers.rl.policies import load_rl_adapter
from cosmos_robot_trainers.rl.rollout import RolloutWorker
from tests.trainers._rollouts import episode_fields
from tests.trainers.test_rl import killed_after

ROOT = Path(__file__).resolve().parents[2]


def record_small(out: Path, noise: float) -> dict:
    config = RecordConfig(
        suite="driving", tasks=("merge",), episodes_per_task=2, num_envs=2, vector_mode="sync", cameras=False,
        max_steps=12, expert_noise=noise, repo_id="local/driving_test", only_success=False,
    )  # fmt: skip
    return record_demonstrations(config, out, command=["test"])


def test_record_driving_stores_state_and_the_experts_plans(tmp_path: Path) -> None:
    side = record_small(tmp_path / "clean", 0.0)
    assert side["counts"]["rolled_out"] == 2 and side["config"]["suite"] == "driving"
    demo = load_demonstrations(tmp_path / "clean", chunk_size=1, image_size=8, cameras=(), state_keys=("state",))
    assert demo.state.shape[1] == 137 and demo.actions.shape[1:] == (1, 40) and demo.fps == DRIVING.fps
    assert set(demo.prompts) == {"merge"}  # no instruction in the suite: the task name labels the frames
    for state, action in zip(demo.state.numpy(), demo.actions[:, 0].numpy(), strict=True):
        assert np.allclose(plan_from_state(state).reshape(-1), action, atol=1e-5)  # labels = the expert's plans
    info = json.loads((tmp_path / "clean" / "meta" / "info.json").read_text())
    assert info["robot_type"] == DRIVING.robot_type and STATE in info["features"]
    # AlpaSim's arrays, flattened row-major: the rows an AlpaSim-ready planner concatenates
    alpasim = load_demonstrations(
        tmp_path / "clean", chunk_size=1, image_size=8, cameras=(), state_keys=("ego_history", "route")
    )
    assert alpasim.state.shape[1] == 16 * 3 + 20 * 3
    history = alpasim.state[:, :48].reshape(-1, 16, 3)
    assert torch.equal(history[:, -1], torch.zeros_like(history[:, -1]))  # the newest pose is the rig origin
    assert torch.allclose(history, demo.state[:, :48].reshape(-1, 16, 3))  # the same history inside state

    # DART: the executed plans are perturbed, so the episodes visit other states, but every label is still
    # the expert's plan for the state it was recorded in
    record_small(tmp_path / "dart", 1.0)
    noisy = load_demonstrations(tmp_path / "dart", chunk_size=1, image_size=8, cameras=(), state_keys=("state",))
    assert not torch.equal(noisy.state, demo.state[: len(noisy.state)])
    for state, action in zip(noisy.state.numpy(), noisy.actions[:, 0].numpy(), strict=True):
        assert np.allclose(plan_from_state(state).reshape(-1), action, atol=1e-5)


def test_record_refuses_noise_for_a_suite_without_a_perturbation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cosmos_robot.data.schema as schema

    # every built-in suite has one now: take the tabletop's away to see the refusal
    monkeypatch.setitem(schema.DEMO_LAYOUTS, "tabletop", dataclasses.replace(schema.TABLETOP, perturb_factory=None))
    with pytest.raises(ValueError, match="expert_noise: suite 'tabletop' has no action perturbation"):
        record_demonstrations(RecordConfig(suite="tabletop", expert_noise=0.5), tmp_path / "out")
    with pytest.raises(ValueError, match="expert_noise: expected >= 0"):
        RecordConfig(suite="driving", expert_noise=-1.0)


def test_a_prompt_free_planner_ignores_instructions() -> None:
    config = FlowConfig(
        cameras=(), state_keys=("state",), state_dim=137, action_dim=40, chunk_size=1, read_prompt=False,
        serve_noise="fixed",
    )  # fmt: skip
    stats = {
        key: FeatureStats.from_dict({"mean": [0.0] * n, "std": [1.0] * n, "min": [-1.0] * n, "max": [1.0] * n}, key)
        for key, n in (("state", 137), ("actions", 40))
    }
    policy = FlowPolicy(FlowModel(config), stats)
    assert "prompt" not in policy.input_spec.fields
    state = np.linspace(-1, 1, 137).astype(np.float32)
    plain = policy.infer({"observation/state": state})["actions"]
    told = policy.infer({"observation/state": state, "prompt": "turn left"})["actions"]
    assert plain.shape == (1, 40) and np.array_equal(plain, told)


def step_infos(preset: str, ticks: int = 25) -> list[tuple[float, dict]]:
    env = DrivingEnv(tasks=["merge"], max_steps=ticks, reward=preset)
    obs, _ = env.reset(seed=5, options={"task": "merge"})
    out = []
    for _ in range(ticks):
        plan = plan_from_state(obs["state"])
        plan[:, 1] -= 0.8  # drift right (rig frame: y left): off the expert's replay, so the distance term is not zero
        obs, reward, terminated, truncated, info = env.step(plan)
        out.append((reward, info))
        if terminated or truncated:
            break
    return out


@pytest.mark.parametrize("preset", ["progress_safety", "distance_to_gt"])
def test_reward_providers_equal_the_envs_own_preset(preset: str) -> None:
    provider = get_algorithm("reward", preset)
    ticks = step_infos(preset)
    assert any(info["dist_to_gt"] > 0 for _, info in ticks)
    for reward, info in ticks:
        assert provider(0.0, info) == pytest.approx(reward, abs=1e-12)
        assert get_algorithm("reward", "env")(reward, info) == reward


def test_reward_provider_errors_name_the_problem() -> None:
    with pytest.raises(KeyError, match="lacks \\['progress_step'"):
        get_algorithm("reward", "progress_safety")(1.0, {"is_success": True})
    with pytest.raises(ConfigError, match="reward.provider.*Did you mean 'progress_safety'"):
        load_train_recipe("debug_grpo_driving", ["reward.provider=progress_safty"])


def test_term_weights_reweight_a_presets_terms_and_name_bad_ones() -> None:
    from cosmos_robot_envs.driving.env import PRESET_TERMS
    from cosmos_robot_trainers.algorithms.rewards import reward_provider

    weighted = reward_provider("progress_safety", {"progress": 10.0, "dist_to_gt": 0.0})
    for reward, info in step_infos("progress_safety"):
        terms = info["reward_terms"]
        assert tuple(terms) == PRESET_TERMS["progress_safety"]  # the names the config checks are the real ones
        assert terms["progress"] > 0
        assert weighted(reward, info) == pytest.approx(10 * terms["progress"] + terms["collision"] + terms["offroad"])
    assert reward_provider("progress_safety") is get_algorithm("reward", "progress_safety")
    _, config = load_train_recipe("debug_grpo_driving", ["reward.term_weights={progress = 10.0}"])
    assert config.reward.term_weights == {"progress": 10.0}  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="not terms of 'progress_safety'; its terms are"):
        load_train_recipe("debug_grpo_driving", ["reward.term_weights={speed = 2.0}"])
    with pytest.raises(ConfigError, match="reward.provider 'env' has none"):
        load_train_recipe("debug_grpo_driving", ["reward.provider='env'", "reward.term_weights={progress = 2.0}"])


def test_groups_compare_returns_when_asked() -> None:
    from cosmos_robot_trainers.rl import Rollout

    n = 4
    fields = episode_fields([1.0, 1.0, 1.0, 0.0], [0, 0, 1, 1], [1] * n)
    fields["ep_return"] = torch.tensor([2.0, -8.0, 0.5, 0.5])  # group 0 both succeeded, one collided later
    m = n
    rollout = Rollout(
        inputs={"state": torch.zeros((m, 4)), "prompt": [""] * m},
        chain=torch.zeros((m, 2, 1, 1)), sde_step=torch.zeros(m, dtype=torch.long), log_prob=torch.zeros(m),
        value=torch.zeros(m), reward=torch.zeros(m), done=torch.ones(m, dtype=torch.bool),
        truncated=torch.zeros(m, dtype=torch.bool), bootstrap=torch.zeros(m), episode=torch.arange(m),
        step=torch.zeros(m, dtype=torch.long), **fields,
    )  # fmt: skip
    by_success = group_advantages(rollout, AlgoConfig(group_size=2))
    by_return = group_advantages(rollout, AlgoConfig(group_size=2, group_score="return"))
    assert by_success.keep.tolist() == [False, False, True, True]  # group 0 unanimous in success
    assert by_return.keep.tolist() == [True, True, False, False]  # group 1 equal in return
    assert by_return.advantages[0] > 0 > by_return.advantages[1]
    pairs = dpo_pairs(rollout, AlgoConfig(group_size=2, group_score="return"), torch.Generator().manual_seed(0))
    assert pairs.tolist() == [[0, 1]]


def debug_config(out: Path, *overrides: str) -> RLConfig:
    init = json.dumps(str(ROOT / "checkpoints" / "driving_planner_sft"))
    _, config = load_train_recipe(
        "debug_grpo_driving", [f"init={init}", f"output.dir={json.dumps(str(out))}", *overrides]
    )
    assert isinstance(config, RLConfig)
    return config


def test_debug_grpo_driving_trains_with_a_healthy_ratio_and_resumes_exactly(tmp_path: Path) -> None:
    full = run_rl(debug_config(tmp_path / "full"), log=lambda _: None)
    assert full.finished and full.final_dir is not None
    records = read_metrics(tmp_path / "full")
    assert any("policy_loss" in r for r in records)  # the groups disagreed: an update ran
    for r in records:
        if "ratio_dev_first_mb" in r:
            assert r["ratio_dev_first_mb"] < 1e-3
        assert r["episode_return"] < 3  # progress_safety returns (progress ~0.15, penalties), not successes
    killed_after(tmp_path / "full", tmp_path / "cut", 1)
    resumed = run_rl(debug_config(tmp_path / "cut"), log=lambda _: None)
    assert resumed.resumed_from == 1 and resumed.finished and resumed.final_dir is not None
    wa = load_policy_folder(full.final_dir).model.state_dict()  # type: ignore[attr-defined]
    wb = load_policy_folder(resumed.final_dir).model.state_dict()  # type: ignore[attr-defined]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    planner = load_policy_folder(full.final_dir)
    assert planner.input_spec.fields.keys() == {"observation/state"}  # servable as a prompt-free planner


def test_driving_rollouts_execute_the_planners_plans_in_metres(tmp_path: Path) -> None:
    """The sampled plan goes to the env as the planner made it, clipped only to the env's own plan box
    (a fixed [-1, 1] clip, right for the tabletop, once cut every plan to 1 m: the rollouts crawled)."""
    config = debug_config(tmp_path / "run")
    adapter = load_rl_adapter(str(config.init), "cpu")
    worker = RolloutWorker(config, adapter, num_envs=1)
    try:
        obs, _ = worker.venv.reset(seeds=[3], options=[{"task": "highway"}])
        batch = worker._model_batch([obs_row(obs, 0)])
        sample, _, chunk = worker._decide(batch, torch.Generator().manual_seed(0), None)
    finally:
        worker.close()
    plan = adapter.env_actions(sample.actions)[:, : config.rollout.replan_steps]
    assert chunk.shape == plan.shape == (1, 1, 40)
    assert chunk[0, 0, 38] > 30  # the plan's last point, 2 s ahead at highway speed, in metres
    np.testing.assert_array_equal(chunk, plan)  # inside the env's box: nothing clipped


def test_rollout_returns_use_the_configured_term_weights(tmp_path: Path) -> None:
    """``reward.term_weights`` reaches the rollouts: the same episode (same seed, same sampling seed)
    under progress weights 1 and 2 differs by exactly its progress, so the return is linear in it."""
    from cosmos_robot_trainers.rl.rollout import episode_specs

    returns = []
    for weight in (1.0, 2.0):
        config = debug_config(tmp_path / str(weight), f"reward.term_weights={{progress = {weight}}}")
        worker = RolloutWorker(config, load_rl_adapter(str(config.init), "cpu"), num_envs=1)
        try:
            returns.append(float(worker.collect(episode_specs(config, 0)[:1], seed=0).ep_return[0]))
        finally:
            worker.close()
    assert returns[1] - returns[0] > 0.01  # the episode's progress (15 ticks of a ~10 s route)


def test_debug_image_planner_records_trains_and_evaluates(tmp_path: Path) -> None:
    from cosmos_robot_trainers.sft import SFTConfig, run_sft

    _, config = load_train_recipe("debug_sft_driving", [f"output.dir={json.dumps(str(tmp_path / 'run'))}"])
    assert isinstance(config, SFTConfig)
    result = run_sft(config, log=lambda _: None)
    assert result.final_dir is not None
    planner = load_policy_folder(result.final_dir)
    # AlpaSim's keys only (no privileged agent list): what `serve --alpasim-port` hands it
    assert planner.input_spec.fields.keys() == {"observation/image", "observation/ego_history", "observation/route"}
    demo = load_demonstrations(
        tmp_path / "run" / "demos", chunk_size=1, image_size=16, cameras=("image",), state_keys=("ego_history",)
    )
    assert demo.images.shape[1:] == (1, 3, 16, 16)  # the 16 x 64 camera, squeezed as serving resizes it
    results = sorted((tmp_path / "run" / "eval").rglob("results.json"))
    assert results and json.loads(results[-1].read_text())["suite"] == "driving"

    # the same checkpoint drives the suite through AlpaSim's driver (the loopback runtime, real messages)
    from cosmos_robot.driving import AlpasimLoopback
    from cosmos_robot_server.alpasim import AlpasimDriverConfig, AlpasimDriverServicer

    config_driver = AlpasimDriverConfig(camera_map={"camera_top_down": "image"}, route_length=20)
    env = DrivingEnv(tasks=["merge"], obs_mode="camera", image_size=16, max_steps=8, expert_replay=False)
    runtime = AlpasimLoopback.in_process(AlpasimDriverServicer(planner, config_driver), camera=True)
    episode = runtime.run_episode(env, seed=3, task="merge")
    assert len(episode.plans) >= 1 and all(p.shape == (20, 2) for p in episode.plans)
    # the plan the driver turned into poses is the planner's own answer for the env's observation
    obs, _ = env.reset(seed=3, options={"task": "merge"})
    direct = planner.infer(
        {
            "observation/image": obs["image"],
            "observation/ego_history": obs["ego_history"],
            "observation/route": obs["route"],
        }
    )["actions"].reshape(20, 2)
    np.testing.assert_allclose(episode.plans[0], direct, atol=2e-3)


def test_record_cli_driving_options(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cosmos_robot.cli import app

    out = tmp_path / "demos"
    args = ["record", "--suite", "driving", "--tasks", "merge", "--episodes-per-task", "1", "--num-envs", "1",
            "--vector-mode", "sync", "--no-cameras", "--expert-noise", "0.5", "--max-steps", "6", "--keep-failed",
            "--repo-id", "local/driving_cli", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    side = json.loads((out / "meta" / "cosmos_robot.json").read_text())
    assert side["config"]["cameras"] is False and side["config"]["expert_noise"] == 0.5
    features = json.loads((out / "meta" / "info.json").read_text())["features"]
    assert "observation.images.image" not in features and features["action"]["shape"] == [40]
    bad = CliRunner().invoke(app, [*args[:-2], "--out", str(tmp_path / "x"), "--suite", "libero_spatial"])
    assert bad.exit_code != 0 and "scripted experts" in bad.output
