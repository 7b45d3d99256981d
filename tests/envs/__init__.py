"""Tests for cosmos_robot_envs."""
