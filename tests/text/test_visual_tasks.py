"""The synthetic visual questions: deterministic per seed, and their answers read back from the rendered
pixels (colour blobs counted by flood fill, left / right from the colour's mean column)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmos_robot.text.vision import IMAGE_PLACEHOLDER
from cosmos_robot.text.visual_tasks import COLORS, QUESTIONS, SIDE, render


def _blobs(image: np.ndarray, rgb: tuple[int, int, int]) -> list[np.ndarray]:
    """Connected pixel sets of exactly ``rgb`` (4-neighbour flood fill)."""
    mask = np.all(image == np.array(rgb, dtype=np.uint8), axis=-1)
    seen = np.zeros_like(mask)
    blobs = []
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if seen[y0, x0]:
            continue
        stack, pixels = [(y0, x0)], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            pixels.append((y, x))
            for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                ny, nx = y + dy, x + dx
                if 0 <= ny < SIDE and 0 <= nx < SIDE and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        if len(pixels) >= 10:  # a shape, not an anti-aliasing speck
            blobs.append(np.array(pixels))
    return blobs


@pytest.mark.parametrize("name", sorted(QUESTIONS))
def test_questions_are_deterministic_and_need_the_image(name: str) -> None:
    make = QUESTIONS[name]
    a, b = make(np.random.default_rng(5)), make(np.random.default_rng(5))
    assert a == b and a.question.count(IMAGE_PLACEHOLDER) == 1
    answers = {make(np.random.default_rng(s)).answer for s in range(200)}
    assert len(answers) >= 2  # the text alone cannot tell the answer


def test_count_answers_match_the_colour_blobs_in_the_pixels() -> None:
    for seed in range(60):
        q = QUESTIONS["count"](np.random.default_rng(seed))
        color = next(c for c in COLORS if f" {c} " in q.question)
        image = render(q.scene)
        assert image.shape == (SIDE, SIDE, 3) and image.dtype == np.uint8
        assert len(_blobs(image, COLORS[color])) == int(q.answer), (seed, q)


def test_left_right_answers_match_the_pixels() -> None:
    for seed in range(60):
        q = QUESTIONS["left_right"](np.random.default_rng(seed))
        image = render(q.scene)
        (red,), (blue,) = _blobs(image, COLORS["red"]), _blobs(image, COLORS["blue"])
        pixel_answer = "left" if red[:, 1].mean() < blue[:, 1].mean() else "right"
        assert pixel_answer == q.answer, (seed, q)


def test_colour_answers_match_the_one_blob_in_the_pixels() -> None:
    for seed in range(60):
        q = QUESTIONS["colour"](np.random.default_rng(seed))
        blobs = {c: _blobs(render(q.scene), rgb) for c, rgb in COLORS.items()}
        assert [c for c, found in blobs.items() if found] == [q.answer], (seed, q)
