"""The driving expert as a servable policy: IDM and lane keeping from the observation alone.

``DrivingExpertPolicy`` reads only what a learned planner reads (``observation/state``: the ego's
recent poses and speed, the lane centre ahead and the nearest agents, all in the rig frame) and answers one
plan per request, ``actions`` of shape ``(1, 2K)``: serve it (``cosmos-robot serve --policy
cosmos_robot_envs.driving:DrivingExpertPolicy``), evaluate it (``eval --suite driving
--replan-steps 1``) or use it as a baseline. The leader is the nearest agent ahead whose lateral
distance to the lane centre is under half a lane; the plan runs along the route polyline at the IDM
speed, with the ego's offset from the lane centre decaying. It differs from the env's privileged
expert (``DrivingEnv.expert_action``, which reads highway-env's road and gives the ground truth) only
in seeing agents through the observation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_client.spec import ArraySpec, InputSpec
from cosmos_robot_envs.driving.env import DT, state_layout
from cosmos_robot_envs.driving.expert import IDMParams, idm_distances

__all__ = ["DrivingExpertPolicy", "plan_from_state"]

_HALF_LANE_M = 2.0  # highway-env lanes are 4 m wide
_IDM = IDMParams()


def _lane_y(route: np.ndarray, x: float) -> float:
    """Lateral position of the lane centre at longitudinal ``x`` (linear through the route points)."""
    xs, ys = route[:, 0], route[:, 1]
    if x <= xs[0] and len(xs) > 1 and xs[1] != xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        return float(ys[0] + slope * (x - xs[0]))
    return float(np.interp(x, xs, ys))


def plan_from_state(
    state: np.ndarray, *, history: int = 16, route_len: int = 20, agents: int = 8, plan_len: int = 20,
    params: IDMParams = _IDM,
) -> np.ndarray:  # fmt: skip
    """(plan_len, 2) rig-frame waypoints from a flat ``state`` observation (``DrivingEnv``'s layout)."""
    layout = state_layout(history, route_len, agents)
    parts = {name: np.asarray(state[sl], np.float64).reshape(shape) for name, (sl, shape) in layout.items()}
    speed = float(parts["speed"][0])
    route = parts["route"]
    offset = -_lane_y(route, 0.0)  # the ego's lateral position relative to the lane centre
    gap, leader_speed = None, 0.0
    for present, x, y, vx, _vy, _h in parts["agents"]:
        if present > 0.5 and x > 0 and abs(y - _lane_y(route, x)) < _HALF_LANE_M:
            if gap is None or x < gap:  # centre to centre, as the IDM's jam gap counts it
                gap, leader_speed = float(x), float(vx)
    # the lane centre as a polyline from abreast of the ego through the route points
    centre = np.concatenate([[[0.0, _lane_y(route, 0.0)]], route])
    seg = np.linalg.norm(np.diff(centre, axis=0), axis=1)
    arc = np.concatenate([[0.0], np.cumsum(seg)])
    travelled = idm_distances(speed, gap, leader_speed, plan_len, DT, params)
    x = np.interp(travelled, arc, centre[:, 0], right=np.nan)
    x = np.where(np.isnan(x), centre[-1, 0] + travelled - arc[-1], x)  # past the route: straight on
    y = np.interp(travelled, arc, centre[:, 1]) - offset * np.exp(
        -np.arange(1, plan_len + 1) * DT / params.lateral_tau_s
    )
    return np.column_stack([x, y]).astype(np.float32)


class DrivingExpertPolicy(BasePolicy):
    """IDM + lane keeping from ``observation/state``; one plan per request, as ``actions`` (1, 2K)."""

    cheap_inference = True

    def __init__(self, history: int = 16, route_len: int = 20, agents: int = 8, plan_len: int = 20) -> None:
        self.history, self.route_len, self.agents, self.plan_len = history, route_len, agents, plan_len
        layout = state_layout(history, route_len, agents)
        self.state_dim = max(sl.stop for sl, _ in layout.values())

    @property
    def input_spec(self) -> InputSpec:
        return InputSpec({"observation/state": ArraySpec((self.state_dim,), "floating")}, allow_extra=False)

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        state = np.asarray(obs["observation/state"], np.float32)
        if state.shape != (self.state_dim,):
            raise ValueError(f"observation/state: expected shape ({self.state_dim},), got {state.shape}")
        plan = plan_from_state(
            state, history=self.history, route_len=self.route_len, agents=self.agents, plan_len=self.plan_len
        )
        return {"actions": plan.reshape(1, -1)}
