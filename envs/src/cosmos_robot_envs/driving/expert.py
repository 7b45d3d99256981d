"""The driving suite's scripted expert: IDM car following and lane keeping, answered as a plan.

It gives demonstrations (SFT), the ground truth of ``dist_to_gt`` (its replay of the same seed) and a
servable baseline. Each tick it plans K ego-frame waypoints 0.1 s apart: speed from the Intelligent
Driver Model against the leader in its lane (the leader predicted at constant speed), position along
the lane centre with the lateral offset decaying over ``lateral_tau_s``. Parameters follow
highway-env's own IDM vehicles (comfort 3 / -5 m/s^2, 1.5 s time gap, 5 m plus a car length jam gap).
It never changes lanes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cosmos_robot_envs.driving.geometry import to_ego

__all__ = ["IDMParams", "expert_plan", "idm_accel", "idm_distances"]


@dataclass(frozen=True)
class IDMParams:
    target_speed: float = 28.0  # m/s (highway-env's reward speed range is 20-30)
    accel_max: float = 3.0
    decel_comfort: float = 5.0
    time_gap_s: float = 1.5
    jam_gap_m: float = 10.0  # centre to centre: 5 m plus a 5 m car length, as highway-env's IDM vehicles
    delta: float = 4.0
    lateral_tau_s: float = 1.0


def idm_accel(speed: float, gap: float | None, leader_speed: float, p: IDMParams) -> float:
    free = 1.0 - (max(speed, 0.0) / p.target_speed) ** p.delta
    if gap is None:
        return p.accel_max * free
    desired = p.jam_gap_m + max(speed, 0.0) * p.time_gap_s
    desired += speed * (speed - leader_speed) / (2.0 * math.sqrt(p.accel_max * p.decel_comfort))
    return p.accel_max * (free - (max(desired, 0.0) / max(gap, 1e-3)) ** 2)


def _leader(road: Any, ego: Any) -> tuple[float | None, float]:
    """(centre-to-centre gap along the lane, speed) of the nearest vehicle ahead in the ego's lane, as
    highway-env's IDM measures it (its jam gap includes a car length); (None, 0) when there is none."""
    front, _ = road.neighbour_vehicles(ego, ego.lane_index)
    if front is None:
        return None, 0.0
    return float(ego.lane_distance_to(front)), float(front.speed)


def expert_plan(road: Any, ego: Any, horizon: int, dt: float, p: IDMParams = IDMParams()) -> np.ndarray:
    """(horizon, 2) ego-frame waypoints: where the expert wants the ego at dt, 2 dt, ... from now."""
    lane = road.network.get_lane(ego.lane_index)
    s, d = lane.local_coordinates(np.asarray(ego.position, np.float64))
    gap, leader_speed = _leader(road, ego)
    travelled = idm_distances(float(ego.speed), gap, leader_speed, horizon, dt, p)
    decay = np.exp(-np.arange(1, horizon + 1) * dt / p.lateral_tau_s)
    world = np.stack([lane.position(s + t, d * f) for t, f in zip(travelled, decay)])
    return to_ego(world, np.asarray(ego.position), float(ego.heading)).astype(np.float32)


def idm_distances(
    speed: float, gap: float | None, leader_speed: float, horizon: int, dt: float, p: IDMParams
) -> np.ndarray:
    """Distance travelled after 1..horizon steps of ``dt`` under IDM behind a constant-speed leader
    (``gap`` centre to centre; None: a free road). Both experts plan along their lane with it."""
    out = np.zeros(horizon)
    travelled = 0.0
    for k in range(horizon):
        accel = float(np.clip(idm_accel(speed, gap, leader_speed, p), -p.decel_comfort * 2, p.accel_max))
        new_speed = max(0.0, speed + accel * dt)
        travelled += 0.5 * (speed + new_speed) * dt
        if gap is not None:
            gap += (leader_speed - 0.5 * (speed + new_speed)) * dt
        speed = new_speed
        out[k] = travelled
    return out
