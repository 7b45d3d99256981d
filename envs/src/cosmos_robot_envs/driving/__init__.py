"""The embedded driving suite: highway-env behind AlpaSim's boundary (issue 20).

``DrivingEnv`` takes planned trajectories (ego-frame waypoints every 0.1 s) and returns the scene in
the ego frame with AlpaGym's metrics (progress, collision, off-road, distance to the expert's replay).
Importing this package registers ``CosmosRobot/Driving-v0``; highway-env itself is imported only when
an environment is made.
"""

from cosmos_robot_envs.driving.env import DT, OBS_MODES, REWARD_PRESETS, DrivingEnv
from cosmos_robot_envs.driving.expert import IDMParams, expert_plan
from cosmos_robot_envs.driving.expert_policy import DrivingExpertPolicy, plan_from_state
from cosmos_robot_envs.driving.scenarios import SCENARIOS

ENV_ID = "CosmosRobot/Driving-v0"


def register_driving_env() -> None:
    import gymnasium as gym

    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="cosmos_robot_envs.driving.env:DrivingEnv")


register_driving_env()

__all__ = [
    "DT",
    "ENV_ID",
    "OBS_MODES",
    "REWARD_PRESETS",
    "SCENARIOS",
    "DrivingEnv",
    "DrivingExpertPolicy",
    "IDMParams",
    "expert_plan",
    "plan_from_state",
    "register_driving_env",
]
