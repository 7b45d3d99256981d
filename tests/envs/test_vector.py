"""The vector layer: sync/async agreement, partial reset, failure recovery (kill, hang, raise), clean close.

The test env lives here (workers import it by reference) and mirrors the tabletop observation: a
uint8 camera image, a float32 state vector and a Text prompt, with per-episode reset options that can
make one env hang, raise or exit inside ``step``.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import signal
import string
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from cosmos_robot_envs.vector import (
    ENV_ERROR,
    WORKER_CRASHED,
    WORKER_TIMEOUT,
    BatchedEnv,
    EnvFactory,
    Mode,
    make_vector_env,
)
from cosmos_robot_envs.vector.subproc import AsyncBatchedEnv
from cosmos_robot_envs.vector.wire import WireError, pack, unpack

IMAGE = "observation/image"
STATE = "observation/state"


class TabletopLikeEnv(gym.Env[dict[str, Any], np.ndarray]):
    """A tiny deterministic-given-seed env; reset options pick the task and inject failures."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, size: int = 8, max_steps: int = 50) -> None:
        self.observation_space = spaces.Dict(
            {
                IMAGE: spaces.Box(0, 255, (size, size, 3), np.uint8),
                STATE: spaces.Box(-np.inf, np.inf, (4,), np.float32),
                "prompt": spaces.Text(64, min_length=0, charset=string.ascii_letters + string.digits + " _-"),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._size, self._default_max = size, max_steps
        self._opts: dict[str, Any] = {}
        self._t = 0
        self._state = np.zeros(4, np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict]:
        super().reset(seed=seed)
        self._opts = dict(options or {})
        if self._opts.get("raise_in_reset"):
            raise ValueError(f"unknown task {self._opts.get('task')!r}")
        self._t = 0
        self._state = self.np_random.normal(size=4).astype(np.float32)
        return self._obs(), {"task": self._opts.get("task", "reach")}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict]:
        self._t += 1
        if self._t == self._opts.get("hang_at"):
            time.sleep(60)
        if self._t == self._opts.get("raise_at"):
            raise RuntimeError("simulated physics blow-up")
        if self._t == self._opts.get("exit_at"):
            os._exit(3)
        self._state[:2] += np.asarray(action, np.float32)
        self._state[2:] += self.np_random.normal(size=2).astype(np.float32) * 0.1
        reward = -float(np.linalg.norm(self._state))
        terminated = self._t >= self._opts.get("max_steps", self._default_max)
        return self._obs(), reward, terminated, False, {"t": self._t, "is_success": reward > -0.5}

    def _obs(self) -> dict[str, Any]:
        image = self.np_random.integers(0, 256, (self._size, self._size, 3), dtype=np.uint8)
        return {IMAGE: image, STATE: self._state.copy(), "prompt": self._opts.get("task", "reach")}


def _actions(n: int, steps: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (steps, n, 2)).astype(np.float32)


def _rollout(venv: BatchedEnv, seeds: list[int], steps: int, options: Any = None) -> list[Any]:
    trace: list[Any] = [venv.reset(seeds=seeds, options=options)[0]]
    for act in _actions(venv.num_envs, steps):
        obs, rew, term, trunc, _ = venv.step(act)
        trace.append((obs, rew, term, trunc))
    return trace


def _pids(venv: BatchedEnv) -> list[int | None]:
    assert isinstance(venv, AsyncBatchedEnv)
    return venv.pids


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (tuple, list)) and not (a and isinstance(a[0], str)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("env", [TabletopLikeEnv, "CartPole-v1", "Pendulum-v1"])
def test_sync_and_async_give_identical_trajectories(env: Any) -> None:
    """Same seeds, same actions: bit-identical observations, rewards and flags, through episode ends."""
    options = {"max_steps": 7} if env is TabletopLikeEnv else None
    with make_vector_env(env, 3, "sync") as sync, make_vector_env(env, 3, "async") as asyn:
        space = sync.single_action_space
        space.seed(0)
        acts = [np.stack([space.sample() for _ in range(3)]) for _ in range(25)]
        traces = []
        for venv in (sync, asyn):
            trace = [venv.reset(seeds=[3, 11, 3], options=options)[0]]
            for act in acts:
                obs, rew, term, trunc, _ = venv.step(act)
                trace.append((obs, rew, term, trunc))
                if (done := term | trunc).any():
                    trace.append(venv.reset(seeds=100, mask=done, options=options)[0])
            traces.append(trace)
        assert len(traces[0]) > 26 or env == "Pendulum-v1"  # episodes ended and were reset
        _assert_same(*traces)


def test_batched_obs_layout_matches_the_space() -> None:
    with make_vector_env(TabletopLikeEnv, 2, "async") as venv:
        obs, infos = venv.reset(seeds=0, options=[{"task": "push"}, {"task": "stack blocks"}])
        assert obs[IMAGE].shape == (2, 8, 8, 3) and obs[IMAGE].dtype == np.uint8
        assert obs[STATE].shape == (2, 4) and obs[STATE].dtype == np.float32
        assert obs["prompt"] == ["push", "stack blocks"]
        assert [i["task"] for i in infos] == ["push", "stack blocks"]
        obs2, *_ = venv.step(np.zeros((2, 2), np.float32))
        assert not np.shares_memory(obs[IMAGE], obs2[IMAGE])  # batches are copies, not shm views
        assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.DISABLED


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_partial_reset_with_per_env_seeds_and_options(mode: Mode) -> None:
    ref_acts = _actions(3, 4)
    with make_vector_env(TabletopLikeEnv, 3, mode) as venv, make_vector_env(TabletopLikeEnv, 3, "sync") as ref:
        venv.reset(seeds=[1, 2, 3])
        ref.reset(seeds=[1, 2, 3])
        for act in ref_acts[:2]:
            venv.step(act)
            ref.step(act)
        obs, infos = venv.reset(seeds=[42], options=[{"task": "open drawer"}], mask=np.array([False, True, False]))
        assert obs["prompt"] == ["reach", "open drawer", "reach"]
        assert infos[0] == {} and infos[2] == {} and infos[1]["task"] == "open drawer"
        # env 1 restarted exactly like a fresh env reset with seed 42 and the same options
        with make_vector_env(TabletopLikeEnv, 1, "sync") as fresh:
            fresh_obs, _ = fresh.reset(seeds=[42], options={"task": "open drawer"})
        np.testing.assert_array_equal(obs[STATE][1], fresh_obs[STATE][0])
        np.testing.assert_array_equal(obs[IMAGE][1], fresh_obs[IMAGE][0])
        # envs 0 and 2 kept their episodes as if nothing happened
        for act in ref_acts[2:]:
            got = venv.step(act)
            want = ref.step(act)
            for k in (0, 2):
                np.testing.assert_array_equal(got[0][STATE][k], want[0][STATE][k])
                assert got[1][k] == want[1][k]


def test_finished_episode_returns_final_obs_and_must_be_reset() -> None:
    with make_vector_env(TabletopLikeEnv, 2, "sync") as venv:
        venv.reset(seeds=0, options=[{"max_steps": 2}, {"max_steps": 5}])
        venv.step(np.zeros((2, 2), np.float32))
        obs, _, term, trunc, infos = venv.step(np.zeros((2, 2), np.float32))
        assert term.tolist() == [True, False] and not trunc.any()
        assert infos[0]["t"] == 2  # the final info, not a reset's
        assert venv.needs_reset.tolist() == [True, False]
        with pytest.raises(RuntimeError, match=r"env 0: its episode ended \(terminated\)"):
            venv.step(np.zeros((2, 2), np.float32))
        # the unfinished env keeps stepping on its own; the finished one repeats its final observation
        obs2, rew, *_ = venv.step(np.zeros((2, 2), np.float32), mask=np.array([False, True]))
        np.testing.assert_array_equal(obs2[STATE][0], obs[STATE][0])
        assert rew[0] == 0.0
        venv.reset(seeds=[9], mask=np.array([True, False]))
        assert not venv.needs_reset.any()


def test_killed_worker_is_replaced_and_its_episode_truncated() -> None:
    acts = _actions(3, 4)
    with make_vector_env(TabletopLikeEnv, 3, "async") as venv, make_vector_env(TabletopLikeEnv, 3, "sync") as ref:
        venv.reset(seeds=[1, 2, 3])
        ref.reset(seeds=[1, 2, 3])
        prev, *_ = venv.step(acts[0])
        ref.step(acts[0])
        victim = _pids(venv)[1]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        obs, rew, term, trunc, infos = venv.step(acts[1])
        want = ref.step(acts[1])
        assert trunc.tolist() == [False, True, False]
        assert infos[1]["truncated_reason"] == WORKER_CRASHED
        assert "SIGKILL" in infos[1]["worker_error"]
        np.testing.assert_array_equal(obs[STATE][1], prev[STATE][1])  # the last good observation
        for k in (0, 2):  # the others lost nothing
            np.testing.assert_array_equal(obs[STATE][k], want[0][STATE][k])
        assert _pids(venv)[1] != victim
        obs, _ = venv.reset(seeds=[7], mask=np.array([False, True, False]))
        obs, rew, term, trunc, infos = venv.step(acts[2])
        assert not trunc.any() and all("worker_error" not in i for i in infos)


def test_hung_worker_times_out_and_is_replaced() -> None:
    with make_vector_env(TabletopLikeEnv, 2, "async", step_timeout=0.5) as venv:
        venv.reset(seeds=0, options=[{"hang_at": 2}, {}])
        venv.step(np.zeros((2, 2), np.float32))
        start = time.monotonic()
        _, _, _, trunc, infos = venv.step(np.zeros((2, 2), np.float32))
        assert time.monotonic() - start < 3.0
        assert trunc.tolist() == [True, False]
        assert infos[0]["truncated_reason"] == WORKER_TIMEOUT and "0.5 s" in infos[0]["worker_error"]
        assert infos[1]["t"] == 2
        venv.reset(seeds=[5], mask=np.array([True, False]))  # waits for the replacement to start
        _, _, _, trunc, _ = venv.step(np.zeros((2, 2), np.float32))
        assert not trunc.any()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_env_raising_in_step_is_reported(mode: Mode) -> None:
    with make_vector_env(TabletopLikeEnv, 2, mode) as venv:
        venv.reset(seeds=0, options=[{}, {"raise_at": 1}])
        _, _, term, trunc, infos = venv.step(np.zeros((2, 2), np.float32))
        assert trunc.tolist() == [False, True] and not term.any()
        assert infos[1]["truncated_reason"] == ENV_ERROR
        assert "RuntimeError: simulated physics blow-up" in infos[1]["worker_error"]
        venv.reset(seeds=[1], mask=np.array([False, True]))
        _, _, _, trunc, _ = venv.step(np.zeros((2, 2), np.float32))
        assert not trunc.any()


def test_worker_exiting_in_step_is_reported() -> None:
    with make_vector_env(TabletopLikeEnv, 2, "async") as venv:
        venv.reset(seeds=0, options=[{"exit_at": 1}, {}])
        _, _, _, trunc, infos = venv.step(np.zeros((2, 2), np.float32))
        assert trunc.tolist() == [True, False]
        assert infos[0]["truncated_reason"] == WORKER_CRASHED and "exit code 3" in infos[0]["worker_error"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failed_reset_is_reported_and_blocks_stepping(mode: Mode) -> None:
    with make_vector_env(TabletopLikeEnv, 2, mode) as venv:
        _, infos = venv.reset(seeds=0, options=[{}, {"task": "bogus", "raise_in_reset": True}])
        assert infos[1]["truncated_reason"] == ENV_ERROR and "unknown task 'bogus'" in infos[1]["worker_error"]
        assert venv.needs_reset.tolist() == [False, True]
        with pytest.raises(RuntimeError, match=r"env 1: its last reset failed \(env_error\)"):
            venv.step(np.zeros((2, 2), np.float32))
        venv.step(np.zeros((2, 2), np.float32), mask=np.array([True, False]))


def test_close_leaves_no_child_processes() -> None:
    venv = make_vector_env(TabletopLikeEnv, 2, "async")
    venv.reset(seeds=0)
    first = _pids(venv)[0]
    assert first is not None
    os.kill(first, signal.SIGKILL)
    venv.step(np.zeros((2, 2), np.float32))  # env 0 is replaced
    pids = [p for p in [first, *_pids(venv)] if p is not None]
    venv.close()
    venv.close()  # idempotent
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not [p for p in mp.active_children() if p.pid in pids]
    with pytest.raises(RuntimeError, match="closed"):
        venv.reset()


def test_errors_name_the_problem() -> None:
    with make_vector_env(TabletopLikeEnv, 2, "sync") as venv:
        venv.reset(seeds=0)
        with pytest.raises(ValueError, match=r"expected \(2, 2\)"):
            venv.step(np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError, match="mask must be a bool array of shape"):
            venv.step(np.zeros((2, 2), np.float32), mask=[1, 0])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="seeds has 3 entries"):
            venv.reset(seeds=[1, 2, 3])
        with pytest.raises(TypeError, match="options: env 0"):
            venv.reset(options=["not a dict", None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not a lambda"):
        make_vector_env(lambda: TabletopLikeEnv(), 1, "async", start_method="spawn")
    with pytest.raises(ValueError, match="num_envs is required"):
        make_vector_env("CartPole-v1")


def test_tabletop_env_runs_sync_and_async_identically() -> None:
    importlib.import_module("cosmos_robot_envs.tabletop")  # registers CosmosRobot/* ids
    seeds, env_id = [0, 1], "CosmosRobot/Reach-v0"
    with make_vector_env(env_id, 2, "sync") as sync, make_vector_env(env_id, 2, "async") as asyn:
        sync.single_action_space.seed(0)
        acts = [np.stack([sync.single_action_space.sample() for _ in range(2)]) for _ in range(3)]
        traces = []
        for venv in (sync, asyn):
            trace = [venv.reset(seeds=seeds)[0]]
            trace += [venv.step(a)[:4] for a in acts]
            traces.append(trace)
        _assert_same(*traces)
        obs = traces[1][0]
        assert isinstance(obs["prompt"], list) and all(isinstance(p, str) for p in obs["prompt"])


def test_spawn_start_method_recovers_too() -> None:
    with make_vector_env(TabletopLikeEnv, 2, "async", start_method="spawn") as venv:
        venv.reset(seeds=0)
        victim = _pids(venv)[0]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _, _, _, trunc, infos = venv.step(np.zeros((2, 2), np.float32))
        assert trunc.tolist() == [True, False] and infos[0]["truncated_reason"] == WORKER_CRASHED
        venv.reset(seeds=[1], mask=np.array([True, False]))
        _, _, _, trunc, _ = venv.step(np.zeros((2, 2), np.float32))
        assert not trunc.any()


def test_worker_wire_round_trips_numpy_and_refuses_what_pickle_would_need() -> None:
    """The parent<->worker messages: arrays and numpy scalars keep dtype, shape and type; nothing
    that would need pickle (objects, object arrays) is sent, and a forged header is refused."""
    msg = {
        "f4": np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2],  # non-contiguous
        "u8": np.zeros((0, 3), np.uint8),
        "zero_d": np.array(2.5),
        "flag": np.bool_(True),
        "n": np.int16(-3),
        "text": ["a", "b"],
    }
    out = unpack(pack(msg))
    for key, value in msg.items():
        assert type(out[key]) is type(value), key
        np.testing.assert_array_equal(out[key], value)
    assert out["f4"].dtype == np.float32 and out["f4"].flags.writeable
    for bad in (object(), np.array([None]), np.array([1j])):
        with pytest.raises(WireError, match="cannot send|cannot be sent"):
            pack({"x": bad})
    forged = pack({"x": np.zeros(4, np.float32)}).replace(b"\x04\x00\x00\x00\x00\x00\x00\x00", b"\x09" + b"\x00" * 7)
    with pytest.raises(WireError, match="does not fit shape"):
        unpack(forged)


def _other_python() -> str:
    """Another venv's interpreter (the Python 3.10 one `make test` builds), else this one."""
    other = os.path.join(os.path.dirname(__file__), "..", "..", ".venv-py310", "bin", "python")
    return os.path.abspath(other) if os.path.exists(other) else sys.executable


def test_envs_under_another_interpreter_match_and_recover() -> None:
    """EnvFactory(python=...) starts workers with `python -m` in that venv: same results, same recovery."""
    factory = EnvFactory("CosmosRobot/Reach-v0", {"image_size": 16}, python=_other_python())
    importlib.import_module("cosmos_robot_envs.tabletop")
    with (
        make_vector_env([factory] * 2, mode="async") as ext,
        make_vector_env("CosmosRobot/Reach-v0", 2, "sync", env_kwargs={"image_size": 16}) as ref,
    ):
        ref.single_action_space.seed(0)
        acts = [np.stack([ref.single_action_space.sample() for _ in range(2)]) for _ in range(3)]
        traces = []
        for venv in (ref, ext):
            trace = [venv.reset(seeds=[3, 4])[0]]
            trace += [venv.step(a)[:4] for a in acts]
            traces.append(trace)
        _assert_same(*traces)
        victim = _pids(ext)[0]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        obs, _, _, trunc, infos = ext.step(acts[0])
        assert trunc.tolist() == [True, False] and infos[0]["truncated_reason"] == WORKER_CRASHED
        assert _pids(ext)[0] != victim
        obs, _ = ext.reset(seeds=[3], mask=np.array([True, False]))
        np.testing.assert_array_equal(obs["state"][0], traces[0][0]["state"][0])  # the shared memory survived
        _, _, _, trunc, _ = ext.step(acts[1])
        assert not trunc.any()
        pids = [p for p in _pids(ext) if p is not None]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_another_interpreter_needs_the_async_mode() -> None:
    factory = EnvFactory("CosmosRobot/Reach-v0", {}, python=sys.executable)
    with pytest.raises(ValueError, match="only mode='async' supports"):
        make_vector_env([factory], mode="sync")
    with pytest.raises(FileNotFoundError, match="is not an executable file"):
        make_vector_env([EnvFactory("CosmosRobot/Reach-v0", {}, python="/nonexistent/python")], mode="async")
