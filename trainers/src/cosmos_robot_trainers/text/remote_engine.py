"""A text rollout engine in a Ray actor of its own: ``rollout.placement = "ray"``.

Why: in process, the engine shares the learner's device and its memory (vLLM colocated takes a
fraction of the learner's GPU). As a Ray actor it gets its own placement (``rollout.engine_cpus``,
``engine_gpus``: a GPU of its own, or a share of one, on any node of the cluster), while the learner
keeps its devices for the update. The actor loads its own copy of the model from ``init`` and runs
the chosen engine (``transformers``, ``transformers_static`` or ``vllm``) on it; ``RayEngine`` is the
learner's handle, with the ``RolloutEngine`` interface the trainers already use, so no trainer knows
where its completions come from.

Weights: the actor's copy gets the learner's state when the handle is made (a resumed run samples
from its checkpoint, a tiny random model from the learner's draw) and after every update
(``sync_weights``), through Ray's object store (tensors by name) or, with
``rollout.weight_sync = "collective"``, a broadcast in a process group of the learner and the actor
(common/weight_sync.py: NCCL between GPUs, gloo otherwise). The actor then hands its updated model to
its engine's own ``sync_weights`` (vLLM reloads the weights into its runner).

Sampling is seeded per call (``SamplingParams.seed``) on the actor as in process, so on the same
weights a remote engine returns the in-process engine's completions (tested on this CPU).
Under data-parallel learners each learner process has its own engine actor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cosmos_robot.distributed import World
from cosmos_robot.text.engines import Completion, SamplingParams, make_engine

__all__ = ["RayEngine"]


class _EngineActor:
    """The body of the engine actor: its own model copy and engine."""

    def __init__(self, init: str, model_cfg: Any, dtype: str, engine: str, options: dict[str, Any], threads: int):
        from cosmos_robot_trainers.text.config import TinyLMConfig
        from cosmos_robot_trainers.text.state import load_lm

        torch.set_num_threads(threads)
        device = "cuda" if torch.cuda.is_available() and engine != "vllm" else "cpu"
        tiny = TinyLMConfig.model_validate(model_cfg) if model_cfg is not None else None
        self.lm = load_lm(init, tiny, dtype, device)
        self.lm.model.eval()
        self.engine = make_engine(engine, self.lm.model, self.lm.tokenizer, self.lm.stop_ids, self.lm.pad_id, options)
        self.sync_group: Any = None

    def manifest(self) -> list[Any]:
        from cosmos_robot_trainers.common.weight_sync import state_manifest

        return state_manifest(self.lm.model.state_dict())

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.lm.model.load_state_dict(state)
        self.engine.sync_weights(self.lm.model)

    def join_sync(self, host: str, port: int, rank: int, size: int, backend: str) -> list[Any]:
        from cosmos_robot_trainers.common.weight_sync import SyncGroup

        self.sync_group = SyncGroup(host, port, rank, size, backend)
        return self.manifest()

    def device_id(self) -> str | None:
        from cosmos_robot_trainers.common.weight_sync import device_id

        return device_id(next(iter(self.lm.model.state_dict().values())))

    def receive_weights(self) -> None:
        self.sync_group.broadcast(list(self.lm.model.state_dict().values()))
        self.engine.sync_weights(self.lm.model)

    def generate(
        self, prompts: list[list[int]], n: int, params: SamplingParams, images: list[Any] | None
    ) -> list[list[Completion]]:
        return self.engine.generate(prompts, n, params, images)


class RayEngine:
    """The learner's handle on an engine actor (module docstring); a ``RolloutEngine``. The actor starts at
    the first rollout (a run that never samples starts none; DPO on offline pairs builds no engine)."""

    def __init__(self, config: Any, model: torch.nn.Module, world: World | None = None) -> None:
        rc = config.rollout
        self.config, self.world = config, world or World()
        self.name = f"ray:{rc.engine}"
        self.weight_sync = rc.weight_sync
        self.scores_by_forward = rc.engine == "transformers_static"  # the engine's own flag (engines.py)
        self.ray: Any = None
        self.actor: Any = None
        self.sync_group: Any = None
        # the learner's weights go out before the first rollout (after a resume has loaded them)
        self.model, self.synced = model, False

    def _start(self) -> Any:
        if self.actor is None:
            from cosmos_robot_trainers.rl.workers import connect_ray

            config, rc = self.config, self.config.rollout
            self.ray = connect_ray(self.world)
            model_cfg = config.model.model_dump(mode="json") if getattr(config, "model", None) is not None else None
            options = {rc.engine: dict(rc.engine_options().get(rc.engine, {}))}
            actor = self.ray.remote(_EngineActor).options(num_cpus=rc.engine_cpus, num_gpus=rc.engine_gpus)
            threads = max(1, int(rc.engine_cpus))
            self.actor = actor.remote(config.init, model_cfg, config.train.dtype, rc.engine, options, threads)
        return self.actor

    def generate(
        self, prompts: Sequence[list[int]], n: int, params: SamplingParams, images: Sequence[Any] | None = None
    ) -> list[list[Completion]]:
        if not self.synced:
            self.sync_weights(self.model)
        batch = [list(p) for p in prompts]
        return self.ray.get(self.actor.generate.remote(batch, n, params, None if images is None else list(images)))

    def sync_weights(self, model: Any) -> None:
        actor = self._start()
        self.synced = True
        state = model.state_dict()
        if self.weight_sync == "object_store":
            self.ray.get(actor.load_weights.remote({k: v.detach().cpu() for k, v in state.items()}))
            return
        from cosmos_robot_trainers.common.weight_sync import broadcast_to, form_group

        if self.sync_group is None:
            self.sync_group = form_group(self.ray, state, [actor])
        broadcast_to(self.ray, self.sync_group, state, [actor])

    def close(self) -> None:
        if self.sync_group is not None:
            self.sync_group.close()
        if self.actor is not None:
            self.ray.kill(self.actor)
            self.actor = None
