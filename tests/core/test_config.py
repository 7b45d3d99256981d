"""Recipes and overrides: every mistake names the field and suggests the close match."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos_robot.config import ConfigError, StrictModel, apply_overrides, find_recipe, load_recipe, parse_override


class Optim(StrictModel):
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)


class Train(StrictModel):
    steps: int = 10
    tasks: list[str] = ["reach"]
    optim: Optim = Optim()


class Recipe(StrictModel):
    name: str
    train: Train = Train()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text)
    return path


def test_load_with_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "x"\n[train]\nsteps = 5\n')
    cfg = load_recipe(path, ["train.optim.lr=3e-4", 'train.tasks=["push", "reach"]', "name=bare_word"], Recipe)
    assert cfg.train.steps == 5 and cfg.train.optim.lr == 3e-4
    assert cfg.train.tasks == ["push", "reach"] and cfg.name == "bare_word"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.stepz=3"], r"train\.stepz: unknown field; did you mean 'train\.steps'\?"),
        (["train.optim.lr=abc"], r"train\.optim\.lr: Input should be a valid number"),
        (["trian.steps=3"], r"trian: unknown field; did you mean 'train'\?"),
        (["train.steps.x=1"], r"train\.steps: Input should be a valid integer"),
        (["novalue"], "expected KEY=VALUE"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, overrides: list[str], message: str) -> None:
    path = write(tmp_path, 'name = "x"\n')
    with pytest.raises(ConfigError, match=message):
        load_recipe(path, overrides, Recipe)


def test_missing_required_field_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="name: Field required"):
        load_recipe(write(tmp_path, "[train]\nsteps = 1\n"), [], Recipe)
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_recipe(write(tmp_path, "name = \n"), [], Recipe)


def test_find_recipe_by_name_with_did_you_mean(tmp_path: Path) -> None:
    (tmp_path / "debug.toml").write_text('name = "d"\n')
    assert find_recipe("debug", tmp_path) == tmp_path / "debug.toml"
    assert find_recipe("debug.toml", tmp_path) == tmp_path / "debug.toml"
    with pytest.raises(ConfigError, match="did you mean 'debug'"):
        find_recipe("debgu", tmp_path)


def test_parse_and_apply_overrides_do_not_mutate() -> None:
    assert parse_override("a.b=1") == (["a", "b"], 1)
    assert parse_override("a=true") == (["a"], True)
    base = {"a": {"b": 1}}
    assert apply_overrides(base, ["a.c=2"]) == {"a": {"b": 1, "c": 2}} and base == {"a": {"b": 1}}


def test_override_through_a_value_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "x"\n[train]\nsteps = 5\n')
    with pytest.raises(ConfigError, match=r"train\.steps is a value \(5\), not a table"):
        load_recipe(path, ["train.steps.x=1"], Recipe)
