"""Ego frames, lane routes and the plan tracker of the driving suite.

Why a tracker: AlpaSim's policies answer with a *planned trajectory* (ego-frame waypoints every
0.1 s), not with pedal and wheel commands; the simulator's controller follows it. highway-env's
vehicle is a kinematic bicycle driven by acceleration and steering, so :func:`track_plan` turns a plan
into those two commands each tick: pure pursuit on the plan for the steering (the bicycle's own
slip-angle relation inverted), a proportional speed loop on the plan's first-segment speed for the
acceleration.

Frames: highway-env's world has x along the road and y towards the right-hand lanes (screen
coordinates); a heading of 0 points along +x and grows clockwise on the screen. The ego frame is
AlpaSim's rig frame: the ego at the origin, x forward, y to its LEFT, yaw counter-clockwise, so a point
in the world is ``(c dx + s dy, s dx - c dy)`` from a vehicle at heading h (c, s = cos h, sin h), and a
world heading h' is the ego-frame yaw ``-(h' - h)``. Plans, routes, histories and agents are all in it,
which is what lets a policy trained on the suite drive AlpaSim through the driver unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TrackerGains", "route_points", "to_ego", "track_plan", "vectors_to_ego", "yaw_to_ego"]


def to_ego(points: np.ndarray, origin: np.ndarray, heading: float) -> np.ndarray:
    """World points (..., 2) in the rig frame (x forward, y left) of a vehicle at ``origin`` with ``heading``."""
    c, s = math.cos(heading), math.sin(heading)
    d = np.asarray(points, np.float64) - np.asarray(origin, np.float64)
    return np.stack([c * d[..., 0] + s * d[..., 1], s * d[..., 0] - c * d[..., 1]], axis=-1)


def yaw_to_ego(world_heading: float | np.ndarray, heading: float) -> float | np.ndarray:
    """A world heading as a yaw in the rig frame of a vehicle at ``heading`` (counter-clockwise, wrapped)."""
    return (-(np.asarray(world_heading, np.float64) - heading) + math.pi) % (2 * math.pi) - math.pi


def vectors_to_ego(vectors: np.ndarray, heading: float) -> np.ndarray:
    """World vectors (velocities) (..., 2) rotated into the ego frame."""
    return to_ego(vectors, np.zeros(2), heading)


def route_points(road: Any, lane_index: Any, position: np.ndarray, count: int, spacing: float) -> np.ndarray:
    """``count`` world points on the lane centre ahead of ``position`` every ``spacing`` metres,
    continuing onto the next lanes of the road network when the current one ends."""
    network = road.network
    index = lane_index
    lane = network.get_lane(index)
    s, _ = lane.local_coordinates(np.asarray(position, np.float64))
    out = np.zeros((count, 2))
    for k in range(count):
        s += spacing
        while s > lane.length:
            nxt = network.next_lane(index, position=lane.position(lane.length, 0))  # the closest, no draw
            if nxt == index or nxt is None:
                break
            s -= lane.length
            index, lane = nxt, network.get_lane(nxt)
        out[k] = lane.position(s, 0.0)
    return out


@dataclass(frozen=True)
class TrackerGains:
    lookahead_min_m: float = 6.0  # pure-pursuit look-ahead floor
    lookahead_s: float = 0.6  # ... and its growth with speed
    speed_gain: float = 3.0  # acceleration per m/s of speed error
    accel_max: float = 5.0  # highway-env's ContinuousAction acceleration range (+-)
    steer_max: float = math.pi / 4  # ... and steering range (+-)


def track_plan(plan: np.ndarray, speed: float, dt: float, length: float, gains: TrackerGains) -> np.ndarray:
    """Normalised [acceleration, steering] in [-1, 1] for highway-env from a rig-frame ``plan``
    (K, 2) whose point k is where the ego should be (k + 1) * dt from now."""
    plan = np.asarray(plan, np.float64)
    # speed: the plan's first segment (origin -> p0 -> p1), averaged over its first two steps
    first = min(2, len(plan))
    target_speed = float(np.linalg.norm(plan[first - 1])) / (first * dt)
    accel = gains.speed_gain * (target_speed - speed)
    # steering: pure pursuit on the first plan point at least the look-ahead away
    lookahead = max(gains.lookahead_min_m, gains.lookahead_s * speed)
    dist = np.linalg.norm(plan, axis=1)
    far = np.nonzero(dist >= lookahead)[0]
    x, y = plan[far[0]] if len(far) else plan[-1]
    d2 = x * x + y * y
    if d2 < 1e-6 or x <= 0:  # a plan that stays put or points backwards: brake, wheel straight
        return np.array([-1.0 if speed > 0 else 0.0, 0.0], np.float32)
    curvature = -2.0 * y / d2  # towards +y (left) is a negative, anticlockwise-on-screen turn in highway-env
    # highway-env's bicycle: yaw rate = v sin(beta) / (L / 2), beta = atan(tan(steer) / 2)
    sin_beta = float(np.clip(curvature * length / 2.0, -1.0, 1.0))
    steer = math.atan(2.0 * math.tan(math.asin(sin_beta)))
    return np.array(
        [np.clip(accel / gains.accel_max, -1.0, 1.0), np.clip(steer / gains.steer_max, -1.0, 1.0)], np.float32
    )
