"""``CosmosRobotRoboLabClient``: RoboLab's ``InferenceClient`` interface, one batched request per query step.

The server is real (loopback websockets); the policy is a deterministic ``CountingDroidPolicy``
whose chunk rows say which observation they answer (row r of the chunk for an env whose first
joint is q0 is ``[q0, r, call, ...]``), so each test can check both the wire (requests counted on
the server) and the per-env open-loop bookkeeping. Observations are shaped like RoboLab's DROID
ones (``image_obs`` / ``proprio_obs``, leading env axis), as numpy instead of torch tensors.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from cosmos_robot_client.base_policy import BasePolicy, BatchPolicy
from cosmos_robot_client.image_tools import resize, resize_with_pad
from cosmos_robot_client.robolab import CosmosRobotRoboLabClient
from cosmos_robot_client.spec import ArraySpec, InputSpec, TextSpec
from cosmos_robot_server import PolicyServer, ServerConfig

EXT1, EXT2, WRIST = (
    "observation/exterior_image_1_left",
    "observation/exterior_image_2_left",
    "observation/wrist_image_left",
)
JOINT, GRIP = "observation/joint_position", "observation/gripper_position"


class CountingDroidPolicy(BatchPolicy):
    """DROID keys in; chunk (rows, 8) out with row r = [q0, r, call, 0, 0, 0, 0, 0.2 or 0.8 alternating]."""

    def __init__(self, rows: int = 10, horizon: int | None = 8, cameras: Sequence[str] = (EXT1, WRIST),
                 resolution: tuple[int, int] | None = (64, 64), reply_key: str = "actions") -> None:  # fmt: skip
        self.rows, self.horizon, self.resolution, self.reply_key = rows, horizon, resolution, reply_key
        img = ArraySpec((*resolution, 3) if resolution else (None, None, 3), "uint8")
        fields: dict[str, ArraySpec | TextSpec] = {k: img for k in cameras}
        fields.update({JOINT: ArraySpec((7,), "float32"), GRIP: ArraySpec((1,), "float32"), "prompt": TextSpec()})
        self._spec = InputSpec(fields)
        self.batches: list[int] = []  # observations per policy call
        self.seen: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @property
    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"action_dim": 8}
        if self.horizon is not None:
            meta["action_horizon"] = self.horizon
        if self.resolution is not None:
            meta["image_resolution"] = list(self.resolution)
        return meta

    @property
    def input_spec(self) -> InputSpec:
        return self._spec

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._lock:
            self.batches.append(len(obs_batch))
            self.seen.extend(obs_batch)
            call = len(self.batches)
        out = []
        for obs in obs_batch:
            chunk = np.zeros((self.rows, 8), np.float32)
            chunk[:, 0] = obs[JOINT][0]
            chunk[:, 1] = np.arange(self.rows)
            chunk[:, 2] = call
            chunk[:, 7] = np.where(np.arange(self.rows) % 2 == 0, 0.2, 0.8)
            out.append({self.reply_key: chunk})
        return out


def robolab_obs(n: int, step: int, height: int = 72, width: int = 128) -> dict[str, Any]:
    """RoboLab's DROID observation dict for n envs; env e's first joint is 100 * e + step (a marker)."""
    rng = np.random.default_rng(step)
    cams = ("over_shoulder_left_camera", "over_shoulder_right_camera", "wrist_cam")
    joints = rng.uniform(-1, 1, (n, 7)).astype(np.float32)
    joints[:, 0] = 100 * np.arange(n) + step
    return {
        "image_obs": {c: rng.integers(0, 256, (n, height, width, 3), dtype=np.uint8) for c in cams},
        "proprio_obs": {"arm_joint_pos": joints, "gripper_pos": rng.uniform(0, 1, (n, 1)).astype(np.float32)},
    }


def request_count(server: PolicyServer) -> int:
    for line in server.metrics.render().splitlines():
        if line.startswith('cosmos_robot_request_latency_seconds_count{transport="ws"}'):
            return int(line.split()[-1])
    return 0


@contextlib.contextmanager
def serving(policy: BasePolicy, **config: Any) -> Iterator[PolicyServer]:
    server = PolicyServer(policy, ServerConfig(port=0, **config)).start_in_thread()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def robolab_client(server: PolicyServer, **kwargs: Any) -> Iterator[CosmosRobotRoboLabClient]:
    client = CosmosRobotRoboLabClient("127.0.0.1", server.ports["ws"], **kwargs)
    try:
        yield client
    finally:
        client.close()


def run(client: CosmosRobotRoboLabClient, n: int, steps: range, env_ids: Sequence[int] | None = None) -> list[dict]:
    """RoboLab's episode loop: one infer_batch per control step over the active envs."""
    ids = list(range(n)) if env_ids is None else list(env_ids)
    return [client.infer_batch(robolab_obs(n, s), "put the banana in the bowl", env_ids=ids) for s in steps]


def test_one_request_per_query_step_across_envs() -> None:
    policy = CountingDroidPolicy(rows=10, horizon=8)
    n = 4
    with serving(policy) as server, robolab_client(server) as client:
        assert client.open_loop_horizon == 8  # the server's action_horizon
        outs = run(client, n, range(24))
        assert request_count(server) == 3 and client.requests_sent == 3  # steps 0, 8, 16: one request each
    assert policy.batches == [4, 4, 4]
    for step, out in enumerate(outs):
        query_step = step - step % 8
        for env in range(n):
            action = out[env]["action"]
            assert action.shape == (8,) and out[env]["viz"] is None
            assert action[0] == 100 * env + query_step  # this env's own chunk, from its query step
            assert action[1] == step % 8  # executed open-loop, row by row
            assert action[7] == float(step % 2 == 1)  # gripper binarised at 0.5 (0.2 -> 0, 0.8 -> 1)


def test_only_reset_or_exhausted_envs_are_requeried() -> None:
    policy = CountingDroidPolicy(rows=10, horizon=8)
    with serving(policy) as server, robolab_client(server) as client:
        run(client, 3, range(3))
        client.reset(env_id=1)  # e.g. that env's episode ended
        out = run(client, 3, range(3, 12))
        assert policy.batches == [3, 1, 2, 1]  # step 0 all; step 3 env 1; step 8 envs 0, 2; step 11 env 1
        assert out[0][1]["action"][0] == 100 + 3 and out[0][0]["action"][0] == 0
        client.reset()  # all envs
        run(client, 3, range(12, 13))
        assert policy.batches[-1] == 3 and request_count(server) == 5
        # frozen (terminated) envs are left out of env_ids, as RoboLab's active_env_ids does
        out = run(client, 3, range(13, 21), env_ids=[0, 2])
        assert sorted(out[0]) == [0, 2] and policy.batches[-1] == 2


def test_what_is_sent_follows_the_server_metadata() -> None:
    """Keys from the announced input_spec, images resized (with pad) to image_resolution, prompt = instruction."""
    policy = CountingDroidPolicy(cameras=(EXT1, EXT2, WRIST), resolution=(48, 64))
    with serving(policy) as server, robolab_client(server) as client:
        assert client.keys == (EXT1, EXT2, WRIST, JOINT, GRIP) and client.image_size == (48, 64)
        raw = robolab_obs(2, 0)
        client.infer_batch(raw, "stack the cups", env_ids=[0, 1])
    sent = policy.seen[1]
    assert set(sent) == {EXT1, EXT2, WRIST, JOINT, GRIP, "prompt"} and sent["prompt"] == "stack the cups"
    want = resize_with_pad(raw["image_obs"]["wrist_cam"][1], 48, 64)
    np.testing.assert_array_equal(sent[WRIST], want)
    np.testing.assert_array_equal(sent[GRIP], raw["proprio_obs"]["gripper_pos"][1])
    assert sent[JOINT].dtype == np.float32 and sent[GRIP].shape == (1,)


def test_horizon_override_short_chunks_and_action_key() -> None:
    policy = CountingDroidPolicy(rows=5, horizon=None, reply_key="action")  # cosmos-framework's reply key
    with serving(policy) as server:
        with pytest.raises(ValueError, match="open_loop_horizon"):
            CosmosRobotRoboLabClient("127.0.0.1", server.ports["ws"])
        with robolab_client(server, open_loop_horizon=8, binarize_gripper=False) as client:
            outs = run(client, 2, range(7))
    assert policy.batches == [2, 2]  # a 5-row chunk is replanned when used up, not read past its end
    assert outs[5][0]["action"][1] == 0 and outs[6][1]["action"][7] == pytest.approx(0.8)


def test_large_batches_are_split_to_fit_the_message_cap() -> None:
    policy = CountingDroidPolicy(resolution=(64, 64))  # ~25 KB per observation
    with serving(policy, max_message_bytes=100_000) as server, robolab_client(server) as client:
        run(client, 7, range(1))
        assert client.requests_sent == 3 and request_count(server) == 3
    assert sorted(policy.batches) == [1, 3, 3]


def test_foreign_server_defaults_and_injected_policy() -> None:
    """Without our metadata (a plain openpi server) it sends openpi's DROID keys at 224x224."""

    class Bare(CountingDroidPolicy):
        @property
        def metadata(self) -> dict[str, Any]:
            return {}

        @property
        def input_spec(self) -> None:  # type: ignore[override]
            return None

    policy = Bare(resolution=None)
    client = CosmosRobotRoboLabClient(policy=policy, open_loop_horizon=4, with_viz=True)
    assert client.keys == (EXT1, WRIST, JOINT, GRIP) and client.image_size == (224, 224)
    out = client.infer(robolab_obs(1, 0), "go", env_id=0)
    assert out["action"].shape == (8,) and out["viz"].shape == (224, 448, 3)
    assert policy.seen[0][EXT1].shape == (224, 224, 3)


def test_errors_name_what_is_missing() -> None:
    policy = CountingDroidPolicy(cameras=(EXT1, EXT2, WRIST))
    client = CosmosRobotRoboLabClient(policy=policy)
    raw = robolab_obs(1, 0)
    del raw["image_obs"]["over_shoulder_right_camera"]  # registered without the right camera
    with pytest.raises(KeyError, match="observation/exterior_image_2_left.*over_shoulder_right_camera"):
        client.infer(raw, "go")
    with pytest.raises(ValueError, match="not DROID keys"):
        CosmosRobotRoboLabClient(policy=policy, keys=["observation/state"])

    class Broken(CountingDroidPolicy):
        def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{"actions": np.zeros(8)} for _ in obs_batch]

    with pytest.raises(RuntimeError, match=r"shape \(horizon, action_dim\)"):
        CosmosRobotRoboLabClient(policy=Broken()).infer(robolab_obs(1, 0), "go")


def test_torch_tensors_from_isaac_lab_are_accepted() -> None:
    torch = pytest.importorskip("torch")
    policy = CountingDroidPolicy()
    client = CosmosRobotRoboLabClient(policy=policy)
    raw = robolab_obs(2, 0)
    as_torch = {g: {k: torch.from_numpy(v) for k, v in d.items()} for g, d in raw.items()}
    assert client.infer_batch(as_torch, "go", env_ids=[0, 1])[1]["action"][0] == 100
    np.testing.assert_array_equal(policy.seen[1][JOINT], raw["proprio_obs"]["arm_joint_pos"][1])


@pytest.mark.parametrize(("src", "dst"), [((720, 1280), (360, 640)), ((720, 1280), (224, 224)), ((50, 70), (120, 90))])
def test_resize_with_pad_matches_openpis_pil_recipe(src: tuple[int, int], dst: tuple[int, int]) -> None:
    """openpi's image_tools.resize_with_pad (PIL bilinear, centred zero pad), in numpy: within one grey level."""
    image_mod = pytest.importorskip("PIL.Image")
    img = np.random.default_rng(0).integers(0, 256, (*src, 3), dtype=np.uint8)
    ratio = max(src[1] / dst[1], src[0] / dst[0])
    h, w = int(src[0] / ratio), int(src[1] / ratio)
    ref = np.zeros((*dst, 3), np.uint8)
    top, left = (dst[0] - h) // 2, (dst[1] - w) // 2
    ref[top : top + h, left : left + w] = np.asarray(image_mod.fromarray(img).resize((w, h), image_mod.BILINEAR))
    ours = resize_with_pad(img, *dst)
    assert ours.shape == (*dst, 3) and ours.dtype == np.uint8
    assert np.abs(ours.astype(int) - ref.astype(int)).max() <= 1
    with pytest.raises(ValueError, match="H, W, C"):
        resize(img[..., 0], 10, 10)
