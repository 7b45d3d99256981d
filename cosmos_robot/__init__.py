"""cosmos-robot: the shared core (policies, transforms, checkpoints, config) and the CLI."""

__version__ = "0.1.0"
