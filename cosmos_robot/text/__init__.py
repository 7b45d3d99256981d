"""Text post-training core: HF causal-LM folders, chat tokenization, packing, text tasks and rollout engines.

Why it lives beside the robot policies: the trainers (``cosmos_robot_trainers.text``), the ``eval``
command (``--suite text/<task>``) and the exporters all need the same pieces (load a real HF folder
offline, turn a conversation into ids with an assistant-only mask, pack sequences, sample
completions with per-token log-probs, score them), exactly as they share the flow policy's.
Everything here imports ``transformers`` lazily where it can, so ``import cosmos_robot`` stays light.
"""

from __future__ import annotations

__all__: list[str] = []
