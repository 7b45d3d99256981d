"""Single-file reference PPO for the flow policy on the tabletop envs (cleanrl style: Args -> envs -> loop).

Why it exists (house style item 9): the modular joint-PPO trainer (``cosmos_robot_trainers.rl``:
config, rollout worker, advantage layout, learner, driver) spreads one algorithm over many files.
This file writes the same algorithm top to bottom with nothing shared but the model, its sampler and
the envs: GAE, advantage whitening, the dual-clip surrogate, the clipped Huber value loss and the
minibatch loop are written out again here, on purpose. ``tests/trainers/test_reference_ppo.py`` runs
both for a tiny budget with the same seeds and requires the same weights; a change to either that
alters the algorithm breaks that test.

Conventions it shares with the modular trainer (they define "the same run"): episode seeds
``1_000_000 * (1 + env_seed) + serial`` with tasks round-robin, per-iteration generators seeded with
``(seed * 1_000_003 + iteration * 101 + stream) % 2**63`` (stream 0 samples actions, stream 1 orders
minibatches), an action chunk = one MDP step with its rewards summed, episodes bootstrapped with
V(final obs) when the time limit cuts them, AdamW with the value head at the critic learning rate and
its gradient clipped apart from the actor's, log-probs over ``logprob_dims`` (the recipes' "auto").

    python -m cosmos_robot_trainers.reference.ppo_flow --init checkpoints/flow_tabletop --iterations 2
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot.policies.flow.policy import collate_observations
from cosmos_robot.policies.flow.sampling import recompute_log_prob, sample_actions
from cosmos_robot.transforms import run_transforms
from cosmos_robot_envs.vector import BatchedEnv, EnvFactory, make_vector_env


@dataclass
class Args:
    init: str = "checkpoints/flow_tabletop"  # starting flow policy folder
    tasks: list[str] = field(default_factory=lambda: ["reach", "push", "pick_place", "open_drawer"])  # tasks
    num_envs: int = 2  # lockstep envs
    image_size: int = 64  # rendered camera side (px)
    max_steps: int | None = None  # env steps per episode cap (None: the task's)
    env_seed: int = 0  # base of the episode seeds
    episodes_per_iter: int = 4  # episodes per iteration
    replan_steps: int = 5  # executed actions per chunk (one MDP step)
    num_flow_steps: int = 4  # denoising steps K
    noise_level: float = 0.5  # Flow-SDE a
    gamma: float = 0.99  # discount per chunk
    lam: float = 0.95  # GAE lambda
    clip: float = 0.2  # ratio clip
    dual_clip: float = 3.0  # dual-clip constant
    value_coef: float = 0.5  # value loss weight
    value_clip: float = 0.2  # value clip around the old value
    huber_delta: float = 10.0  # Huber delta of the value loss
    actor_lr: float = 1e-5  # actor learning rate
    critic_lr: float = 1e-3  # value head learning rate
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # actor grad-norm clip (everything but the value head)
    critic_grad_clip: float = 1.0  # value-head grad-norm clip (clipped on its own)
    logprob_dims: list[int] = field(default_factory=lambda: [0, 1, 2, 5, 6])  # log-prob action dims (not drx, dry)
    epochs: int = 2  # passes over each iteration's data
    minibatch_size: int = 8  # decisions per optimizer step
    iterations: int = 2  # rollout + update iterations
    seed: int = 0  # sampling and minibatch seed


def iteration_seed(args: Args, iteration: int, stream: int) -> int:
    return (args.seed * 1_000_003 + iteration * 101 + stream) % (2**63)


def model_batch(policy: FlowPolicy, obs: dict, rows: list[int]) -> dict:
    items = []
    for i in rows:
        wire = {f"observation/{c}": obs[c][i] for c in policy.config.cameras}
        wire["observation/state"], wire["prompt"] = obs["state"][i], obs["prompt"][i]
        items.append(run_transforms(policy.input_transforms, wire))
    batch = collate_observations(items, policy.config)
    batch["prompt"] = [str(item["prompt"]) for item in items]
    return batch


def rollout(args: Args, policy: FlowPolicy, envs: BatchedEnv, iteration: int) -> dict:
    """Play the iteration's episodes; return flat per-decision lists."""
    model = policy.model.eval()
    gen = torch.Generator().manual_seed(iteration_seed(args, iteration, 0))
    schedule = []
    for serial in range(iteration * args.episodes_per_iter, (iteration + 1) * args.episodes_per_iter):
        schedule.append((args.tasks[serial % len(args.tasks)], 1_000_000 * (1 + args.env_seed) + serial))
    schedule.reverse()
    n = envs.num_envs
    episode_of: list[int | None] = [None] * n
    decision_count = [0] * n
    next_episode = 0
    data: dict[str, list] = {
        k: []
        for k in (
            "images",
            "state",
            "prompt",
            "chain",
            "sde",
            "logp",
            "value",
            "reward",
            "done",
            "boot",
            "episode",
            "t",
        )
    }
    obs: dict = {}
    success: list[float] = []
    while schedule or any(e is not None for e in episode_of):
        free = [i for i in range(n) if episode_of[i] is None]
        if free and schedule:
            chosen = free[: len(schedule)]
            specs = [schedule.pop() for _ in chosen]
            mask = np.zeros(n, dtype=bool)
            mask[chosen] = True
            obs, _ = envs.reset(seeds=[s for _, s in specs], options=[{"task": t} for t, _ in specs], mask=mask)
            for i in chosen:
                episode_of[i], decision_count[i] = next_episode, 0
                next_episode += 1
        active = [i for i in range(n) if episode_of[i] is not None]
        with torch.no_grad():
            batch = model_batch(policy, obs, active)
            context = model.encode(batch)
            value = model.value(context)
            sample = sample_actions(
                model,
                context,
                "flow_sde",
                num_steps=args.num_flow_steps,
                generator=gen,
                noise_level=args.noise_level,
                replan_steps=args.replan_steps,
                dims=args.logprob_dims,
            )
        obs, reward, done, cut = execute_chunk(args, policy, envs, sample.actions, active, obs, success)
        boot = np.zeros(len(active), dtype=np.float32)
        if cut.any():
            rows = [active[j] for j in np.flatnonzero(cut)]
            with torch.no_grad():
                boot[cut] = model.value(model.encode(model_batch(policy, obs, rows))).numpy()
        for j, i in enumerate(active):
            data["images"].append(batch["images"][j])
            data["state"].append(batch["state"][j])
            data["prompt"].append(batch["prompt"][j])
            data["chain"].append(sample.chain[j])
            data["sde"].append(sample.sde_step[j])
            data["logp"].append(sample.log_prob[j])
            data["value"].append(value[j])
            data["reward"].append(reward[j])
            data["done"].append(done[j])
            data["boot"].append(boot[j])
            data["episode"].append(episode_of[i])
            data["t"].append(decision_count[i])
            decision_count[i] += 1
            if done[j]:
                episode_of[i] = None
    data["success"] = success
    return data


def execute_chunk(
    args: Args,
    policy: FlowPolicy,
    envs: BatchedEnv,
    sampled: torch.Tensor,
    active: list[int],
    obs: dict,
    success: list[float],
) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """One MDP step: the active envs execute the first ``replan_steps`` actions of their chunks (an env
    stops at its episode's end). Returns the last observations, each env's summed reward, which episodes
    ended and which of those the time limit cut; appends each ended episode's success to ``success``."""
    n = envs.num_envs
    chunks = np.stack([run_transforms(policy.output_transforms, {"actions": a})["actions"] for a in sampled.numpy()])
    chunks = np.clip(chunks[:, : args.replan_steps], -1.0, 1.0)
    reward = np.zeros(len(active), dtype=np.float32)
    done = np.zeros(len(active), dtype=bool)
    cut = np.zeros(len(active), dtype=bool)
    for h in range(args.replan_steps):
        alive = np.zeros(n, dtype=bool)
        actions = np.zeros((n, chunks.shape[-1]), dtype=np.float32)
        for j, i in enumerate(active):
            if not done[j]:
                alive[i], actions[i] = True, chunks[j, h]
        if not alive.any():
            break
        obs, r, term, trunc, infos = envs.step(actions, mask=alive)
        for j, i in enumerate(active):
            if alive[i]:
                reward[j] += float(r[i])
                if term[i] or trunc[i]:
                    done[j], cut[j] = True, bool(trunc[i]) and not bool(term[i])
                    success.append(float(infos[i].get("is_success", False)))
    return obs, reward, done, cut


def gae(args: Args, data: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE per episode, walking each episode's decisions backwards (float32 throughout)."""
    f32 = np.float32
    m = len(data["reward"])
    adv, ret = torch.zeros(m), torch.zeros(m)
    episodes: dict[int, list[int]] = {}
    for k in range(m):
        episodes.setdefault(data["episode"][k], []).append(k)
    for rows in episodes.values():
        rows.sort(key=lambda k: data["t"][k])
        next_value, next_adv = f32(0.0), f32(0.0)
        for k in reversed(rows):
            r = f32(data["reward"][k]) + f32(args.gamma) * f32(data["boot"][k])
            nonterminal = f32(0.0 if data["done"][k] else 1.0)
            v = f32(data["value"][k])
            delta = r + f32(args.gamma) * next_value * nonterminal - v
            a = delta + f32(args.gamma * args.lam) * nonterminal * next_adv
            adv[k], ret[k] = float(a), float(a + v)
            next_value, next_adv = v, a
    return adv, ret


def whiten(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    mean = x.sum() / len(x)
    var = ((x - mean) ** 2).sum() / max(len(x) - 1, 1)
    return (x - mean) / (var.sqrt() + eps)


def main(args: Args) -> FlowPolicy:
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    policy = FlowPolicy.from_pretrained(args.init)
    model = policy.model
    critic = [p for n, p in model.named_parameters() if n.startswith("value_head.")]
    actor = [p for n, p in model.named_parameters() if not n.startswith("value_head.")]
    optimizer = torch.optim.AdamW(
        [{"params": actor, "lr": args.actor_lr}, {"params": critic, "lr": args.critic_lr}],
        betas=args.betas,
        weight_decay=args.weight_decay,
        fused=True,
    )
    kwargs = {"tasks": args.tasks, "obs_mode": "rgb", "image_size": args.image_size, "max_steps": args.max_steps}
    envs = make_vector_env(EnvFactory("CosmosRobot/Tabletop-v0", kwargs), num_envs=args.num_envs, mode="sync")
    try:
        for iteration in range(args.iterations):
            t0 = time.perf_counter()
            data = rollout(args, policy, envs, iteration)
            adv, ret = gae(args, data)
            adv = whiten(adv)
            images, state = torch.stack(data["images"]), torch.stack(data["state"])
            chain, sde = torch.stack(data["chain"]), torch.stack(data["sde"])
            old_logp, old_v = torch.stack(data["logp"]), torch.stack(data["value"])
            gen = torch.Generator().manual_seed(iteration_seed(args, iteration, 1))
            model.train()
            clipfracs = []
            for _ in range(args.epochs):
                order = torch.arange(len(adv))[torch.randperm(len(adv), generator=gen)]
                for start in range(0, len(order), args.minibatch_size):
                    mb = order[start : start + args.minibatch_size]
                    batch = {"images": images[mb], "state": state[mb], "prompt": [data["prompt"][i] for i in mb]}
                    context = model.encode(batch)
                    logp = recompute_log_prob(
                        model,
                        context,
                        chain[mb],
                        "flow_sde",
                        sde_step=sde[mb],
                        noise_level=args.noise_level,
                        replan_steps=args.replan_steps,
                        dims=args.logprob_dims,
                    ).log_prob
                    ratio = torch.exp(logp - old_logp[mb])
                    a = adv[mb]
                    pg = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - args.clip, 1 + args.clip))
                    pg = torch.minimum(pg, torch.sign(a) * args.dual_clip * a).mean()
                    clipfracs.append(float(((ratio - 1).abs() > args.clip).float().mean()))
                    v = model.value(context)
                    v_clipped = old_v[mb] + torch.clamp(v - old_v[mb], -args.value_clip, args.value_clip)
                    v_loss = torch.maximum(
                        F.huber_loss(v, ret[mb], reduction="none", delta=args.huber_delta),
                        F.huber_loss(v_clipped, ret[mb], reduction="none", delta=args.huber_delta),
                    )
                    loss = pg + args.value_coef * v_loss.mean()
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    for group, clip in ((actor, args.grad_clip), (critic, args.critic_grad_clip)):
                        torch.nn.utils.clip_grad_norm_([p for p in group if p.grad is not None], clip)
                    optimizer.step()
            sr = float(np.mean(data["success"])) if data["success"] else math.nan
            print(
                f"iteration {iteration + 1}: train success {sr:.3f}, {len(adv)} decisions, "
                f"clipfrac {np.mean(clipfracs):.3f}, {time.perf_counter() - t0:.1f} s"
            )
    finally:
        envs.close()
    return policy


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    defaults = Args()
    for f in dataclasses.fields(Args):
        default: Any = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, list):
            parser.add_argument(flag, nargs="+", type=type(default[0]) if default else str, default=default)
        elif isinstance(default, tuple):
            parser.add_argument(flag, nargs=2, type=float, default=default)
        elif default is None:
            parser.add_argument(flag, type=int, default=None)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    values: dict[str, Any] = vars(parser.parse_args(argv))
    values["betas"] = tuple(values["betas"])
    return Args(**values)


if __name__ == "__main__":
    main(parse_args())
