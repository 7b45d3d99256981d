"""GR00T's layouts (flat video.* / state.* / annotation.*; N1.6's nested groups) in front of any policy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from cosmos_robot.policies.groot_layout import LAYOUTS, Gr00tLayoutPolicy
from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_client.spec import ObservationError
from tests.cli.test_cli import read_ready_line
from tests.policies._pi05_helpers import libero_obs, tiny_pi05


def flat(b: int | None, seed: int = 0) -> dict:
    """A GR00T LIBERO sim request for ``b`` envs (None: N1.5's unbatched format)."""
    obs = [libero_obs(seed + i) for i in range(b or 1)]
    lead = (lambda x: np.stack(x)) if b else (lambda x: x[0])
    req = {
        "video.image": lead([o["observation/image"][None] for o in obs]),
        "video.wrist_image": lead([o["observation/wrist_image"][None] for o in obs]),
        "annotation.human.action.task_description": [o["prompt"] for o in obs],
    }
    names = ["x", "y", "z", "roll", "pitch", "yaw"]
    for j, name in enumerate(names):
        req[f"state.{name}"] = lead([o["observation/state"][None, j : j + 1] for o in obs])
    req["state.gripper"] = lead([o["observation/state"][None, 6:8] for o in obs])
    return req


@pytest.fixture(scope="module")
def wrapped() -> Gr00tLayoutPolicy:
    return Gr00tLayoutPolicy(tiny_pi05(seed=4), LAYOUTS["libero"])


def test_batched_request_equals_the_inner_policy_per_env(wrapped: Gr00tLayoutPolicy) -> None:
    (reply,) = wrapped.infer_batch([flat(3)])
    assert sorted(reply) == sorted(k for k, _ in LAYOUTS["libero"].action)
    assert reply["action.x"].shape == (3, 5, 1) and reply["action.gripper"].dtype == np.float32
    for i in range(3):
        ref = wrapped.inner.infer(libero_obs(i))["actions"]
        got = np.concatenate([reply[k][i] for k, _ in LAYOUTS["libero"].action], axis=-1)
        np.testing.assert_allclose(got, ref, atol=1e-5)


def test_example_observation_is_the_inner_policys(wrapped: Gr00tLayoutPolicy) -> None:
    example = wrapped.example_observation()
    assert example is not None and wrapped.infer(example)["actions"].shape[-1] == 7


def test_unbatched_n15_request_and_plain_requests_pass(wrapped: Gr00tLayoutPolicy) -> None:
    single, plain = wrapped.infer_batch([flat(None, seed=7), libero_obs(7)])
    assert single["action.x"].shape == (5, 1)
    got = np.concatenate([single[k] for k, _ in LAYOUTS["libero"].action], axis=-1)
    np.testing.assert_allclose(got, plain["actions"], atol=1e-5)


def test_bad_flat_requests_name_the_key(wrapped: Gr00tLayoutPolicy) -> None:
    req = flat(2)
    del req["state.gripper"]
    with pytest.raises(ObservationError, match="state.gripper"):
        wrapped.infer_batch([req])
    req = flat(2)
    req["annotation.human.action.task_description"] = ["a", "b", "c"]
    with pytest.raises(ObservationError, match="3 instructions for a batch of 2"):
        wrapped.infer_batch([req])
    assert wrapped.metadata["modality_config"]["action"]["modality_keys"][-1] == "gripper"


def test_serve_groot_layout_over_zmq(tmp_path: Path) -> None:
    """`serve --ckpt pi05 --groot-layout libero --transport zmq` answers a GR00T N1.6 client's batched request."""
    from cosmos_robot_client.zmq_client_policy import ZmqClientPolicy

    folder = tiny_pi05(seed=4).save_pretrained(tmp_path / "pi05")
    cmd = [sys.executable, "-m", "cosmos_robot.cli", "serve", "--ckpt", str(folder), "--transport", "zmq",
           "--zmq-port", "0", "--groot-layout", "libero"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        ports = read_ready_line(proc)
        client = ZmqClientPolicy("127.0.0.1", ports["zmq"], protocol="n1.6")
        action = client.infer(flat(2))
        assert action["action.x"].shape == (2, 5, 1) and action["action.gripper"].shape == (2, 5, 1)
        config = client.get_modality_config()
        assert json.dumps(config)  # msgpack-decoded tables
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


class EchoStatePolicy(BatchPolicy):
    """Answers each env's state repeated over 16 rows, so the reply's columns show where each group went."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def infer_batch(self, obs_batch: Sequence[dict]) -> list[dict]:
        self.seen.extend(obs_batch)
        return [{"actions": np.tile(o["observation/state"], (16, 1))} for o in obs_batch]


def so100_client_obs(arm: list[float], gripper: float, text: str) -> dict:
    """What GR00T N1.6's SO100 example (``So100Adapter.obs_to_policy_inputs``) sends: nested groups,
    then a (B=1, T=1) axis added twice to every array and around the instruction."""
    frame = np.full((32, 48, 3), 7, np.uint8)
    obs = {
        "video": {"front": frame, "wrist": frame + 1},
        "state": {"single_arm": np.asarray(arm, np.float32), "gripper": np.asarray([gripper], np.float32)},
        "language": {"annotation.human.task_description": text},
    }
    for _ in range(2):
        for group in obs.values():
            for key, value in group.items():
                group[key] = value[np.newaxis] if isinstance(value, np.ndarray) else [value]
    return obs


def test_nested_n16_request_maps_to_inner_keys_and_back() -> None:
    inner = EchoStatePolicy()
    policy = Gr00tLayoutPolicy(inner, LAYOUTS["so100"])
    a, b = so100_client_obs([1, 2, 3, 4, 5], 6, "grab"), so100_client_obs([7, 8, 9, 10, 11], 12, "drop")
    pair = {g: {k: np.concatenate([a[g][k], b[g][k]]) for k in a[g]} for g in ("video", "state")}
    pair["language"] = {"annotation.human.task_description": [["grab"], ["drop"]]}
    (reply,) = policy.infer_batch([pair])
    assert sorted(reply) == ["gripper", "single_arm"]  # no "action." prefix in N1.6's nested reply
    assert reply["single_arm"].shape == (2, 16, 5) and reply["gripper"].shape == (2, 16, 1)
    np.testing.assert_array_equal(reply["single_arm"][1][3], [7, 8, 9, 10, 11])
    assert [o["prompt"] for o in inner.seen] == ["grab", "drop"]
    assert inner.seen[1]["observation/wrist_image"].shape == (32, 48, 3)
    config = policy.metadata["modality_config"]
    assert config["language"]["modality_keys"] == ["annotation.human.task_description"]
    assert config["video"]["modality_keys"] == ["front", "wrist"]


def test_bad_nested_requests_name_the_key() -> None:
    policy = Gr00tLayoutPolicy(EchoStatePolicy(), LAYOUTS["so100"])
    req = so100_client_obs([0] * 5, 0, "x")
    req["video"]["front"] = req["video"]["front"][0]  # (T, H, W, 3): the batch axis is missing
    with pytest.raises(ObservationError, match=r"video.front.*\(B, T, H, W, 3\)"):
        policy.infer_batch([req])
    req = so100_client_obs([0] * 5, 0, "x")
    del req["state"]["gripper"]
    with pytest.raises(ObservationError, match="state.gripper"):
        policy.infer_batch([req])
    req = so100_client_obs([0] * 5, 0, "x")
    req["language"] = "x"
    with pytest.raises(ObservationError, match="language.*needs a map"):
        policy.infer_batch([req])


def test_so100_example_client_over_zmq() -> None:
    """GR00T N1.6's SO100 example against our ZMQ port: ``PolicyClient.get_action`` sends
    ``{"observation", "options"}``, reads ``(action, info)``; the example reads ``chunk[group][0][t]``.
    ``PolicyClient`` is reproduced by ``Gr00tN16ClientDouble`` (tests/policy_server/test_peer_compat.py)."""
    from cosmos_robot_server import PolicyServer, ServerConfig
    from tests.policy_server.test_peer_compat import Gr00tN16ClientDouble

    policy = Gr00tLayoutPolicy(EchoStatePolicy(), LAYOUTS["so100"])
    cfg = ServerConfig(port=0, zmq_port=0, transports=("zmq",))
    server = PolicyServer(policy, cfg).start_in_thread()
    client = Gr00tN16ClientDouble(server.ports["zmq"])
    try:
        chunk, info = client.get_action(so100_client_obs([1, 2, 3, 4, 5], 6, "pick"))
        horizon = chunk[next(iter(chunk))].shape[1]
        rows = [np.concatenate([chunk["single_arm"][0][t], chunk["gripper"][0][t]]) for t in range(horizon)]
        assert horizon == 16 and all(list(r) == [1, 2, 3, 4, 5, 6] for r in rows)
        assert "server_timing" in info
        assert client.get_modality_config()["state"].modality_keys == ["single_arm", "gripper"]
    finally:
        client.close()
        server.stop()
