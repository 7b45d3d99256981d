"""Every shipped recipe validates against its trainer's config: a typo or a stale field in any of them fails
here, not when a user first launches it."""

from __future__ import annotations

import pytest

from cosmos_robot.config.recipes import RECIPES_DIR
from cosmos_robot_trainers.launch import TRAINERS, load_train_recipe

RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_validates(recipe: str) -> None:
    name, config = load_train_recipe(recipe)
    assert name in TRAINERS and config.output.dir
