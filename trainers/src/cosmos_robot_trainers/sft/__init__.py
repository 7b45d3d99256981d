"""Supervised fine-tuning (flow-matching behaviour cloning) of the embedded flow policy.

``SFTConfig`` is the recipe schema (``recipes/sft_flow_tabletop.toml``, ``recipes/debug.toml``);
``run_sft(config)`` trains, checkpoints, resumes exactly and exports ``final/`` as a ``FlowPolicy``
folder. ``cosmos-robot train RECIPE`` is the command-line entry.
"""

from cosmos_robot_trainers.sft.config import SFTConfig
from cosmos_robot_trainers.sft.trainer import SFTResult, run_sft

__all__ = ["SFTConfig", "SFTResult", "run_sft"]
