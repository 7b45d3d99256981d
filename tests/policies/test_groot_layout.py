"""GR00T's flat layout (video.* / state.* / annotation.*, batch axis on the wire) in front of any policy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cosmos_robot.policies.groot_layout import LAYOUTS, Gr00tLayoutPolicy
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
