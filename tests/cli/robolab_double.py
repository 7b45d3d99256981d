"""TEST DOUBLE of RoboLab's policy clients (NVlabs/RoboLab v0.2.1 @0aef241), run in .venv-openpi.

RoboLab itself needs Isaac Sim, so it cannot run in tests. This script stands in for it: it
re-implements, from RoboLab's documented interface, the ``InferenceClient`` base
(``robolab/eval/base_client.py``: extract -> pack -> query -> unpack -> postprocess, per-env chunk
caching with ``open_loop_horizon``, ``infer_batch`` as a serial loop of ``infer``) and the two
clients we must serve unchanged, sending exactly what they send over the same transport (openpi's
``WebsocketClientPolicy`` and ``image_tools.resize_with_pad`` from the real openpi-client package):

- ``policies/cosmos3/client.py`` ``Cosmos3Client``: three 720x1280 cameras, each resize_with_pad
  to 360x640; the wrist view on top of left|right bilinearly resized to 180x320 -> one 540x640x3
  uint8 ``observation/image``; ``observation/joint_position`` float32 (7,),
  ``observation/gripper_position`` float32 (1,), ``prompt``; reads ``response["action"]``; horizon 32;
- ``policies/pi0_family/client.py`` ``Pi0DroidJointposClient`` (pi05): ``over_shoulder_left_camera``
  and ``wrist_cam`` resize_with_pad to 224x224 as ``observation/exterior_image_1_left`` /
  ``observation/wrist_image_left``, the same joint / gripper / prompt; reads ``response["actions"]``;
  horizon 15.

Both binarise the gripper column at 0.5. The one liberty: the cosmos3 half-size resize uses PIL
bilinear instead of torch's ``F.interpolate`` (no torch in this venv); keys, shapes and dtypes are
identical. The simulator is replaced by numpy arrays shaped like RoboLab's DROID observations.

    python robolab_double.py PORT cosmos3|pi05 --num-envs N --steps S   -> one JSON line on stdout
    python robolab_double.py PORT probe --drop KEY | --reshape KEY:D1xD2  (cosmos3 request, edited)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
from openpi_client import image_tools, websocket_client_policy
from PIL import Image


class InferenceClientDouble:
    """RoboLab's ``InferenceClient`` contract: infer / infer_batch (serial) / reset, per-env chunks."""

    open_loop_horizon = 1
    client: Any  # openpi's WebsocketClientPolicy

    def __init__(self) -> None:
        self._chunks: dict[int, np.ndarray] = {}
        self._counters: dict[int, int] = {}
        self.sent: list[dict] = []  # every request, as RoboLab would send it
        self.replies: list[dict] = []

    def infer(self, obs, instruction, *, env_id=0):
        extracted = self._extract_observation(obs, env_id=env_id)
        if env_id not in self._chunks or self._counters[env_id] >= self.open_loop_horizon:
            request = self._pack_request(extracted, instruction)
            self.sent.append(request)
            response = self.client.infer(request)
            self.replies.append(response)
            self._chunks[env_id] = self._postprocess_chunk(self._unpack_response(response))
            self._counters[env_id] = 0
        action = self._chunks[env_id][self._counters[env_id]]
        self._counters[env_id] += 1
        return {"action": action, "viz": None}

    def infer_batch(self, obs, instruction, *, env_ids):
        return {env_id: self.infer(obs, instruction, env_id=env_id) for env_id in env_ids}

    def reset(self, *, env_id=None):
        if env_id is None:
            self._chunks.clear()
            self._counters.clear()
        else:
            self._chunks.pop(env_id, None)
            self._counters.pop(env_id, None)

    def _extract_observation(self, raw_obs, *, env_id=0):  # the four hooks RoboLab's subclasses implement
        raise NotImplementedError

    def _pack_request(self, extracted, instruction):
        raise NotImplementedError

    def _unpack_response(self, response):
        raise NotImplementedError

    def _postprocess_chunk(self, chunk):
        chunk = chunk.copy()
        chunk[..., -1] = (chunk[..., -1] > 0.5).astype(chunk.dtype)
        return chunk


class Cosmos3ClientDouble(InferenceClientDouble):
    IMAGE_H, IMAGE_W = 360, 640

    def __init__(self, port: int) -> None:
        super().__init__()
        self.open_loop_horizon = 32
        self.client = websocket_client_policy.WebsocketClientPolicy("127.0.0.1", port)

    def _extract_observation(self, raw_obs, *, env_id=0):
        cams = raw_obs["image_obs"]
        prop = raw_obs["proprio_obs"]
        return {
            "left_image": image_tools.resize_with_pad(cams["over_shoulder_left_camera"][env_id], 360, 640),
            "right_image": image_tools.resize_with_pad(cams["over_shoulder_right_camera"][env_id], 360, 640),
            "wrist_image": image_tools.resize_with_pad(cams["wrist_cam"][env_id], 360, 640),
            "joint_position": prop["arm_joint_pos"][env_id],
            "gripper_position": prop["gripper_pos"][env_id],
        }

    def _pack_request(self, extracted, instruction):
        wrist = extracted["wrist_image"]

        def half(img):
            return np.asarray(Image.fromarray(img).resize((320, 180), Image.Resampling.BILINEAR)).astype(wrist.dtype)

        image = np.concatenate(
            (wrist, np.concatenate((half(extracted["left_image"]), half(extracted["right_image"])), 1))
        )
        return {
            "observation/image": image,
            "observation/joint_position": extracted["joint_position"],
            "observation/gripper_position": extracted["gripper_position"],
            "prompt": instruction,
        }

    def _unpack_response(self, response):
        return np.asarray(response["action"])


class Pi05ClientDouble(InferenceClientDouble):
    def __init__(self, port: int) -> None:
        super().__init__()
        self.open_loop_horizon = 15  # DEFAULT_HORIZONS["pi05"]
        self.client = websocket_client_policy.WebsocketClientPolicy("127.0.0.1", port)

    def _extract_observation(self, raw_obs, *, env_id=0):
        return {
            "right_image": raw_obs["image_obs"]["over_shoulder_left_camera"][env_id],
            "wrist_image": raw_obs["image_obs"]["wrist_cam"][env_id],
            "joint_position": raw_obs["proprio_obs"]["arm_joint_pos"][env_id],
            "gripper_position": raw_obs["proprio_obs"]["gripper_pos"][env_id],
        }

    def _pack_request(self, extracted, instruction):
        return {
            "observation/exterior_image_1_left": image_tools.resize_with_pad(extracted["right_image"], 224, 224),
            "observation/wrist_image_left": image_tools.resize_with_pad(extracted["wrist_image"], 224, 224),
            "observation/joint_position": extracted["joint_position"],
            "observation/gripper_position": extracted["gripper_position"],
            "prompt": instruction,
        }

    def _unpack_response(self, response):
        return np.asarray(response["actions"])


def robolab_obs(num_envs: int, step: int, height: int = 720, width: int = 1280) -> dict:
    """What RoboLab's DROID registration (WRIST_LEFT_RIGHT_HEAD cameras) returns, as numpy instead of torch."""
    rng = np.random.default_rng(step)
    cams = ("over_shoulder_left_camera", "over_shoulder_right_camera", "wrist_cam")
    return {
        "image_obs": {c: rng.integers(0, 256, (num_envs, height, width, 3), dtype=np.uint8) for c in cams},
        "proprio_obs": {
            "arm_joint_pos": (rng.uniform(-1, 1, (num_envs, 7)) + np.arange(num_envs)[:, None]).astype(np.float32),
            "gripper_pos": rng.uniform(0, 1, (num_envs, 1)).astype(np.float32),
        },
    }


def describe(obj) -> dict:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, np.ndarray):
            out[key] = {"shape": list(value.shape), "dtype": str(value.dtype)}
        else:
            out[key] = type(value).__name__
    return out


def run_episode(client, num_envs: int, steps: int) -> dict:
    """RoboLab's ``run_episode`` loop: infer_batch for the active envs, stack, step; reset at the end."""
    actions = []
    for step in range(steps):
        rets = client.infer_batch(
            robolab_obs(num_envs, step), "put the banana in the bowl", env_ids=list(range(num_envs))
        )
        actions.append(np.stack([rets[e]["action"] for e in sorted(rets)]))
    client.reset()
    first = client.replies[0]
    key = "action" if isinstance(client, Cosmos3ClientDouble) else "actions"
    chunks = [np.asarray(r[key]) for r in client.replies]
    return {
        "metadata": client.client.get_server_metadata(),
        "requests": len(client.sent),
        "request": describe(client.sent[0]),
        "reply_keys": sorted(first),
        "chunk": {"shape": list(chunks[0].shape), "dtype": str(chunks[0].dtype)},
        "finite": bool(all(np.isfinite(c).all() for c in chunks)),
        "executed": np.stack(actions).tolist(),  # (steps, num_envs, 8) after binarisation
        "first_chunk": chunks[0].tolist(),
    }


def probe(port: int, drop: str | None, reshape: str | None) -> dict:
    """One Cosmos3Client request, edited to look like a misconfigured client; reports the server's error."""
    client = Cosmos3ClientDouble(port)
    request = client._pack_request(client._extract_observation(robolab_obs(1, 0), env_id=0), "pick")
    if drop:
        del request[drop]
    if reshape:
        key, dims = reshape.split(":")
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        request[key] = np.zeros(shape, dtype=np.uint8 if "image" in key else np.float32)
    try:
        reply = client.client.infer(request)
    except RuntimeError as exc:  # openpi's client raises on the server's TEXT error frame
        return {"error": str(exc)}
    return {"reply_keys": sorted(reply), "shape": list(np.asarray(reply["action"]).shape)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("client", choices=["cosmos3", "pi05", "probe"])
    ap.add_argument("--num-envs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--drop")
    ap.add_argument("--reshape")
    args = ap.parse_args()
    if args.client == "probe":
        out = probe(args.port, args.drop, args.reshape)
    else:
        cls = Cosmos3ClientDouble if args.client == "cosmos3" else Pi05ClientDouble
        out = run_episode(cls(args.port), args.num_envs, args.steps)
    json.dump(out, sys.stdout, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else str(o))
    print()


if __name__ == "__main__":
    main()
