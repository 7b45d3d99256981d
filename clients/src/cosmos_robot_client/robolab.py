"""A RoboLab ``InferenceClient`` for a cosmos-robot server: ONE request per step for all sub-environments.

RoboLab (NVlabs/RoboLab, v0.2.1) evaluates a policy through an ``InferenceClient`` subclass
(``robolab/eval/base_client.py``): its episode loop calls ``infer_batch(obs, instruction,
env_ids=...)`` every control step (15 Hz) for the active sub-environments of ``--num-envs N``,
``reset()`` at episode end and ``close()`` at task end. The base class answers ``infer_batch``
with a serial loop of ``infer`` (one round trip per env), and its cosmos3 and pi05 clients keep
it, so the N envs, which replan in lockstep, cost N sequential requests per replan. This client
keeps RoboLab's interface and per-env chunk bookkeeping (each env executes its chunk open-loop for
``open_loop_horizon`` steps) but sends the envs whose chunk is exhausted, or that were reset, as
ONE ``{"batch": [...]}`` request, which the server runs as one batched policy call.

It is written against RoboLab's documented interface (method names and signatures of
``InferenceClient``; the DROID observation dict of ``docs/policy.md``) without importing robolab,
which needs Isaac Sim. RoboLab's episode loop only duck-types the client; to make it a real
subclass, mix it in: ``class Client(CosmosRobotRoboLabClient, robolab.eval.InferenceClient)``.

What it sends is decided by the server's metadata (announced on connect), not hard-coded:
the DROID keys the server's ``input_spec`` lists (cosmos3: three views; pi05: exterior 1 + wrist),
images ``resize_with_pad``-ed to its ``image_resolution`` (else 360x640, the per-view size of
RoboLab's cosmos3 client, since the server composes and resizes itself), and the chunk length it
announces as ``action_horizon``. Images are shrunk here, before they cross the network: RoboLab
renders 720x1280 frames, 2.7 MB each. The gripper column of each chunk is binarised at 0.5, as
RoboLab's own clients do for its binary gripper action.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy, supports_batch
from cosmos_robot_client.batching import split_batch
from cosmos_robot_client.image_tools import resize_with_pad

__all__ = ["DROID_SOURCES", "CosmosRobotRoboLabClient"]

# wire key (openpi / RoboArena DROID) -> where RoboLab's DROID registration puts it: raw_obs[group][name][env_id]
DROID_SOURCES: dict[str, tuple[str, str]] = {
    "observation/exterior_image_1_left": ("image_obs", "over_shoulder_left_camera"),
    "observation/exterior_image_2_left": ("image_obs", "over_shoulder_right_camera"),
    "observation/wrist_image_left": ("image_obs", "wrist_cam"),
    "observation/joint_position": ("proprio_obs", "arm_joint_pos"),
    "observation/gripper_position": ("proprio_obs", "gripper_pos"),
}
_IMAGE_KEYS = frozenset(k for k, (group, _) in DROID_SOURCES.items() if group == "image_obs")
# what openpi's DROID clients (and RoboLab's pi05 client) send, for servers that announce no input_spec
_OPENPI_DROID_KEYS = (
    "observation/exterior_image_1_left",
    "observation/wrist_image_left",
    "observation/joint_position",
    "observation/gripper_position",
)
_OPENPI_IMAGE_SIZE = (224, 224)
_CANVAS_VIEW_SIZE = (360, 640)  # RoboLab's cosmos3 client: each view resize_with_pad-ed to 360x640


class CosmosRobotRoboLabClient:
    """RoboLab's ``InferenceClient`` interface over a cosmos-robot (or openpi) websocket server.

    ``client = CosmosRobotRoboLabClient("gpu-box", 8000)`` in a RoboLab ``run.py``'s
    ``make_client``; ``policy=`` injects any ``BasePolicy`` instead (tests, other transports).
    """

    open_loop_horizon: int = 1

    def __init__(
        self,
        remote_host: str = "localhost",
        remote_port: int = 8000,
        *,
        remote_uri: str | None = None,  # ws:// or wss:// URL; overrides host and port (like RoboLab's pi05 client)
        api_key: str | None = None,
        open_loop_horizon: int | None = None,  # actions each env executes per chunk; None = server's action_horizon
        image_size: tuple[int, int] | None = None,  # (H, W) per view; None = from the server's metadata
        keys: Sequence[str] | None = None,  # wire keys to send; None = the DROID keys the server's input_spec lists
        binarize_gripper: bool = True,  # last action column > 0.5 -> 1 else 0, as RoboLab's clients do
        with_viz: bool = False,  # build the viewer image every step (RoboLab without --headless)
        request_timeout_s: float | None = None,
        policy: BasePolicy | None = None,  # an already-connected policy instead of a websocket connection
    ) -> None:
        owned = policy is None
        if policy is None:
            from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

            policy = WebsocketClientPolicy(
                remote_uri if remote_uri is not None else remote_host,
                None if remote_uri is not None else remote_port,
                api_key=api_key,
                request_timeout_s=request_timeout_s,
            )
        self.policy = policy
        self._chunks: dict[int, np.ndarray] = {}
        self._counters: dict[int, int] = {}
        self.requests_sent = 0  # batched calls (one per step in which any env replans, unless split for size)
        try:
            self._configure(open_loop_horizon, image_size, keys)
        except BaseException:
            if owned:
                self.close()
            raise
        self.binarize_gripper = binarize_gripper
        self.with_viz = with_viz

    def _configure(
        self, open_loop_horizon: int | None, image_size: tuple[int, int] | None, keys: Sequence[str] | None
    ) -> None:
        self.metadata: dict[str, Any] = dict(_metadata_of(self.policy))
        self.keys = tuple(keys) if keys is not None else self._keys_from_metadata()
        unknown = [k for k in self.keys if k not in DROID_SOURCES]
        if unknown:
            raise ValueError(f"keys: {unknown} are not DROID keys this client can fill (known: {list(DROID_SOURCES)})")
        self.image_size = tuple(image_size) if image_size is not None else self._image_size_from_metadata()
        horizon = open_loop_horizon if open_loop_horizon is not None else self.metadata.get("action_horizon")
        if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1:
            raise ValueError(
                f"open_loop_horizon: the server announces action_horizon={horizon!r}; pass open_loop_horizon=N "
                "(the number of actions each env executes before replanning)"
            )
        self.open_loop_horizon = horizon

    # -- RoboLab's public interface ------------------------------------------------------------
    def infer(self, obs: Any, instruction: str, *, env_id: int = 0) -> dict[str, Any]:
        """``{"action": (action_dim,) array, "viz": image or None}`` for one env (RoboLab's ``infer``)."""
        return self.infer_batch(obs, instruction, env_ids=[env_id])[env_id]

    def infer_batch(self, obs: Any, instruction: str, *, env_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """``{env_id: {"action", "viz"}}``; envs needing a new chunk are queried in one request."""
        env_ids = [int(e) for e in env_ids]
        stale = [e for e in env_ids if self._needs_refresh(e)]
        extracted = {e: self._extract_observation(obs, env_id=e) for e in (env_ids if self.with_viz else stale)}
        if stale:
            requests = [self._pack_request(extracted[e], instruction) for e in stale]
            responses = self._query_server_batch(requests)
            for env_id, response in zip(stale, responses):
                self._set_chunk(env_id, self._postprocess_chunk(self._unpack_response(response)))
        out: dict[int, dict[str, Any]] = {}
        for env_id in env_ids:
            viz = self._build_visualization(extracted[env_id]) if self.with_viz else None
            out[env_id] = {"action": self._next_action(env_id), "viz": viz}
        return out

    def reset(self, *, env_id: int | None = None) -> None:
        """Forget the chunk of ``env_id`` (all envs when None); its next step queries the server."""
        for env in list(self._chunks) if env_id is None else [env_id]:
            self._chunks.pop(env, None)
            self._counters.pop(env, None)

    def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if callable(close):
            close()

    def visualize(self, obs: Any, *, env_id: int = 0) -> np.ndarray | None:
        return self._build_visualization(self._extract_observation(obs, env_id=env_id))

    # -- RoboLab's hooks -------------------------------------------------------------------------
    def _extract_observation(self, raw_obs: Any, *, env_id: int = 0) -> dict[str, np.ndarray]:
        """RoboLab's batched (torch) observation dict -> this env's numpy arrays, under wire keys."""
        out: dict[str, np.ndarray] = {}
        for key in self.keys:
            group, name = DROID_SOURCES[key]
            try:
                batched = raw_obs[group][name]
            except (KeyError, TypeError) as exc:
                raise KeyError(
                    f"{key}: RoboLab observation has no {group}[{name!r}]; register the env with the cameras this "
                    "server needs (e.g. WRIST_LEFT_RIGHT_HEAD for three views) or pass keys="
                ) from exc
            out[key] = _to_numpy(batched[env_id])
        return out

    def _pack_request(self, extracted_obs: Mapping[str, np.ndarray], instruction: str) -> dict[str, Any]:
        height, width = self.image_size
        request: dict[str, Any] = {}
        for key, value in extracted_obs.items():
            request[key] = resize_with_pad(_as_uint8(value), height, width) if key in _IMAGE_KEYS else value
        request["prompt"] = str(instruction)
        return request

    def _query_server(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._query_server_batch([request])[0]

    def _query_server_batch(self, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """One request for all ``requests`` (split only if it would exceed the server's message cap)."""
        replies: list[dict[str, Any]] = []
        for part in self._split(requests):
            if supports_batch(self.policy):
                got = list(self.policy.infer_batch(part))  # type: ignore[attr-defined]
            else:
                got = [self.policy.infer(obs) for obs in part]
            if len(got) != len(part):
                raise RuntimeError(f"server answered {len(got)} results for {len(part)} observations")
            replies.extend(got)
            self.requests_sent += 1
        return replies

    def _unpack_response(self, response: Mapping[str, Any]) -> np.ndarray:
        """``actions`` (ours, openpi) or ``action`` (cosmos-framework) as a (horizon, action_dim) array."""
        key = "actions" if "actions" in response else "action"
        if key not in response:
            raise RuntimeError(f"server reply has no 'actions' (keys: {sorted(map(str, response))})")
        chunk = np.asarray(response[key])
        if chunk.ndim != 2 or chunk.shape[0] < 1:
            raise RuntimeError(f"server reply {key!r} must have shape (horizon, action_dim), got {chunk.shape}")
        return chunk

    def _postprocess_chunk(self, chunk: np.ndarray) -> np.ndarray:
        if not self.binarize_gripper:
            return chunk
        chunk = chunk.astype(np.float32, copy=True)
        chunk[:, -1] = (chunk[:, -1] > 0.5).astype(np.float32)
        return chunk

    def _build_visualization(self, extracted_obs: Mapping[str, np.ndarray]) -> np.ndarray | None:
        views = [
            resize_with_pad(_as_uint8(v), *_OPENPI_IMAGE_SIZE) for k, v in extracted_obs.items() if k in _IMAGE_KEYS
        ]
        return np.concatenate(views, axis=1) if views else None

    # -- chunk bookkeeping (RoboLab's names) ----------------------------------------------------
    def _needs_refresh(self, env_id: int) -> bool:
        if env_id not in self._chunks:
            return True
        # a chunk shorter than the horizon is replanned when used up (RoboLab's base would IndexError)
        return self._counters[env_id] >= min(self.open_loop_horizon, len(self._chunks[env_id]))

    def _set_chunk(self, env_id: int, chunk: np.ndarray) -> None:
        self._chunks[env_id] = chunk
        self._counters[env_id] = 0

    def _next_action(self, env_id: int) -> np.ndarray:
        action = self._chunks[env_id][self._counters[env_id]]
        self._counters[env_id] += 1
        return action

    # -- metadata ------------------------------------------------------------------------------
    def _keys_from_metadata(self) -> tuple[str, ...]:
        spec = self.metadata.get("input_spec")
        if not isinstance(spec, Mapping):
            return _OPENPI_DROID_KEYS
        keys = tuple(k for k in DROID_SOURCES if k in spec)
        if not keys:
            raise ValueError(
                f"the server expects none of the DROID keys this client sends (its input_spec: {sorted(spec)})"
            )
        return keys

    def _image_size_from_metadata(self) -> tuple[int, int]:
        res = self.metadata.get("image_resolution")
        if isinstance(res, (list, tuple)) and len(res) == 2 and all(isinstance(d, int) and d > 0 for d in res):
            return int(res[0]), int(res[1])
        return _CANVAS_VIEW_SIZE if isinstance(self.metadata.get("input_spec"), Mapping) else _OPENPI_IMAGE_SIZE

    def _split(self, requests: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        return split_batch(requests, self.metadata.get("server")) or [[]]


def _metadata_of(policy: BasePolicy) -> Mapping[str, Any]:
    """What the server announced; for an in-process policy, what a server would announce for it."""
    getter = getattr(policy, "get_server_metadata", None)
    if callable(getter):
        meta = getter()
        return meta if isinstance(meta, Mapping) else {}
    out = dict(policy.metadata or {})
    spec = policy.input_spec
    if spec is not None:
        out.setdefault("input_spec", spec.to_dict())
    return out


def _to_numpy(value: Any) -> np.ndarray:
    """A torch tensor (any device) or array-like -> numpy, without importing torch."""
    for step in ("detach", "cpu", "numpy"):
        method = getattr(value, step, None)
        if callable(method) and not isinstance(value, np.ndarray):
            value = method()
    return np.asarray(value)


def _as_uint8(image: np.ndarray) -> np.ndarray:
    if image.dtype == np.uint8:
        return image
    if np.issubdtype(image.dtype, np.floating) and image.size and float(image.max()) <= 1.0:
        image = image * 255.0  # float images in [0, 1]
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)
