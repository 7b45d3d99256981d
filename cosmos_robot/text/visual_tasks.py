"""Synthetic visual questions for the VLM paths: rendered shapes, counting and left / right.

Why: there is no hub here, so a VLM's learning has to be shown on data generated offline whose
answers are known by construction and need the image: "How many red shapes?" cannot be answered from
the text, nor "Is the red shape left or right of the blue one?". Scenes are small lists of shapes
(kind, colour, centre, size) drawn by PIL on a grey background at 64 px, the size the tiny Qwen3-VL's
image processor takes; a scene is JSON-serialisable, so it can travel as a task's ground truth and be
re-rendered where the image is needed. Shapes do not overlap, so every one is visible.

``QUESTIONS[name](rng) -> VisualQuestion`` (question text with the ``<image>`` placeholder of
``cosmos_robot.text.vision``, answer, scene). ``shapes_task("shapes/<name>")`` makes one a text task
(``shapes/count``, ``shapes/left_right``, ``shapes/colour``, ``shapes/mixed``: count or left / right at
random), so the text trainers
sample it and ``eval --suite text/shapes/count`` scores it like any other: the scene travels in the
example's fields (its ground truth), the image is rendered from it, and the split is decided by a hash
of question and scene (``TextExample.key``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from cosmos_robot.text.tasks import IMAGE_PLACEHOLDER, TextTask

__all__ = ["COLORS", "QUESTIONS", "SIDE", "Shape", "VisualQuestion", "random_scene", "render", "shapes_task"]

SIDE = 64
BACKGROUND = (128, 128, 128)
COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 220)}
KINDS = ("circle", "square", "triangle")


@dataclass(frozen=True)
class Shape:
    kind: str
    color: str
    x: int  # centre, pixels from the left
    y: int  # centre, pixels from the top
    radius: int


@dataclass(frozen=True)
class VisualQuestion:
    question: str  # with one IMAGE_PLACEHOLDER
    answer: str
    scene: list[dict[str, object]]  # the shapes as dicts (JSON-serialisable; Shape(**d) rebuilds them)


def _place(rng: np.random.Generator, taken: list[Shape], radius: int) -> tuple[int, int] | None:
    """A centre whose shape cannot touch any taken one (squares reach sqrt(2) r from their centre), or None."""
    for _ in range(200):
        x, y = (int(v) for v in rng.integers(radius + 1, SIDE - radius - 1, size=2))
        reach = math.ceil(math.sqrt(2) * radius)
        if all((x - s.x) ** 2 + (y - s.y) ** 2 > (reach + math.ceil(math.sqrt(2) * s.radius) + 2) ** 2 for s in taken):
            return x, y
    return None


def random_scene(rng: np.random.Generator, colors: list[str], radius: int = 5) -> list[Shape]:
    """One shape per entry of ``colors`` (random kinds and places; no two shapes touch)."""
    for _ in range(100):  # start over when a layout leaves no room for the next shape
        scene: list[Shape] = []
        for color in colors:
            spot = _place(rng, scene, radius)
            if spot is None:
                break
            scene.append(Shape(str(rng.choice(KINDS)), color, spot[0], spot[1], radius))
        else:
            return scene
    raise RuntimeError(f"no layout of {len(colors)} shapes of radius {radius} fits a {SIDE}-px image")


def render(scene: list[Shape] | list[dict[str, object]]) -> np.ndarray:
    """The scene as a (SIDE, SIDE, 3) uint8 image."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIDE, SIDE), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for item in scene:
        s = item if isinstance(item, Shape) else Shape(**item)  # type: ignore[arg-type]
        box = (s.x - s.radius, s.y - s.radius, s.x + s.radius, s.y + s.radius)
        fill = COLORS[s.color]
        if s.kind == "circle":
            draw.ellipse(box, fill=fill)
        elif s.kind == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon(
                [(s.x, s.y - s.radius), (s.x - s.radius, s.y + s.radius), (s.x + s.radius, s.y + s.radius)], fill=fill
            )
    return np.array(image, dtype=np.uint8)  # a writable copy (torch warns on read-only arrays)


def count_question(rng: np.random.Generator) -> VisualQuestion:
    """How many shapes of one colour (0-4, among up to 6 shapes)."""
    target = str(rng.choice(list(COLORS)))
    others = [c for c in COLORS if c != target]
    n_target = int(rng.integers(0, 5))
    colors = [target] * n_target + [str(rng.choice(others)) for _ in range(int(rng.integers(0, 7 - n_target)))]
    rng.shuffle(colors)
    scene = random_scene(rng, colors)
    question = f"{IMAGE_PLACEHOLDER}How many {target} shapes are there?"
    return VisualQuestion(question, str(n_target), [asdict(s) for s in scene])


def left_right_question(rng: np.random.Generator) -> VisualQuestion:
    """Whether the red shape is left or right of the blue one (centres at least 8 px apart in x; a green
    distractor or two)."""
    while True:
        scene = random_scene(rng, ["red", "blue"] + ["green"] * int(rng.integers(0, 3)))
        if abs(scene[0].x - scene[1].x) >= 8:
            break
    answer = "left" if scene[0].x < scene[1].x else "right"
    question = f"{IMAGE_PLACEHOLDER}Is the red shape left or right of the blue shape?"
    return VisualQuestion(question, answer, [asdict(s) for s in scene])


QUESTIONS: dict[str, Callable[[np.random.Generator], VisualQuestion]] = {
    "count": count_question,
    "left_right": left_right_question,
}


def colour_question(rng: np.random.Generator) -> VisualQuestion:
    """The colour of the one shape in the image (the easiest question: a tiny model's first visual skill)."""
    color = str(rng.choice(list(COLORS)))
    scene = random_scene(rng, [color], radius=int(rng.integers(5, 11)))
    return VisualQuestion(f"{IMAGE_PLACEHOLDER}What colour is the shape?", color, [asdict(s) for s in scene])


def mixed_question(rng: np.random.Generator) -> VisualQuestion:
    """A counting or a left / right question, one or the other at random."""
    return (count_question if rng.integers(0, 2) == 0 else left_right_question)(rng)


QUESTIONS["colour"] = colour_question
QUESTIONS["mixed"] = mixed_question

SHAPES_PREFIX = "shapes/"


def shapes_task(name: str) -> TextTask:
    """``shapes/<question>`` as a text task: exact-match reward, the scene in the fields, its image rendered."""
    kind = name[len(SHAPES_PREFIX) :]
    if kind not in QUESTIONS:
        raise ValueError(f"unknown visual question {name!r}; known: {', '.join(SHAPES_PREFIX + q for q in QUESTIONS)}")
    make_question = QUESTIONS[kind]

    def make(rng: np.random.Generator) -> tuple[str, str, str, dict[str, object]]:
        q = make_question(rng)
        return q.question, q.answer, q.answer, {"scene": q.scene}

    return TextTask(
        name,
        "exact_match",
        make,
        description=f"{kind} questions about a rendered {SIDE}-px image of shapes",
        render=lambda fields: [render(fields["scene"])],
    )
