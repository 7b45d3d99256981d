"""RL advantage estimators and losses against hand-computed numbers on tiny tensors (STYLE.md item 8).

Every expected value is derived in the comment next to it, following the formulas in
``shared/research/rl_vla_anchors.md`` §1.4 (GAE, GRPO, PPO dual clip, clipped Huber), §3.2 (DiffusionNFT) and
§3.3 (Flow-DPO)."""

from __future__ import annotations

import math

import pytest
import torch

from cosmos_robot_trainers.algorithms import (
    UnknownAlgorithmError,
    dr_grpo,
    entropy_bonus,
    filter_groups,
    flow_dpo_loss,
    gae,
    get,
    grpo,
    gspo_policy_loss,
    kl_penalty,
    names,
    nft_loss,
    nft_optimality,
    normalize_advantages,
    ppo_policy_loss,
    register,
    value_loss,
)


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected: object, tol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=tol)


# ---------------------------------------------------------------------------------------------- GAE


def test_gae_hand_computed() -> None:
    # γ = λ = 0.5, r = [1, 0, 2], V = [1, 2, 3], V_T = 4, no dones.
    # t=2: δ = 2 + .5·4 − 3 = 1;     A2 = 1
    # t=1: δ = 0 + .5·3 − 2 = −0.5;  A1 = −0.5 + .25·1 = −0.25
    # t=0: δ = 1 + .5·2 − 1 = 1;     A0 = 1 + .25·(−0.25) = 0.9375;   returns = A + V
    adv, ret = gae(t([1, 0, 2]), t([1, 2, 3]), t([0, 0, 0]), t(4), gamma=0.5, lam=0.5)
    close(adv, [[0.9375, -0.25, 1.0]])
    close(ret, [[1.9375, 1.75, 4.0]])


def test_gae_done_cuts_and_truncation_bootstraps() -> None:
    # done after t=1: t=1 δ = 0 + 0 − 2 = −2 (no V_2, no A_2); t=0 δ = 1; A0 = 1 + .25·(−2) = 0.5; A2 unchanged = 1
    r, v, d = t([1, 0, 2]), t([1, 2, 3]), t([0, 1, 0])
    adv, _ = gae(r, v, d, t(4), gamma=0.5, lam=0.5)
    close(adv, [[0.5, -2.0, 1.0]])
    # truncated at t=1 with V(s_final) = 6: r1 = 0 + .5·6 = 3, δ1 = 3 − 2 = 1 = A1; A0 = 1 + .25·1 = 1.25
    adv, _ = gae(r, v, d, t(4), gamma=0.5, lam=0.5, truncated_bootstrap=t([0, 6, 0]))
    close(adv, [[1.25, 1.0, 1.0]])


def test_gae_mask_makes_padding_transparent() -> None:
    # tail padding (value 7, reward 9 at t=3) is skipped: identical to the unpadded case, padding gets 0
    adv, ret = gae(t([1, 0, 2, 9]), t([1, 2, 3, 7]), t([0, 0, 0, 0]), t(4), 0.5, 0.5, mask=t([1, 1, 1, 0]))
    close(adv, [[0.9375, -0.25, 1.0, 0.0]])
    close(ret, [[1.9375, 1.75, 4.0, 0.0]])
    # invalid middle step: t=0 sees V_2 = 3 and A_2 = 1: δ0 = 1 + .5·3 − 1 = 1.5, A0 = 1.5 + .25·1 = 1.75
    adv, _ = gae(t([1, 0, 2]), t([1, 2, 3]), t([0, 0, 0]), t(4), 0.5, 0.5, mask=t([1, 0, 1]))
    close(adv, [[1.75, 0.0, 1.0]])


# --------------------------------------------------------------------------------------------- GRPO


def test_grpo_group_normalisation_and_dr_grpo() -> None:
    # group 7: R = [1, 0, 1, 0], mean .5, unbiased std = sqrt(4·.25/3) = 0.57735 -> A = ±.5/.57735 = ±0.866025
    # group 3: R = [0, 0] -> A = 0;  group 5: single sample -> std 0, A = 0
    returns = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 5.0])
    groups = torch.tensor([7, 7, 7, 7, 3, 3, 5])
    a = 0.5 / math.sqrt(1 / 3)
    close(grpo(returns, groups, eps=0.0), [a, -a, a, -a, 0, 0, 0])
    # Dr. GRPO: no std division -> ±0.5
    close(dr_grpo(returns, groups), [0.5, -0.5, 0.5, -0.5, 0, 0, 0])
    close(grpo(returns, groups, normalize_std=False), [0.5, -0.5, 0.5, -0.5, 0, 0, 0])


def test_filter_groups_drops_equal_outcomes_and_applies_bounds() -> None:
    # g0 mixed (kept), g1 all fail (success 0), g2 all succeed (success 1), g3 success 1/11 ≈ 0.09
    returns = torch.tensor([1.0, 0, 1, 0] + [0.0, 0] + [1.0, 1, 1] + [1.0] + [0.0] * 10)
    groups = torch.tensor([0] * 4 + [1] * 2 + [2] * 3 + [3] * 11)
    keep = filter_groups(returns, groups)
    assert keep.tolist() == [True] * 4 + [False] * 5 + [True] * 11
    # DAPO / RLinf bounds [0.1, 0.9]: g3's mean 0.09 < 0.1 is dropped too
    keep = filter_groups(returns, groups, low=0.1, high=0.9)
    assert keep.tolist() == [True] * 4 + [False] * 16


def test_normalize_advantages_masked_and_nft_optimality() -> None:
    # valid [1, 2, 3]: mean 2, unbiased std 1 -> [−1, 0, 1]; the masked 100 is ignored and set to 0
    close(normalize_advantages(t(1, 2, 3, 100), t(1, 1, 1, 0), eps=0.0), [-1.0, 0.0, 1.0, 0.0])
    # r = clamp(clip(A, ±5)/5/2 + .5, 0, 1): −10 -> 0, −2.5 -> .25, 0 -> .5, 5 -> 1, 7 -> 1
    close(nft_optimality(t(-10, -2.5, 0, 5, 7)), [0.0, 0.25, 0.5, 1.0, 1.0])


# ---------------------------------------------------------------------------------------------- PPO


def test_ppo_ratio_one_is_minus_mean_advantage_and_respects_mask() -> None:
    logp = torch.tensor([-1.0, -2.0, -3.0])
    adv = torch.tensor([1.0, -2.0, 3.0])
    loss, m = ppo_policy_loss(logp, logp.clone(), adv, torch.ones(3))
    close(loss, -adv.mean())  # −(1 − 2 + 3)/3 = −2/3
    close(m["ratio_mean"], 1.0)
    close(m["approx_kl"], 0.0)
    close(m["clip_fraction"], 0.0)
    loss, _ = ppo_policy_loss(logp, logp.clone(), adv, torch.tensor([1.0, 1.0, 0.0]))
    close(loss, 0.5)  # −(1 − 2)/2; the masked A = 3 does not count


def test_ppo_clip_and_dual_clip_hand_computed() -> None:
    # ratio r, advantage A, L = max(−A·r, −A·clip(r, .8, 1.2)), then min(L, sign(A)·3·A)
    # (1.5, +1): max(−1.5, −1.2) = −1.2 (clipped)
    # (0.5, −1): max( 0.5,  0.8) =  0.8 (clipped)
    # (4.0, −1): max( 4.0,  1.2) =  4.0 -> dual cap 3·1 = 3      (negative A beyond c: dual clip engages)
    # (2.5, −1): max( 2.5,  1.2) =  2.5 < 3, not capped           (negative A, ratio below c)
    # (4.0, +1): max(−4.0, −1.2) = −1.2; cap +3 is inert           (positive A: never dual-clipped)
    ratio = torch.tensor([1.5, 0.5, 4.0, 2.5, 4.0])
    adv = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0])
    logp = ratio.log().requires_grad_()
    old = torch.zeros(5)
    loss, m = ppo_policy_loss(logp, old, adv, torch.ones(5))
    close(loss, (-1.2 + 0.8 + 3.0 + 2.5 - 1.2) / 5)  # 0.78
    close(m["clip_fraction"], 3 / 5)  # entries 0, 1, 4 take the clipped branch
    close(m["dual_clip_fraction"], 1 / 5)  # only entry 2
    close(m["ratio_mean"], (1.5 + 0.5 + 4 + 2.5 + 4) / 5)
    loss.backward()
    assert logp.grad is not None
    # clipped and dual-clipped entries carry no gradient; entry 3 (unclipped): d(−A·r)/dlogp = −A·r/5 = 2.5/5
    close(logp.grad, [0.0, 0.0, 0.0, 0.5, 0.0])
    loss, _ = ppo_policy_loss(ratio.log(), old, adv, torch.ones(5), dual_clip=None)
    close(loss, (-1.2 + 0.8 + 4.0 + 2.5 - 1.2) / 5)  # 0.98 without dual clip


def test_ppo_loss_aggregations() -> None:
    # ratio 1 -> L = −A. valid tokens: seq0 [1, 2, 3], seq1 [4]
    adv = t([1, 2, 3], [4, 0, 0])
    mask = t([1, 1, 1], [1, 0, 0])
    logp = torch.zeros(2, 3)
    close(ppo_policy_loss(logp, logp, adv, mask)[0], -10 / 4)  # token mean
    close(ppo_policy_loss(logp, logp, adv, mask, loss_agg="seq_mean_token_mean")[0], -(2 + 4) / 2)
    # Dr. GRPO constant normaliser 4: (−6/4 + −4/4)/2 = −1.25
    close(ppo_policy_loss(logp, logp, adv, mask, loss_agg="seq_mean_token_sum_norm", norm_constant=4)[0], -1.25)
    with pytest.raises(ValueError, match="norm_constant"):
        ppo_policy_loss(logp, logp, adv, mask, loss_agg="seq_mean_token_sum_norm")


def test_gspo_sequence_ratio() -> None:
    # seq0: valid log-ratios [0.2, 0.0] (padding 5.0 masked) -> s = e^0.1 = 1.105171, A = 1, inside ±0.2 -> −1.105171
    # seq1: [0.4, 0.4] -> s = e^0.4 = 1.491825, A = 2: max(−2.98365, −2·1.2) = −2.4 (clipped)
    logp = t([0.2, 0.0, 5.0], [0.4, 0.4, 0.0])
    loss, m = gspo_policy_loss(logp, torch.zeros(2, 3), t(1, 2), t([1, 1, 0], [1, 1, 0]), clip_low=0.2, clip_high=0.2)
    close(loss, (-math.exp(0.1) - 2.4) / 2)
    close(m["clip_fraction"], 0.5)


# ----------------------------------------------------------------------------------- value, KL, entropy


def test_value_loss_clipped_huber() -> None:
    # δ = 1, clip 0.5, V_old = 0:
    # V=2,  R=.5: Huber(−1.5) = 1·(1.5 − .5) = 1.0; V_clip = .5 -> Huber(0) = 0; max = 1.0
    # V=0,  R=3:  Huber(3) = 2.5; V_clip = 0 -> 2.5; max = 2.5
    # V=1.4,R=1.5: Huber(.1) = .005; V_clip = .5 -> Huber(1) = .5; max = .5 (clipped term larger)
    # V=100 masked out
    v, old, ret = t(2.0, 0.0, 1.4, 100.0), torch.zeros(4), t(0.5, 3.0, 1.5, 0.0)
    loss, m = value_loss(v, old, ret, t(1, 1, 1, 0), clip=0.5, huber_delta=1.0)
    close(loss, (1.0 + 2.5 + 0.5) / 3)
    close(m["value_clip_fraction"], 1 / 3)
    loss, _ = value_loss(v, old, ret, t(1, 1, 1, 0), clip=None, huber_delta=1.0)
    close(loss, (1.0 + 2.5 + 0.005) / 3)


def test_kl_estimators_and_entropy() -> None:
    # d = ref − logp = [ln 2, 0]
    logp, ref = torch.zeros(2), t(math.log(2), 0.0)
    ln2 = math.log(2)
    close(kl_penalty(logp, ref, "k1"), -ln2 / 2)
    close(kl_penalty(logp, ref, "k2"), 0.5 * ln2**2 / 2)
    close(kl_penalty(logp, ref, "k3"), (2 - ln2 - 1) / 2)  # e^d − d − 1 = 1 − ln 2
    close(kl_penalty(logp, ref, "k3", mask=t(1, 0)), 1 - ln2)
    close(kl_penalty(logp, ref, "abs"), ln2 / 2)
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k4")
    # −coef·mean(H over valid) = −.5·(1 + 2)/2
    close(entropy_bonus(t(1, 2, 9), t(1, 1, 0), coef=0.5), -0.75)


# ------------------------------------------------------------------------------------- NFT, Flow-DPO


def test_nft_loss_hand_computed() -> None:
    # β = .5, v_old = [1, 1], v_θ = [3, −1], target v = [2, 0]; third dim is padding (masked)
    # v+ = .5·[1, 1] + .5·[3, −1] = [2, 0]        -> ||v+ − v||² = 0
    # v− = 1.5·[1, 1] − .5·[3, −1] = [0, 2]       -> mean([4, 4]) = 4
    # r = .75: L = .75·0 + .25·4 = 1
    v_old = t([1.0, 1.0, 0.0]).requires_grad_()
    v_theta = t([3.0, -1.0, 10.0]).requires_grad_()
    loss, m = nft_loss(v_theta, v_old, t([2.0, 0.0, 0.0]), t(0.75), beta=0.5, mask=t(1, 1, 0))
    close(loss, 1.0)
    close(m["nft_neg_mse"], 4.0)
    loss.backward()
    assert v_old.grad is None  # the old (EMA) policy is a fixed target
    assert v_theta.grad is not None
    # dL/dv_θ = .25·2·(v− − v)/2·(−β) = .25·(−.5)·[−2, 2] = [.25, −.25]; padded dim 0
    close(v_theta.grad, [[0.25, -0.25, 0.0]])
    # β = 1, r = 1: v+ = v_θ -> plain flow-matching MSE: mean([1, 1]) = 1
    loss, _ = nft_loss(t([3.0, -1.0]), t([0.0, 0.0]), t([2.0, 0.0]), t(1.0), beta=1.0)
    close(loss, 1.0)


def test_flow_dpo_loss_hand_computed() -> None:
    # β = 2: e_θ(w) = (1 − 0)² = 1, e_ref(w) = 0, e_θ(l) = (0 − 1)² = 1, e_ref(l) = 1
    # logit = −β/2·[(1 − 0) − (1 − 1)] = −1 -> L = −log σ(−1) = log(1 + e) = 1.3132617
    loss, m = flow_dpo_loss(t([1.0]), t([0.0]), t([0.0]), t([0.0]), t([0.0]), t([1.0]), beta=2.0)
    close(loss, math.log(1 + math.e))
    close(m["implicit_acc"], 0.0)
    # policy == reference -> logit 0 -> L = log 2; padded dim (huge error) is masked out
    v = t([0.3, 100.0])
    loss, _ = flow_dpo_loss(v, v, t([1.0, 0.0]), v, v, t([0.0, -50.0]), beta=100.0, mask=t(1, 0))
    close(loss, math.log(2))


def test_flow_dpo_trajectory_loss_sums_each_episode() -> None:
    # pair 0: winner decisions d = [0.1, −0.3] (sum −0.2), loser [0.2] (sum 0.2)
    #   logit = −β/2·(−0.2 − 0.2) = 0.4 with β = 2 -> −log σ(0.4) = log(1 + e^−0.4)
    # pair 1: winner [0.5] (sum 0.5), loser [0.0, 0.1, 0.4] (sum 0.5) -> logit 0 -> log 2
    from cosmos_robot_trainers.algorithms.losses import flow_dpo_trajectory_loss

    loss, m = flow_dpo_trajectory_loss(
        t(0.1, -0.3, 0.5), torch.tensor([0, 0, 1]), t(0.2, 0.0, 0.1, 0.4), torch.tensor([0, 1, 1, 1]), 2, beta=2.0
    )
    close(loss, (math.log(1 + math.exp(-0.4)) + math.log(2)) / 2)
    close(m["implicit_acc"], 0.5)
    close(m["logit_mean"], 0.2)
    # reduce = "mean": pair 0: winner mean −0.1, loser 0.2 -> logit = −(−0.1 − 0.2) = 0.3;
    # pair 1: winner 0.5, loser mean 0.5/3 -> logit = −(0.5 − 1/6) = −1/3
    loss, m = flow_dpo_trajectory_loss(
        t(0.1, -0.3, 0.5), torch.tensor([0, 0, 1]), t(0.2, 0.0, 0.1, 0.4), torch.tensor([0, 1, 1, 1]), 2, 2.0, "mean"
    )
    close(loss, (math.log(1 + math.exp(-0.3)) + math.log(1 + math.exp(1 / 3))) / 2)
    close(m["implicit_acc"], 0.5)
    with pytest.raises(ValueError, match="reduce: expected 'sum' or 'mean'"):
        flow_dpo_trajectory_loss(t(0.1), torch.tensor([0]), t(0.2), torch.tensor([0]), 1, reduce="max")


# ------------------------------------------------------------------------------------------- registry


def test_registry_resolves_names_and_suggests() -> None:
    assert get("loss", "ppo") is ppo_policy_loss
    assert get("advantage", "gae") is gae
    assert {"ppo", "gspo", "value", "kl", "entropy", "nft", "flow_dpo", "flow_dpo_trajectory"} <= set(names("loss"))
    assert {"gae", "grpo", "dr_grpo"} <= set(names("advantage"))
    with pytest.raises(UnknownAlgorithmError, match="Did you mean 'ppo'"):
        get("loss", "ppoo")
    with pytest.raises(UnknownAlgorithmError, match="Did you mean 'grpo'"):
        get("advantage", "gpro")
    with pytest.raises(UnknownAlgorithmError, match="Did you mean 'advantage'"):
        get("advantages", "gae")
    with pytest.raises(ValueError, match="already registered"):
        register("loss", "ppo")(lambda: None)
