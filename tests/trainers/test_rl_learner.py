"""The learner's correctness pieces on hand-built batches and a stub model (milliseconds each): the
action-dim mask of log-probs and regression losses, NFT on the executed slice only, Flow-DPO pairs
from one observation and its whole-trajectory loss, per-group gradient clipping, the split-half
gradient cosine, and the data behind the tabletop log-prob dims."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosmos_robot.policies.flow.sampling import executed_mask, recompute_log_prob, sample_actions
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.rl import RLConfig, Rollout
from cosmos_robot_trainers.rl.advantage import Advantages, nft_advantages
from cosmos_robot_trainers.rl.config import SUITE_LOGPROB_DIMS
from cosmos_robot_trainers.rl.inputs import UpdateInputs
from cosmos_robot_trainers.rl.learner import (
    accumulated_step,
    build_optimizer,
    episode_split_minibatches,
    split_half_cosine,
)
from cosmos_robot_trainers.rl.regression import (
    dpo_decision_pairs,
    dpo_health,
    loss_mask,
    trajectory_dpo_loss,
    trajectory_draws,
    update_dpo,
    update_nft,
)
from tests.trainers._rollouts import episode_fields

H, D = 6, 7  # chunk rows and action dims of the stub


class Stub(torch.nn.Module):
    """v = w * x_t + c t (w a (H, D) parameter, c the first state entry); a scalar value head."""

    def __init__(self, scale: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        self.config = SimpleNamespace(chunk_size=H, action_dim=D, num_flow_steps=2, noise_level=0.5)
        gen = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(scale + 0.1 * torch.randn((H, D), generator=gen))
        self.value_head = torch.nn.Linear(1, 1)

    def encode(self, batch: dict[str, Any]) -> torch.Tensor:
        return batch["state"]

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor | float, context: torch.Tensor) -> torch.Tensor:
        tt = torch.as_tensor(t, dtype=x_t.dtype).reshape(-1, 1, 1)
        return self.w * x_t + context[:, :1, None] * tt

    def expert(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return self.velocity(x, t, context), None

    def value(self, context: torch.Tensor, detach: bool = False) -> torch.Tensor:
        return self.value_head(context[:, :1]).squeeze(-1)

    def sample_time(self, n: int, generator: torch.Generator | None = None, device: Any = None) -> torch.Tensor:
        return torch.rand(n, generator=generator)


def config(algo: str, *overrides: str) -> RLConfig:
    _, cfg = load_train_recipe(f"debug_{algo}", [f"output.dir={json.dumps('/nonexistent')}", *overrides])
    assert isinstance(cfg, RLConfig)
    return cfg


def rollout(lengths: list[int], groups: list[int], success: list[float], seed: int = 0) -> Rollout:
    """Episodes of ``lengths`` decisions; state = group at step 0 (a group's shared initial observation),
    else 10 * episode + step."""
    gen = torch.Generator().manual_seed(seed)
    ep = [e for e, n in enumerate(lengths) for _ in range(n)]
    st = [k for n in lengths for k in range(n)]
    state = torch.tensor([[float(groups[e]) if k == 0 else 10.0 * e + k, 1.0] for e, k in zip(ep, st)])
    m = len(ep)
    return Rollout(
        inputs={"state": state},
        chain=torch.randn((m, 3, H, D), generator=gen),
        sde_step=torch.zeros(m, dtype=torch.long),
        log_prob=torch.zeros(m),
        value=torch.zeros(m),
        reward=torch.zeros(m),
        done=torch.tensor([k == lengths[e] - 1 for e, k in zip(ep, st)]),
        truncated=torch.zeros(m, dtype=torch.bool),
        bootstrap=torch.zeros(m),
        episode=torch.tensor(ep),
        step=torch.tensor(st),
        **episode_fields(success, groups, lengths),
    )


# --- item 3: the action-dim mask ------------------------------------------------------------------------


def test_masked_dims_get_no_policy_gradient_and_the_ratio_stays_one() -> None:
    model = Stub()
    ctx = torch.tensor([[0.3, 1.0], [-0.2, 1.0]])
    gen = torch.Generator().manual_seed(0)
    dims = (0, 2, 5)
    sample = sample_actions(model, ctx, "flow_sde", generator=gen, replan_steps=2, dims=dims)  # type: ignore[arg-type]
    full = sample_actions(model, ctx, "flow_sde", generator=torch.Generator().manual_seed(0))  # type: ignore[arg-type]
    assert torch.equal(sample.chain, full.chain)
    assert torch.allclose(sample.log_prob, full.dim_log_prob[:, :2][:, :, list(dims)].sum(dim=(1, 2)), atol=1e-5)
    lp = recompute_log_prob(model, ctx, sample.chain, "flow_sde", sample.sde_step, 0.5, 2, dims)  # type: ignore[arg-type]
    assert torch.allclose(torch.exp(lp.log_prob - sample.log_prob), torch.ones(2), atol=1e-6)  # ratio 1
    lp.log_prob.sum().backward()
    grad = model.w.grad
    assert grad is not None
    keep = executed_mask(H, D, 2, dims)
    assert torch.all(grad[~keep] == 0)  # masked dims and rows never executed: no gradient
    assert torch.all(grad[keep] != 0)
    for bad in ((0, 0), (7,), ()):
        with pytest.raises(ValueError, match="dims: expected distinct action-dim indices"):
            sample_actions(model, ctx, "flow_sde", dims=bad)  # type: ignore[arg-type]


def test_logprob_dims_config() -> None:
    assert config("joint_ppo").logprob_dims(7) == SUITE_LOGPROB_DIMS["tabletop"] == (0, 1, 2, 5, 6)
    assert config("joint_ppo", "rollout.logprob_dims=all").logprob_dims(7) == tuple(range(7))
    assert config("joint_ppo", "rollout.logprob_dims=[6, 0]").logprob_dims(7) == (0, 6)
    libero = config("joint_ppo", 'env.suite="libero_spatial"', 'env.tasks=["a"]')
    assert libero.logprob_dims(7) == tuple(range(7))
    from cosmos_robot.config import ConfigError

    with pytest.raises(ConfigError, match="logprob_dims"):
        config("joint_ppo", "rollout.logprob_dims=[1, 1]")
    with pytest.raises(ValueError, match="logprob_dims"):
        config("joint_ppo", "rollout.logprob_dims=[7]").logprob_dims(7)
    # item 2: NFT samples deterministically unless told otherwise; the others keep Flow-SDE
    assert config("nft").sample_mode == "ode" and config("nft", "rollout.sample_mode=auto").sample_mode == "ode"
    assert config("grpo", "rollout.sample_mode=auto").sample_mode == "flow_sde"


def test_tabletop_logprob_dims_are_the_dims_the_experts_use() -> None:
    """The scripted experts' per-dim action std (4 episodes per task here; 8 in rl/config.py's comment):
    the dims left out stay under 3% of each task's largest std (measured: at most 2.0%), every dim kept
    reaches over 10% of it in some task (drz: 40% in pick_place)."""
    import gymnasium as gym

    import cosmos_robot_envs.tabletop  # noqa: F401  (registers the env)
    from cosmos_robot_envs.tabletop.experts import scripted_expert

    stds = []
    for task in ("reach", "push", "pick_place", "open_drawer"):
        env = gym.make("CosmosRobot/Tabletop-v0", tasks=[task], obs_mode="state")
        expert, acts = scripted_expert(task), []
        for ep in range(4):
            obs, info = env.reset(seed=1000 + ep, options={"task": task})
            for _ in range(300):
                acts.append(expert.act(obs, info))
                obs, _, term, trunc, info = env.step(acts[-1])
                if term or trunc:
                    break
        env.close()
        std = np.asarray(acts).std(axis=0)
        stds.append(std / std.max())
    rel = np.max(stds, axis=0)  # per dim, its largest share of a task's largest std
    kept = SUITE_LOGPROB_DIMS["tabletop"]
    left_out = [d for d in range(7) if d not in kept]
    assert left_out == [3, 4] and np.all(rel[left_out] < 0.03), rel
    assert np.all(rel[list(kept)] > 0.1), rel


# --- item 2: DiffusionNFT on the executed slice ---------------------------------------------------------


def test_nft_trains_only_the_executed_rows_and_logprob_dims() -> None:
    cfg = config("nft", "rollout.replan_steps=2", "optim.actor_lr=0.01", "optim.epochs=1")
    model, old = Stub(), Stub()
    r = rollout([3, 2], [0, 0], [1.0, 0.0])
    adv = Advantages(torch.tensor([0.9, 0.9, 0.9, 0.1, 0.1]), None, torch.ones(5, dtype=torch.bool), {})
    before = model.w.detach().clone()
    update_nft(model, old, build_optimizer(model, cfg), r, adv, cfg, torch.Generator().manual_seed(0))  # type: ignore[arg-type]
    moved = model.w.detach() != before
    keep = loss_mask(model, cfg)  # type: ignore[arg-type]
    assert keep.tolist() == executed_mask(H, D, 2, (0, 1, 2, 5, 6)).tolist()
    assert not moved[~keep].any()  # rows beyond replan_steps and drx / dry: zero gradient
    assert moved[keep].all()


def test_nft_episode_weighting_centres_r_and_keeps_the_policy_on_its_samples() -> None:
    # failed episodes run longer: per decision, r's mean sits below 1/2 (net push away from the samples)
    lengths, groups, success = [5, 5, 1, 2], [0, 0, 0, 0], [0.0, 0.0, 1.0, 1.0]
    r = rollout(lengths, groups, success)
    by_decision = nft_advantages(r, config("nft", "algo.group_size=4", 'algo.nft_weighting="decision"').algo)
    assert by_decision.weights is None and float(by_decision.advantages.mean()) < 0.46
    adv = nft_advantages(r, config("nft", "algo.group_size=4").algo)
    w = adv.weights
    assert w is not None and abs(float(w.mean()) - 1.0) < 1e-6
    totals = torch.zeros(4).index_add_(0, r.episode, w)
    assert torch.allclose(totals, totals[0].expand(4))  # every episode weighs the same
    assert abs(float((w * (2 * adv.advantages - 1)).sum())) < 1e-5  # the group's (2r - 1) sums to zero
    assert abs(adv.stats["r_mean_weighted"] - 0.5) < 1e-6

    def fm_error(model: Stub) -> float:
        """The flow-matching error of the model on the rollout's own samples (fixed draws)."""
        gen = torch.Generator().manual_seed(123)
        x0 = r.chain[:, -1]
        noise = torch.randn((200, *x0.shape), generator=gen)
        tt = torch.rand(200, r.num_decisions, generator=gen)[..., None, None]
        v = model.velocity(((1 - tt) * x0 + tt * noise).flatten(0, 1), tt.flatten(), r.inputs["state"].repeat(200, 1))
        return float(((v.detach() - (noise - x0).flatten(0, 1)) ** 2).mean())

    def error_change(advantages: Advantages) -> float:
        """fm_error after 60 iterations of one epoch each, the old policy = the current one, minus before."""
        cfg = config("nft", "rollout.replan_steps=6", "optim.actor_lr=0.01", "optim.epochs=1")
        model = Stub()
        before, opt = fm_error(model), build_optimizer(model, cfg)
        for i in range(60):
            old = Stub()
            old.load_state_dict(model.state_dict())
            update_nft(model, old, opt, r, advantages, cfg, torch.Generator().manual_seed(i))  # type: ignore[arg-type]
        return fm_error(model) - before

    # decision weighting walks away from the samples; episode weighting does not
    assert error_change(by_decision) > 0.1 and error_change(adv) < 0.0


def test_nft_rollouts_sample_the_old_policy_and_its_decay_ramps() -> None:
    from cosmos_robot_trainers.rl import trainer as rl_trainer
    from cosmos_robot_trainers.rl.workers import LocalRollouts

    model, old = Stub(1.0, seed=1), Stub(0.0, seed=2)
    seen: list[torch.Tensor] = []
    synced: list[Any] = []

    class Recording(LocalRollouts):  # a test double of the in-process rollouts: records what it samples
        def __init__(self) -> None:
            pass

        def collect(self, specs: Any, seed: int) -> Any:
            seen.append(model.w.detach().clone())  # the module the in-process worker samples from
            return "rollout"

        def sync(self, m: Any) -> None:
            synced.append(m)

    run = SimpleNamespace(
        policy=SimpleNamespace(model=model), old_model=old, rollouts=Recording(), config=config("nft"), sharded=False
    )
    theta = model.w.detach().clone()
    assert rl_trainer._collect(run, [], 0) == "rollout"  # type: ignore[arg-type]
    assert torch.equal(seen[0], old.w) and torch.equal(model.w, theta) and not torch.equal(old.w, theta)
    run.config = config("nft", 'algo.nft_sampler="current"')
    rl_trainer._collect(run, [], 0)  # type: ignore[arg-type]
    assert torch.equal(seen[1], theta)
    algo = config("nft", "algo.nft_old_decay=0.5", "algo.nft_old_decay_ramp=0.001").algo
    assert [rl_trainer.nft_old_decay(algo, i) for i in (0, 100, 1000)] == [0.0, 0.1, 0.5]
    # weight_sync: old <- d old + (1 - d) theta (d = 0.1 at iteration 100); the rollouts get the old policy
    run.config = config("nft", "algo.nft_old_decay=0.5", "algo.nft_old_decay_ramp=0.001")
    old_w = old.w.detach().clone()
    rl_trainer._sync(run, 100)  # type: ignore[arg-type]
    assert torch.allclose(old.w, 0.1 * old_w + 0.9 * theta) and synced == [old]


# --- item 1: Flow-DPO pairs ----------------------------------------------------------------------------


def test_first_decision_pairs_share_the_observation() -> None:
    r = rollout([3, 2, 4, 1], [0, 0, 1, 1], [1.0, 0.0, 0.0, 1.0])
    pairs = torch.tensor([[0, 1], [3, 2]])
    win, lose = dpo_decision_pairs(r, pairs)
    assert r.step[win].tolist() == r.step[lose].tolist() == [0, 0]
    assert r.episode[win].tolist() == [0, 3] and r.episode[lose].tolist() == [1, 2]
    assert torch.equal(r.inputs["state"][win], r.inputs["state"][lose])  # the same observation


def test_trajectory_dpo_loss_equals_a_hand_computation() -> None:
    r = rollout([3, 2, 2, 1], [0, 0, 1, 1], [1.0, 0.0, 1.0, 0.0])
    pairs = torch.tensor([[0, 1], [2, 3]])
    model, ref = Stub(1.0, seed=1), Stub(0.8, seed=2)
    mask = executed_mask(H, D, 2, (0, 1, 2, 5, 6))
    draws = trajectory_draws(r, pairs, model, torch.Generator().manual_seed(0))  # type: ignore[arg-type]
    # decision k of a pair's winner and loser share draw k; the winner's third decision has its own
    assert draws.win.tolist() == [0, 1, 2, 5, 6] and draws.lose.tolist() == [3, 4, 7]
    assert torch.equal(draws.noise_win[:2], draws.noise_lose[:2]) and torch.equal(draws.t_win[:2], draws.t_lose[:2])
    assert torch.equal(draws.noise_win[3], draws.noise_lose[2])
    beta = 3.0
    loss, _ = trajectory_dpo_loss(model, ref, r, draws, 2, mask, beta)  # type: ignore[arg-type]

    def err(m: Stub, dec: int, noise: torch.Tensor, t: float) -> float:
        x0 = r.chain[dec, -1]
        v = m.w.detach() * ((1 - t) * x0 + t * noise) + float(r.inputs["state"][dec, 0]) * t
        return float(((v - (noise - x0)) ** 2)[mask].mean())

    def side(decs: torch.Tensor, pair_of: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, p: int) -> float:
        return sum(
            err(model, int(d), noise[i], float(t[i])) - err(ref, int(d), noise[i], float(t[i]))
            for i, d in enumerate(decs)
            if int(pair_of[i]) == p
        )

    expected = 0.0
    for p in range(2):
        sw = side(draws.win, draws.win_pair, draws.noise_win, draws.t_win, p)
        sl = side(draws.lose, draws.lose_pair, draws.noise_lose, draws.t_lose, p)
        expected += -float(F.logsigmoid(torch.tensor(-beta / 2 * (sw - sl)))) / 2
    assert abs(float(loss.detach()) - expected) < 1e-5


@pytest.mark.parametrize("pairing", ["trajectory", "first_decision"])
def test_dpo_update_trains_only_the_executed_slice_and_reports_health(pairing: str) -> None:
    cfg = config("dpo", f"algo.dpo_pairing={pairing}", "rollout.replan_steps=2", "optim.epochs=1")
    model, ref = Stub(1.0, seed=1), Stub(1.0, seed=1)
    r = rollout([3, 2, 2, 2], [0, 0, 1, 1], [1.0, 0.0, 1.0, 0.0])
    pairs = torch.tensor([[0, 1], [2, 3]])
    gen = torch.Generator().manual_seed(0)
    inputs = UpdateInputs(model, None, cfg, gen, 0, "flow_sde", 1, 0.5, ref_model=ref)  # type: ignore[arg-type]
    health = dpo_health(inputs, r, pairs)
    assert -1.0 <= health["grad_cosine_split_half"] <= 1.0 and model.w.grad is None
    before = model.w.detach().clone()
    stats = update_dpo(model, ref, build_optimizer(model, cfg), r, pairs, cfg, gen)  # type: ignore[arg-type]
    assert stats["dpo_loss"] == pytest.approx(np.log(2.0), abs=1e-6)  # model = reference: logit 0 on the first step
    assert stats["grad_norm_actor"] > 0 and "grad_norm_critic" not in stats  # no value loss in DPO
    moved = model.w.detach() != before
    keep = loss_mask(model, cfg)  # type: ignore[arg-type]
    assert not moved[~keep].any() and moved[keep].any()


# --- item 4: per-group clipping ------------------------------------------------------------------------


def test_actor_and_critic_are_clipped_apart_and_logged() -> None:
    cfg = config("joint_ppo", "optim.grad_clip=1.0", "optim.critic_grad_clip=0.5")
    model = Stub()
    optimizer = build_optimizer(model, cfg)  # type: ignore[arg-type]
    ctx = torch.ones((1, 2))

    def loss_fn(_: torch.Tensor) -> tuple[torch.Tensor, dict]:  # actor grad norm 3 sqrt(42), critic 4 sqrt(2)
        return 3.0 * model.w.sum() + 4.0 * model.value(ctx).sum(), {}

    _, norms = accumulated_step(model, optimizer, torch.arange(1), loss_fn, cfg.optim)  # type: ignore[arg-type]
    assert norms["grad_norm_actor"] == pytest.approx(3.0 * 42**0.5, rel=1e-5)
    assert norms["grad_norm_critic"] == pytest.approx(4.0 * 2**0.5, rel=1e-5)
    assert norms["grad_norm"] == pytest.approx((9 * 42 + 16 * 2) ** 0.5, rel=1e-5)
    assert model.w.grad is not None and float(model.w.grad.norm()) == pytest.approx(1.0, rel=1e-5)
    critic = torch.cat([p.grad.flatten() for p in model.value_head.parameters() if p.grad is not None])
    assert float(critic.norm()) == pytest.approx(0.5, rel=1e-5)  # not scaled by the actor's clip


# --- item 5: split-half gradient cosine ----------------------------------------------------------------


def test_split_half_cosine_reads_agreement_and_leaves_the_model_alone() -> None:
    model = Stub()
    before = model.w.detach().clone()
    target = torch.randn((4, H, D), generator=torch.Generator().manual_seed(0))
    data = torch.cat([target, target, -target])  # rows 0-3 and 4-7 agree, 8-11 oppose

    def loss_of(mb: torch.Tensor) -> torch.Tensor:
        return (model.w * data[mb]).sum()

    same = split_half_cosine(model, (torch.arange(4), torch.arange(4, 8)), loss_of)  # type: ignore[arg-type]
    opposite = split_half_cosine(model, (torch.arange(4), torch.arange(8, 12)), loss_of)  # type: ignore[arg-type]
    assert same["grad_cosine_split_half"] == pytest.approx(1.0, abs=1e-6)
    assert opposite["grad_cosine_split_half"] == pytest.approx(-1.0, abs=1e-6)
    assert model.w.grad is None and torch.equal(model.w.detach(), before)


def test_split_half_minibatches_come_from_disjoint_episodes() -> None:
    r = rollout([3, 2, 4, 1, 2, 2], [0, 0, 1, 1, 2, 2], [1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    keep = torch.ones(r.num_decisions, dtype=torch.bool)
    keep[r.episode == 5] = False
    mbs = episode_split_minibatches(r, keep, 64, torch.Generator().manual_seed(1))
    assert mbs is not None
    a, b = (set(r.episode[mb].tolist()) for mb in mbs)
    assert a and b and not a & b and 5 not in a | b
    assert len(mbs[0]) + len(mbs[1]) == int(keep.sum())  # minibatch larger than the halves: all of them
    assert episode_split_minibatches(r, r.episode == 0, 64, torch.Generator()) is None  # one episode: none
