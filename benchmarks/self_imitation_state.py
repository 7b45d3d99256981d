"""Does learning from its own successes close the few-shot gap? Iterated success-filtered behaviour
cloning of the camera-free tabletop flow policy: an experiment for issue 16, not a trainer.

Why: from the few-shot start (`checkpoints/flow_tabletop_state_weak`, 15 demonstrations per task,
~52%) joint PPO reached 64% in 60 CPU minutes, while the same architecture cloned from 200
demonstrations per task reaches 96%: the failures left are what few data leave unlearned. If so, the
policy's own successful episodes are demonstrations too, and cloning them (expert iteration / RAFT;
the idea behind self-imitation learning, Oh et al. 2018) should climb towards the 200-demo ceiling at
the sample cost of rollouts only. This script measures that, to decide whether a self-imitation term
belongs in the joint PPO learner.

Each iteration: roll out ``--episodes-per-task`` episodes of every task with the current policy
(the serving ODE from fresh noise each chunk: its own action distribution; ``--replan`` actions per
chunk, unrendered envs, training seeds from 2,000,000), keep the successful episodes' frames (state,
the executed actions of the next ``chunk_size`` steps as the target chunk, LeRobot's padding), add
them to a per-task buffer of the newest ``--buffer-episodes`` successes, then take ``--steps``
AdamW steps of the flow-matching loss on task-balanced batches of the buffer. The normalisation stats
stay the start's. Every ``--eval-every`` iterations the served policy (fixed serving noise) is scored
on held-out seeds (``--eval-episodes`` per task, from 1000; a curve, not a claim); the final policy is
saved as a policy folder for ``cosmos-robot eval --ckpt``.

    .venv/bin/python benchmarks/self_imitation_state.py --minutes 45 --out runs/self_imitation
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot.policies.flow.text import encode_prompts
from cosmos_robot_envs.tabletop import TabletopEnv
from cosmos_robot_envs.tabletop.tasks import TASK_NAMES
from cosmos_robot_trainers.common.export import export_policy

TRAIN_SEED0 = 2_000_000  # rollout seeds: disjoint from eval (1000+) and from the demonstrations (hashed)


@dataclass
class Episode:
    task: str
    prompt: str
    states: list[np.ndarray] = field(default_factory=list)  # (23,) raw: state + object_state
    actions: list[np.ndarray] = field(default_factory=list)  # (7,) executed (the policy's output rows)
    success: bool = False


def wire(obs: dict[str, Any]) -> dict[str, Any]:
    return {"observation/state": obs["state"], "observation/object_state": obs["object_state"], "prompt": obs["prompt"]}


def rollout(policy: FlowPolicy, tasks: list[str], seeds: list[int], replan: int, n_envs: int) -> list[Episode]:
    """One episode per (task, seed), ``n_envs`` at a time in lockstep; the policy queried in batches."""
    out: list[Episode] = []
    jobs = list(zip(tasks, seeds, strict=True))
    pool = [TabletopEnv(None, obs_mode="state") for _ in range(n_envs)]
    try:
        for start in range(0, len(jobs), n_envs):
            wave = jobs[start : start + n_envs]
            obs, eps = [], []
            for env, (task, seed) in zip(pool, wave):
                o, _ = env.reset(seed=seed, options={"task": task})
                obs.append(o)
                eps.append(Episode(task, str(o["prompt"])))
            queue: list[np.ndarray] = [np.zeros((0, 7))] * len(wave)
            pos = [0] * len(wave)
            live = list(range(len(wave)))
            while live:
                need = [i for i in live if pos[i] >= min(replan, len(queue[i]))]
                if need:
                    with torch.inference_mode():
                        chunks = policy.infer_batch([wire(obs[i]) for i in need])
                    for i, r in zip(need, chunks):
                        queue[i], pos[i] = np.asarray(r["actions"], dtype=np.float64), 0
                for i in list(live):
                    action = queue[i][pos[i]]
                    pos[i] += 1
                    eps[i].states.append(np.concatenate([obs[i]["state"], obs[i]["object_state"]]).astype(np.float32))
                    eps[i].actions.append(action.astype(np.float32))
                    obs[i], _, term, trunc, info = pool[i].step(np.clip(action, -1.0, 1.0))
                    if term or trunc:
                        eps[i].success = bool(info["is_success"])
                        live.remove(i)
            out += eps
    finally:
        for env in pool:
            env.close()
    return out


def frames(ep: Episode, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(states (T, 23), chunks (T, H, 7), pad (T, H)): each step's next H executed actions, the last repeated."""
    acts = np.stack(ep.actions)
    t = len(acts)
    idx = np.minimum(np.arange(t)[:, None] + np.arange(chunk)[None, :], t - 1)
    pad = (np.arange(t)[:, None] + np.arange(chunk)[None, :]) >= t
    return np.stack(ep.states), acts[idx], pad


class Buffer:
    """The newest ``cap`` successful episodes of each task, as normalised training frames."""

    def __init__(self, policy: FlowPolicy, cap: int) -> None:
        self.cap, self.cfg = cap, policy.config
        self.state_stats, self.action_stats = policy.stats["state"], policy.stats["actions"]
        self.by_task: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, str]]] = {}

    def add(self, episodes: list[Episode]) -> None:
        mode = self.cfg.norm_mode
        for ep in episodes:
            if not ep.success:
                continue
            s, a, pad = frames(ep, self.cfg.chunk_size)
            item = (self.state_stats.normalize(s, mode), self.action_stats.normalize(a, mode), pad, ep.prompt)
            self.by_task.setdefault(ep.task, []).append(item)
            del self.by_task[ep.task][: -self.cap]

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, Any]:
        tasks = [t for t, eps in self.by_task.items() if eps]
        states, actions, pads, prompts = [], [], [], []
        for _ in range(batch):
            eps = self.by_task[tasks[rng.integers(len(tasks))]]  # task-balanced
            s, a, pad, prompt = eps[rng.integers(len(eps))]
            k = rng.integers(len(s))
            states.append(s[k]), actions.append(a[k]), pads.append(pad[k]), prompts.append(prompt)
        ids, offsets = encode_prompts(prompts, self.cfg.text_buckets)
        return {
            "state": torch.from_numpy(np.stack(states)).float(),
            "actions": torch.from_numpy(np.stack(actions)).float(),
            "action_pad_mask": torch.from_numpy(np.stack(pads)),
            "text_ids": ids,
            "text_offsets": offsets,
        }

    def counts(self) -> dict[str, int]:
        return {t: len(v) for t, v in sorted(self.by_task.items())}


def evaluate(policy: FlowPolicy, episodes: int, replan: int, n_envs: int) -> dict[str, float]:
    explore = policy.__dict__.pop("serving_noise", None)  # back to the class's fixed serving noise
    try:
        tasks = [t for t in TASK_NAMES for _ in range(episodes)]
        seeds = [1000 + i for _ in TASK_NAMES for i in range(episodes)]
        eps = rollout(policy, tasks, seeds, replan, n_envs)
    finally:
        if explore is not None:
            policy.serving_noise = explore  # type: ignore[method-assign]
    rates = {t: float(np.mean([e.success for e in eps if e.task == t])) for t in TASK_NAMES}
    return {**rates, "mean": float(np.mean(list(rates.values())))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", default="checkpoints/flow_tabletop_state_weak")
    ap.add_argument("--minutes", type=float, default=45.0, help="wall-clock budget of the loop")
    ap.add_argument("--episodes-per-task", type=int, default=32)
    ap.add_argument("--buffer-episodes", type=int, default=300, help="newest successes kept per task")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per iteration")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--replan", type=int, default=5)
    ap.add_argument("--num-envs", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-episodes", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/self_imitation"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    policy = FlowPolicy.from_pretrained(args.start)
    model = policy.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    buffer = Buffer(policy, args.buffer_episodes)
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "curve.jsonl").open("a")
    t0, it, env_steps, seed = time.perf_counter(), 0, 0, TRAIN_SEED0
    record = {
        "iteration": 0,
        "env_steps": 0,
        "wall_s": 0.0,
        "eval": evaluate(policy, args.eval_episodes, args.replan, args.num_envs),
    }
    print(json.dumps(record), flush=True)
    log.write(json.dumps(record) + "\n")
    while time.perf_counter() - t0 < 60 * args.minutes:
        it += 1
        policy.serving_noise = lambda b: None  # type: ignore[method-assign]  # fresh noise: the policy's own distribution
        tasks = [t for t in TASK_NAMES for _ in range(args.episodes_per_task)]
        seeds = list(range(seed, seed + len(tasks)))
        seed += len(tasks)
        model.eval()
        eps = rollout(policy, tasks, seeds, args.replan, args.num_envs)
        env_steps += sum(len(e.actions) for e in eps)
        buffer.add(eps)
        model.train()
        losses = []
        for _ in range(args.steps):
            loss, _ = model.flow_loss(buffer.sample(args.batch, rng))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
        model.eval()
        record = {
            "iteration": it,
            "env_steps": env_steps,
            "wall_s": round(time.perf_counter() - t0, 1),
            "rollout_success": {t: float(np.mean([e.success for e in eps if e.task == t])) for t in TASK_NAMES},
            "buffer": buffer.counts(),
            "loss": float(np.mean(losses)),
        }
        if it % args.eval_every == 0:
            record["eval"] = evaluate(policy, args.eval_episodes, args.replan, args.num_envs)
        print(json.dumps(record), flush=True)
        log.write(json.dumps(record) + "\n")
        log.flush()
    policy.__dict__.pop("serving_noise", None)
    export_policy(policy, args.out / "final", source=f"self_imitation_state:{it}")
    print(f"final policy: {args.out / 'final'} after {it} iterations, {env_steps} env steps", flush=True)


if __name__ == "__main__":
    main()
