"""The regression-style updates: DiffusionNFT and Flow-DPO (no likelihoods, flow-matching errors).

- ``update_nft``: DiffusionNFT's forward-process loss on each decision's sampled chunk, weighted by
  its episode's optimality probability, against the "old" (rollout-time or EMA) policy's velocity.
- ``update_dpo``: Flow-DPO on (success, failure) episode pairs from the same initial state, relative
  to the frozen initial policy. ``algo.dpo_pairing`` says what a pair compares:
  ``"trajectory"`` (default) Diffusion-DPO's implicit reward summed over each episode's decisions,
  ``L = -log sigmoid(-beta/2 [sum_w (e_theta - e_ref) - sum_l (e_theta - e_ref)])``, decision k of
  the winner and of the loser sharing one (noise, time) draw, the longer episode's extra decisions
  drawing their own; ``"first_decision"`` the two step-0 decisions, which see the same observation
  (a group shares its initial state). A random decision of each episode (the old pairing) almost
  never shares an observation (1 of 150 pairs in the diagnosis), so its preference compared states.

Why the executed slice only: both losses count the chunk rows ``[:replan_steps]`` and the action dims
``rollout.logprob_dims`` (``executed_mask``), the elements the env executed and the policy-gradient
methods' log-probs cover; rows never executed carry no evidence of the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cosmos_robot.distributed import World, rank_share
from cosmos_robot.policies.flow.sampling import executed_mask
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.rl.advantage import Advantages
from cosmos_robot_trainers.rl.config import RLConfig
from cosmos_robot_trainers.rl.inputs import AuxLoss, UpdateInputs
from cosmos_robot_trainers.rl.learner import (
    Means,
    accumulated_step,
    episode_split_minibatches,
    logprob_dims,
    minibatches,
    split_half_cosine,
    split_halves,
)
from cosmos_robot_trainers.rl.policies import RLModel
from cosmos_robot_trainers.rl.rollout import Rollout, index_inputs

__all__ = [
    "dpo_decision_pairs",
    "dpo_health",
    "loss_mask",
    "nft_health",
    "nft_minibatch_loss",
    "trajectory_dpo_loss",
    "trajectory_draws",
    "update_dpo",
    "update_nft",
]


def loss_mask(model: RLModel, config: RLConfig) -> torch.Tensor:
    """``(chunk_size, action_dim)`` bool: the executed rows x ``rollout.logprob_dims``, on the model's device."""
    cfg = model.config
    mask = executed_mask(cfg.chunk_size, cfg.action_dim, config.rollout.replan_steps, logprob_dims(model, config))
    return mask.to(next(model.parameters()).device)


def _flow_draws(n: int, model: RLModel, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = model.config
    noise = torch.randn((n, cfg.chunk_size, cfg.action_dim), generator=generator)
    return noise, model.sample_time(n, generator)


def _errors(
    model: RLModel, rollout: Rollout, idx: torch.Tensor, noise: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(v_model, target)`` of decisions ``idx`` at x_t = (1 - t) x0 + t noise, x0 the sampled chunk."""
    device = next(model.parameters()).device
    x0 = rollout.chain[idx, -1].to(device)
    noise, t = noise.to(device), t.to(device)
    x_t = (1.0 - t[:, None, None]) * x0 + t[:, None, None] * noise
    batch = index_inputs(rollout.inputs, idx, device)
    return model.velocity(x_t, t, model.encode(batch)), noise - x0


def nft_minibatch_loss(
    model: RLModel,
    old_model: RLModel,
    rollout: Rollout,
    r: torch.Tensor,
    mb: torch.Tensor,
    draws: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor,
    beta: float,
    weights: torch.Tensor | None = None,
    ref: tuple[RLModel, float] | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DiffusionNFT on decisions ``mb`` with optimality probabilities ``r[mb]`` and (noise, t) ``draws``,
    counting only the ``mask`` elements of each chunk; ``weights`` (per decision) scale each one's loss;
    ``ref = (reference model, coefficient)`` adds the coefficient times the masked ||v_theta - v_ref||^2."""
    v_theta, target = _errors(model, rollout, mb, *draws)
    with torch.no_grad():
        v_old, _ = _errors(old_model, rollout, mb, *draws)
        v_ref = None if ref is None else _errors(ref[0], rollout, mb, *draws)[0]
    r_mb = r[mb].to(v_theta.device)
    w_mb = None if weights is None else weights[mb].to(v_theta.device)
    loss, metrics = get_algorithm("loss", "nft")(v_theta, v_old, target, r_mb, beta=beta, mask=mask, weight=w_mb)
    if ref is not None and v_ref is not None:
        m = mask.to(v_theta.dtype).expand_as(v_theta)
        kl = (((v_theta - v_ref) ** 2) * m).sum() / m.sum().clamp(min=1.0)
        loss = loss + ref[1] * kl
        metrics = {**metrics, "nft_ref_mse": kl.detach()}
    return loss, metrics


def update_nft(
    model: RLModel,
    old_model: RLModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    adv: Advantages,
    config: RLConfig,
    generator: torch.Generator,
    world: World | None = None,
    ref_model: RLModel | None = None,
    aux: AuxLoss | None = None,
) -> dict[str, float]:
    """DiffusionNFT epochs: x0 = the sampled chunk, r = optimality probability of its episode (``world``:
    this rank's shares of the minibatches, ``learner.py``); ``ref_model`` with ``algo.kl_coef`` adds the
    reference term."""
    o, algo = config.optim, config.algo
    world = world or World()
    keep_idx = torch.nonzero(adv.keep).flatten()
    means = Means()
    model.train()
    if len(keep_idx) == 0:
        return {"skipped_update": 1.0}
    mask = loss_mask(model, config)
    ref = _nft_reference(ref_model, config)
    for _ in range(o.epochs):
        for mb in minibatches(keep_idx.repeat(algo.nft_samples), o.minibatch_size, generator):
            noise, t = _flow_draws(len(mb), model, generator)  # the whole minibatch's draws on every rank
            pos, weight = rank_share(torch.arange(len(mb)), world)

            def loss_fn(part: torch.Tensor, mb: torch.Tensor = mb, noise: Any = noise, t: Any = t) -> Any:
                draws = (noise[part], t[part])
                return nft_minibatch_loss(
                    model, old_model, rollout, adv.advantages, mb[part], draws, mask, algo.nft_beta, adv.weights, ref
                )

            loss, step = accumulated_step(model, optimizer, pos, loss_fn, o, world, weight, aux=aux)
            means.add({"nft_loss": loss, **step}, weight)
    return means.result(world)


def _nft_reference(ref_model: RLModel | None, config: RLConfig) -> tuple[RLModel, float] | None:
    return (ref_model, config.algo.kl_coef) if ref_model is not None and config.algo.kl_coef > 0 else None


def nft_health(
    model: RLModel,
    old_model: RLModel,
    rollout: Rollout,
    adv: Advantages,
    config: RLConfig,
    generator: torch.Generator,
    ref_model: RLModel | None = None,
) -> dict[str, float]:
    """Split-half gradient cosine of the DiffusionNFT loss (one minibatch per half of the episodes)."""
    mbs = episode_split_minibatches(rollout, adv.keep, config.optim.minibatch_size, generator)
    if mbs is None:
        return {}
    mask = loss_mask(model, config)
    model.train()

    def loss_of(mb: torch.Tensor) -> torch.Tensor:
        draws = _flow_draws(len(mb), model, generator)
        beta, ref = config.algo.nft_beta, _nft_reference(ref_model, config)
        return nft_minibatch_loss(model, old_model, rollout, adv.advantages, mb, draws, mask, beta, adv.weights, ref)[0]

    return split_half_cosine(model, mbs, loss_of)


def dpo_decision_pairs(rollout: Rollout, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(winner decisions, loser decisions)``: each pair's two step-0 decisions (same initial state)."""
    first = torch.full((rollout.num_episodes,), -1, dtype=torch.long)
    at_start = torch.nonzero(rollout.step == 0).flatten()
    first[rollout.episode[at_start]] = at_start
    win, lose = first[pairs[:, 0]], first[pairs[:, 1]]
    if bool(((win < 0) | (lose < 0)).any()):
        raise ValueError("a DPO pair's episode has no step-0 decision")
    return win, lose


@dataclass
class TrajectoryDraws:
    """Every decision of a minibatch of pairs with its (noise, t) draw; decision k of a pair's winner
    and of its loser share draw k."""

    win: torch.Tensor  # (Nw,) decision indices of the winners' episodes
    win_pair: torch.Tensor  # (Nw,) the row of the pair each belongs to
    lose: torch.Tensor  # (Nl,)
    lose_pair: torch.Tensor  # (Nl,)
    noise_win: torch.Tensor  # (Nw, chunk, D)
    t_win: torch.Tensor  # (Nw,)
    noise_lose: torch.Tensor  # (Nl, chunk, D)
    t_lose: torch.Tensor  # (Nl,)

    def select(self, rows: torch.Tensor) -> TrajectoryDraws:
        """The draws of pair rows ``rows`` only, their pair indices renumbered 0..len(rows)-1."""
        renumber = torch.full((int(max(self.win_pair.max(), self.lose_pair.max())) + 1,), -1, dtype=torch.long)
        renumber[rows] = torch.arange(len(rows))
        w, lo = renumber[self.win_pair] >= 0, renumber[self.lose_pair] >= 0
        return TrajectoryDraws(
            self.win[w], renumber[self.win_pair[w]], self.lose[lo], renumber[self.lose_pair[lo]],
            self.noise_win[w], self.t_win[w], self.noise_lose[lo], self.t_lose[lo],
        )  # fmt: skip


def trajectory_draws(
    rollout: Rollout, pairs: torch.Tensor, model: RLModel, generator: torch.Generator
) -> TrajectoryDraws:
    """The decisions of ``pairs`` (P, 2) in step order and one (noise, t) draw per aligned step."""
    by_episode = [torch.nonzero(rollout.episode == e).flatten() for e in range(rollout.num_episodes)]
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("w", "wp", "l", "lp", "nw", "tw", "nl", "tl")}
    for row, (w, lo) in enumerate(pairs.tolist()):
        dw = by_episode[w][torch.argsort(rollout.step[by_episode[w]])]
        dl = by_episode[lo][torch.argsort(rollout.step[by_episode[lo]])]
        noise, t = _flow_draws(max(len(dw), len(dl)), model, generator)
        for key, dec, pair_key in (("w", dw, "wp"), ("l", dl, "lp")):
            parts[key].append(dec)
            parts[pair_key].append(torch.full((len(dec),), row, dtype=torch.long))
            parts["n" + key].append(noise[: len(dec)])
            parts["t" + key].append(t[: len(dec)])
    cat = {k: torch.cat(v) for k, v in parts.items()}
    return TrajectoryDraws(cat["w"], cat["wp"], cat["l"], cat["lp"], cat["nw"], cat["tw"], cat["nl"], cat["tl"])


def _implicit_reward(
    model: RLModel,
    ref_model: RLModel,
    rollout: Rollout,
    idx: torch.Tensor,
    noise: torch.Tensor,
    t: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per decision ``(e_theta - e_ref, e_theta, e_ref)`` with e the masked mean squared velocity error."""
    v_theta, target = _errors(model, rollout, idx, noise, t)
    with torch.no_grad():
        v_ref, _ = _errors(ref_model, rollout, idx, noise, t)
    m = mask.to(v_theta.dtype).expand_as(v_theta)
    count = m.sum(dim=(1, 2)).clamp(min=1.0)
    e_theta = (((v_theta.float() - target.float()) ** 2) * m).sum(dim=(1, 2)) / count
    e_ref = (((v_ref.float() - target.float()) ** 2) * m).sum(dim=(1, 2)) / count
    return e_theta - e_ref, e_theta.detach(), e_ref


def trajectory_dpo_loss(
    model: RLModel,
    ref_model: RLModel,
    rollout: Rollout,
    draws: TrajectoryDraws,
    num_pairs: int,
    mask: torch.Tensor,
    beta: float,
    reduce: str = "sum",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Whole-episode Flow-DPO: ``-log sigmoid(-beta/2 [sum_w (e_theta - e_ref) - sum_l (e_theta - e_ref)])``
    (``reduce = "mean"``: each sum over the episode's decisions divided by their number)."""
    dw, ew_theta, ew_ref = _implicit_reward(model, ref_model, rollout, draws.win, draws.noise_win, draws.t_win, mask)
    dl, el_theta, el_ref = _implicit_reward(model, ref_model, rollout, draws.lose, draws.noise_lose, draws.t_lose, mask)
    loss, metrics = get_algorithm("loss", "flow_dpo_trajectory")(
        dw, draws.win_pair, dl, draws.lose_pair, num_pairs, beta=beta, reduce=reduce
    )
    metrics["model_margin"] = ew_theta.mean() - el_theta.mean()
    metrics["ref_margin"] = ew_ref.mean() - el_ref.mean()
    return loss, metrics


def _decision_dpo_loss(
    model: RLModel,
    ref_model: RLModel,
    rollout: Rollout,
    iw: torch.Tensor,
    il: torch.Tensor,
    draws: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Flow-DPO on decision pairs with one shared (noise, t) draw per pair."""
    noise, t = draws
    outs = []
    for idx in (iw, il):
        v_theta, target = _errors(model, rollout, idx, noise, t)
        with torch.no_grad():
            v_ref, _ = _errors(ref_model, rollout, idx, noise, t)
        outs.append((v_theta, v_ref, target))
    return get_algorithm("loss", "flow_dpo")(*outs[0], *outs[1], beta=beta, mask=mask)


def _dpo_loss_fn(
    model: RLModel,
    ref_model: RLModel,
    rollout: Rollout,
    pairs: torch.Tensor,
    config: RLConfig,
    generator: torch.Generator,
    mask: torch.Tensor,
) -> Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]:
    """The minibatch's flow draws, made now for all of ``pairs``, and the loss of any rows of it (a rank's
    share, a micro-batch of it): the rows' draws are the same however the minibatch is cut."""
    beta = config.algo.dpo_beta
    if config.algo.dpo_pairing == "first_decision":
        iw, il = dpo_decision_pairs(rollout, pairs)
        noise, t = _flow_draws(len(iw), model, generator)
        return lambda rows: _decision_dpo_loss(
            model, ref_model, rollout, iw[rows], il[rows], (noise[rows], t[rows]), mask, beta
        )
    draws = trajectory_draws(rollout, pairs, model, generator)
    reduce = config.algo.dpo_trajectory_reduce
    return lambda rows: trajectory_dpo_loss(
        model, ref_model, rollout, draws.select(rows), len(rows), mask, beta, reduce
    )


def update_dpo(
    model: RLModel,
    ref_model: RLModel,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    pairs: torch.Tensor,
    config: RLConfig,
    generator: torch.Generator,
    world: World | None = None,
    aux: AuxLoss | None = None,
) -> dict[str, float]:
    """Flow-DPO epochs over (winner, loser) episode pairs (``algo.dpo_pairing``; minibatches of pairs;
    ``world``: this rank's shares of them, ``learner.py``)."""
    o, algo = config.optim, config.algo
    world = world or World()
    means = Means()
    model.train()
    if len(pairs) == 0:
        return {"skipped_update": 1.0}
    mask = loss_mask(model, config)
    rows = torch.arange(len(pairs)).repeat(algo.nft_samples)
    for _ in range(o.epochs):
        for mb in minibatches(rows, o.minibatch_size, generator):
            pos, weight = rank_share(torch.arange(len(mb)), world)
            loss_fn = _dpo_loss_fn(model, ref_model, rollout, pairs[mb], config, generator, mask)
            loss, step = accumulated_step(model, optimizer, pos, loss_fn, o, world, weight, aux=aux)
            means.add({"dpo_loss": loss, **step}, weight)
    return means.result(world)


def dpo_health(inp: UpdateInputs, rollout: Rollout, pairs: torch.Tensor) -> dict[str, float]:
    """Split-half gradient cosine of the DPO loss: the groups (so the episodes) cut into two random
    halves, a minibatch of each half's pairs."""
    model, ref_model, config, generator = inp.model, inp.ref_model, inp.config, inp.generator
    assert ref_model is not None
    group_of = rollout.ep_group[pairs[:, 0]] if len(pairs) else torch.zeros(0, dtype=torch.long)
    groups = torch.unique(group_of)
    if len(groups) < 2:
        return {}
    size = config.optim.minibatch_size
    halves = split_halves(groups, generator)
    mbs = tuple(torch.nonzero(torch.isin(group_of, half)).flatten()[:size] for half in halves)
    mask = loss_mask(model, config)
    model.train()

    def loss(mb: torch.Tensor) -> torch.Tensor:
        return _dpo_loss_fn(model, ref_model, rollout, pairs[mb], config, generator, mask)(torch.arange(len(mb)))[0]

    return split_half_cosine(model, (mbs[0], mbs[1]), loss)
