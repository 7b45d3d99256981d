"""LIBERO: the env in its own venv (through the vector layer), the suite catalog, eval, action conventions.

The env tests run the real LIBERO (hf-libero 0.1.4, robosuite 1.4.0, mujoco 3.8.1, the official
assets) headless in ``.venv-libero``, with small images; they skip when that venv is missing unless
``COSMOS_ROBOT_REQUIRE_LIBERO=1`` (``make test`` sets it).
"""

from __future__ import annotations

import json
import math
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cosmos_robot_client.libero_actions import (
    CosmosFrameworkLiberoActions,
    OpenpiLiberoActions,
    axis_angle_to_matrix,
    matrix_to_axis_angle,
    matrix_to_rot6d,
    rot6d_to_matrix,
)
from cosmos_robot_envs.libero.state import libero_state, quat_xyzw_to_axis_angle
from tests.helpers import libero_python

SPATIAL_0 = "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"


def _rotvecs(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    axis = rng.normal(size=(n, 3))
    axis /= np.linalg.norm(axis, axis=1, keepdims=True)
    angle = rng.uniform(0.0, math.pi - 1e-3, size=(n, 1))
    angle[:3] = [[0.0], [1e-9], [math.pi - 1e-6]]  # identity, tiny, near half a turn
    return axis * angle


def _commands(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.uniform(-1, 1, (n, 3)), _rotvecs(n, seed), rng.uniform(-1, 1, (n, 1))], axis=1)


# --- state and rotations (numpy only) -------------------------------------------------------------
def test_state_is_position_axis_angle_and_fingers() -> None:
    s = math.sin(math.pi / 4)
    state = libero_state(np.array([0.1, 0.2, 0.3]), np.array([0.0, 0.0, s, s]), np.array([0.04, -0.04]))
    assert state.dtype == np.float32 and state.shape == (8,)
    np.testing.assert_allclose(state, [0.1, 0.2, 0.3, 0, 0, math.pi / 2, 0.04, -0.04], atol=1e-6)
    np.testing.assert_array_equal(quat_xyzw_to_axis_angle(np.array([0.0, 0.0, 0.0, 1.0])), np.zeros(3))
    # same convention as the rotation helpers (angle 2 acos(w) for w >= 0)
    v = _rotvecs(50)
    half = np.linalg.norm(v, axis=1, keepdims=True) / 2
    axis = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-300)
    quat = np.concatenate([axis * np.sin(half), np.cos(half)], axis=1)
    np.testing.assert_allclose(quat_xyzw_to_axis_angle(quat), v, atol=1e-7)


def test_rotation_helpers_invert_each_other() -> None:
    v = _rotvecs(200)
    m = axis_angle_to_matrix(v)
    np.testing.assert_allclose(m @ np.swapaxes(m, -1, -2), np.broadcast_to(np.eye(3), m.shape), atol=1e-12)
    np.testing.assert_allclose(matrix_to_axis_angle(m), v, atol=1e-9)
    np.testing.assert_allclose(rot6d_to_matrix(matrix_to_rot6d(m)), m, atol=1e-12)
    # a perturbed 6-D vector decodes to the nearest rotation (SVD), as cosmos-framework does
    noisy = rot6d_to_matrix(matrix_to_rot6d(m) + 1e-3)
    np.testing.assert_allclose(np.linalg.det(noisy), 1.0, atol=1e-12)


def test_rotation_helpers_match_scipy() -> None:
    rotation = pytest.importorskip("scipy.spatial.transform").Rotation
    v = _rotvecs(100, seed=1)
    np.testing.assert_allclose(axis_angle_to_matrix(v), rotation.from_rotvec(v).as_matrix(), atol=1e-12)
    m = rotation.random(100, random_state=2).as_matrix()
    np.testing.assert_allclose(matrix_to_axis_angle(m), rotation.from_matrix(m).as_rotvec(), atol=1e-9)


# --- action conventions ---------------------------------------------------------------------------
def test_openpi_actions_round_trip() -> None:
    conv = OpenpiLiberoActions(model_dim=32)
    cmd = _commands(10).astype(np.float32)
    rows = conv.from_env(cmd)
    assert rows.shape == (10, 32) and not rows[:, 7:].any()
    np.testing.assert_array_equal(conv.to_env(rows), cmd)
    with pytest.raises(ValueError, match=r"commands: expected shape \(H, 7\)"):
        conv.from_env(np.zeros((4, 6)))
    with pytest.raises(ValueError, match="at least 7 dims"):
        conv.to_env(np.zeros((4, 5)))
    with pytest.raises(ValueError, match="model_dim"):
        OpenpiLiberoActions(model_dim=6)


@pytest.mark.parametrize("rotation", ["3d", "6d", "9d"])
@pytest.mark.parametrize("gripper", ["zero_one", "pm_one", "pm_one_flip"])
@pytest.mark.parametrize("normalised", [False, True])
def test_cosmos_framework_actions_round_trip_both_ways(rotation: str, gripper: str, normalised: bool) -> None:
    width = {"3d": 7, "6d": 10, "9d": 13}[rotation]
    quantiles = {}
    if normalised:  # like the stats file: translation about +-0.94, rotation -1/1 (passed through), g 0/1
        lo = np.full(width, -1.0)
        hi = np.full(width, 1.0)
        lo[:3], hi[:3] = -0.94, 0.93
        lo[-1], hi[-1] = (0.0, 1.0) if gripper == "zero_one" else (-1.0, 1.0)
        quantiles = {"q01": lo, "q99": hi}
    conv = CosmosFrameworkLiberoActions(rotation=rotation, gripper=gripper, **quantiles)  # type: ignore[arg-type]
    assert CosmosFrameworkLiberoActions.for_width(width).rotation == rotation
    cmd = _commands(64)
    rows = conv.from_env(cmd)
    assert rows.shape == (64, width)
    np.testing.assert_allclose(conv.to_env(rows), cmd, atol=1e-6)  # float32 commands
    np.testing.assert_allclose(conv.from_env(conv.to_env(rows).astype(np.float64)), rows, atol=1e-6)


def test_cosmos_framework_gripper_and_rot6d_layout() -> None:
    conv = CosmosFrameworkLiberoActions()
    rows = np.zeros((3, 10))
    rows[:, 3:9] = [1, 0, 0, 0, 1, 0]  # identity: first two columns of I
    rows[:, 9] = [0.0, 0.5, 1.0]  # g: 0 = open (+1), 1 = closed (-1)
    out = conv.to_env(rows)
    np.testing.assert_allclose(out[:, 3:6], 0.0, atol=1e-12)
    np.testing.assert_allclose(out[:, 6], [1.0, 0.0, -1.0])
    with pytest.raises(ValueError, match=r"actions: expected shape \(H, 10\)"):
        conv.to_env(np.zeros((2, 7)))
    with pytest.raises(ValueError, match="rotation"):
        CosmosFrameworkLiberoActions(rotation="4d")
    with pytest.raises(ValueError, match="q01 and q99"):
        CosmosFrameworkLiberoActions(q01=np.zeros(10))
    with pytest.raises(ValueError, match=r"q01: expected shape \(10,\)"):
        CosmosFrameworkLiberoActions(q01=np.zeros(7), q99=np.ones(7))
    with pytest.raises(ValueError, match="action width 8"):
        CosmosFrameworkLiberoActions.for_width(8)


# --- the real LIBERO ------------------------------------------------------------------------------
def test_catalog_lists_the_five_suites() -> None:
    from cosmos_robot_envs.libero import libero_catalog

    catalog = libero_catalog(libero_python())
    sizes = {name: (entry["max_steps"], len(entry["tasks"])) for name, entry in catalog.items()}
    assert sizes == {
        "libero_spatial": (220, 10),
        "libero_object": (280, 10),
        "libero_goal": (300, 10),
        "libero_10": (520, 10),
        "libero_90": (400, 90),
    }
    spatial = catalog["libero_spatial"]["tasks"][0]
    assert spatial == {"name": SPATIAL_0, "language": SPATIAL_0.replace("_", " ")}
    long_0 = catalog["libero_10"]["tasks"][0]
    assert long_0["name"].startswith("LIVING_ROOM_SCENE2_")
    assert long_0["language"] == "put both the alphabet soup and the tomato sauce in the basket"


def test_suite_errors_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from cosmos_robot_envs.eval import get_suite

    monkeypatch.setenv("COSMOS_ROBOT_LIBERO_PYTHON", "/nonexistent/python")
    with pytest.raises(ValueError, match="COSMOS_ROBOT_LIBERO_PYTHON='/nonexistent/python' is not an executable"):
        get_suite("libero_goal")
    with pytest.raises(ValueError, match="unknown suite 'libero_100'"):
        get_suite("libero_100")


@pytest.mark.slow
def test_envs_run_in_the_libero_venv_through_the_vector_layer() -> None:
    from cosmos_robot_envs.libero import ENV_ID
    from cosmos_robot_envs.vector import EnvFactory, make_vector_env

    factory = EnvFactory(ENV_ID, {"suite": "libero_spatial", "image_size": 32, "max_steps": 3}, python=libero_python())
    with make_vector_env([factory] * 2, mode="async", reset_timeout=300) as venv:
        assert venv.single_action_space.shape == (7,)
        same = {"task": SPATIAL_0, "init_state": 4}
        obs, infos = venv.reset(seeds=[11, 11], options=[same, same])
        assert obs["image"].shape == (2, 32, 32, 3) and obs["image"].dtype == np.uint8
        assert obs["wrist_image"].shape == (2, 32, 32, 3) and obs["state"].shape == (2, 8)
        assert obs["prompt"] == [SPATIAL_0.replace("_", " ")] * 2
        assert infos[0]["init_state"] == 4 and infos[0]["task"] == SPATIAL_0
        # the same task, initial state and seed: the same scene, to the pixel
        np.testing.assert_array_equal(obs["image"][0], obs["image"][1])
        np.testing.assert_array_equal(obs["state"][0], obs["state"][1])
        assert 0.0 <= obs["state"][0, 6] <= 0.05 and -0.05 <= obs["state"][0, 7] <= 0.0  # fingers open
        other, _ = venv.reset(seeds=[11], options=[{"task": SPATIAL_0, "init_state": 5}], mask=np.array([True, False]))
        assert np.abs(other["state"][0] - obs["state"][1]).max() > 0 or (other["image"][0] != obs["image"][1]).any()
        down = np.tile(np.array([0, 0, -1, 0, 0, 0, -1], np.float32), (2, 1))
        for _ in range(3):
            obs, rew, term, trunc, infos = venv.step(down)
            assert not term.any() and rew.tolist() == [0.0, 0.0]
        assert trunc.tolist() == [True, True]  # max_steps=3 (the settle steps do not count)
        assert infos[0]["is_success"] is False
        bad = np.zeros((2, 7), np.float32)
        bad[0, 0] = np.nan
        venv.reset(seeds=[1, 2], options=[same, same])
        _, _, _, trunc, infos = venv.step(bad)
        assert trunc.tolist() == [True, False] and infos[0]["truncated_reason"] == "env_error"
        assert "action: expected finite values" in infos[0]["worker_error"]


@pytest.mark.slow
def test_check_env_and_input_errors_in_the_libero_venv() -> None:
    code = textwrap.dedent(
        """
        import json, warnings
        import numpy as np
        from gymnasium.utils.env_checker import check_env
        from cosmos_robot_envs.libero.env import LiberoEnv
        warnings.simplefilter("ignore")
        env = LiberoEnv("libero_object", image_size=32, settle_steps=1, cache_size=1)
        check_env(env, skip_render_check=True)
        errors = []
        for call in (lambda: env.reset(options={"task": "fly"}),
                     lambda: env.reset(options={"init_state": 50}),
                     lambda: env.reset(options={"camera": 1}),
                     lambda: env.step(np.zeros(6))):
            try:
                call()
            except ValueError as exc:
                errors.append(str(exc))
        try:
            LiberoEnv("libero_100")
        except ValueError as exc:
            errors.append(str(exc))
        print(json.dumps(errors))
        env.close()
        """
    )
    done = subprocess.run(
        [libero_python(), "-c", code], capture_output=True, text=True, timeout=600, check=False, cwd="/tmp"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(errors) == 5, errors
    assert "options['task']: 'fly'" in errors[0]
    assert "options['init_state']: 50 is out of range" in errors[1] and "has 50 states" in errors[1]
    assert "unknown key(s) ['camera']" in errors[2]
    assert "action: expected shape (7,)" in errors[3]
    assert "unknown LIBERO suite 'libero_100'" in errors[4]


def test_init_state_reader_rebuilds_numpy_pickles_without_unpickling(tmp_path: Path) -> None:
    """torch.save's zip of a pickled float64 array (numpy 1 style: the bytes as a latin-1 str)."""
    import io
    import pickle
    import zipfile

    from cosmos_robot_envs.libero.catalog import LiberoSetupError, load_init_states

    want = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    for protocol in (2, 4):
        path = tmp_path / f"p{protocol}.pruned_init"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", pickle.dumps(want, protocol=protocol))
            z.writestr("archive/version", "3\n")
        np.testing.assert_array_equal(load_init_states(path), want)
    evil = tmp_path / "evil.pruned_init"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(io.StringIO("x")))
    with pytest.raises(LiberoSetupError, match="evil.pruned_init"):
        load_init_states(evil)


@pytest.mark.slow
def test_success_comes_from_the_task_predicates() -> None:
    """Put the bowl on the plate in the simulator: the BDDL goal (on bowl plate) ends the episode, reward 1."""
    code = textwrap.dedent(
        f"""
        import json
        import numpy as np
        from cosmos_robot_envs.libero.env import LiberoEnv
        env = LiberoEnv("libero_spatial", image_size=32, cache_size=1)
        env.reset(seed=0, options={{"task": "{SPATIAL_0}", "init_state": 0}})
        _, r0, term0, _, info0 = env.step(np.zeros(7, np.float32))
        sim = env._envs["{SPATIAL_0}"].sim
        plate = sim.data.body_xpos[sim.model.body_name2id("plate_1_main")].copy()
        qpos = sim.data.get_joint_qpos("akita_black_bowl_1_joint0").copy()
        qpos[:3] = plate + np.array([0.0, 0.0, 0.04])
        sim.data.set_joint_qpos("akita_black_bowl_1_joint0", qpos)
        sim.forward()
        for step in range(1, 21):
            _, r, term, trunc, info = env.step(np.zeros(7, np.float32))
            if term or trunc:
                break
        print(json.dumps({{"before": [r0, term0, info0["is_success"]], "after": [r, term, trunc, info["is_success"]]}}))
        env.close()
        """
    )
    done = subprocess.run(
        [libero_python(), "-c", code], capture_output=True, text=True, timeout=600, check=False, cwd="/tmp"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before"] == [0.0, False, False]
    assert result["after"] == [1.0, True, False, True]
