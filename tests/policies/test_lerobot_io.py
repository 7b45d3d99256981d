"""``stack_images``: the served uint8 batch is stacked once and converted where it is used, with the
values of the image-by-image path bit for bit; anything else still fails naming the observation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos_robot.policies.lerobot_io import image_tensor, stack_images
from cosmos_robot_client.spec import ObservationError


def per_image(values: list[np.ndarray]) -> torch.Tensor:
    return torch.stack([image_tensor(v, "cam", i) for i, v in enumerate(values)])


def test_uint8_batch_equals_the_per_image_path_bitwise() -> None:
    rng = np.random.default_rng(0)
    values = [rng.integers(0, 256, (24, 32, 3), dtype=np.uint8) for _ in range(5)]
    values.append(np.arange(24 * 32 * 3).reshape(24, 32, 3).astype(np.uint8))  # every byte value
    got = stack_images(values, "cam")
    assert got.shape == (6, 3, 24, 32) and got.dtype == torch.float32 and got.is_contiguous()
    assert torch.equal(got, per_image(values))
    assert torch.equal(stack_images(values, "cam", "cpu"), got)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uint8_batch_converted_on_the_gpu_equals_the_host_values() -> None:
    rng = np.random.default_rng(1)
    values = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(3)]
    got = stack_images(values, "cam", "cuda")
    assert got.is_cuda and torch.equal(got.cpu(), per_image(values))


def test_other_inputs_take_the_checked_path() -> None:
    rng = np.random.default_rng(2)
    floats = [rng.uniform(0, 1, (8, 8, 3)).astype(np.float32) for _ in range(2)]
    assert torch.equal(stack_images(floats, "cam"), per_image(floats))
    chw = [rng.integers(0, 256, (3, 8, 8), dtype=np.uint8) for _ in range(2)]
    assert torch.equal(stack_images(chw, "cam"), per_image(chw))
    mixed = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), rng.integers(0, 256, (9, 8, 3), dtype=np.uint8)]
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        stack_images(mixed, "cam")  # per-image conversion, then torch's own message
    bad = [rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), rng.integers(0, 256, (8, 8), dtype=np.uint8)]
    with pytest.raises(ObservationError, match=r"observation 1: expected HxWx3 or 3xHxW, got shape \(8, 8\)"):
        stack_images(bad, "cam")
