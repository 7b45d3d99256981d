"""Residual RL on the frozen camera-free flow policy: PPO on a small Gaussian correction, tried for issue 16.

Why this exists: joint PPO of the whole flow chunk took the few-shot state policy from 52% to 64% in
60 CPU minutes and stalled on push and pick_place (docs/benchmarks.md). Residual RL (Ankile et al.
2024, "From Imitation to Refinement") freezes the imitation policy and trains only a small Gaussian
policy whose output is added to the base's actions; it took FurnitureBench tasks from 5-50% to >90%.
Its appeal here: the base is exactly the served policy (the serving ODE from the serving noise, every
``--replan`` steps), the residual's log-probs are closed-form (the first minibatch's ratio is 1 to
float precision, no sampler mismatch), and the residual starts at zero (its mean's last layer is zero),
so iteration 0 is the base policy plus exploration noise.

What one iteration does:
- ``--envs`` unrendered tabletop envs (``obs_mode="state"``) run the four tasks in turn on training
  seeds (1,000,000 + ...); each env's base chunk is recomputed every ``--replan`` steps;
- a decision every ``--hold`` steps (1: a correction per step; ``--replan``: one correction held over
  the base chunk's executed part): the residual reads the normalised state and object state, the task,
  the base's next ``--hold`` actions (and, per step, the step within the chunk) and adds
  ``--scale`` x a Gaussian sample to the translation and gripper dims (rotation dims can not change
  any task's outcome: issue 16, item 3); the sum is clipped to the action box;
- reward: success (1 on the success step) + ``--shaping`` x the change of the env's
  ``info["dense_reward"]`` (potential-based, as the RL recipes);
- GAE (gamma 0.99 per env step, lambda 0.95) with time-limit truncation bootstrapped from the critic,
  then PPO (clip 0.2, ``--epochs`` x minibatches of ``--mb``), advantages whitened per batch.

Each iteration prints one JSON line: env steps, steps/s, the rolling training success per task (last 50
episodes, with exploration), the residual's std and the first minibatch's largest |ratio - 1| over the
decisions sampled under the current weights.

    .venv/bin/python benchmarks/residual_rl_state.py --minutes 25 --hold 1      # per-step residual
    .venv/bin/python benchmarks/residual_rl_state.py --minutes 25 --hold 5      # held over the chunk

Result (docs/benchmarks.md, "Residual RL, tried and not adopted"; 2.0-2.2 M env steps in 25 minutes at
about one core each): reach and open_drawer rise to 94-98% / 85-89% training success, push and
pick_place do not move (12-14% / 22-25%).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

TASKS = ["reach", "push", "pick_place", "open_drawer"]
DIMS = [0, 1, 2, 6]  # x, y, z, gripper: the dims a tabletop task can use
SEED_BASE = 1_000_000


class RunningNorm:
    """Running mean / variance of the observation features (Welford over batches), clipped to +-10 sigma."""

    def __init__(self, dim: int) -> None:
        self.mean, self.var, self.count = np.zeros(dim), np.ones(dim), 1e-4

    def update(self, x: np.ndarray) -> None:
        bm, bv, bc = x.mean(0), x.var(0), len(x)
        delta, total = bm - self.mean, self.count + bc
        self.mean = self.mean + delta * bc / total
        self.var = (self.var * self.count + bv * bc + delta**2 * self.count * bc / total) / total
        self.count = total

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -10, 10)


def mlp(inputs: int, outputs: int, zero_last: bool = False) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(inputs, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, outputs))
    if zero_last:
        nn.init.zeros_(net[-1].weight)
        nn.init.zeros_(net[-1].bias)
    return net


@dataclass
class Decision:
    """One residual decision of one env: its input, sample, log-prob, value and the reward it collected."""

    x: np.ndarray
    r: np.ndarray
    lp: float
    v: float
    fresh: bool  # sampled under the weights of the coming update (not carried over from the last one)
    rew: float = 0.0
    steps: int = 0
    done: bool = False
    trunc_value: float = 0.0


@dataclass
class Residual:
    """The residual policy, its critic and their optimizer."""

    inputs: int
    std: float
    lr: float
    actor: nn.Sequential = field(init=False)
    critic: nn.Sequential = field(init=False)
    log_std: nn.Parameter = field(init=False)

    def __post_init__(self) -> None:
        self.actor = mlp(self.inputs, len(DIMS), zero_last=True)
        self.critic = mlp(self.inputs, 1)
        self.log_std = nn.Parameter(torch.full((len(DIMS),), math.log(self.std)))
        self.params = [*self.actor.parameters(), self.log_std, *self.critic.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=self.lr)

    def dist(self, x: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.actor(x), self.log_std.exp())

    def value(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.critic(torch.from_numpy(x)).squeeze(-1).numpy()


class Runner:
    """The envs, the frozen base and the residual's decisions (module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from cosmos_robot.policies.flow.policy import FlowPolicy
        from cosmos_robot_envs.vector import EnvFactory, make_vector_env

        self.args, self.n, self.k, self.hold = args, args.envs, args.replan, args.hold
        if self.hold < 1 or self.k % self.hold:
            raise SystemExit(f"--hold {self.hold}: expected a positive divisor of --replan {self.k}")
        self.base = FlowPolicy.from_pretrained(args.ckpt)
        kwargs = {"tasks": TASKS, "obs_mode": "state", "image_size": 64}
        self.venv = make_vector_env(
            EnvFactory("CosmosRobot/Tabletop-v0", kwargs), num_envs=self.n, mode=args.vector_mode
        )
        self.next_seed, self.next_task = SEED_BASE + args.seed * 100_000, 0
        self.task_of = np.zeros(self.n, dtype=np.int64)
        self.obs, infos = self._reset(np.arange(self.n))
        self.phi = np.array([i.get("dense_reward", 0.0) for i in infos])
        self.feat = self.obs["state"].shape[1] + self.obs["object_state"].shape[1]
        per_step = self.k if self.hold < self.k else 0
        self.residual = Residual(self.feat + self.hold * 7 + len(TASKS) + per_step, args.std, args.lr)
        self.norm = RunningNorm(self.feat)
        self.chunk = self._base(self.obs, np.arange(self.n))
        self.kstep = np.zeros(self.n, dtype=np.int64)
        self.open: list[Decision | None] = [None] * self.n
        self.current = np.zeros((self.n, len(DIMS)), dtype=np.float32)
        self.episodes: dict[str, list[float]] = {t: [] for t in TASKS}
        self.env_steps = 0
        self.raw: list[np.ndarray] = []
        self._decide(np.arange(self.n))

    def _reset(self, rows: np.ndarray) -> tuple[Any, list[dict[str, Any]]]:
        tasks = [(self.next_task + j) % len(TASKS) for j in range(len(rows))]
        seeds = [self.next_seed + j for j in range(len(rows))]
        self.next_task, self.next_seed = self.next_task + len(rows), self.next_seed + len(rows)
        mask = np.zeros(self.n, dtype=bool)
        mask[rows] = True
        obs, infos = self.venv.reset(seeds=seeds, options=[{"task": TASKS[t]} for t in tasks], mask=mask)
        self.task_of[rows] = tasks
        return obs, infos

    def _base(self, obs: Any, rows: np.ndarray) -> np.ndarray:
        """The served policy's chunks for env ``rows`` (serving ODE from the serving noise)."""
        wire = [
            {"observation/state": obs["state"][i], "observation/object_state": obs["object_state"][i],
             "prompt": obs["prompt"][i]}
            for i in rows
        ]  # fmt: skip
        return np.stack([o["actions"] for o in self.base.infer_batch(wire)]).astype(np.float32)

    def _features(self, obs: Any, chunk: np.ndarray, kstep: np.ndarray, rows: np.ndarray) -> np.ndarray:
        raw = np.concatenate([obs["state"][rows], obs["object_state"][rows]], 1)
        self.raw.append(raw)
        ahead = np.stack([chunk[i, kstep[i] : kstep[i] + self.hold].reshape(-1) for i in rows])
        parts = [self.norm(raw), ahead, np.eye(len(TASKS))[self.task_of[rows]]]
        if self.hold < self.k:
            parts.append(np.eye(self.k)[kstep[rows]])
        return np.concatenate(parts, 1).astype(np.float32)

    def _decide(self, rows: np.ndarray) -> None:
        x = self._features(self.obs, self.chunk, self.kstep, rows)
        with torch.no_grad():
            dist = self.residual.dist(torch.from_numpy(x))
            r = dist.sample()
            lp = dist.log_prob(r).sum(-1)
        v = self.residual.value(x)
        for j, i in enumerate(rows):
            self.current[i] = r[j].numpy()
            self.open[i] = Decision(x[j], r[j].numpy(), float(lp[j]), float(v[j]), fresh=True)

    def collect(self, decisions: int) -> list[list[Decision]]:
        """Step until ``decisions`` residual decisions closed; each env's closed ones in order."""
        seqs: list[list[Decision]] = [[] for _ in range(self.n)]
        closed = 0
        for d in self.open:
            assert d is not None
            d.fresh = False  # sampled before the last update: its log-prob is an older policy's
        while closed < decisions:
            act = self.chunk[np.arange(self.n), self.kstep].copy()
            act[:, DIMS] += self.args.scale * self.current
            obs, rew, term, trunc, infos = self.venv.step(np.clip(act, -1, 1).astype(np.float32))
            self.env_steps += self.n
            dense = np.array([i.get("dense_reward", 0.0) for i in infos])
            shaped = rew + self.args.shaping * (dense - self.phi)
            self.phi = dense
            done = term | trunc
            self.kstep += 1
            for i in range(self.n):
                d = self.open[i]
                assert d is not None
                d.rew += float(shaped[i]) * 0.99**d.steps
                d.steps += 1
            ending = np.flatnonzero(done | (self.kstep % self.hold == 0))
            cut = np.flatnonzero(trunc)
            if len(cut):  # time-limit truncation: bootstrap from the final observation
                chunk = self.chunk.copy()
                chunk[cut] = self._base(obs, cut)
                values = self.residual.value(self._features(obs, chunk, np.zeros(self.n, dtype=np.int64), cut))
                for j, i in enumerate(cut):
                    d = self.open[i]
                    assert d is not None
                    d.trunc_value = float(values[j])
            for i in ending:
                d = self.open[i]
                assert d is not None
                d.done = bool(done[i])
                seqs[i].append(d)
                closed += 1
            ended = np.flatnonzero(done)
            if len(ended):
                for i in ended:
                    self.episodes[TASKS[self.task_of[i]]].append(float(term[i]))
                obs, infos = self._reset(ended)
                for i in ended:
                    self.phi[i] = infos[i].get("dense_reward", 0.0)
                self.kstep[ended] = self.k
            self.obs = obs
            replan = np.flatnonzero(self.kstep >= self.k)
            if len(replan):
                self.chunk[replan] = self._base(obs, replan)
                self.kstep[replan] = 0
            if len(ending):
                self._decide(ending)
        return seqs

    def update(self, seqs: list[list[Decision]]) -> dict[str, float]:
        """GAE over each env's decisions (bootstrapped from its open one), then the PPO epochs."""
        self.norm.update(np.concatenate(self.raw))
        self.raw = []
        rows: list[tuple[Decision, float]] = []
        for i, seq in enumerate(seqs):
            d_open = self.open[i]
            assert d_open is not None
            next_v, last = d_open.v, 0.0
            for d in reversed(seq):
                g = 0.99**d.steps
                delta = d.rew + g * (d.trunc_value if d.done else next_v) - d.v
                last = delta + g * 0.95 * (0.0 if d.done else last)
                rows.append((d, last))
                next_v = d.v
        x = torch.from_numpy(np.stack([d.x for d, _ in rows]))
        r = torch.from_numpy(np.stack([d.r for d, _ in rows]))
        old = torch.tensor([d.lp for d, _ in rows])
        adv = torch.tensor([a for _, a in rows], dtype=torch.float32)
        ret = adv + torch.tensor([d.v for d, _ in rows])
        fresh = torch.tensor([d.fresh for d, _ in rows])
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        res, first = self.residual, float("nan")
        for epoch in range(self.args.epochs):
            perm = torch.randperm(len(x))
            for s in range(0, len(x), self.args.mb):
                b = perm[s : s + self.args.mb]
                ratio = (res.dist(x[b]).log_prob(r[b]).sum(-1) - old[b]).exp()
                policy = -torch.min(ratio * adv[b], ratio.clamp(0.8, 1.2) * adv[b]).mean()
                value = 0.5 * (res.critic(x[b]).squeeze(-1) - ret[b]).pow(2).mean()
                res.optimizer.zero_grad()
                (policy + 0.5 * value).backward()
                nn.utils.clip_grad_norm_(res.params, 0.5)
                res.optimizer.step()
                if epoch == 0 and s == 0 and bool(fresh[b].any()):
                    first = float((ratio.detach()[fresh[b]] - 1).abs().max())
        return {"ratio_dev_first_mb": first, "value_loss": float(value.detach())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", default="checkpoints/flow_tabletop_state_weak")
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--vector-mode", default="async", choices=["sync", "async"])
    ap.add_argument("--replan", type=int, default=5, help="base chunk every N steps (the serving horizon)")
    ap.add_argument("--hold", type=int, default=1, help="a residual decision every N steps (1 or --replan)")
    ap.add_argument("--decisions", type=int, default=2048, help="residual decisions per iteration")
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--scale", type=float, default=0.5, help="residual units per action unit")
    ap.add_argument("--std", type=float, default=0.3, help="initial residual std")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--shaping", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    runner = Runner(args)
    t0, it = time.time(), 0
    try:
        while time.time() - t0 < args.minutes * 60:
            stats = runner.update(runner.collect(args.decisions))
            it += 1
            wall = time.time() - t0
            line = {
                "it": it, "minutes": round(wall / 60, 2), "env_steps": runner.env_steps,
                "steps_per_s": round(runner.env_steps / wall, 1),
                "success_last50": {t: round(float(np.mean(v[-50:])), 3) if v else None
                                   for t, v in runner.episodes.items()},
                "residual_std": [round(float(s), 3) for s in runner.residual.log_std.exp()],
                **{k: round(v, 6) for k, v in stats.items()},
            }  # fmt: skip
            print(json.dumps(line), flush=True)
    finally:
        runner.venv.close()


if __name__ == "__main__":
    main()
