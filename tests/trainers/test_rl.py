"""RL trainers: every debug recipe runs two iterations, resumes exactly after a kill, exports a policy;
the ratio gate holds (and can fail); the rollout schedule, GAE layout and DPO pairs are right."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib
import torch

from cosmos_robot.policies import load_policy_folder
from cosmos_robot.policies.flow import FlowPolicy
from cosmos_robot.policies.flow.rl import FlowRLAdapter
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.common import read_metrics
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.rl import RLConfig, Rollout, episode_specs, run_rl
from cosmos_robot_trainers.rl.advantage import dpo_pairs, episode_layout, group_advantages, ppo_advantages
from cosmos_robot_trainers.rl.config import AlgoConfig
from cosmos_robot_trainers.rl.learner import build_optimizer, update_policy_gradient
from cosmos_robot_trainers.rl.rollout import TRAIN_SEED_BASE, RolloutWorker
from cosmos_robot_trainers.rl.seed_replay import SeedReplay
from tests.trainers._rollouts import episode_fields

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "checkpoints" / "flow_tabletop"
ALGOS = ("joint_ppo", "grpo", "nft", "dpo")
NOT_DETERMINISTIC = ("time/", "wall_s", "iter_wall_s", "env_steps_per_s")


def quiet(_: str) -> None:
    pass


def debug_config(algo: str, out: Path, *overrides: str) -> RLConfig:
    init = tomllib.loads((ROOT / "recipes" / f"debug_{algo}.toml").read_text())["init"]
    _, config = load_train_recipe(
        f"debug_{algo}",
        [f"init={json.dumps(str(ROOT / init))}", f"output.dir={json.dumps(str(out))}", *overrides],
    )
    assert isinstance(config, RLConfig)
    return config


def libero_overrides(init: Path, out: Path, task: str) -> list[str]:
    """A LIBERO RL recipe shrunk to seconds: one task, 2 envs of 32 px, 10-step episodes, one update."""
    return [
        f"init={json.dumps(str(init))}",
        f"output.dir={json.dumps(str(out))}",
        f"env.tasks={json.dumps([task])}",
        "env.num_envs=2",
        "env.image_size=32",
        "env.max_steps=10",
        "rollout.episodes_per_iter=2",
        "algo.critic_warmup_iters=0",
        "optim.minibatch_size=4",
        "train.iterations=1",
        "train.progress=false",
        "eval.initial=false",
        "eval.final=false",
        "eval.every=0",
    ]


def killed_after(full: Path, dest: Path, iteration: int) -> Path:
    """What a run killed right after iteration ``iteration``'s checkpoint leaves, made from the
    uninterrupted run's folder (no re-run of the iterations before the cut): no ``final/``, no later
    checkpoint, no metrics line of a later iteration (so the resumed run must write them itself).
    Real kills: the SIGKILL tests; ``stop_at_iteration``: test_rl_groot's recipe-as-typed test."""
    shutil.copytree(full, dest, ignore=shutil.ignore_patterns("final"))
    for ckpt in (dest / "checkpoints").glob("step_*"):
        if int(ckpt.name.split("_")[1]) > iteration:
            shutil.rmtree(ckpt)
    assert (dest / "checkpoints" / f"step_{iteration:06d}").is_dir()
    metrics = dest / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= iteration]
    metrics.write_text("".join(f"{line}\n" for line in kept))
    return dest


def deterministic(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(k.startswith(p) for p in NOT_DETERMINISTIC)}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
def test_debug_recipe_runs_resumes_exactly_and_exports(algo: str, tmp_path: Path) -> None:
    lines: list[str] = []
    full = run_rl(debug_config(algo, tmp_path / "full"), log=lines.append)
    assert full.finished and full.iteration == 2
    per_iter = [line for line in lines if line.startswith("iter ")]  # one metrics line per iteration
    assert [line.split(":")[0] for line in per_iter] == ["iter 1/2", "iter 2/2"]
    assert all("train_success=" in line for line in per_iter) and any("_loss=" in x for x in per_iter), per_iter
    assert full.final_dir is not None and isinstance(load_policy_folder(full.final_dir), FlowPolicy)
    # killed after iteration 1 (its checkpoint written), then resumed by the same command
    killed_after(tmp_path / "full", tmp_path / "cut", 1)
    resumed = run_rl(debug_config(algo, tmp_path / "cut"), log=quiet)
    assert resumed.resumed_from == 1 and resumed.finished
    a, b = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "cut")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    assert [deterministic(r) for r in a] == [deterministic(r) for r in b]
    wa = load_policy_folder(full.final_dir).model.state_dict()  # type: ignore[attr-defined]
    wb = load_policy_folder(resumed.final_dir).model.state_dict()  # type: ignore[attr-defined]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # each algorithm's update really ran (not skipped for lack of informative groups or pairs)
    loss_key = {"joint_ppo": "policy_loss", "grpo": "policy_loss", "nft": "nft_loss", "dpo": "dpo_loss"}[algo]
    assert any(loss_key in record for record in a)
    # the split-half health check and the per-group pre-clip norms are logged
    assert any(-1.0 <= record.get("grad_cosine_split_half", 2.0) <= 1.0 for record in a)
    assert all("grad_norm_actor" in record for record in a if loss_key in record)
    if algo == "grpo":  # the resumed iteration 2 reran iteration 1's split seed from the restored pool
        assert [r["seed_replay_groups"] for r in b] == [0.0, 1.0]
    if algo in ("joint_ppo", "grpo"):
        for record in a:
            if "ratio_dev_first_mb" in record:  # GRPO skips an update whose groups were all filtered
                assert record["ratio_dev_first_mb"] < 1e-3
    assert (tmp_path / "full" / "checkpoints").is_dir()
    assert (tmp_path / "full" / "tensorboard").is_dir()


@pytest.mark.slow
def test_flow_noise_ppo_ratio_is_one_and_entropy_logged(tmp_path: Path) -> None:
    config = debug_config(
        "joint_ppo", tmp_path, "rollout.sample_mode=flow_noise", "algo.entropy_coef=0.005", "train.iterations=1"
    )
    run_rl(config, log=quiet)
    (record,) = read_metrics(tmp_path)
    assert record["ratio_dev_first_mb"] < 1e-3
    assert record["entropy"] != 0.0


@pytest.fixture(scope="module")
def small_rollout() -> tuple[RLConfig, FlowPolicy, Rollout]:
    config = debug_config("joint_ppo", Path("/nonexistent"), "env.max_steps=15")
    policy = FlowPolicy.from_pretrained(CKPT)
    worker = RolloutWorker(config, FlowRLAdapter(policy))
    try:
        rollout = worker.collect(episode_specs(config, 0), seed=3)
    finally:
        worker.close()
    return config, policy, rollout


def test_rollout_records_whole_episodes(small_rollout: tuple[RLConfig, FlowPolicy, Rollout]) -> None:
    config, policy, r = small_rollout
    assert r.num_episodes == config.rollout.episodes_per_iter
    cfg = policy.config
    k = config.rollout.num_flow_steps
    assert r.chain.shape == (r.num_decisions, k + 1, cfg.chunk_size, cfg.action_dim)  # type: ignore[operator]
    images = r.inputs["images"]
    assert images.dtype == torch.uint8 and images.shape[1:] == (2, 3, cfg.image_size, cfg.image_size)
    assert r.inputs["state"].shape == (r.num_decisions, cfg.state_dim) and len(r.inputs["prompt"]) == r.num_decisions
    # every episode ends exactly once, on its last decision; steps count 0.. per episode
    for e in range(r.num_episodes):
        sel = r.episode == e
        steps = r.step[sel]
        assert steps.tolist() == list(range(len(steps)))
        assert r.done[sel].tolist() == [False] * (len(steps) - 1) + [True]
        assert int(r.ep_length[e]) <= 15
    # a 15-step cap truncates unsuccessful episodes on their last decision (bootstrapped with V there)
    last = torch.tensor([int(torch.nonzero(r.episode == e).max()) for e in range(r.num_episodes)])
    assert r.truncated[last].tolist() == ((r.ep_success == 0) & (r.ep_length == 15)).tolist()
    assert int(r.truncated.sum()) == int(r.truncated[last].sum())
    assert torch.all(r.bootstrap[~r.truncated] == 0)
    assert r.env_steps == int(r.ep_length.sum())


def test_ratio_gate_can_fail(small_rollout: tuple[RLConfig, FlowPolicy, Rollout]) -> None:
    """Recomputing with another noise level than the rollout's must show up in the first-minibatch ratio."""
    config, policy, rollout = small_rollout
    adv = ppo_advantages(rollout, config.algo)
    gen = torch.Generator().manual_seed(0)

    def first_ratio_dev(noise_level: float) -> float:
        model = FlowPolicy.from_pretrained(CKPT).model
        optimizer = build_optimizer(model, config)
        kwargs = {"sample_mode": "flow_sde", "num_flow_steps": 4, "noise_level": noise_level}
        return update_policy_gradient(model, optimizer, rollout, adv, config, gen, **kwargs)["ratio_dev_first_mb"]

    assert first_ratio_dev(policy.config.noise_level) < 1e-3
    assert first_ratio_dev(2 * policy.config.noise_level) > 1e-2


def _rollout(
    episodes: list[list[float]],
    values: list[list[float]],
    success: list[float],
    groups: list[int],
    bootstrap_last: list[float] | None = None,
) -> Rollout:
    """A hand-made rollout: per episode the chunk rewards and values."""
    ep, st, rew, val, done, boot = [], [], [], [], [], []
    for e, (rs, vs) in enumerate(zip(episodes, values)):
        for t, (rw, v) in enumerate(zip(rs, vs)):
            ep.append(e)
            st.append(t)
            rew.append(rw)
            val.append(v)
            done.append(t == len(rs) - 1)
            boot.append(bootstrap_last[e] if bootstrap_last and t == len(rs) - 1 else 0.0)
    m, n = len(ep), len(episodes)
    return Rollout(
        inputs={
            "images": torch.zeros((m, 1, 3, 8, 8), dtype=torch.uint8),
            "state": torch.zeros((m, 8)),
            "prompt": ["x"] * m,
        },
        chain=torch.zeros((m, 2, 1, 1)),
        sde_step=torch.zeros(m, dtype=torch.long),
        log_prob=torch.zeros(m),
        value=torch.tensor(val),
        reward=torch.tensor(rew),
        done=torch.tensor(done),
        truncated=torch.tensor(boot) != 0,
        bootstrap=torch.tensor(boot),
        episode=torch.tensor(ep),
        step=torch.tensor(st),
        **episode_fields(success, groups, [1] * n),
    )


def test_ppo_advantages_are_gae_per_episode_with_bootstrap() -> None:
    r = _rollout([[0.0, 1.0], [0.0, 0.0, 0.0]], [[0.5, 0.8], [0.1, 0.2, 0.3]], [1.0, 0.0], [0, 1], [0.0, 0.4])
    adv = ppo_advantages(r, AlgoConfig(gamma=0.9, lam=0.5, normalize_advantages=False))
    g, lam = 0.9, 0.5
    # episode 0: terminal success at t=1
    d1 = 1.0 - 0.8
    d0 = 0.0 + g * 0.8 - 0.5
    a0 = [d0 + g * lam * d1, d1]
    # episode 1: truncated at t=2, bootstrapped with V = 0.4
    e2 = 0.0 + g * 0.4 - 0.3
    e1 = 0.0 + g * 0.3 - 0.2
    e0 = 0.0 + g * 0.2 - 0.1
    a1 = [e0 + g * lam * (e1 + g * lam * e2), e1 + g * lam * e2, e2]
    assert torch.allclose(adv.advantages, torch.tensor(a0 + a1), atol=1e-6)
    assert adv.returns is not None
    assert torch.allclose(adv.returns, adv.advantages + r.value, atol=1e-6)
    index, valid = episode_layout(r)
    assert valid.tolist() == [[True, True, False], [True, True, True]]
    assert index[1].tolist() == [2, 3, 4]


def test_ppo_advantages_whiten_within_each_task() -> None:
    """``whiten_over="task"``: each task's decisions have mean 0 and std 1 on their own, so a task with
    small returns is not drowned by one with large returns (batch whitening would give it tiny advantages)."""
    r = _rollout([[0.0, 1.0], [0.0, 0.0], [0.0, 0.01], [0.0, 0.0]], [[0.0, 0.0]] * 4, [1, 0, 0, 0], [0, 1, 2, 3])
    r.ep_task = ["reach", "reach", "push", "push"]
    raw = ppo_advantages(r, AlgoConfig(gamma=1.0, lam=1.0, normalize_advantages=False)).advantages
    per_task = ppo_advantages(r, AlgoConfig(gamma=1.0, lam=1.0, whiten_over="task")).advantages
    batch = ppo_advantages(r, AlgoConfig(gamma=1.0, lam=1.0)).advantages
    for rows in ([0, 1, 2, 3], [4, 5, 6, 7]):
        a, x = per_task[rows], raw[rows]
        assert abs(float(a.mean())) < 1e-6 and abs(float(a.std()) - 1.0) < 1e-5
        assert torch.allclose(a, (x - x.mean()) / x.std(), atol=1e-5)
    assert float(batch[4:].std()) < 0.05  # batch whitening: push decisions barely told apart


def test_group_advantages_filter_and_broadcast() -> None:
    r = _rollout(
        [[0.0], [1.0], [0.0, 0.0], [1.0], [1.0]],
        [[0]] * 2 + [[0, 0]] + [[0]] * 2,
        [0.0, 1.0, 0.0, 1.0, 1.0],
        [0, 0, 0, 1, 1],
    )
    adv = group_advantages(r, AlgoConfig(group_size=3))
    expected_ep = get_algorithm("advantage", "grpo")(r.ep_success, r.ep_group)
    assert torch.allclose(adv.advantages, expected_ep[r.episode])
    # group 1 (two successes) is filtered, group 0 kept
    assert adv.keep.tolist() == [True, True, True, True, False, False]
    assert adv.stats == {"groups_kept": 1.0, "groups_total": 2.0, "groups_mixed_success": 1.0}


def test_shaped_group_score_ranks_failed_episodes_by_their_progress() -> None:
    """``group_score="shaped"``: a group whose episodes all failed is kept and ranked by the summed shaped
    reward (how far each got); by success it is dropped. A group with a success ranks it first."""
    r = _rollout(
        [[0.1, 0.2], [0.05], [0.0, -0.1], [0.3, 1.5], [0.1, 0.1]],  # chunk rewards: shaping (+ 1 on success)
        [[0.0, 0.0], [0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
        [0.0, 0.0, 0.0, 1.0, 0.0],
        [0, 0, 0, 1, 1],
    )
    by_success = group_advantages(r, AlgoConfig(group_size=3))
    shaped = group_advantages(r, AlgoConfig(group_size=3, group_score="shaped"))
    assert not bool(by_success.keep[:5].any())  # group 0: three failures, no gradient by success
    scores = torch.tensor([0.3, 0.05, -0.1, 1.8, 0.2])
    expected = get_algorithm("advantage", "grpo")(scores, r.ep_group)
    assert torch.allclose(shaped.advantages, expected[r.episode])
    assert bool(shaped.keep.all()) and shaped.stats["groups_kept"] == 2.0
    assert shaped.stats["groups_mixed_success"] == 1.0  # group 0 is kept by its shaped scores, but all failed
    ep0, ep1, ep2 = shaped.advantages[0], shaped.advantages[2], shaped.advantages[3]
    assert ep0 > ep1 > ep2  # the failure that got furthest leads its group
    # DAPO's filter on success: the all-failed group 0 is dropped whatever its scores; group 1 keeps its
    # shaped advantages
    dapo = group_advantages(r, AlgoConfig(group_size=3, group_score="shaped", filter_on="success"))
    assert dapo.keep.tolist() == [False] * 5 + [True] * 4 and dapo.stats["groups_kept"] == 1.0
    assert torch.equal(dapo.advantages, shaped.advantages)
    pairs = dpo_pairs(r, AlgoConfig(group_size=3, group_score="shaped", dpo_pairs_per_group=8), torch.Generator())
    assert sorted(map(tuple, pairs.tolist())) == [(0, 1), (0, 2), (1, 2), (3, 4)]
    with pytest.raises(ValueError, match="group_score 'shaped'.*shaping_coef is 0"):
        debug_config("grpo", Path("/x"), "algo.group_score=shaped", "reward.shaping_coef=0")


def test_reward_to_go_credit_puts_a_crash_on_the_decisions_before_it() -> None:
    """``algo.credit = "reward_to_go"``: each decision is scored by its discounted rewards from then on and
    compared with its group's other episodes at the same decision index. A crash at decision 3 of a
    4-decision group-mate makes the decisions just before it the worst; the first decision, far from the
    crash, is ranked by the progress that followed it. Broadcast credit gives every decision the same."""
    progress, crash = 0.1, -20.0
    r = _rollout(
        [
            [progress] * 4,  # ep 0: drives on
            [progress, progress, progress, crash],  # ep 1: crashes at decision 3
            [0.2, progress, progress, progress],  # ep 2: faster at first
            [progress, progress],  # ep 3, group 1: alone at decision 1 (ep 4 ended)
            [0.0],  # ep 4
        ],
        [[0.0] * 4, [0.0] * 4, [0.0] * 4, [0.0] * 2, [0.0]],
        [1.0, 0.0, 1.0, 1.0, 0.0],
        [0, 0, 0, 1, 1],
    )
    r.ep_return = torch.zeros(5).index_add_(0, r.episode, r.reward)  # the provider's return is the rewards' sum
    gamma = 0.5
    algo = AlgoConfig(
        group_size=3, group_score="return", advantage="dr_grpo", credit="reward_to_go", credit_gamma=gamma
    )
    out = group_advantages(r, algo)
    rtg = torch.tensor(
        [
            [
                progress * (1 + gamma + gamma**2 + gamma**3),
                progress * (1 + gamma + gamma**2),
                progress * (1 + gamma),
                progress,
            ],
            [
                progress * (1 + gamma + gamma**2) + crash * gamma**3,
                progress * (1 + gamma) + crash * gamma**2,
                progress + crash * gamma,
                crash,
            ],
            [
                0.2 + progress * (gamma + gamma**2 + gamma**3),
                progress * (1 + gamma + gamma**2),
                progress * (1 + gamma),
                progress,
            ],
        ]
    )
    expected = rtg - rtg.mean(dim=0, keepdim=True)  # Dr-GRPO at each decision index of group 0
    assert torch.allclose(out.advantages[:12], expected.flatten(), atol=1e-6)
    crashed = out.advantages[4:8]
    assert crashed[3] < crashed[2] < crashed[1] < crashed[0] < 0  # the blame grows towards the crash
    assert out.advantages[8] > out.advantages[0]  # decision 0: the faster start ranks first
    assert out.advantages[13] == 0.0  # group 1's decision 1: nobody to compare with
    assert out.advantages[12] == pytest.approx(float(torch.tensor(progress) * (1 + gamma) - 0.0) / 2)
    assert bool(out.keep.all())
    broadcast = group_advantages(r, algo.model_copy(update={"credit": "episode"}))
    assert torch.equal(broadcast.advantages[4:8], broadcast.advantages[4].expand(4))
    # gamma 1: the reward-to-go at decision 0 is the return, so decision 0 gets the episode's advantage
    undiscounted = group_advantages(r, algo.model_copy(update={"credit_gamma": 1.0}))
    assert torch.allclose(undiscounted.advantages[[0, 4, 8, 12, 14]], broadcast.advantages[[0, 4, 8, 12, 14]])
    for bad in (
        ["algo.credit=reward_to_go"],
        ["algo.credit=reward_to_go", "algo.group_score=return", "algo.policy_loss=gspo"],
    ):
        with pytest.raises(ValueError, match="algo.credit 'reward_to_go'"):
            debug_config("grpo", Path("/x"), *bad)  # the debug recipe scores by success


def test_dpo_pairs_match_success_with_failure_in_the_same_group() -> None:
    r = _rollout([[0.0]] * 6, [[0.0]] * 6, [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], [0, 0, 0, 1, 1, 1])
    pairs = dpo_pairs(r, AlgoConfig(group_size=3, dpo_pairs_per_group=8), torch.Generator().manual_seed(0))
    assert sorted(map(tuple, pairs.tolist())) == [(0, 1), (0, 2)]  # group 1 has no failure


def test_episode_specs_groups_share_an_initial_state() -> None:
    config = debug_config("grpo", Path("/x"), "rollout.episodes_per_iter=8", "algo.group_size=4")
    specs = episode_specs(config, 3)
    assert [s.group for s in specs] == [0] * 4 + [1] * 4
    assert len({(s.task, s.seed) for s in specs[:4]}) == 1 and specs[0].seed != specs[4].seed
    assert specs[0].task != specs[4].task  # tasks round-robin over groups
    assert min(s.seed for s in specs) >= TRAIN_SEED_BASE  # never an eval layout
    assert episode_specs(config, 3) == specs  # a pure function (resume replays it)


def test_seed_replay_reruns_the_seeds_whose_groups_split() -> None:
    config = debug_config("grpo", Path("/x"), "rollout.episodes_per_iter=8", "algo.group_size=2")
    replay = SeedReplay(0.5, capacity=2)
    specs = episode_specs(config, 0)
    assert replay.pick(4) == []  # nothing in doubt yet: every group a fresh seed
    # group 0 split 1:1, group 1 all failed, group 2 split, but one of its episodes' worker crashed, group 3 all won
    outcome = SimpleNamespace(
        ep_group=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]),
        ep_success=torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]),
        ep_failed=torch.tensor([False, False, False, False, False, True, False, False]),
    )
    stats = replay.update(specs, outcome, 0, [])
    assert stats == {"seed_replay_groups": 0.0, "seed_replay_mixed": 0.0, "seed_replay_pool": 1.0}
    picked = replay.pick(4)
    assert picked == [(specs[0].task, specs[0].seed)]  # only group 0 was in doubt
    again = episode_specs(config, 1, picked)
    fresh = episode_specs(config, 1)
    assert [(s.task, s.seed) for s in again[:2]] == [picked[0]] * 2  # the first group reruns it
    assert again[2:] == fresh[2:]  # the other groups keep their fresh seeds
    # the rerun is settled now (both won): the seed leaves the pool; each of the fresh groups 1-3 split
    outcome.ep_success = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    outcome.ep_failed = torch.zeros(8, dtype=torch.bool)
    stats = replay.update(again, outcome, 1, picked)
    assert stats == {"seed_replay_groups": 1.0, "seed_replay_mixed": 0.0, "seed_replay_pool": 2.0}  # capacity 2
    assert picked[0] not in replay.pool and all(e.last_iter == 1 for e in replay.pool.values())
    restored = SeedReplay(0.5, capacity=2)
    restored.load_state_dict(json.loads(json.dumps(replay.state_dict())))  # survives a checkpoint
    assert restored.pool == replay.pool and restored.pick(4) == replay.pick(4) and len(restored.pick(4)) == 2
    with pytest.raises(ValueError, match="replayed seeds"):
        episode_specs(config, 2, [picked[0]] * 5)


def test_recipe_errors_name_the_field(tmp_path: Path) -> None:
    from cosmos_robot.config import ConfigError

    with pytest.raises(ConfigError, match="group_size"):
        debug_config("grpo", tmp_path, "algo.group_size=1")
    with pytest.raises(ConfigError, match="filter_on = 'success'.*set filter_groups"):
        debug_config("grpo", tmp_path, "algo.filter_on=success", "algo.filter_groups=false")
    with pytest.raises(ConfigError, match=r"seed_replay .*algo.group_size >= 2"):
        debug_config("joint_ppo", tmp_path, "rollout.seed_replay=0.5")
    with pytest.raises(ConfigError, match="episodes_per_iter"):
        debug_config("grpo", tmp_path, "rollout.episodes_per_iter=5")
    with pytest.raises(ConfigError, match="sample_mode"):
        debug_config("joint_ppo", tmp_path, "rollout.sample_mode=ode")
    with pytest.raises(ConfigError, match="cilp"):
        debug_config("joint_ppo", tmp_path, "algo.cilp=0.1")


def test_every_algorithm_is_one_method_table_entry(tmp_path: Path) -> None:
    from cosmos_robot_trainers.rl.config import ALGORITHMS
    from cosmos_robot_trainers.rl.methods import METHODS

    assert set(METHODS) == set(ALGORITHMS)
    models = {}
    for algo in ALGORITHMS:
        config = debug_config(algo, tmp_path)
        models[algo] = (METHODS[algo].reference(config), METHODS[algo].old_model)
    assert models == {
        "joint_ppo": (False, False),
        "grpo": (False, False),
        "nft": (False, True),
        "dpo": (True, False),
    }
    assert METHODS["grpo"].reference(debug_config("grpo", tmp_path, "algo.kl_coef=0.01"))
    from cosmos_robot.config import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        debug_config("grpo", tmp_path, "trainer=grpoo")


@pytest.mark.slow
def test_ray_rollout_workers_match_the_schedule(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    config = debug_config("grpo", tmp_path, "rollout.num_workers=2", "train.iterations=1")
    result = run_rl(config, log=quiet)
    assert result.finished
    (record,) = read_metrics(tmp_path)
    assert record["env_steps"] > 0 and record["decisions"] > 0


@pytest.mark.slow
def test_ray_rollout_workers_are_placed_in_a_placement_group_and_a_missing_gpu_is_named(tmp_path: Path) -> None:
    """``rollout.worker_cpus`` puts each Ray rollout worker in its own bundle of one placement group (the
    same episodes as unplaced workers); a GPU share the cluster cannot give fails within the timeout,
    naming the fields and what the cluster has."""
    pytest.importorskip("ray")
    import ray

    placed = debug_config(
        "grpo", tmp_path / "placed", "rollout.num_workers=2", "rollout.worker_cpus=1", "train.iterations=1"
    )
    free = debug_config("grpo", tmp_path / "free", "rollout.num_workers=2", "train.iterations=1")
    run_rl(placed, log=quiet)
    run_rl(free, log=quiet)
    (a,), (b,) = read_metrics(tmp_path / "placed"), read_metrics(tmp_path / "free")
    assert deterministic(a) == deterministic(b)
    assert ray.util.placement_group_table() and all(  # the run removed its group at the end
        g["state"] == "REMOVED" for g in ray.util.placement_group_table().values()
    )
    gpu = debug_config(
        "grpo", tmp_path / "gpu", "rollout.num_workers=2", "rollout.worker_gpus=0.5", "rollout.placement_timeout_s=3"
    )
    with pytest.raises(RuntimeError, match=r"Ray could not place 2 rollout workers of \{'CPU': 0\.0, 'GPU': 0\.5\}"):
        run_rl(gpu, log=quiet)


@pytest.mark.slow
def test_collective_weight_sync_gives_the_object_store_run(tmp_path: Path) -> None:
    """``rollout.weight_sync = "collective"``: the learner broadcasts its weights to its 2 Ray rollout
    workers in a gloo group of their own, received in place: every actor then holds the learner's state
    exactly, and a 3-iteration run (iteration 3 samples from weights iteration 2 trained) is the
    object-store run's."""
    pytest.importorskip("ray")
    from cosmos_robot.policies.init_source import resolve_init
    from cosmos_robot_trainers.rl.policies import load_rl_adapter
    from cosmos_robot_trainers.rl.workers import RayRollouts

    config = debug_config("grpo", tmp_path / "direct", "rollout.num_workers=2", 'rollout.weight_sync="collective"')
    policy = load_rl_adapter(resolve_init(config.init), torch.device("cpu"), noise_level=config.rollout.noise_level)
    rollouts = RayRollouts(config)
    try:
        with torch.no_grad():
            for i, p in enumerate(policy.model.parameters()):
                p.add_(0.01 * (i + 1))
        rollouts.sync(policy.model)
        held = rollouts.ray.get(
            [
                a.__ray_call__.remote(lambda w: {k: v.clone() for k, v in w.worker.policy.model.state_dict().items()})
                for a in rollouts.actors
            ]
        )
    finally:
        rollouts.close()
    mine = policy.model.state_dict()
    for state in held:
        assert state.keys() == mine.keys() and all(torch.equal(state[k], mine[k]) for k in mine)
    runs = {}
    for mode in ("object_store", "collective"):
        sets = ("rollout.num_workers=2", f'rollout.weight_sync="{mode}"', "train.iterations=3")
        assert run_rl(debug_config("grpo", tmp_path / mode, *sets), log=quiet).finished
        runs[mode] = [deterministic(r) for r in read_metrics(tmp_path / mode)]
    assert len(runs["collective"]) == 3 and runs["collective"] == runs["object_store"]


def test_weight_sync_names_the_first_tensor_an_actor_disagrees_on() -> None:
    from cosmos_robot_trainers.common.weight_sync import check_manifests, state_manifest

    learner = state_manifest({"a.weight": torch.zeros(2, 3), "a.bias": torch.zeros(2)})
    check_manifests(learner, [learner, [list(e) for e in learner]])  # a JSON round trip is the same manifest
    other = state_manifest({"a.weight": torch.zeros(2, 4), "a.bias": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"actor 2 holds \('a.weight', \(2, 4\), 'float32'\) where the learner"):
        check_manifests(learner, [learner, other])
    with pytest.raises(ValueError, match="rollout actor 1 holds 1 tensors, the learner 2"):
        check_manifests(learner, [learner[:1]])


def test_weight_sync_uses_nccl_only_between_gpus_of_their_own_and_needs_ray_workers(tmp_path: Path) -> None:
    from cosmos_robot.config import ConfigError
    from cosmos_robot_trainers.common.weight_sync import choose_backend

    assert choose_backend(["gpu-a", "gpu-b", "gpu-c"]) == "nccl"
    assert choose_backend(["gpu-a", "gpu-b", "gpu-b"]) == "gloo"  # two workers sharing a GPU
    assert choose_backend([None, "gpu-b"]) == "gloo"  # a learner on the CPU
    with pytest.raises(ConfigError, match=r"rollout\.weight_sync = 'collective' broadcasts to Ray rollout workers"):
        debug_config("grpo", tmp_path, 'rollout.weight_sync="collective"')


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
def test_micro_batches_take_the_same_optimizer_steps(algo: str, tmp_path: Path) -> None:
    """``optim.micro_batch_size``: each minibatch's loss in micro-batches of 3 rows (pairs for DPO), each
    weighted by its share, accumulates to the whole minibatch's gradient: the same metrics and final
    weights as one pass per minibatch, up to float rounding (GRPO cut at whole episodes by GSPO's rule
    is not exercised here; its minibatches are decisions)."""
    runs = {}
    for name, sets in {"whole": (), "micro": ("optim.micro_batch_size=3",)}.items():
        assert run_rl(debug_config(algo, tmp_path / name, *sets), log=quiet).finished
        runs[name] = [deterministic(r) for r in read_metrics(tmp_path / name)]
    assert len(runs["whole"]) == len(runs["micro"]) == 2
    # diagnostics that are not means over the minibatch's rows: the first-minibatch ratio deviation (float
    # noise, < 1e-3 either way), DPO's margins (means over decisions, whose count per pair varies) and the
    # split-half cosine (a ratio of two small gradients' dot products: iteration 2's, on weights that
    # rounding moved, differed by 1.5e-5 at -0.076 for GRPO)
    loose = {"ratio_dev_first_mb", "model_margin", "ref_margin", "grad_cosine_split_half"}
    for a, b in zip(runs["whole"], runs["micro"], strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            if key not in loose:
                assert value == pytest.approx(b[key], rel=1e-4, abs=1e-5), (key, value, b[key])
        assert b.get("ratio_dev_first_mb", 0.0) < 1e-3
        if "grad_cosine_split_half" in a:
            assert a["grad_cosine_split_half"] == pytest.approx(b["grad_cosine_split_half"], abs=1e-3)
    # (iteration 2's losses and gradient norms are computed on the weights iteration 1's steps made; the
    # weights themselves are not compared: AdamW moves an element whose gradient is rounding noise by
    # about the learning rate either way)


def test_progress_shaping_telescopes_per_episode() -> None:
    """With shaping c, an episode's rewards sum to success + c * (phi_last - phi_first), within [-c, c] of it."""
    config = debug_config("joint_ppo", Path("/x"), "env.max_steps=15", "reward.shaping_coef=2.0")
    worker = RolloutWorker(config, FlowRLAdapter(FlowPolicy.from_pretrained(CKPT)))
    try:
        r = worker.collect(episode_specs(config, 0), seed=3)
    finally:
        worker.close()
    sums = torch.zeros(r.num_episodes).index_add_(0, r.episode, r.reward)
    extra = sums - r.ep_success
    assert torch.all(extra.abs() <= 2.0 + 1e-5)
    assert bool((extra != 0).any())  # the shaping is really there
    assert torch.equal(r.ep_return, r.ep_success)  # statistics stay on the env's sparse reward


@pytest.mark.slow
def test_sigkill_then_rerun_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    """``kill -9`` of ``cosmos-robot train`` after its first checkpoint; the same command resumes it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    init = ROOT / "checkpoints" / "flow_tabletop"

    def command(out: Path) -> list[str]:
        sets = [f"init={init}", f"output.dir={out}", "train.iterations=2", "env.max_steps=40"]
        return [
            sys.executable,
            "-m",
            "cosmos_robot.cli",
            "train",
            "debug_joint_ppo",
            *(a for s in sets for a in ("--set", s)),
        ]

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(command(tmp_path / "whole"), check=True, env=env, cwd=ROOT, capture_output=True, timeout=300)
    proc = subprocess.Popen(
        command(tmp_path / "killed"), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240
    while not (tmp_path / "killed" / "checkpoints" / "step_000001").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint before the run ended"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not (tmp_path / "killed" / "final").exists()
    subprocess.run(command(tmp_path / "killed"), check=True, env=env, cwd=ROOT, capture_output=True, timeout=300)
    a, b = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "killed")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    assert [deterministic(r) for r in a] == [deterministic(r) for r in b]


def test_sampled_policy_swaps_only_the_sampler() -> None:
    """Flow-SDE chunks scatter around the served ODE chunk (same transforms, same shapes)."""
    import numpy as np

    from cosmos_robot_trainers.rl.sampled_policy import SampledFlowPolicy

    base = FlowPolicy.from_pretrained(CKPT)
    rng = np.random.default_rng(0)
    obs = {
        "observation/image": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 255, (64, 64, 3), dtype=np.uint8),
        "observation/state": np.zeros(8, dtype=np.float32),
        "prompt": "open the drawer",
    }
    served = base.infer(obs)["actions"]
    sde = SampledFlowPolicy(base, "flow_sde", seed=0)
    chunks = np.stack([sde.infer(obs)["actions"] for _ in range(8)])
    assert chunks.shape == (8, *served.shape) and chunks.dtype == np.float32
    assert not np.allclose(chunks[0], chunks[1])  # stochastic
    spread = np.abs(chunks - served).mean()
    assert 0 < spread < 0.5 * np.abs(served).mean() + 0.05  # near the served chunk, not noise
    assert sde.metadata["sample_mode"] == "flow_sde"
    assert np.array_equal(base.infer(obs)["actions"], served)  # the base policy is untouched


def test_bad_init_is_a_clear_error_and_makes_no_run_folder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cosmos_robot.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["train", "debug_joint_ppo", "--set", f"init={tmp_path / 'nope'}", "--set", f"output.dir={out}"]
    )
    assert result.exit_code == 2
    assert "does not exist" in result.output and str(tmp_path / "nope") in result.output
    assert not out.exists()


def test_policy_gradient_moves_actions_toward_positive_advantages(
    small_rollout: tuple[RLConfig, FlowPolicy, Rollout],
) -> None:
    """End to end through the stored chains: reward the chunks that the stochastic Flow-SDE step pushed
    up in the first action dim (relative to the ODE from the same start noise), and the ODE chunks
    from those start noises move up in that dim."""
    from cosmos_robot.policies.flow.sampling import sample_actions
    from cosmos_robot_trainers.rl.advantage import Advantages

    config, policy, r = small_rollout
    config = config.model_copy(
        update={"optim": config.optim.model_copy(update={"actor_lr": 1e-4, "epochs": 10, "minibatch_size": 64})}
    )
    model = FlowPolicy.from_pretrained(CKPT).model
    h = config.rollout.replan_steps
    batch = r.inputs

    def ode_dim0() -> torch.Tensor:
        with torch.no_grad():
            out = sample_actions(model, model.encode(batch), "ode", num_steps=4, noise=r.chain[:, 0]).actions
        return out[:, :h, 0].mean(dim=1)

    before = ode_dim0()
    pushed = r.chain[:, -1, :h, 0].mean(dim=1) - before  # what the stochastic step did to dim 0
    adv = torch.where(pushed > 0, 1.0, -1.0)
    stats = update_policy_gradient(
        model,
        build_optimizer(model, config),
        r,
        Advantages(adv, None, torch.ones_like(adv, dtype=torch.bool), {}),
        config,
        torch.Generator().manual_seed(0),
        sample_mode="flow_sde",
        num_flow_steps=4,
        noise_level=policy.config.noise_level,
    )
    assert stats["ratio_dev_first_mb"] < 1e-3
    assert float((ode_dim0() - before).mean()) > 0.02  # measured 0.19


def test_cli_reports_a_failed_ratio_gate_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import cosmos_robot_trainers.launch as launch_module
    from cosmos_robot.cli import app
    from cosmos_robot_trainers.rl import RatioGateError

    def fail(*args: object, **kwargs: object) -> None:
        raise RatioGateError("iteration 3: importance ratio on the first minibatch deviates from 1 by 2.0e-02")

    monkeypatch.setattr(launch_module, "launch", fail)
    result = CliRunner().invoke(app, ["train", "debug_joint_ppo"])
    assert result.exit_code == 1
    assert "deviates from 1" in result.output and "rerun to resume" in result.output
    assert "Traceback" not in result.output
