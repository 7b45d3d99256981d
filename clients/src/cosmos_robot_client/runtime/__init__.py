"""Robot-side runtime loop: environment, agent and subscribers at a fixed control rate."""

from cosmos_robot_client.runtime.runtime import Agent, Environment, EpisodeStats, PolicyAgent, Runtime, Subscriber

__all__ = ["Agent", "EpisodeStats", "Environment", "PolicyAgent", "Runtime", "Subscriber"]
