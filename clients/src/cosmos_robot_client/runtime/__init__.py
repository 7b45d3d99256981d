"""Robot-side runtime loop: environment, agent and subscribers at a fixed control rate."""

from cosmos_robot_client.action_chunk_broker import NonFiniteActionError
from cosmos_robot_client.runtime.runtime import Agent, Environment, EpisodeStats, PolicyAgent, Runtime, Subscriber

__all__ = ["Agent", "EpisodeStats", "Environment", "NonFiniteActionError", "PolicyAgent", "Runtime", "Subscriber"]
