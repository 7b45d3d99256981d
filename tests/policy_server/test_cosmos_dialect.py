"""The cosmos-framework LIBERO JSON dialect conversion, without sockets."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from cosmos_robot_client.spec import ArraySpec, InputSpec, TextSpec
from cosmos_robot_server import cosmos_dialect
from cosmos_robot_server.batcher import PolicyError
from cosmos_robot_server.core import RequestError
from cosmos_robot_server.cosmos_dialect import (
    CosmosRequest,
    DialectError,
    action_list,
    decode_image,
    info_fields,
    json_safe,
    parse_batch,
    parse_request,
    to_observation,
)
from cosmos_robot_server.example_policies import libero_input_spec


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def noise_png() -> tuple[np.ndarray, bytes]:
    """A noise image whose PNG needs padding and whose base64 uses '+' and '/' (exercises every variant)."""
    rng = np.random.default_rng(0)
    for height in range(16, 40):
        arr = rng.integers(0, 256, (height, 20, 3), dtype=np.uint8)
        data = png_bytes(arr)
        text = base64.b64encode(data).decode()
        if len(data) % 3 and "+" in text and "/" in text:
            return arr, data
    raise AssertionError("no suitable noise image found")


def two_view(height: int = 256) -> np.ndarray:
    """agentview (red) | wrist (blue), side by side as the cosmos LIBERO client sends them."""
    img = np.zeros((height, 2 * height, 3), np.uint8)
    img[:, :height] = (200, 10, 10)
    img[:, height:] = (10, 10, 200)
    return img


def request(image: np.ndarray, **over: object) -> CosmosRequest:
    fields: dict[str, object] = {"prompt": "pick up the bowl", "domain_name": "libero", "image_size": 256}
    fields.update(over)
    return CosmosRequest(image=image, **fields)  # type: ignore[arg-type]


def libero_spec_without_state(size: int = 224) -> InputSpec:
    fields = dict(libero_input_spec(size).fields)
    fields["observation/state"] = ArraySpec((8,), "floating", optional=True)
    return InputSpec(fields)


# -- images ------------------------------------------------------------------------------------
def test_decode_image_accepts_every_base64_variant() -> None:
    arr, data = noise_png()
    std = base64.b64encode(data).decode()
    assert std.endswith("=")
    variants = {
        "standard": std,
        "data_url": "data:image/png;base64," + std,
        "urlsafe": base64.urlsafe_b64encode(data).decode(),
        "no_padding": std.rstrip("="),
        "urlsafe_no_padding": base64.urlsafe_b64encode(data).decode().rstrip("="),
        "whitespace": "\n".join(std[i : i + 60] for i in range(0, len(std), 60)) + "\n",
    }
    for name, text in variants.items():
        out = decode_image(text)
        assert out.dtype == np.uint8 and out.shape == arr.shape, name
        np.testing.assert_array_equal(out, arr, err_msg=name)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P"])
def test_decode_image_converts_to_rgb(mode: str) -> None:
    img = Image.new(mode, (8, 4))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    out = decode_image(base64.b64encode(buf.getvalue()).decode())
    assert out.shape == (4, 8, 3) and out.dtype == np.uint8


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty image"),
        ("a", "not valid base64"),
        ("****", "not valid base64"),
        (base64.b64encode(b"definitely not a png").decode(), "not a decodable image"),
        ("data:image/png,abcd", "data URL"),
        (base64.b64encode(png_bytes(np.zeros((4, 4, 3), np.uint8))[:40]).decode(), "not a decodable image"),
    ],
)
def test_decode_image_errors_name_the_field(text: str, expected: str) -> None:
    with pytest.raises(DialectError) as info:
        decode_image(text, "items[2].image")
    assert info.value.field == "items[2].image" and info.value.status == 400
    assert str(info.value).startswith("items[2].image: ") and expected in str(info.value)


def test_decode_image_refuses_huge_images(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cosmos_dialect, "MAX_PIXELS", 100)
    with pytest.raises(DialectError, match=r"image: \d+x20 \(HxW\) exceeds the limit of 100 pixels"):
        decode_image(base64.b64encode(noise_png()[1]).decode())


# -- request fields ----------------------------------------------------------------------------
def valid_body() -> dict[str, object]:
    data = png_bytes(two_view(8))
    return {"image": base64.b64encode(data).decode(), "prompt": "p", "domain_name": "libero", "image_size": 8}


def test_parse_request_reads_every_field() -> None:
    req = parse_request(valid_body())
    assert req.image.shape == (8, 16, 3) and req.prompt == "p" and req.domain_name == "libero"
    assert req.image_size == 8


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"image": None}, "image: missing required field"),
        ({"prompt": None}, "prompt: missing required field"),
        ({"domain_name": None}, "domain_name: missing required field"),
        ({"image_size": None}, "image_size: missing required field"),
        ({"image": 5}, "image: expected a string, got integer"),
        ({"prompt": ["a"]}, "prompt: expected a string, got array"),
        ({"domain_name": {}}, "domain_name: expected a string, got object"),
        ({"image_size": "256"}, "image_size: expected an integer, got string"),
        ({"image_size": 256.0}, "image_size: expected an integer, got number"),
        ({"image_size": True}, "image_size: expected an integer, got boolean"),
        ({"image_size": 0}, "image_size: must be > 0, got 0"),
        ({"image_size": -3}, "image_size: must be > 0, got -3"),
    ],
)
def test_parse_request_errors_name_the_field(change: dict[str, object], expected: str) -> None:
    body = valid_body()
    for key, value in change.items():
        if value is None:
            del body[key]
        else:
            body[key] = value
    with pytest.raises(DialectError) as info:
        parse_request(body)
    assert str(info.value) == expected


def test_parse_request_rejects_non_objects() -> None:
    with pytest.raises(RequestError, match="request body: must be a JSON object, got array"):
        parse_request([1, 2])


def test_parse_batch_names_the_item() -> None:
    good = valid_body()
    assert len(parse_batch({"items": [good, good]})) == 2
    bad = dict(good)
    del bad["prompt"]
    with pytest.raises(DialectError, match=r"^items\[1\]\.prompt: missing required field$"):
        parse_batch({"items": [good, bad]})
    with pytest.raises(RequestError, match=r"items\[0\]: must be a JSON object, got string"):
        parse_batch({"items": ["x"]})
    for body, expected in (
        ({}, "items: missing required field"),
        ({"items": []}, "items: must not be empty"),
        ({"items": {"a": 1}}, "items: expected a list of request objects, got object"),
        ([good], "request body: must be a JSON object, got array"),
    ):
        with pytest.raises(RequestError) as info:
            parse_batch(body)
        assert str(info.value) == expected


# -- conversion to our observation convention --------------------------------------------------
def test_split_and_resize_to_the_spec() -> None:
    obs = to_observation(request(two_view(256)), libero_spec_without_state(224))
    assert set(obs) == {"observation/image", "observation/wrist_image", "prompt"}  # spec has no domain_name
    for key, colour in (("observation/image", (200, 10, 10)), ("observation/wrist_image", (10, 10, 200))):
        assert obs[key].shape == (224, 224, 3) and obs[key].dtype == np.uint8
        assert (obs[key] == colour).all(), key
    libero_spec_without_state(224).validate(obs)


def test_split_without_resize_keeps_pixels_exact() -> None:
    img = np.random.default_rng(1).integers(0, 256, (32, 64, 3), dtype=np.uint8)
    obs = to_observation(request(img), libero_spec_without_state(32))
    np.testing.assert_array_equal(obs["observation/image"], img[:, :32])
    np.testing.assert_array_equal(obs["observation/wrist_image"], img[:, 32:])
    assert obs["observation/image"].flags.c_contiguous


def test_no_spec_sends_one_image_and_every_field() -> None:
    img = two_view(16)
    obs = to_observation(request(img), None)
    assert set(obs) == {"observation/image", "prompt", "domain_name", "image_size"}
    np.testing.assert_array_equal(obs["observation/image"], img)
    assert obs["domain_name"] == "libero" and obs["image_size"] == 256


def test_single_camera_spec_takes_the_whole_square_image() -> None:
    spec = InputSpec({"observation/image": ArraySpec((64, 64, 3), "uint8"), "prompt": TextSpec()}, allow_extra=True)
    obs = to_observation(request(np.full((128, 128, 3), 7, np.uint8)), spec)
    assert obs["observation/image"].shape == (64, 64, 3) and "observation/wrist_image" not in obs
    assert obs["domain_name"] == "libero" and obs["image_size"] == 256  # allow_extra lets them through


def test_spec_declared_extra_fields_get_the_declared_types() -> None:
    spec = InputSpec(
        {
            "observation/image": ArraySpec((None, None, 3), "uint8"),
            "prompt": TextSpec(),
            "domain_name": TextSpec(),
            "image_size": ArraySpec((), "integer"),
        }
    )
    obs = to_observation(request(np.zeros((10, 30, 3), np.uint8)), spec)
    spec.validate(obs)
    assert obs["observation/image"].shape == (10, 30, 3)  # free dims: no resize


def test_aspect_mismatch_is_refused_not_distorted() -> None:
    spec = InputSpec({"observation/image": ArraySpec((224, 224, 3), "uint8"), "prompt": TextSpec()})
    with pytest.raises(DialectError, match=r"image: observation/image would be 256x512 \(HxW\).*224x224"):
        to_observation(request(two_view(256)), spec)


def test_missing_wrist_view_is_explained() -> None:
    with pytest.raises(RequestError, match=r"observation/wrist_image: required .* width == 2 \* height.*256x256"):
        to_observation(request(np.zeros((256, 256, 3), np.uint8)), libero_spec_without_state())


def test_required_state_is_explained() -> None:
    with pytest.raises(RequestError, match=r"observation/state: required by the policy's input spec, but .* only"):
        to_observation(request(two_view(224)), libero_input_spec(224))


# -- responses ---------------------------------------------------------------------------------
def test_action_list_is_nested_floats() -> None:
    out = action_list({"actions": np.arange(6, dtype=np.float32).reshape(3, 2) / 4})
    assert out == [[0.0, 0.25], [0.5, 0.75], [1.0, 1.25]]
    assert all(type(v) is float for row in out for v in row)
    assert json.loads(json.dumps(out)) == out
    assert action_list({"actions": [[1, 2]]}) == [[1.0, 2.0]]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"action": [[1.0]]}, "no 'actions'"),
        ({"actions": np.zeros(7)}, r"shape \(T, D\), got \(7,\)"),
        ({"actions": np.zeros((1, 2, 3))}, r"got \(1, 2, 3\)"),
        ({"actions": np.array([[np.nan, 0.0]])}, "NaN or infinite"),
        ({"actions": np.array([["a"]])}, "numeric"),
        ({"actions": [[1.0], [1.0, 2.0]]}, "not an array"),
    ],
)
def test_action_list_blames_the_policy(result: dict[str, object], expected: str) -> None:
    with pytest.raises(PolicyError, match=expected):
        action_list(result)


def test_info_fields_fill_cosmos_names_without_inventing() -> None:
    info = info_fields({"action_horizon": np.int64(16), "action_dim": 10, "stats": np.array([0.5, np.inf])})
    assert info["action_chunk_size"] == 16 and info["raw_action_dim"] == 10
    assert info["stats"] == [0.5, None]
    assert "max_action_dim" not in info and "fps" not in info
    assert "action_chunk_size" not in info_fields({"policy": "x"})
    assert info_fields({"action_horizon": 16, "action_chunk_size": 8})["action_chunk_size"] == 8
    json.dumps(info, allow_nan=False)


def test_json_safe_handles_numpy_and_odd_objects() -> None:
    value = {1: (np.float32(0.5), {"a", "b"}), "b": b"xyz", "o": object, "n": float("nan")}
    safe = json_safe(value)
    assert safe["1"] == [0.5, ["a", "b"]] and safe["b"] == "<3 bytes>" and safe["n"] is None
    assert isinstance(safe["o"], str)
    json.dumps(safe, allow_nan=False)
