"""cosmos-framework's LIBERO JSON dialect, converted to and from our observation convention.

cosmos-framework's ``closed_loop_eval.py`` talks to its ``action_policy_server_libero.py`` with
JSON over HTTP: ``{"image": base64 PNG, "prompt", "domain_name", "image_size"}`` in, ``{"action":
(T, D) nested lists}`` out (``/predict_batch``: ``{"items": [...]}`` in, ``{"actions": [...]}``
out). We answer that client unchanged, so a team can swap the server without touching its
evaluation, while every policy behind us keeps speaking the one openpi-style dict
(``observation/image``, ``observation/wrist_image``, ``prompt``).

This module is pure (no sockets, no model): it parses and checks a request, decodes the PNG,
splits the client's agentview|wrist side-by-side image into the two camera keys when the policy
declares a wrist camera, resizes to the size the policy declares, and turns the policy's
``actions`` array back into JSON lists. Every error names the field it is about. We do not return
cosmos-framework's ``video`` (its server VAE-decodes a predicted rollout; our policies do not
produce one, and the evaluation client ignores it unless asked to save comparisons).

Errors are HTTP statuses by default. cosmos-framework's own server answers them with 200 and
``{"action": [], "error": ...}`` instead, and its client calls ``raise_for_status()``, so behind a
4xx our message never reaches its log: ``error_reply`` offers that shape as
``ServerConfig.cosmos_errors = "in_body"``.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from cosmos_robot_client.spec import ArraySpec, InputSpec
from cosmos_robot_server.batcher import PolicyError
from cosmos_robot_server.core import RequestError

__all__ = [
    "CosmosRequest",
    "DialectError",
    "PolicyOutputError",
    "action_list",
    "decode_image",
    "error_reply",
    "info_fields",
    "json_safe",
    "parse_batch",
    "parse_request",
    "to_observation",
]

MAX_PIXELS = 4096 * 4096  # a decoded image larger than this is refused (PNG compresses zeros ~1000x)
IMAGE_KEY = "observation/image"
WRIST_KEY = "observation/wrist_image"
_ASPECT_TOLERANCE = 0.02  # relative; a resize within it is a rescale, beyond it a distortion we refuse


class DialectError(RequestError):
    """A request that does not follow the dialect (HTTP 400); ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", status=400)
        self.field = field


class PolicyOutputError(PolicyError):
    """The policy answered, but not with a (T, D) finite numeric ``actions`` array (HTTP 500)."""


@dataclass(frozen=True)
class CosmosRequest:
    image: np.ndarray  # (H, W, 3) uint8 RGB
    prompt: str
    domain_name: str
    image_size: int


# -- requests ----------------------------------------------------------------------------------
def decode_image(text: str, field: str = "image") -> np.ndarray:
    """Base64 (plain or URL-safe, optional ``data:`` prefix, whitespace, missing padding) -> HWC uint8."""
    if text.startswith("data:"):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise DialectError(field, "data URL must be of the form data:<type>;base64,<payload>")
    compact = "".join(text.split()).translate(str.maketrans("-_", "+/")).rstrip("=")
    if not compact:
        raise DialectError(field, "empty image")
    if len(compact) % 4 == 1:
        raise DialectError(field, f"not valid base64 (a payload of {len(compact)} characters cannot be decoded)")
    try:
        data = base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DialectError(field, f"not valid base64: {exc}") from exc
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise DialectError(field, f"{height}x{width} (HxW) exceeds the limit of {MAX_PIXELS} pixels")
            rgb = np.array(img.convert("RGB"), dtype=np.uint8)
    except DialectError:
        raise
    except Exception as exc:  # any decoder failure is the client's bad bytes, never a crash
        raise DialectError(field, f"not a decodable image ({len(data)} bytes): {type(exc).__name__}: {exc}") from exc
    return rgb


def parse_request(body: Any, where: str = "") -> CosmosRequest:
    """Check one ``{"image", "prompt", "domain_name", "image_size"}`` object and decode its image."""
    if not isinstance(body, Mapping):
        name = where.rstrip(".") or "request body"
        raise RequestError(f"{name}: must be a JSON object, got {_json_type(body)}")
    for name, kind in (("image", "string"), ("prompt", "string"), ("domain_name", "string")):
        if name not in body:
            raise DialectError(where + name, "missing required field")
        if not isinstance(body[name], str):
            raise DialectError(where + name, f"expected a {kind}, got {_json_type(body[name])}")
    if "image_size" not in body:
        raise DialectError(where + "image_size", "missing required field")
    size = body["image_size"]
    if isinstance(size, bool) or not isinstance(size, int):
        raise DialectError(where + "image_size", f"expected an integer, got {_json_type(size)}")
    if size <= 0:
        raise DialectError(where + "image_size", f"must be > 0, got {size}")
    image = decode_image(body["image"], where + "image")
    return CosmosRequest(image=image, prompt=body["prompt"], domain_name=body["domain_name"], image_size=size)


def parse_batch(body: Any) -> list[CosmosRequest]:
    """``{"items": [request, ...]}`` -> requests; an error names the item (``items[2].prompt``)."""
    if not isinstance(body, Mapping):
        raise RequestError(f"request body: must be a JSON object, got {_json_type(body)}")
    if "items" not in body:
        raise DialectError("items", "missing required field")
    items = body["items"]
    if not isinstance(items, list):
        raise DialectError("items", f"expected a list of request objects, got {_json_type(items)}")
    if not items:
        raise DialectError("items", "must not be empty")
    return [parse_request(item, f"items[{i}].") for i, item in enumerate(items)]


def to_observation(req: CosmosRequest, spec: InputSpec | None) -> dict[str, Any]:
    """Our observation dict for one request, shaped to what ``spec`` declares."""
    fields = dict(spec.fields) if spec is not None else {}
    image = req.image
    height, width = image.shape[:2]
    if WRIST_KEY in fields and width == 2 * height:
        views = {IMAGE_KEY: np.ascontiguousarray(image[:, :height]), WRIST_KEY: np.ascontiguousarray(image[:, height:])}
    else:
        views = {IMAGE_KEY: image}
    obs: dict[str, Any] = {key: _fit(view, fields.get(key), key) for key, view in views.items()}
    obs["prompt"] = req.prompt
    for name, value in (("domain_name", req.domain_name), ("image_size", req.image_size)):
        if spec is None or name in fields or spec.allow_extra or name in spec.ignored_keys:
            obs[name] = np.asarray(value, dtype=np.int64) if isinstance(fields.get(name), ArraySpec) else value
    missing = [key for key, field_spec in fields.items() if not field_spec.optional and key not in obs]
    if missing:
        key = missing[0]
        if key == WRIST_KEY:
            why = (
                "the cosmos-framework dialect carries it only as the right half of `image` "
                f"(agentview|wrist side by side, width == 2 * height); got a {height}x{width} (HxW) image"
            )
        else:
            why = "the cosmos-framework dialect carries only image, prompt, domain_name and image_size"
        raise RequestError(f"{key}: required by the policy's input spec, but {why}")
    return obs


def _fit(view: np.ndarray, field_spec: Any, key: str) -> np.ndarray:
    """Resize to the spec's (H, W) when it declares one and the aspect ratio allows a clean rescale."""
    if not isinstance(field_spec, ArraySpec) or len(field_spec.shape) != 3:
        return view
    want_h, want_w = field_spec.shape[0], field_spec.shape[1]
    have_h, have_w = view.shape[:2]
    if want_h is None or want_w is None or (want_h, want_w) == (have_h, have_w):
        return view
    if abs((want_w / want_h) / (have_w / have_h) - 1.0) > _ASPECT_TOLERANCE:
        raise DialectError(
            "image",
            f"{key} would be {have_h}x{have_w} (HxW) but the policy expects {want_h}x{want_w}; "
            "the aspect ratios differ, so resizing would distort it (send one view per camera the policy declares)",
        )
    resized = Image.fromarray(np.ascontiguousarray(view)).resize((want_w, want_h), Image.Resampling.BILINEAR)
    return np.asarray(resized, dtype=np.uint8)


# -- responses ---------------------------------------------------------------------------------
IN_BODY_STATUSES = (400, 500)  # a bad field, a spec violation, a policy failure; auth, size, type stay HTTP
_PREDICT_ROUTES = {"/": "action", "/predict": "action", "/predict_batch": "actions"}


def error_reply(mode: str, route: str, status: int, message: str) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of an error: ``{"error"}`` with ``status``, or with ``mode`` ``in_body`` on a
    predict route, cosmos-framework's ``200 {"action": [], "error"}`` (``"actions"`` for a batch)."""
    key = _PREDICT_ROUTES.get(route)
    if mode == "in_body" and key is not None and status in IN_BODY_STATUSES:
        return 200, {key: [], "error": message}
    return status, {"error": message}


def action_list(result: Mapping[str, Any]) -> list[list[float]]:
    """The policy's ``actions`` (T, D) as JSON lists; a malformed result is the policy's fault (500)."""
    if "actions" not in result:
        raise PolicyOutputError(f"policy result has no 'actions' (keys: {sorted(map(str, result))})")
    try:
        arr = np.asarray(result["actions"])
    except (TypeError, ValueError) as exc:
        raise PolicyOutputError(f"policy 'actions' is not an array: {exc}") from exc
    if arr.dtype.kind not in "biuf":
        raise PolicyOutputError(f"policy 'actions' must be numeric, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise PolicyOutputError(f"policy 'actions' must have shape (T, D), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise PolicyOutputError("policy 'actions' contains NaN or infinite values, which JSON cannot carry")
    return arr.astype(np.float64).tolist()


def info_fields(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``GET /info``: our metadata plus the cosmos-framework field names we can fill truthfully."""
    info = json_safe(dict(metadata))
    if "action_chunk_size" not in info and isinstance(info.get("action_horizon"), int):
        info["action_chunk_size"] = info["action_horizon"]
    if "raw_action_dim" not in info and isinstance(info.get("action_dim"), int):
        info["raw_action_dim"] = info["action_dim"]  # the width of the actions we return
    return info


def json_safe(value: Any, depth: int = 0) -> Any:
    """Arrays -> lists, numpy scalars -> Python, non-finite floats -> None, unknown objects -> str."""
    if depth > 32:
        return "..."
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return json_safe(value.item(), depth + 1)
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist(), depth + 1)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v, depth + 1) for v in value), key=repr)
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
