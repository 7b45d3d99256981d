"""Rollouts: episodes on the vectorized envs, one batched policy call per decision, chunk = MDP step.

Why a decision loop over lockstep envs: every env that needs an action chunk is served by ONE
batched forward pass (encoder, value head, K denoising steps with log-probs), then each env executes
``replan_steps`` actions of its chunk; the rewards inside a chunk are summed into one MDP step
(notes §1.4, chunk-level MDP). An env whose episode ends starts the next episode of the iteration's
schedule at the next decision, so the envs stay busy while episodes of different lengths finish.
The loop is the shared episode scheduler (``cosmos_robot_envs.episodes``) with aligned starts, so
every decision covers all live envs; this module only supplies its hooks (``_RolloutHooks``).

Why an explicit episode schedule (``episode_specs``): GRPO, NFT and DPO compare episodes that start
from the same initial state, so a group of ``group_size`` specs shares one (task, seed); PPO uses
groups of one. Seeds are a pure function of (env seed, iteration, group), disjoint from the
evaluation seeds, so a resumed run replays the same layouts.

What is stored per decision (``Rollout``) is what the learner needs to recompute everything under
new parameters: the model-ready observation (resized uint8 cameras, normalised state, prompt), the
whole denoising chain, the Flow-SDE step index, the old log-prob and value, the summed reward, the
episode-end flags and, for a time-limit truncation, the value of the final observation (truncation
bootstrapping, checklist item 7).

Reward: ``success_coef`` times the step reward of the recipe's provider (``reward.provider``: the env's
own sparse success reward, or a driving preset computed from the step's info), plus, with ``shaping_coef`` c > 0,
potential-based progress shaping c * (phi(s') - phi(s)) with phi = the env's ``info["dense_reward"]``
(a task-progress measure in [0, 1], 1 on success). Over an episode the shaping telescopes to
c * (phi(last) - phi(first)): it pays for progress, never for dawdling, and success still dominates.
Episode success and return statistics always use the unshaped, unscaled provider reward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from cosmos_robot.distributed import World, all_gather_json, all_gather_rows
from cosmos_robot.policies.flow.sampling import sample_actions
from cosmos_robot_envs.episodes import EpisodeHooks, EpisodeOutcome, EpisodeScheduler, LiveEpisode, Step, obs_row
from cosmos_robot_envs.eval import get_suite
from cosmos_robot_envs.eval.suites import LIBERO_INIT_STATES
from cosmos_robot_envs.vector import BatchedEnv, EnvFactory, make_vector_env
from cosmos_robot_trainers.algorithms.rewards import reward_provider
from cosmos_robot_trainers.rl.config import RLConfig
from cosmos_robot_trainers.rl.critic import CRITIC_OBS, critic_obs
from cosmos_robot_trainers.rl.policies import RLAdapter as RLPolicy

__all__ = [
    "EpisodeSpec",
    "Rollout",
    "RolloutWorker",
    "concat_rollouts",
    "episode_specs",
    "gather_rollout",
    "make_envs",
]

TRAIN_SEED_BASE = 1_000_000  # training layouts start here; evaluation uses small seeds (eval.seed = 1000)


def train_tasks(config: RLConfig) -> list[str]:
    """``env.tasks``, checked against the suite; empty means all of the suite's tasks."""
    if config.env.suite == "tabletop" and config.env.tasks:
        return list(config.env.tasks)
    return list(get_suite(config.env.suite).resolve_tasks(config.env.tasks))


def reset_options(config: RLConfig, spec: EpisodeSpec) -> dict[str, Any]:
    """The env's reset options for an episode: its task; on LIBERO also the benchmark initial state,
    ``seed mod 50`` (a group shares its seed, so its episodes start from the same state)."""
    if config.env.suite.startswith("libero"):
        return {"task": spec.task, "init_state": spec.seed % LIBERO_INIT_STATES}
    return {"task": spec.task}


@dataclass(frozen=True)
class EpisodeSpec:
    """One scheduled episode: its index in the iteration, task, layout seed and group."""

    index: int
    task: str
    seed: int
    group: int


def episode_specs(config: RLConfig, iteration: int, replay: Sequence[tuple[str, int]] = ()) -> list[EpisodeSpec]:
    """The iteration's episodes: ``episodes_per_iter / group_size`` groups, tasks round-robin. The first
    groups rerun the (task, seed) pairs of ``replay`` (``seed_replay.py``); the others get their fresh
    seeds, the ones they would have had without replay."""
    g = config.algo.group_size
    n_groups = config.rollout.episodes_per_iter // g
    if len(replay) > n_groups:
        raise ValueError(f"{len(replay)} replayed seeds for {n_groups} groups")
    tasks = train_tasks(config)
    specs: list[EpisodeSpec] = []
    for group in range(n_groups):
        serial = iteration * n_groups + group
        if group < len(replay):
            task, seed = replay[group]
        else:
            task, seed = tasks[serial % len(tasks)], TRAIN_SEED_BASE * (1 + config.env.seed) + serial
        specs.extend(EpisodeSpec(group * g + k, task, seed, group) for k in range(g))
    return specs


@dataclass
class Rollout:
    """Decisions (first dim M) and episodes (first dim E) of one iteration, as CPU tensors."""

    # per decision
    inputs: dict[str, Any]  # the model inputs the family stores (tensors with first dim M, or lists of M)
    chain: torch.Tensor  # (M, K + 1, H, D) float32 denoising chain (normalised action units)
    sde_step: torch.Tensor  # (M,) int64 Flow-SDE step (-1 for flow_noise / ode)
    log_prob: torch.Tensor  # (M,) float32 old log-prob (chunk level: executed rows x rollout.logprob_dims)
    value: torch.Tensor  # (M,) float32 old value
    reward: torch.Tensor  # (M,) float32 MDP reward of the chunk (summed, scaled, shaped: what the learner uses)
    done: torch.Tensor  # (M,) bool: the episode ended after this decision
    truncated: torch.Tensor  # (M,) bool: the episode was cut by the time limit (or a failed worker) here
    bootstrap: torch.Tensor  # (M,) float32 V(final obs) where ``truncated``, else 0
    episode: torch.Tensor  # (M,) int64 episode index (into the per-episode fields)
    step: torch.Tensor  # (M,) int64 decision index within its episode
    # per episode
    ep_task: list[str]
    ep_group: torch.Tensor  # (E,) int64
    ep_success: torch.Tensor  # (E,) float32 (1.0 / 0.0)
    ep_return: torch.Tensor  # (E,) float32 undiscounted
    ep_length: torch.Tensor  # (E,) int64 env steps
    ep_failed: torch.Tensor  # (E,) bool: a worker crashed or hung (truncated, not a policy failure)
    # bookkeeping
    env_steps: int = 0
    wall_s: dict[str, float] = field(default_factory=dict)
    # (M, replan_steps, len(logprob_dims)) float32 old log-prob per executed element (algo.ratio_level
    # "action" / "element"); None in rollouts built without it
    elem_log_prob: torch.Tensor | None = None

    @property
    def num_decisions(self) -> int:
        return int(self.log_prob.shape[0])

    @property
    def num_episodes(self) -> int:
        return int(self.ep_success.shape[0])


def concat_rollouts(parts: Sequence[Rollout]) -> Rollout:
    """One rollout from several workers' parts (episode indices re-based, groups kept)."""
    if len(parts) == 1:
        return parts[0]
    values: dict[str, Any] = {}
    offset, offsets = 0, []
    for part in parts:
        offsets.append(offset)
        offset += part.num_episodes
    for f in fields(Rollout):
        items = [getattr(p, f.name) for p in parts]
        if f.name == "episode":
            values[f.name] = torch.cat([x + off for x, off in zip(items, offsets)])
        elif f.name == "env_steps":
            values[f.name] = sum(items)
        elif f.name == "inputs":
            values[f.name] = {k: _cat([it[k] for it in items]) for k in items[0]}
        elif f.name == "wall_s":
            values[f.name] = {k: max(d.get(k, 0.0) for d in items) for k in items[0]}
        elif items[0] is None:
            values[f.name] = None
        elif isinstance(items[0], list):
            values[f.name] = [x for item in items for x in item]
        else:
            values[f.name] = torch.cat(items)
    return Rollout(**values)


def gather_rollout(rollout: Rollout, world: World) -> Rollout:
    """Every data-parallel rank's part of the iteration, joined in rank order (``concat_rollouts``), on
    every rank: the learner ranks then compute the same advantages (whitening, groups, pairs) from
    the same data. Tensors travel as tensors, strings and bookkeeping as JSON: nothing is unpickled."""
    if not world.distributed:
        return rollout
    gathered: dict[str, list[Any]] = {}
    for f in fields(Rollout):
        value = getattr(rollout, f.name)
        if f.name == "inputs":
            per_key = {k: _gather_value(f"inputs[{k!r}]", v, world) for k, v in value.items()}
            gathered[f.name] = [{k: parts[r] for k, parts in per_key.items()} for r in range(world.world_size)]
        elif value is None:
            gathered[f.name] = [None] * world.world_size
        else:
            gathered[f.name] = _gather_value(f.name, value, world)
    parts = [Rollout(**{k: v[r] for k, v in gathered.items()}) for r in range(world.world_size)]
    return concat_rollouts(parts)


def _gather_value(name: str, value: Any, world: World) -> list[Any]:
    if isinstance(value, torch.Tensor):
        return all_gather_rows(value.cpu(), world)
    if isinstance(value, (list, dict, int, float, str)):
        try:
            return all_gather_json(value, world)
        except TypeError as exc:
            raise TypeError(f"rollout field {name} cannot be sent between learner ranks: {exc}") from exc
    raise TypeError(f"rollout field {name} is a {type(value).__name__}; ranks exchange tensors and JSON values")


def _cat(parts: Sequence[Any]) -> Any:
    """Tensors concatenated along the first dim; lists joined."""
    if isinstance(parts[0], list):
        return [x for part in parts for x in part]
    return torch.cat(list(parts))


def index_inputs(inputs: dict[str, Any], idx: torch.Tensor, device: torch.device | str) -> dict[str, Any]:
    """Rows ``idx`` of stored model inputs, tensors moved to ``device``."""
    rows = idx.tolist()
    return {k: v[idx].to(device) if isinstance(v, torch.Tensor) else [v[i] for i in rows] for k, v in inputs.items()}


def tabletop_obs_mode(images: bool, object_state: bool) -> str:
    """The tabletop env's ``obs_mode`` for a policy that reads cameras and/or ``object_state``:
    a camera-free policy gets ``"state"`` (nothing rendered: 7.7x faster stepping)."""
    if not images:
        return "state"
    return "all" if object_state else "rgb"


def make_envs(
    config: RLConfig, num_envs: int | None = None, *, images: bool = True, object_state: bool = False
) -> BatchedEnv:
    """The suite's multi-task env, ``num_envs`` copies behind the project's vector layer; ``images`` /
    ``object_state``: what the policy reads (``RLAdapter.reads_images`` / ``reads_object_state``).

    Other suites come from the evaluator's registry (LIBERO's envs run under its own interpreter,
    in ``async`` mode)."""
    if config.env.suite != "tabletop":
        suite = get_suite(config.env.suite)
        return make_vector_env(
            suite.make_env(tuple(train_tasks(config)), config.env.image_size, config.env.max_steps, images),
            num_envs=num_envs or config.env.num_envs,
            mode=config.env.vector_mode,
            step_timeout=config.env.step_timeout,
        )
    kwargs = {
        "tasks": list(config.env.tasks),
        "obs_mode": tabletop_obs_mode(images, object_state),
        "image_size": config.env.image_size,
        "max_steps": config.env.max_steps,
    }
    return make_vector_env(
        EnvFactory("CosmosRobot/Tabletop-v0", kwargs),
        num_envs=num_envs or config.env.num_envs,
        mode=config.env.vector_mode,
        step_timeout=config.env.step_timeout,
    )


def action_bounds(space: Any) -> tuple[np.ndarray, np.ndarray]:
    """The env's own action bounds, what a sampled chunk is clipped to before it is executed (the
    tabletop's and LIBERO's [-1, 1]; the driving suite's plan box in metres). A fixed [-1, 1] here once
    clipped every driving plan to 1 m, so its GRPO rollouts braked to a crawl."""
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    if low is None or high is None:
        raise ValueError(f"RL rollouts need a Box action space with bounds; the env's is {space}")
    return np.asarray(low, np.float32), np.asarray(high, np.float32)


class _Recorder:
    """Accumulates decision rows and finished episodes; ``build`` stacks them into a ``Rollout``."""

    def __init__(self, specs: Sequence[EpisodeSpec]) -> None:
        self.rows: dict[str, list[Any]] = {}
        self.episodes: dict[int, tuple[float, float, int, bool]] = {}
        self.specs = list(specs)

    def add(self, **row: Any) -> None:
        for key, value in row.items():
            self.rows.setdefault(key, []).append(value)

    def build(self, env_steps: int, wall: dict[str, float]) -> Rollout:
        r = self.rows
        if not r:
            raise RuntimeError(
                f"no decision was recorded for {len(self.specs)} episodes: every env reset failed "
                "(see the vector env's worker errors above)"
            )
        index = {spec.index: i for i, spec in enumerate(self.specs)}
        ep_rows = [self.episodes[s.index] for s in self.specs]
        return Rollout(
            inputs={k: _cat([row[k] for row in r["inputs"]]) for k in r["inputs"][0]},
            chain=torch.cat(r["chain"]),
            sde_step=torch.cat(r["sde_step"]),
            log_prob=torch.cat(r["log_prob"]),
            elem_log_prob=torch.cat(r["elem_log_prob"]),
            value=torch.cat(r["value"]),
            reward=torch.tensor(np.concatenate(r["reward"]), dtype=torch.float32),
            done=torch.tensor(np.concatenate(r["done"]), dtype=torch.bool),
            truncated=torch.tensor(np.concatenate(r["truncated"]), dtype=torch.bool),
            bootstrap=torch.tensor(np.concatenate(r["bootstrap"]), dtype=torch.float32),
            episode=torch.tensor([index[e] for chunk in r["episode"] for e in chunk], dtype=torch.long),
            step=torch.tensor(np.concatenate(r["step"]), dtype=torch.long),
            ep_task=[s.task for s in self.specs],
            ep_group=torch.tensor([s.group for s in self.specs], dtype=torch.long),
            ep_success=torch.tensor([e[0] for e in ep_rows], dtype=torch.float32),
            ep_return=torch.tensor([e[1] for e in ep_rows], dtype=torch.float32),
            ep_length=torch.tensor([e[2] for e in ep_rows], dtype=torch.long),
            ep_failed=torch.tensor([e[3] for e in ep_rows], dtype=torch.bool),
            env_steps=env_steps,
            wall_s=wall,
        )


class RolloutWorker:
    """Envs + the policy: ``collect(specs, seed)`` runs the scheduled episodes and returns a ``Rollout``.

    The policy is an ``RLPolicy`` (any family) whose model the learner updates in place (single
    process) or whose weights arrive through ``set_weights`` (a Ray actor). Sampling draws from a CPU generator seeded
    per call, so the same weights, specs and seed give the same rollout on any device.
    """

    def __init__(self, config: RLConfig, policy: RLPolicy, num_envs: int | None = None) -> None:
        self.config = config
        self.policy = policy
        self.venv = make_envs(config, num_envs, images=policy.reads_images, object_state=policy.reads_object_state)
        cfg = policy.model.config
        self.replan_steps = config.rollout.replan_steps
        if self.replan_steps > cfg.chunk_size:
            raise ValueError(
                f"rollout.replan_steps ({self.replan_steps}) exceeds the policy's chunk_size ({cfg.chunk_size})"
            )
        self.num_flow_steps = config.rollout.num_flow_steps or cfg.num_flow_steps
        self.noise_level = config.rollout.noise_level or cfg.noise_level
        self.logprob_dims = config.logprob_dims(policy.action_dims)  # the learner recomputes the same slice
        self.start_noise = config.start_noise
        self.action_low, self.action_high = action_bounds(self.venv.single_action_space)

    def set_weights(self, state: dict[str, Any]) -> None:
        """Load weights sent by the learner (tensors or numpy arrays by parameter name)."""
        tensors = {k: torch.as_tensor(v) for k, v in state.items()}
        self.policy.model.load_state_dict(tensors)

    def close(self) -> None:
        self.venv.close()

    # --- model side --------------------------------------------------------------------------------
    def _model_batch(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Model inputs of env observation rows (every array, camera or vector, as ``observation/<key>``)."""
        wire = []
        for row in rows:
            w: dict[str, Any] = {f"observation/{k}": v for k, v in row.items() if isinstance(v, np.ndarray)}
            if "prompt" in row:  # a suite without instructions (driving) has none
                w["prompt"] = str(row["prompt"])
            wire.append(w)
        inputs = self.policy.model_inputs(wire)
        if self.config.algo.critic_inputs == "privileged":
            inputs[CRITIC_OBS] = critic_obs(rows).to(self.policy.device)
        return inputs

    @torch.no_grad()
    def _decide(
        self, batch: dict[str, Any], generator: torch.Generator, noise: torch.Tensor | None
    ) -> tuple[Any, torch.Tensor, np.ndarray]:
        """Sample the chunks of one batched decision from start ``noise`` (None: fresh draws)."""
        model = self.policy.model
        context = model.encode(batch)
        value = model.value(context)
        mode = self.config.sample_mode
        sample = sample_actions(
            model,
            context,
            mode,
            num_steps=self.num_flow_steps,
            generator=generator,
            noise_level=self.noise_level,
            noise=noise,
            replan_steps=self.replan_steps,
            dims=self.logprob_dims,
        )
        env_actions = self.policy.env_actions(sample.actions)
        chunk = np.clip(env_actions[:, : self.replan_steps], self.action_low, self.action_high)
        return sample, value.float().cpu(), chunk

    @torch.no_grad()
    def _final_values(self, rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        batch = self._model_batch(rows)
        return self.policy.model.value(self.policy.model.encode(batch)).float().cpu().numpy()

    # --- the loop -------------------------------------------------------------------------------------
    def collect(self, specs: Sequence[EpisodeSpec], seed: int) -> Rollout:
        """Run every scheduled episode to its end; ``seed`` seeds the sampling noise."""
        self.policy.model.eval()
        rec = _Recorder(specs)
        hooks = _RolloutHooks(self, torch.Generator().manual_seed(seed), rec)
        scheduler = EpisodeScheduler[EpisodeSpec](
            self.venv,
            replan_steps=self.replan_steps,
            align_starts=True,  # every decision covers all live envs: one forward pass each
            reset_options=lambda spec: reset_options(self.config, spec),
            affinity=lambda spec: (spec.task, spec.seed),  # a group's episodes stay on one env (its caches)
        )
        scheduler.run(specs, hooks)
        wall = {"env": scheduler.timing["env"], "policy": scheduler.timing["decide"]}
        return rec.build(scheduler.env_steps, wall)


@dataclass
class _Decision:
    """One batched decision while its chunks run: per row (j) the summed rewards and how its chunk ended."""

    episodes: list[LiveEpisode[EpisodeSpec]]
    step: np.ndarray  # (n,) int64 the decision's index within each episode
    batch: dict[str, Any]
    sample: Any
    values: torch.Tensor
    shaped: np.ndarray  # (n,) float32 the MDP reward: scaled, shaped env rewards summed over the executed slice
    done: np.ndarray  # (n,) bool
    truncated: np.ndarray  # (n,) bool
    final: dict[int, Mapping[str, Any]] = field(default_factory=dict)  # j -> observation to bootstrap from
    open: int = 0  # rows whose chunk is still running


class _RolloutHooks(EpisodeHooks[EpisodeSpec]):
    """RL on the episode scheduler: sample chunks, sum (shaped) rewards per chunk, bootstrap truncations.

    A decision is recorded when the last of its chunks is over; the values of the final observations
    of its time-limit truncations are then computed in one forward pass.
    """

    def __init__(self, worker: RolloutWorker, generator: torch.Generator, rec: _Recorder) -> None:
        self.worker, self.generator, self.rec = worker, generator, rec
        self.reward_cfg = worker.config.reward
        self.provider = reward_provider(self.reward_cfg.provider, self.reward_cfg.term_weights)
        self.returns: dict[int, float] = {}  # episode position -> the provider's summed reward so far
        self.current: dict[int, tuple[_Decision, int]] = {}  # episode position -> (decision, row in it)
        self.potential: dict[int, float] = {}  # episode position -> info["dense_reward"] of its latest obs
        self.episode_noise: dict[int, torch.Tensor] = {}  # episode position -> its start noise ("episode")

    def started(self, ep: LiveEpisode[EpisodeSpec], obs: dict[str, Any], info: dict[str, Any]) -> None:
        self.potential[ep.position] = float(info.get("dense_reward", 0.0))
        self.returns[ep.position] = 0.0
        if self.worker.start_noise == "episode":
            cfg = self.worker.policy.model.config
            self.episode_noise[ep.position] = torch.randn((cfg.chunk_size, cfg.action_dim), generator=self.generator)

    def start_noise(self, episodes: Sequence[LiveEpisode[EpisodeSpec]]) -> torch.Tensor | None:
        """Each row's denoising start under ``rollout.start_noise`` (config.StartNoise)."""
        mode = self.worker.start_noise
        if mode == "serving":
            return self.worker.policy.serving_noise(len(episodes))
        if mode == "episode":
            return torch.stack([self.episode_noise[ep.position] for ep in episodes])
        return None

    def decide(self, episodes: Sequence[LiveEpisode[EpisodeSpec]], obs: Any) -> np.ndarray:
        batch = self.worker._model_batch([obs_row(obs, ep.row) for ep in episodes])
        sample, values, chunk = self.worker._decide(batch, self.generator, self.start_noise(episodes))
        n = len(episodes)
        flags = np.zeros(n, dtype=bool)
        step = np.array([ep.decisions for ep in episodes], dtype=np.int64)
        decision = _Decision(
            list(episodes), step, batch, sample, values, np.zeros(n, dtype=np.float32), flags, flags.copy(), open=n
        )
        for j, ep in enumerate(episodes):
            self.current[ep.position] = (decision, j)
        return chunk

    def stepped(self, ep: LiveEpisode[EpisodeSpec], step: Step) -> None:
        d, j = self.current[ep.position]
        reward = self.provider(step.reward, step.info)
        self.returns[ep.position] += reward
        d.shaped[j] += self.reward_cfg.success_coef * reward
        if self.reward_cfg.shaping_coef > 0 and "dense_reward" in step.info:
            phi = float(step.info["dense_reward"])
            d.shaped[j] += self.reward_cfg.shaping_coef * (phi - self.potential[ep.position])
            self.potential[ep.position] = phi

    def chunk_done(self, ep: LiveEpisode[EpisodeSpec], obs: dict[str, Any], *, done: bool, truncated: bool) -> None:
        d, j = self.current.pop(ep.position)
        d.done[j], d.truncated[j] = done, truncated
        if truncated:
            d.final[j] = obs
        d.open -= 1
        if d.open == 0:
            self._record(d)

    def ended(self, outcomes: Sequence[EpisodeOutcome[EpisodeSpec]], obs: Any) -> None:
        for o in outcomes:
            self.potential.pop(o.position, None)
            self.episode_noise.pop(o.position, None)
            ret = self.returns.pop(o.position, 0.0)
            self.rec.episodes[o.spec.index] = (float(o.success), ret, o.steps, o.infra_failure)

    def _record(self, d: _Decision) -> None:
        bootstrap = np.zeros(len(d.episodes), dtype=np.float32)
        cut = sorted(d.final)
        if cut:
            bootstrap[cut] = self.worker._final_values([d.final[j] for j in cut])
        self.rec.add(
            inputs={k: v.cpu() if isinstance(v, torch.Tensor) else list(v) for k, v in d.batch.items()},
            chain=d.sample.chain.float().cpu(),
            sde_step=d.sample.sde_step.cpu(),
            log_prob=d.sample.log_prob.float().cpu(),
            elem_log_prob=d.sample.dim_log_prob.float().cpu(),
            value=d.values,
            reward=d.shaped,
            done=d.done,
            truncated=d.truncated,
            bootstrap=bootstrap,
            episode=[ep.spec.index for ep in d.episodes],
            step=d.step,
        )
