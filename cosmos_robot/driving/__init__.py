"""Driving policies in closed loop, AlpaSim's way (issue 20): ``runtime`` drives the embedded driving
suite (``cosmos_robot_envs.driving``) through an ``EgodriverService`` driver, over gRPC or in-process."""

from cosmos_robot.driving.runtime import AlpasimLoopback, DriverCallError, LoopbackEpisode, RouteKeepingPolicy

__all__ = ["AlpasimLoopback", "DriverCallError", "LoopbackEpisode", "RouteKeepingPolicy"]
