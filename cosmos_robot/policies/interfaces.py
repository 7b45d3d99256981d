"""The typed seams between a policy family and the trainers: ``RLModel`` and ``RLAdapter``.

Why here, in the core: every family (flow, pi05, groot, and the ones to come) implements these in its
own package (``cosmos_robot/policies/<family>/rl.py``), the family registry hands them out, and the RL
trainer drives them without knowing which family it holds. Nothing in the trainers compares family
names; a new family subclasses these two and adds one registry entry.

- ``RLModel``: the ``nn.Module`` the shared flow samplers (``flow.sampling``) and the RL learner drive:
  ``encode`` an observation batch into an opaque context, the action expert's velocity at per-sample
  flow times (``expert`` / ``velocity``), the critic (``value``), the Flow-Noise head (``noise_std``)
  and the flow-time draw of the family's training recipe (``sample_time``). Its ``config`` carries the
  sampler-facing sizes (``FlowSizes``); the critic's parameters live under ``value_head.``.
- ``RLAdapter``: a checkpoint folder of that family made trainable: the ``RLModel``, the tensors stored
  per decision from openpi-style wire observations (the rollout and the learner encode exactly these,
  so the first-minibatch ratio is 1), model-space chunks to env units, and the serving policy that
  owns a copy of the trained weights (evaluations, ``final/``); optionally a demonstration dataset as
  the same model inputs and model-space chunks (``Demonstrations``: demonstration-augmented RL).

Contexts stay ``Any`` on purpose: each family's context (a tensor, a prefix KV cache, ...) is only ever
handed back to the same model.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from cosmos_robot_client.base_policy import BatchPolicy

__all__ = ["Demonstrations", "FlowSizes", "ModelInputs", "RLAdapter", "RLModel"]

P = TypeVar("P", bound=BatchPolicy)

# what an adapter stores per decision: tensors with first dim = decisions, or lists (prompts)
ModelInputs = dict[str, torch.Tensor | list[str]]


@dataclass
class Demonstrations:
    """A demonstration dataset as the RL learner sees its own decisions: ``inputs`` what ``model.encode``
    takes (what ``RLAdapter.model_inputs`` stores per decision), ``chunks`` the demonstrated action
    chunks in model space (normalised, the model's padded width), ``pad`` the rows past an episode's end
    (no target), ``prompts`` each frame's instruction (to sample the tasks equally)."""

    inputs: ModelInputs  # first dim = frames
    chunks: torch.Tensor  # (N, chunk_size, action_dim) float32, model space
    pad: torch.Tensor  # (N, chunk_size) bool, True past the episode's end
    prompts: list[str]  # (N,)
    episode: torch.Tensor  # (N,) int64: the recording's episode index of each frame

    def __len__(self) -> int:
        return int(self.chunks.shape[0])

    @property
    def num_episodes(self) -> int:
        return len(torch.unique(self.episode))


class FlowSizes(Protocol):
    """The sizes the shared flow samplers read from ``model.config`` (``FlowConfig``, ``FlowSpec``)."""

    @property
    def chunk_size(self) -> int: ...  # rows of the denoised chunk

    @property
    def action_dim(self) -> int: ...  # width of the chunk (padded width for LeRobot families)

    @property
    def num_flow_steps(self) -> int: ...

    @property
    def noise_level(self) -> float: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any: ...


class RLModel(nn.Module, abc.ABC):
    """A flow policy's trainable module behind the samplers' and learner's interface (module docstring)."""

    config: FlowSizes

    @abc.abstractmethod
    def encode(self, batch: Mapping[str, Any]) -> Any:
        """An opaque, batch-first context from stored model inputs (``RLAdapter.model_inputs``)."""

    @abc.abstractmethod
    def expert(self, x: torch.Tensor, t: torch.Tensor, context: Any) -> tuple[torch.Tensor, Any]:
        """``(velocity, features for noise_std)`` at noisy chunks ``x`` and per-sample times ``t``."""

    @abc.abstractmethod
    def velocity(self, x_t: torch.Tensor, t: torch.Tensor | float, context: Any) -> torch.Tensor:
        """The flow velocity alone (SFT / NFT / DPO losses)."""

    @abc.abstractmethod
    def value(self, context: Any, detach: bool = False) -> torch.Tensor:
        """``(B,)`` critic values; ``detach`` keeps the critic's gradient out of the trunk."""

    @abc.abstractmethod
    def noise_std(self, features: Any) -> torch.Tensor:
        """Flow-Noise's learned std; families without a noise head raise a ``ValueError`` saying so."""

    @abc.abstractmethod
    def sample_time(self, n: int, generator: torch.Generator | None = None, device: Any = None) -> torch.Tensor:
        """``(n,)`` flow times from the family's training distribution."""

    def set_num_flow_steps(self, steps: int) -> None:
        """Sample (and so train, evaluate and export) with ``steps`` denoising steps."""
        self.config = self.config.model_copy(update={"num_flow_steps": steps})


class RLAdapter(abc.ABC):
    """One checkpoint folder made trainable by the RL trainer (module docstring)."""

    model: RLModel
    action_dims: int  # executed action dims (log-probs cover these, never padding)
    reads_images: bool = True  # the policy reads camera images (False: a camera-free policy; envs skip rendering)
    reads_object_state: bool = False  # the policy reads the simulator's object_state vector

    @abc.abstractmethod
    def __init__(self, policy: BatchPolicy, *, noise_level: float | None = None, freeze_vlm: bool = False) -> None:
        """Wrap the family's serving policy; an option the family cannot honour is a ``CheckpointError``."""

    @classmethod
    def from_checkpoint(
        cls,
        path: str,
        *,
        device: torch.device | str = "cpu",
        noise_level: float | None = None,
        freeze_vlm: bool = False,
    ) -> RLAdapter:
        """The adapter of the family's folder at ``path`` (``noise_level`` None: the family's default)."""
        return cls(cls.load_policy(path, device), noise_level=noise_level, freeze_vlm=freeze_vlm)

    @staticmethod
    @abc.abstractmethod
    def load_policy(path: str, device: torch.device | str) -> BatchPolicy:
        """The family's serving policy from its folder, on ``device``, ready to be trained."""

    @staticmethod
    def expect(policy: BatchPolicy, cls: type[P]) -> P:
        """``policy`` as the family's serving policy class; a ``TypeError`` naming both otherwise."""
        if not isinstance(policy, cls):
            raise TypeError(f"expected a {cls.__name__} to train, got {type(policy).__name__}")
        return policy

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @abc.abstractmethod
    def model_inputs(self, wire: Sequence[Mapping[str, Any]]) -> ModelInputs:
        """Tensors (first dim = len(wire)) or lists to store per decision and to ``model.encode``."""

    @abc.abstractmethod
    def env_actions(self, chunks: torch.Tensor) -> np.ndarray:
        """(B, H, D) model-space chunks -> (B, >= H rows, env action dims) float32 env units."""

    @abc.abstractmethod
    def servable(self, model: RLModel) -> BatchPolicy:
        """A serving policy that owns ``model`` (a copy the caller made)."""

    def serving_noise(self, batch: int) -> torch.Tensor | None:
        """The denoising start x_1 ``(batch, chunk_size, action_dim)`` serving uses, when serving fixes it
        (None: serving draws fresh noise per call, and so do rollouts that follow serving)."""
        return None

    def set_num_flow_steps(self, steps: int) -> None:
        """Serve and sample with ``steps`` denoising steps (families also update their serving policy)."""
        self.model.set_num_flow_steps(steps)

    def demonstrations(self, root: str | Path, *, max_episodes_per_task: int | None = None) -> Demonstrations:
        """The LeRobot dataset at ``root`` as ``Demonstrations`` for this checkpoint (its cameras, state
        keys, chunk size and normalisation); ``max_episodes_per_task``: the first that many per instruction.
        A family that cannot map demonstrations into its model space says so."""
        raise NotImplementedError(
            f"{type(self).__name__}: this family has no demonstration loader, so bc.coef (demonstration-"
            "augmented RL) is not available for it; set bc.coef = 0"
        )

    def fsdp_units(self, model: RLModel) -> list[nn.Module] | None:
        """The modules of ``model`` (a copy of ``self.model``) that FSDP shards one by one (``train.fsdp``):
        modules the family's code calls through their ``forward``. None: every block of its ``ModuleList``
        stacks (``common/fsdp.py``)."""
        return None
