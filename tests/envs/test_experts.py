"""The scripted experts solve every tabletop task, act like LIBERO demonstrations, and serve as a policy.

They are the SFT demonstration source and the oracle of the eval tests, so the bar is high: at least
95% success per task, actions inside the action space, and the same success when their action
chunks are executed open-loop, as a client of the policy server would.
"""

from __future__ import annotations

import numpy as np
import pytest

from cosmos_robot_envs.tabletop import TASK_NAMES, TASKS, ExpertPolicy, TabletopEnv, make_env, scripted_expert


def _run_expert(env: TabletopEnv, task: str, seed: int) -> tuple[bool, int, np.ndarray]:
    expert = scripted_expert(task)
    obs, info = env.reset(seed=seed)
    expert.reset(info)
    actions = []
    while True:
        action = expert.act(obs, info)
        actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return bool(info["is_success"]), len(actions), np.stack(actions)


@pytest.mark.parametrize("task", TASK_NAMES)
def test_expert_solves_at_least_95_percent_of_seeds_with_sensible_actions(task: str) -> None:
    env = make_env(task, obs_mode="state")
    try:
        results = [_run_expert(env, task, seed) for seed in range(20)]
    finally:
        env.close()
    successes = sum(ok for ok, _, _ in results)
    assert successes >= 19, f"{task}: {successes}/20"
    longest = max(n for ok, n, _ in results if ok)
    assert longest <= TASKS[task].max_steps // 2, f"{task}: the expert needs {longest} steps; horizon too tight"
    actions = np.concatenate([a for _, _, a in results])
    assert actions.dtype == np.float32 and np.all(np.abs(actions) <= 1.0)
    assert np.all(np.abs(actions[:, :3]) <= 0.75 + 1e-6)  # moderate LIBERO-like deltas, never saturated
    assert set(np.unique(actions[:, 6])) <= {-1.0, 1.0}  # open / close, LIBERO's sign convention


@pytest.mark.parametrize("task", TASK_NAMES)
def test_random_actions_rarely_succeed(task: str) -> None:
    env = make_env(task, obs_mode="state")
    rng = np.random.default_rng(0)
    successes = 0
    try:
        for seed in range(6):
            env.reset(seed=seed)
            while True:
                _, _, terminated, truncated, info = env.step(rng.uniform(-1, 1, 7))
                if terminated or truncated:
                    break
            successes += info["is_success"]
    finally:
        env.close()
    assert successes <= 1


def test_expert_works_in_rgb_mode_from_info() -> None:
    env = make_env("pick_place", image_size=32)  # rgb mode: object_state only in info
    try:
        ok, _, _ = _run_expert(env, "pick_place", seed=7)
    finally:
        env.close()
    assert ok
    with pytest.raises(KeyError, match="object_state"):
        scripted_expert("push").act({"state": np.zeros(8, np.float32)})
    with pytest.raises(ValueError, match=r"state: expected shape \(8,\)"):
        scripted_expert("push").act({"state": np.zeros(7), "object_state": np.zeros(15)})


@pytest.mark.parametrize("task", TASK_NAMES)
def test_expert_policy_chunks_executed_open_loop_still_succeed(task: str) -> None:
    """What a policy-server client does: send wire keys, execute the first 5 of each 10-step chunk."""
    policy = ExpertPolicy(action_horizon=10)  # one policy for all tasks: the task comes from object_state
    env = make_env(task, obs_mode="state")
    successes = 0
    try:
        for seed in range(5):
            obs, _ = env.reset(seed=100 + seed)
            policy.reset()
            done = False
            while not done:
                wire = {f"observation/{k}": v for k, v in obs.items()} | {"prompt": TASKS[task].instruction}
                policy.input_spec.validate(wire)
                chunk = policy.infer(wire)["actions"]
                assert chunk.shape == (10, 7) and chunk.dtype == np.float32 and np.all(np.abs(chunk) <= 1)
                for action in chunk[:5]:
                    obs, _, terminated, truncated, info = env.step(action)
                    done = terminated or truncated
                    if done:
                        break
            successes += info["is_success"]
    finally:
        env.close()
    assert successes == 5
    assert policy.metadata["action_horizon"] == 10 and "observation/object_state" in policy.metadata["needs"]


def test_expert_policy_validates_its_inputs() -> None:
    policy = ExpertPolicy("reach", action_horizon=3)
    state = np.zeros(8, np.float32)
    obj = np.zeros(15, np.float32)
    obj[:3] = [0.1, 0.0, 0.1]
    chunk = policy.infer({"state": state, "object_state": obj})["actions"]  # env keys work too
    assert chunk.shape == (3, 7) and chunk[0, 0] > 0  # heads for the target
    with pytest.raises(ValueError, match="one-hot task id"):
        ExpertPolicy().infer({"state": state, "object_state": obj})
    with pytest.raises(KeyError, match="object_state"):
        policy.infer({"observation/state": state, "prompt": "reach the red target"})
    with pytest.raises(ValueError, match="action_horizon"):
        ExpertPolicy(action_horizon=0)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASK_NAMES)
def test_expert_succeeds_on_100_seeds(task: str) -> None:
    env = make_env(task, obs_mode="state")
    try:
        successes = sum(_run_expert(env, task, seed)[0] for seed in range(1000, 1100))
    finally:
        env.close()
    assert successes >= 95, f"{task}: {successes}/100"
