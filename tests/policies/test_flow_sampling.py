"""ODE / Flow-SDE / Flow-Noise sampling: hand-computed transitions and exact log-prob recomputation."""

from __future__ import annotations

import math

import pytest
import torch

from cosmos_robot.policies.flow import FlowModel, recompute_log_prob, sample_actions
from cosmos_robot.policies.flow.sampling import sde_sigmas, timesteps
from tests.policies._flow_helpers import make_batch, scrambled_model, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/policies/conftest.py


class ToyModel(FlowModel):
    """Velocity v = 2 x + 1 whatever t and context: every transition can be computed by hand."""

    def expert(
        self, x_t: torch.Tensor, t: torch.Tensor | float, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return 2.0 * x_t + 1.0, torch.zeros(x_t.shape[0], self.config.expert_width)


def _toy(num_steps: int = 4) -> tuple[ToyModel, torch.Tensor]:
    cfg = tiny_config(chunk_size=1, action_dim=1, num_flow_steps=num_steps, noise_level=0.5)
    return ToyModel(cfg), torch.zeros(1, cfg.trunk_width)


def _log_normal(x: float, mean: float, std: float) -> float:
    return -math.log(std) - 0.5 * math.log(2 * math.pi) - 0.5 * ((x - mean) / std) ** 2


def _setup(seed: int = 0, batch: int = 5, **overrides: object) -> tuple[FlowModel, torch.Tensor]:
    cfg = tiny_config(**overrides)
    model = scrambled_model(cfg, seed)
    with torch.no_grad():
        context = model.encode(make_batch(cfg, batch=batch, seed=seed))
    return model, context


def test_timesteps_and_sigmas() -> None:
    assert torch.allclose(timesteps(4), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    # sigma_t = a sqrt(t / (1 - t)); at t = 1 the denominator is 1 - t_1 = 0.25
    expected = [0.5 * math.sqrt(1 / 0.25), 0.5 * math.sqrt(0.75 / 0.25), 0.5, 0.5 * math.sqrt(0.25 / 0.75)]
    assert torch.allclose(sde_sigmas(4, 0.5), torch.tensor(expected))


def test_ode_is_euler_and_deterministic() -> None:
    model, ctx = _toy()
    res = sample_actions(model, ctx, "ode", noise=torch.full((1, 1, 1), 0.5))
    x = 0.5
    for k in range(4):
        x = x - 0.25 * (2 * x + 1)  # mean = x0_hat (1 - t + d) + x1_hat (t - d) = x - d v
        assert res.chain[0, k + 1].item() == pytest.approx(x, abs=1e-6)
    assert res.actions.item() == pytest.approx(x, abs=1e-6)
    assert torch.equal(res.log_prob, torch.zeros(1)) and torch.equal(res.sde_step, torch.tensor([-1]))
    real, ctx = _setup()
    a = sample_actions(real, ctx, "ode", generator=torch.Generator().manual_seed(3))
    b = sample_actions(real, ctx, "ode", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.actions, b.actions) and torch.equal(a.chain, b.chain)


@pytest.mark.parametrize(
    ("step", "x", "mean", "std"),
    [
        # t = 1, d = 0.25, sigma = 0.5 * sqrt(1 / 0.25) = 1: x0_hat = -1.5, x1_hat = 0.5,
        # mean = -1.5 * 0.25 + 0.5 * (1 - 0.25 - 1 * 0.25 / 2) = -0.0625, std = 1 * sqrt(0.25) = 0.5
        (0, 0.5, -0.0625, 0.5),
        # t = 0.5, d = 0.25, sigma = 0.5: x0_hat = -0.5, x1_hat = 1.5,
        # mean = -0.5 * 0.75 + 1.5 * (0.25 - 0.25 * 0.25 / 1) = -0.09375, std = 0.5 * 0.5 = 0.25
        (2, 0.5, -0.09375, 0.25),
    ],
)
def test_flow_sde_step_matches_hand_computation(step: int, x: float, mean: float, std: float) -> None:
    model, ctx = _toy()
    noise = torch.full((1, 1, 1), 0.5)
    # Place x = 0.5 at the chosen step of a stored chain and score a next value of 0.1.
    res = sample_actions(model, ctx, "flow_sde", sde_step=step, noise=noise, generator=torch.Generator().manual_seed(0))
    chain = res.chain.clone()
    chain[0, step] = x
    chain[0, step + 1] = 0.1
    lp = recompute_log_prob(model, ctx, chain, "flow_sde", sde_step=step)
    assert lp.log_prob.item() == pytest.approx(_log_normal(0.1, mean, std), abs=1e-5)
    assert lp.entropy.item() == pytest.approx(0.5 * math.log(2 * math.pi * math.e * std**2), abs=1e-6)


def test_flow_sde_sampling_one_stochastic_step() -> None:
    model, ctx = _toy()
    gen = torch.Generator().manual_seed(0)
    res = sample_actions(model, ctx, "flow_sde", sde_step=0, noise=torch.full((1, 1, 1), 0.5), generator=gen)
    x1 = res.chain[0, 1].item()
    assert x1 != pytest.approx(-0.0625)  # noise was added at step 0 ...
    assert res.log_prob.item() == pytest.approx(_log_normal(x1, -0.0625, 0.5), abs=1e-5)
    x = x1
    for k in range(1, 4):  # ... and the remaining steps are plain Euler
        x = x - 0.25 * (2 * x + 1)
        assert res.chain[0, k + 1].item() == pytest.approx(x, abs=1e-5)
    assert res.step_log_probs[0, 1:].abs().sum() == 0 and res.sde_step.tolist() == [0]


def test_flow_sde_random_step_is_shared_and_seeded() -> None:
    model, ctx = _setup()
    a = sample_actions(model, ctx, "flow_sde", generator=torch.Generator().manual_seed(7))
    b = sample_actions(model, ctx, "flow_sde", generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.chain, b.chain) and torch.equal(a.sde_step, b.sde_step)
    assert len(set(a.sde_step.tolist())) == 1 and 0 <= int(a.sde_step[0]) < 4
    steps = {
        int(sample_actions(model, ctx, "flow_sde", generator=torch.Generator().manual_seed(s)).sde_step[0])
        for s in range(20)
    }
    assert steps == {0, 1, 2, 3}


@pytest.mark.parametrize("mode", ["flow_sde", "flow_noise"])
def test_recompute_equals_sampled_log_prob(mode: str) -> None:
    model, ctx = _setup(batch=7)
    res = sample_actions(model, ctx, mode, generator=torch.Generator().manual_seed(1))  # type: ignore[arg-type]
    lp = recompute_log_prob(model, ctx, res.chain, mode, res.sde_step)  # type: ignore[arg-type]
    assert torch.allclose(lp.log_prob, res.log_prob, atol=1e-5, rtol=0)
    assert torch.allclose(lp.step_log_probs, res.step_log_probs, atol=1e-5, rtol=0)
    assert torch.allclose(lp.dim_log_prob, res.dim_log_prob, atol=1e-5, rtol=0)
    assert torch.allclose(lp.entropy, res.entropy, atol=1e-5, rtol=0)
    assert torch.exp(lp.log_prob - res.log_prob).sub(1).abs().max() < 1e-5  # PPO ratio is 1 before an update
    lp.log_prob.sum().backward()  # gradients reach the expert (and the noise head for flow_noise)
    assert model.velocity_out.weight.grad is not None and model.velocity_out.weight.grad.abs().sum() > 0
    last = model.noise_head[-1]
    assert isinstance(last, torch.nn.Linear)
    noise_grad = last.weight.grad
    assert (noise_grad is not None and noise_grad.abs().sum() > 0) == (mode == "flow_noise")


def test_recompute_with_per_sample_sde_steps() -> None:
    model, ctx = _setup(batch=4)
    r1 = sample_actions(model, ctx[:2], "flow_sde", sde_step=1, generator=torch.Generator().manual_seed(0))
    r2 = sample_actions(model, ctx[2:], "flow_sde", sde_step=3, generator=torch.Generator().manual_seed(0))
    chain, steps = torch.cat([r1.chain, r2.chain]), torch.cat([r1.sde_step, r2.sde_step])
    lp = recompute_log_prob(model, ctx, chain, "flow_sde", steps)  # a minibatch mixing two rollouts
    assert torch.allclose(lp.log_prob, torch.cat([r1.log_prob, r2.log_prob]), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="sde_step"):
        recompute_log_prob(model, ctx, chain, "flow_sde")
    with pytest.raises(ValueError, match=r"sde_step must be in \[0, 3\]"):
        recompute_log_prob(model, ctx, chain, "flow_sde", 4)


def test_flow_noise_log_prob_is_mean_of_k_plus_one_terms() -> None:
    model, ctx = _setup(batch=3)
    res = sample_actions(model, ctx, "flow_noise", generator=torch.Generator().manual_seed(2))
    k = model.config.num_flow_steps
    assert res.step_log_probs.shape == (3, k + 1)
    x0 = res.chain[:, 0]
    prior = (-0.5 * math.log(2 * math.pi) - 0.5 * x0.pow(2)).sum(dim=(1, 2))
    assert torch.allclose(res.step_log_probs[:, 0], prior, atol=1e-5)
    assert torch.allclose(res.log_prob, res.step_log_probs.mean(dim=1), atol=1e-6)
    # every transition is stochastic with a std inside the bounds
    cfg = model.config
    for j in range(k):
        step = res.step_log_probs[:, j + 1]
        assert torch.all(step != 0)
    per_dim_entropy = res.entropy / (cfg.chunk_size * cfg.action_dim)
    lo, hi = (0.5 * math.log(2 * math.pi * math.e * s**2) for s in (cfg.noise_std_min, cfg.noise_std_max))
    assert torch.all(per_dim_entropy >= lo - 1e-5) and torch.all(per_dim_entropy <= hi + 1e-5)


@pytest.mark.parametrize("mode", ["flow_sde", "flow_noise"])
def test_log_probs_cover_only_the_executed_slice(mode: str) -> None:
    model, ctx = _setup(batch=3, action_dim=5)
    full = sample_actions(model, ctx, mode, generator=torch.Generator().manual_seed(4))  # type: ignore[arg-type]
    part = sample_actions(model, ctx, mode, generator=torch.Generator().manual_seed(4), replan_steps=2, dims=3)  # type: ignore[arg-type]
    assert torch.equal(full.chain, part.chain)
    assert part.dim_log_prob.shape == (3, 2, 3)
    assert torch.allclose(part.log_prob, full.dim_log_prob[:, :2, :3].sum(dim=(1, 2)), atol=1e-5)
    lp = recompute_log_prob(model, ctx, part.chain, mode, part.sde_step, replan_steps=2, dims=3)  # type: ignore[arg-type]
    assert torch.allclose(lp.log_prob, part.log_prob, atol=1e-5, rtol=0)


def test_argument_errors() -> None:
    model, ctx = _setup(batch=2)
    with pytest.raises(ValueError, match="mode must be one of"):
        sample_actions(model, ctx, "sde")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"noise: expected shape \(2, 4, 7\)"):
        sample_actions(model, ctx, noise=torch.zeros(2, 3, 7))
    with pytest.raises(ValueError, match="sde_step must be in"):
        sample_actions(model, ctx, "flow_sde", sde_step=9)
    with pytest.raises(ValueError, match=r"replan_steps must be in \[1, chunk_size=4\]"):
        sample_actions(model, ctx, "flow_noise", replan_steps=0)
    with pytest.raises(ValueError, match=r"dims must be in \[1, 7\]"):
        sample_actions(model, ctx, "flow_noise", dims=8)
    with pytest.raises(ValueError, match=r"chain: expected shape"):
        recompute_log_prob(model, ctx, torch.zeros(2, 5, 4, 6), "flow_noise")
