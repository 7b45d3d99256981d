"""Input specs: every mismatch is reported with the key, the expected and the actual value."""

from __future__ import annotations

import numpy as np
import pytest

from cosmos_robot_client.spec import ArraySpec, InputSpec, ObservationError, TextSpec

SPEC = InputSpec(
    {
        "observation/image": ArraySpec((224, 224, 3), "uint8"),
        "observation/state": ArraySpec((8,), "floating"),
        "observation/extra": ArraySpec((None, 2), "number", optional=True),
        "prompt": TextSpec(),
    }
)


def good() -> dict[str, object]:
    return {
        "observation/image": np.zeros((224, 224, 3), np.uint8),
        "observation/state": np.zeros(8, np.float64),
        "prompt": "go",
    }


def test_valid_observation_passes_and_families_match() -> None:
    SPEC.validate(good())
    obs = good() | {"observation/state": np.zeros(8, np.float32), "observation/extra": np.zeros((5, 2), np.int16)}
    SPEC.validate(obs)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"observation/image": np.zeros((224, 224), np.uint8)},
            r"observation/image: expected shape \(224, 224, 3\), got \(224, 224\)",
        ),
        (
            {"observation/image": np.zeros((224, 224, 3), np.float32)},
            "observation/image: expected dtype uint8, got float32",
        ),
        ({"observation/state": np.zeros(8, np.int32)}, "observation/state: expected dtype floating, got int32"),
        ({"observation/state": [0.0] * 8}, "observation/state: expected an array of shape \\(8,\\) floating, got list"),
        ({"prompt": 3}, "prompt: expected a string, got int"),
        ({"observation/extra": np.zeros((5, 3))}, r"observation/extra: expected shape \(\*, 2\), got \(5, 3\)"),
        ({"observation/imagee": np.zeros(1)}, "observation/imagee: unknown key; did you mean 'observation/image'"),
    ],
)
def test_errors_name_key_expected_and_actual(change: dict[str, object], message: str) -> None:
    with pytest.raises(ObservationError, match=message) as info:
        SPEC.validate(good() | change)
    assert info.value.key in message


def test_missing_key_and_non_map() -> None:
    obs = good()
    del obs["prompt"]
    with pytest.raises(ObservationError, match="prompt: missing required key"):
        SPEC.validate(obs)
    with pytest.raises(ObservationError, match="expected a map"):
        SPEC.validate([1, 2])


def test_round_trip_through_metadata_and_example() -> None:
    again = InputSpec.from_dict(SPEC.to_dict())
    assert again.to_dict() == SPEC.to_dict()
    example = again.example()
    again.validate(example)
    assert example["observation/image"].dtype == np.uint8
    with pytest.raises(ValueError, match="kind"):
        InputSpec.from_dict({"x": {"kind": "blob"}})
    with pytest.raises(ValueError, match="unknown dtype"):
        ArraySpec((1,), "nonsense")


def test_alternative_shapes_accept_a_scalar_gripper() -> None:
    """DROID clients send the gripper as (1,) or as a 0-D scalar; a spec with ``alt_shapes`` takes both."""
    grip = ArraySpec((1,), "number", alt_shapes=((),))
    for value in (np.array([0.5], np.float32), np.float32(0.5), np.array(0.5), 0.5):
        grip.check("observation/gripper_position", value)
    with pytest.raises(ObservationError, match=r"observation/gripper_position: expected shape \(1,\) or \(\), got"):
        grip.check("observation/gripper_position", np.zeros((2, 2)))
    with pytest.raises(ObservationError, match="expected an array"):
        ArraySpec((1,)).check("g", 0.5)  # a bare number only where a scalar shape is accepted
    spec = InputSpec({"g": grip})
    again = InputSpec.from_dict(spec.to_dict())
    assert again.fields["g"] == grip and spec.to_dict()["g"]["alt_shapes"] == [[]]
    assert "alt_shapes" not in SPEC.to_dict()["observation/image"]  # unchanged announcement for the rest


def test_layouts_require_exactly_one_complete_key_set() -> None:
    img = ArraySpec((None, None, 3), "uint8", optional=True)
    spec = InputSpec({"a": img, "b": img, "canvas": img, "prompt": TextSpec()}, layouts=(("a", "b"), ("canvas",)))
    pic = np.zeros((4, 4, 3), np.uint8)
    spec.validate({"a": pic, "b": pic, "prompt": "x"})
    spec.validate({"canvas": pic, "prompt": "x"})
    with pytest.raises(ObservationError, match=r"^b: missing required key \(send all keys of one layout"):
        spec.validate({"a": pic, "prompt": "x"})
    with pytest.raises(ObservationError, match="^a: missing required key"):
        spec.validate({"prompt": "x"})
    with pytest.raises(ObservationError, match="^a: mixes two layouts"):
        spec.validate({"a": pic, "canvas": pic, "prompt": "x"})


def test_example_takes_the_first_layout_and_sized_images() -> None:
    """With layouts (RoboLab's three views or one composed canvas) the example is one complete
    layout, and free image dimensions get a real image size."""
    spec = InputSpec(
        {
            "observation/exterior": ArraySpec((None, None, 3), "uint8", optional=True),
            "observation/wrist": ArraySpec((None, None, 3), "uint8", optional=True),
            "observation/image": ArraySpec((None, None, 3), "uint8", optional=True),
            "observation/state": ArraySpec((None,), "floating"),
            "prompt": TextSpec(),
        },
        layouts=(("observation/exterior", "observation/wrist"), ("observation/image",)),
    )
    example = spec.example(image_size=96)
    spec.validate(example)
    assert "observation/image" not in example and example["observation/wrist"].shape == (96, 96, 3)
    assert example["observation/state"].shape == (1,) and example["prompt"]
