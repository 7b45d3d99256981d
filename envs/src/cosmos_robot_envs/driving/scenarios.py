"""The driving suite's scenarios: highway-env environments configured for 10 Hz plan tracking.

Each scenario is a highway-env environment class and the configuration changes that make it an
AlpaSim-style world: continuous acceleration + steering (what the tracker commands), the policy and
the simulation both at 10 Hz (one tick = one 0.1 s plan step), no episode end of its own before the
suite's horizon, and traffic of highway-env's IDM/MOBIL vehicles.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCENARIOS", "make_scenario"]

_COMMON: dict[str, Any] = {
    "action": {"type": "ContinuousAction"},
    # the wrapper reads the road itself; highway-env's own observation is unused, and its Kinematics
    # type (a pandas frame per step) cost 40% of a step: an empty attribute list computes nothing
    "observation": {"type": "AttributesObservation", "attributes": []},
    "policy_frequency": 10,
    "simulation_frequency": 10,
    "offroad_terminal": False,
}

# name -> (highway-env class name, configuration on top of _COMMON)
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "highway": ("HighwayEnv", {"lanes_count": 4, "vehicles_count": 30, "vehicles_density": 1.0}),
    "highway_dense": ("HighwayEnv", {"lanes_count": 3, "vehicles_count": 40, "vehicles_density": 1.6}),
    "merge": ("MergeEnv", {}),
}


def make_scenario(name: str, duration_s: float, *, fast_road: bool = True) -> Any:
    """A fresh highway-env environment of scenario ``name`` (rgb_array rendering available). With
    ``fast_road`` the highway scenarios' traffic (30-40 vehicles) steps through ``FastRoad``
    (fast_road.py: the same traffic, 1.5-1.8x the ticks/s); merge's ~10 vehicles, where the numpy
    set-up costs more than it saves, and ``fast_road=False`` use highway-env's own ``Road``."""
    import highway_env.envs as envs

    cls_name, extra = SCENARIOS[name]
    config = {**_COMMON, **extra}
    if cls_name == "HighwayEnv":
        config["duration"] = duration_s + 1.0  # the suite's horizon ends the episode, not highway-env's
    cls = getattr(envs, cls_name)
    if cls_name == "MergeEnv":
        cls = _continuous_merge(cls)
    if fast_road and cls_name == "HighwayEnv":
        from cosmos_robot_envs.driving.fast_road import use_fast_road

        cls = use_fast_road(cls)
    return cls(config=config, render_mode="rgb_array")


def _continuous_merge(base: type) -> type:
    """highway-env's MergeEnv scores a lane-change term with ``action in [0, 2]``, which only works for its
    discrete actions (an array action raises); the suite does not use highway-env's reward, so the
    term is computed as for "keep lane" (1)."""

    class ContinuousMergeEnv(base):
        def _rewards(self, action: Any) -> dict[str, float]:
            return super()._rewards(1)

    return ContinuousMergeEnv
