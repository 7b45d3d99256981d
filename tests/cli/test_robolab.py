"""RoboLab at its protocol: its cosmos3 and pi05 clients, unchanged, against checkpoints served like `serve --ckpt`.

RoboLab needs Isaac Sim, so ``robolab_double.py`` (a TEST DOUBLE written from RoboLab's documented
``InferenceClient`` interface, run in .venv-openpi with the real openpi-client) sends exactly what
RoboLab's ``Cosmos3Client`` and ``Pi0DroidJointposClient`` send. The servers are tiny real
checkpoints loaded by ``cosmos_robot.policies.load_policy_folder`` behind ``PolicyServer``, the path
``cosmos-robot serve --ckpt`` takes. The tiny cosmos3 model takes about 2 s per call on a CPU, so
it runs once; the other cosmos3 tests swap its sampler for a recorder (``recording``), which keeps
every transform at the edge real (key checks, canvas, state row, gripper flip) and shows what the
model would have been given.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosmos_robot.policies import load_policy_folder
from cosmos_robot_client.robolab import CosmosRobotRoboLabClient
from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from tests.helpers import openpi_python

DOUBLE = Path(__file__).with_name("robolab_double.py")
FAST_COSMOS3 = {"resolution_tier": 256, "num_steps": 1, "guidance": 1.0}  # sampling settings; layout unchanged
DROID_PROPRIO = {  # what both RoboLab clients send besides their camera images
    "observation/joint_position": {"shape": [7], "dtype": "float32"},
    "observation/gripper_position": {"shape": [1], "dtype": "float32"},
    "prompt": "str",
}


def run_double(server: PolicyServer, *args: str) -> tuple[dict[str, Any], int]:
    """The double's JSON summary against ``server``, and how many requests the server answered meanwhile."""
    before = request_count(server)
    out = subprocess.run([str(openpi_python()), str(DOUBLE), str(server.ports["ws"]), *args], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), request_count(server) - before


def request_count(server: PolicyServer) -> int:
    """Requests (websocket messages) answered: the request-latency histogram's count."""
    for line in server.metrics.render().splitlines():
        if line.startswith('cosmos_robot_request_latency_seconds_count{transport="ws"}'):
            return int(line.split()[-1])
    return 0


@pytest.fixture(scope="module")
def cosmos3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, PolicyServer]]:
    from cosmos_robot.policies.cosmos3.tiny import build_tiny_cosmos3

    folder = build_tiny_cosmos3(tmp_path_factory.mktemp("c3") / "droid", "droid", FAST_COSMOS3)
    policy = load_policy_folder(folder, device="cpu")
    server = PolicyServer(policy, ServerConfig(port=0)).start_in_thread()
    yield policy, server
    server.stop()


@pytest.fixture(scope="module")
def pi05(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, PolicyServer]]:
    """A LeRobot pi05 folder with DROID cameras, 8-D state (7 joints + gripper) and 8-D joint-position actions."""
    from cosmos_robot.policies.pi05.tiny import build_tiny_pi05

    cams = ("exterior_image_1_left", "wrist_image_left")
    tiny = build_tiny_pi05(seed=2, chunk=16, n_action_steps=15, state_dim=8, action_dim=8, cameras=cams)
    policy = load_policy_folder(tiny.save_pretrained(tmp_path_factory.mktemp("pi05") / "droid"), device="cpu")
    server = PolicyServer(policy, ServerConfig(port=0)).start_in_thread()
    yield policy, server
    server.stop()


class Recorder:
    """Stands in for ``Cosmos3Sampler``: records the model inputs, returns the state row as every action row."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def sample(self, image: np.ndarray, prompt: str, s: Any, state: np.ndarray, seed: int) -> tuple[np.ndarray, dict]:
        self.calls.append({"image": image.shape, "dtype": str(image.dtype), "state": state.copy(), "prompt": prompt})
        return np.tile(state, (s.chunk, 1)).astype(np.float32), {}


@contextlib.contextmanager
def recording(policy: Any) -> Iterator[Recorder]:
    real, policy.sampler = policy.sampler, Recorder()
    try:
        yield policy.sampler
    finally:
        policy.sampler = real


def test_robolab_cosmos3_client_unchanged_real_model(cosmos3: tuple[Any, PolicyServer]) -> None:
    """RoboLab's Cosmos3Client: 540x640 canvas in, ``action`` (32, 8) out, 3 steps executed from one chunk."""
    _, server = cosmos3
    got, answered = run_double(server, "cosmos3", "--num-envs", "1", "--steps", "3")
    assert got["request"] == {"observation/image": {"shape": [540, 640, 3], "dtype": "uint8"}, **DROID_PROPRIO}
    assert got["requests"] == 1 and answered == 1
    assert "action" in got["reply_keys"] and "actions" in got["reply_keys"]
    assert got["chunk"] == {"shape": [32, 8], "dtype": "float32"} and got["finite"]
    executed, chunk = np.asarray(got["executed"]), np.asarray(got["first_chunk"])
    np.testing.assert_allclose(executed[:, 0, :7], chunk[:3, :7], rtol=1e-6)
    assert set(np.unique(executed[:, 0, 7])) <= {0.0, 1.0}  # binarised by the client, as RoboLab does
    meta = got["metadata"]  # what the server announces on connect
    assert meta["action_horizon"] == 32 and meta["action_dim"] == 8 and meta["action_space"] == "joint_position"
    assert meta["observation_layouts"]["canvas"][0] == "observation/image" and meta["canvas_resolution"] == [540, 640]
    assert meta["action_keys"] == ["actions", "action"] and "gripper_convention" in meta
    assert meta["input_spec"]["observation/gripper_position"]["alt_shapes"] == [[], [None, 1]]


def test_cosmos3_gripper_convention_at_the_boundary(cosmos3: tuple[Any, PolicyServer]) -> None:
    """g (0 open .. 1 closed) in; the model sees 1 - g in its state row; the reply's last column is g again."""
    policy, server = cosmos3
    with recording(policy) as rec:
        got, _ = run_double(server, "cosmos3", "--num-envs", "2", "--steps", "1")
    sent = np.asarray(got["first_chunk"])  # the recorder echoes the state row, so the reply reveals the mapping
    assert [c["image"] for c in rec.calls] == [(540, 640, 3)] * 2
    state = rec.calls[0]["state"]
    g = 1.0 - state[7]  # what the client sent
    np.testing.assert_allclose(sent[:, 7], g, atol=1e-6)  # flipped back on the way out
    np.testing.assert_allclose(sent[:, :7], np.tile(state[:7], (32, 1)), atol=1e-6)
    assert got["executed"][0][0][7] == float(g > 0.5)


def test_scalar_and_vector_gripper_both_accepted(
    cosmos3: tuple[Any, PolicyServer], pi05: tuple[Any, PolicyServer]
) -> None:
    """Some DROID clients send the gripper as a 0-D scalar, RoboLab as (1,): both work (openpi's DroidInputs too)."""
    c3_policy, c3_server = cosmos3
    _, p_server = pi05
    rng = np.random.default_rng(0)
    q = rng.uniform(-1, 1, 7).astype(np.float32)
    names = ("observation/exterior_image_1_left", "observation/exterior_image_2_left", "observation/wrist_image_left")
    views = {k: rng.integers(0, 256, (90, 160, 3), dtype=np.uint8) for k in names}
    with recording(c3_policy) as rec, WebsocketClientPolicy("127.0.0.1", c3_server.ports["ws"]) as client:
        for g in (np.float32(0.75), np.array([0.75], np.float32), 0.75):
            obs = {**views, "observation/joint_position": q, "observation/gripper_position": g, "prompt": "x"}
            assert client.infer(obs)["actions"].shape == (32, 8)
    assert [float(c["state"][7]) for c in rec.calls] == [0.25] * 3
    with WebsocketClientPolicy("127.0.0.1", p_server.ports["ws"]) as client:
        obs = {"observation/exterior_image_1_left": views["observation/exterior_image_1_left"],
               "observation/wrist_image_left": views["observation/wrist_image_left"],
               "observation/joint_position": q, "prompt": "x"}  # fmt: skip
        a = client.infer({**obs, "observation/gripper_position": np.float32(0.75)})["actions"]
        b = client.infer({**obs, "observation/gripper_position": np.array([0.75], np.float32)})["actions"]
    assert a.shape == (15, 8)
    np.testing.assert_array_equal(a, b)


def test_robolab_pi05_client_unchanged(pi05: tuple[Any, PolicyServer]) -> None:
    """RoboLab's Pi0DroidJointposClient (pi05): 224x224 views + joints + gripper in, ``actions`` (15, 8) out."""
    _, server = pi05
    got, answered = run_double(server, "pi05", "--num-envs", "2", "--steps", "16")
    assert got["request"] == {
        "observation/exterior_image_1_left": {"shape": [224, 224, 3], "dtype": "uint8"},
        "observation/wrist_image_left": {"shape": [224, 224, 3], "dtype": "uint8"},
        **DROID_PROPRIO,
    }
    assert got["chunk"] == {"shape": [15, 8], "dtype": "float32"} and got["finite"]
    # RoboLab's serial loop: 2 envs x 2 replans (steps 0 and 15) = 4 requests
    assert got["requests"] == 4 and answered == 4
    meta = got["metadata"]
    assert meta["action_horizon"] == 15 and meta["action_dim"] == 8
    assert meta["state_from"] == {"observation.state": ["observation/joint_position", "observation/gripper_position"]}


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        (("--drop", "observation/joint_position"), "observation/joint_position"),
        (("--drop", "observation/image"), "observation/exterior_image_1_left"),
        (("--reshape", "observation/joint_position:6"), "observation/joint_position: expected shape (7,), got (6,)"),
        (("--reshape", "observation/gripper_position:2x2"), "observation/gripper_position: expected shape"),
        (("--reshape", "observation/wrist_image_left:90x160x3"), "observation/wrist_image_left: mixes two layouts"),
    ],
)
def test_bad_robolab_requests_name_the_key(
    cosmos3: tuple[Any, PolicyServer], edit: tuple[str, str], names: str
) -> None:
    """A misconfigured client gets an error naming the key (openpi's client raises it), before any model work."""
    policy, server = cosmos3
    with recording(policy) as rec:
        got, _ = run_double(server, "probe", *edit)
    assert names in got.get("error", ""), got
    assert rec.calls == []


def test_pi05_bad_requests_name_the_key(pi05: tuple[Any, PolicyServer]) -> None:
    _, server = pi05
    rng = np.random.default_rng(1)
    obs = {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": np.zeros(7, np.float32),
        "observation/gripper_position": np.zeros(1, np.float32),
        "prompt": "x",
    }
    cases = [
        ({k: v for k, v in obs.items() if k != "observation/wrist_image_left"}, "observation/wrist_image_left"),
        ({k: v for k, v in obs.items() if k != "observation/gripper_position"}, "observation/gripper_position"),
        ({**obs, "observation/joint_position": np.zeros(6, np.float32)}, "observation/joint_position"),
    ]
    for bad, key in cases:
        with WebsocketClientPolicy("127.0.0.1", server.ports["ws"]) as client:
            with pytest.raises(RuntimeError, match=key):
                client.infer(bad)


def test_batched_adapter_against_cosmos3(cosmos3: tuple[Any, PolicyServer]) -> None:
    """Our RoboLab client over 3 envs: the three views at 360x640, ONE request, a (32, 8) chunk per env."""
    policy, server = cosmos3
    rng = np.random.default_rng(2)
    n = 3
    raw: dict[str, dict[str, np.ndarray]] = {
        "image_obs": {c: rng.integers(0, 256, (n, 720, 1280, 3), dtype=np.uint8)
                      for c in ("over_shoulder_left_camera", "over_shoulder_right_camera", "wrist_cam")},
        "proprio_obs": {"arm_joint_pos": rng.uniform(-1, 1, (n, 7)).astype(np.float32),
                        "gripper_pos": np.array([[0.1], [0.9], [0.6]], np.float32)},
    }  # fmt: skip
    before = request_count(server)
    client = CosmosRobotRoboLabClient("127.0.0.1", server.ports["ws"])
    try:
        assert client.open_loop_horizon == 32 and client.image_size == (360, 640)
        assert client.keys == (
            "observation/exterior_image_1_left", "observation/exterior_image_2_left", "observation/wrist_image_left",
            "observation/joint_position", "observation/gripper_position",
        )  # fmt: skip
        with recording(policy) as rec:
            out = client.infer_batch(raw, "put the banana in the bowl", env_ids=[0, 1, 2])
            for _ in range(31):
                client.infer_batch(raw, "put the banana in the bowl", env_ids=[0, 1, 2])
        assert request_count(server) - before == 1 and client.requests_sent == 1
        assert [c["image"] for c in rec.calls] == [(540, 640, 3)] * n
        for e in range(n):
            assert out[e]["action"].shape == (8,)
            np.testing.assert_allclose(out[e]["action"][:7], raw["proprio_obs"]["arm_joint_pos"][e], atol=1e-6)
        assert [out[e]["action"][7] for e in range(n)] == [0.0, 1.0, 1.0]
    finally:
        client.close()
