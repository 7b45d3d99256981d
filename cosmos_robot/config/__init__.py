"""One config system: pydantic models (``extra="forbid"``) loaded from TOML recipes with overrides.

Why: a typo in a recipe or in ``--set`` must fail before a long run starts, naming the field and
offering the close match; a recipe is a complete, named, frozen description of one launch.
"""

from cosmos_robot.config.base import ConfigError, StrictModel, format_validation_error
from cosmos_robot.config.recipes import apply_overrides, find_recipe, load_recipe, parse_override

__all__ = [
    "ConfigError",
    "StrictModel",
    "apply_overrides",
    "find_recipe",
    "format_validation_error",
    "load_recipe",
    "parse_override",
]
