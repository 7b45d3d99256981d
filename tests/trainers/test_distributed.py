"""Data-parallel SFT (issue 22): two real processes (torchrun, gloo on this CPU) train the same curve as one
process on the same global batch, write one run folder, and the run resumes at another world size."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from safetensors.torch import load_file

from cosmos_robot.config import ConfigError, find_recipe
from cosmos_robot.distributed import (
    World,
    average_gradients,
    broadcast_text,
    mean_over_ranks,
    rank_share,
    shard_range,
    world_from_env,
)
from cosmos_robot_trainers.common import read_metrics
from cosmos_robot_trainers.launch import DATA_PARALLEL, TRAINERS, check_world_size, load_train_recipe
from cosmos_robot_trainers.rl.rollout import EpisodeSpec
from cosmos_robot_trainers.rl.workers import deal_specs, env_shares
from cosmos_robot_trainers.sft import run_sft
from cosmos_robot_trainers.sft.data import TrainData
from cosmos_robot_trainers.text.driver import language_units
from cosmos_robot_trainers.text.state import load_lm
from tests.trainers.test_rl import killed_after

STEPS = 6
ROOT = Path(__file__).resolve().parents[2]


def test_a_world_of_one_is_the_default_and_its_collectives_are_identities(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    world = world_from_env()
    assert world == World() and world.is_main and not world.distributed
    assert broadcast_text("x", world) == "x" and broadcast_text(None, world) is None
    assert mean_over_ranks(2.5, world) == 2.5
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    average_gradients([p], world)
    assert p.grad.tolist() == [2.0, 2.0, 2.0]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="RANK is missing.*torchrun"):
        world_from_env()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"train\.device='cuda:0' names one GPU, and 2 processes would share it"):
        world_from_env("cuda:0")


def test_shard_range_splits_the_global_batch_and_names_an_indivisible_one() -> None:
    assert [shard_range(8, World(rank=r, world_size=2)) for r in (0, 1)] == [(0, 4), (4, 8)]
    with pytest.raises(ValueError, match=r"train\.batch_size=9 is not divisible by the 2 training processes"):
        shard_range(9, World(rank=0, world_size=2))


def test_flow_batches_shard_their_flat_prompt_ids_at_the_offsets() -> None:
    """The flow batch holds its prompts as EmbeddingBag ids + offsets, not one row per sample."""
    batch = {
        "actions": torch.arange(4.0)[:, None, None],
        "action_pad_mask": torch.zeros(4, 1, dtype=torch.bool),
        "text_ids": torch.tensor([10, 11, 20, 30, 31, 32, 40]),
        "text_offsets": torch.tensor([0, 2, 3, 6]),
    }
    data = cast(Any, object.__new__(TrainData))
    first, second = data.shard_batch(batch, 0, 2), data.shard_batch(batch, 2, 4)
    assert first["text_ids"].tolist() == [10, 11, 20] and first["text_offsets"].tolist() == [0, 2]
    assert second["text_ids"].tolist() == [30, 31, 32, 40] and second["text_offsets"].tolist() == [0, 3]
    assert second["actions"].flatten().tolist() == [2.0, 3.0]
    pad = torch.zeros(4, 3, dtype=torch.bool)
    pad[3, 1:] = True  # the last sample's chunk runs past its episode: 2 of its 3 steps are padding
    assert data.loss_mass({"action_pad_mask": pad}) == 10.0


def test_every_trainer_runs_data_parallel_and_one_that_does_not_would_be_refused() -> None:
    assert DATA_PARALLEL == set(TRAINERS)
    check_world_size("text_opd", 2)
    check_world_size("generator_nft", 2)
    check_world_size("future_trainer", 1)
    with pytest.raises(ConfigError, match="trainer 'future_trainer' runs in one process.*for: dpo, generator_dpo"):
        check_world_size("future_trainer", 2)


def test_rl_and_text_rl_refuse_a_world_their_iteration_cannot_be_split_over(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before any folder: every learner process needs an env and an episode group, every text process an
    equal share of the prompts; the errors name the fields."""
    from cosmos_robot_trainers.rl.trainer import run_rl
    from cosmos_robot_trainers.text.grpo import run_text_grpo

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("torch.distributed.is_initialized", lambda: True)  # no process group is started
    monkeypatch.setattr("torch.distributed.get_backend", lambda: "gloo")
    out = f'output.dir="{tmp_path / "x"}"'
    _, config = load_train_recipe("debug_joint_ppo", [out, "env.num_envs=1"])
    with pytest.raises(ConfigError, match=r"env\.num_envs=1 is fewer than the 2 learner processes"):
        run_rl(config)
    _, config = load_train_recipe("debug_grpo", [out, "rollout.episodes_per_iter=2"])
    with pytest.raises(ConfigError, match=r"= 1 episode groups per iteration for 2 learner processes"):
        run_rl(config)
    _, config = load_train_recipe("debug_text_grpo", [out, "rollout.prompts_per_iter=3"])
    with pytest.raises(ConfigError, match=r"rollout\.prompts_per_iter=3 is not divisible by the 2"):
        run_text_grpo(config)
    assert not (tmp_path / "x").exists()


def test_rank_shares_cover_a_minibatch_and_weigh_it_back_to_its_mean() -> None:
    """Each rank's share of a minibatch and its loss weight: the shares tile the minibatch, the weights
    average to 1 (so weighted share losses average to the minibatch's mean loss), a unit (an episode,
    for GSPO) stays on one rank, and a rank left without rows computes one at weight 0."""
    mb = torch.tensor([7, 3, 9, 1, 4])
    losses = torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0])
    shares = [rank_share(mb, World(rank=r, world_size=2)) for r in (0, 1)]
    assert torch.equal(torch.cat([rows for rows, _ in shares]), mb)
    assert sum(w for _, w in shares) / 2 == 1.0
    pos = {int(v): i for i, v in enumerate(mb)}
    weighted = sum(w * losses[[pos[int(v)] for v in rows]].mean() for rows, w in shares) / 2
    torch.testing.assert_close(weighted, losses.mean())
    episodes = torch.tensor([0, 0, 1, 1, 1])
    by_episode = [rank_share(mb, World(rank=r, world_size=2), episodes) for r in (0, 1)]
    assert [rows.tolist() for rows, _ in by_episode] == [[7, 3], [9, 1, 4]]
    assert [w for _, w in by_episode] == [1.0, 1.0]  # one episode each: GSPO's mean is over episodes
    assert rank_share(torch.tensor([5]), World(rank=1, world_size=2)) == (torch.tensor([5]), 0.0)
    assert rank_share(mb, World()) == (mb, 1.0)


def _score_rows_worker(rank: int, port: int, out: str) -> None:
    """One of two gloo ranks scoring 10 rows in micro-batches of 3 (and in one piece) with score_rows."""
    import json

    import torch.distributed as dist

    from cosmos_robot_trainers.text.driver import score_rows

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    world = World(rank=rank, world_size=2, backend="gloo")
    seen: list[list[int]] = []

    def score(rows: torch.Tensor) -> torch.Tensor:
        seen.append(rows.tolist())
        return torch.stack([rows.double() ** 2, -rows.double()], dim=1)

    micro = score_rows(score, 10, 3, "cpu", world)
    whole = score_rows(score, 10, None, "cpu", world)
    tiny = score_rows(score, 1, None, "cpu", world)  # fewer rows than ranks: both score it
    Path(out, f"{rank}.json").write_text(json.dumps([seen, micro.tolist(), whole.tolist(), tiny.tolist()]))
    dist.destroy_process_group()


def test_scoring_passes_are_split_over_ranks_in_the_single_process_micro_batches(tmp_path: Path) -> None:
    """driver.score_rows: each rank scores a contiguous share of the micro-batches (the single-process ones:
    rows 0-2, 3-5 | 6-8, 9), the shares are joined, and every rank holds what one process computes."""
    import json
    import socket

    import torch.multiprocessing as mp

    from cosmos_robot_trainers.text.driver import score_rows

    expected = torch.stack([torch.arange(10).double() ** 2, -torch.arange(10).double()], dim=1)
    single = score_rows(lambda r: torch.stack([r.double() ** 2, -r.double()], dim=1), 10, 3, "cpu")
    assert torch.equal(single, expected)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_score_rows_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert got[0][0] == [[0, 1, 2], [3, 4, 5], [0, 1, 2, 3, 4], [0]]
    assert got[1][0] == [[6, 7, 8], [9], [5, 6, 7, 8, 9], [0]]
    for _seen, micro, whole, tiny in got:
        assert torch.equal(torch.tensor(micro, dtype=torch.float64), expected)
        assert torch.equal(torch.tensor(whole, dtype=torch.float64), expected)
        assert torch.equal(torch.tensor(tiny, dtype=torch.float64), expected[:1])


def test_joined_image_prompt_groups_get_their_own_images_back_or_a_clear_error() -> None:
    """grpo.attach_images: each joined group takes the images of the prompt with the same index; a rank whose
    prompts differ (ids or count) is an error naming it, never images paired with another prompt's text."""
    from cosmos_robot.text.engines import Completion
    from cosmos_robot_trainers.text.grpo import attach_images

    def group(prompt: list[int]) -> list[Completion]:
        return [Completion(prompt, [7], [], True, "7") for _ in range(2)]

    groups = [group([1, 2]), group([3])]
    attach_images(groups, [([1, 2], "images-0"), ([3], "images-1")])
    assert [[c.images for c in g] for g in groups] == [["images-0"] * 2, ["images-1"] * 2]
    with pytest.raises(RuntimeError, match="group 1: its prompt ids differ"):
        attach_images(groups, [([1, 2], "a"), ([4], "b")])
    with pytest.raises(RuntimeError, match="joined 2 groups for 1 prompts"):
        attach_images(groups, [([1, 2], "a")])


def test_episode_groups_are_dealt_to_ranks_as_to_ray_workers() -> None:
    specs = [EpisodeSpec(i, "reach", 100 + i // 2, i // 2) for i in range(8)]  # 4 groups of 2
    parts = deal_specs(specs, 2)
    assert [[s.index for s in p] for p in parts] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert env_shares(5, 2) == [3, 2]
    with pytest.raises(ConfigError, match=r"env\.num_envs=1 is fewer than the 2 learner processes"):
        env_shares(1, 2, "learner processes")


def test_recipes_refuse_what_sharding_cannot_do_naming_the_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"train\.batch_size \(8\) must be a multiple of train\.grad_accum \(3\)"):
        load_train_recipe("debug", ["train.grad_accum=3"])
    with pytest.raises(ConfigError, match=r"checkpoint_format = 'sharded' writes float32"):
        load_train_recipe("debug_text_sft", ['train.checkpoint_format="sharded"', 'train.dtype="bfloat16"'])
    _, config = load_train_recipe("debug", ["train.batch_size=9"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("torch.distributed.is_initialized", lambda: True)  # no process group is started
    monkeypatch.setattr("torch.distributed.get_backend", lambda: "gloo")
    with pytest.raises(ConfigError, match=r"train\.batch_size=9 is not divisible by the 2 training processes"):
        run_sft(config)
    _, config = load_train_recipe("debug", ["train.grad_accum=8"])
    with pytest.raises(ConfigError, match=r"not divisible into train\.grad_accum=8 micro-batches on each of the 2"):
        run_sft(config)


def _train(recipe: str, out: Path, *sets: str, nproc: int = 1) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cosmos_robot.cli", "train", recipe, f"--nproc={nproc}"]
    sets = (f'output.dir="{out}"', f"train.steps={STEPS}", "train.log_every=1", "train.ckpt_every=3", *sets)
    cmd += [f"--set={s}" for s in (*sets, "train.progress=false")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def _curve(out: Path) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(out) if "loss" in r]


def _close(a: list[tuple[int, float, float]], b: list[tuple[int, float, float]], tol: float = 1e-5) -> None:
    assert [s for s, _, _ in a] == [s for s, _, _ in b]
    for (step, loss_a, grad_a), (_, loss_b, grad_b) in zip(a, b, strict=True):
        assert abs(loss_a - loss_b) <= tol and abs(grad_a - grad_b) <= tol, (step, loss_a, loss_b, grad_a, grad_b)


# the flow policy's SFT (a masked mean over real action steps) and a tiny Qwen3's conversation SFT (a mean
# over assistant tokens): each rank weighs its slice by its share of the global batch's normaliser
RECIPES = {
    "debug": ("data.root", "4 samples of each batch per process", "final/model.safetensors"),
    "debug_text_sft": (None, "2 rows of each batch per process", "final/config.json"),
    # a tiny Qwen3-VL: each rank collates only its rows with their images (the patches cannot be cut by rows)
    "debug_text_sft_vl": (None, "1 rows of each batch per process", "final/config.json"),
    # GR00T: LeRobot's masked loss divided by the mask's sum, on cached backbone features
    "debug_sft_groot": ("data.root", "4 samples of each batch per process", "final/model.safetensors"),
    # pi0.5: LeRobot's processors in the loop, the masked flow loss over real action steps
    "debug_sft_pi05": ("data.root", "4 samples of each batch per process", "final/model.safetensors"),
}


# what make test runs of the above; the families' variants are marked extended (make test-all): the same
# mechanism through another model, minutes of 2-process runs on a 2-core machine
CORE = ("debug", "debug_text_sft")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [r if r in CORE else pytest.param(r, marks=pytest.mark.extended) for r in RECIPES])
def test_two_processes_train_the_single_process_curve_and_resume_at_one(recipe: str, tmp_path: Path) -> None:
    data_key, announce, exported = RECIPES[recipe]
    sets = [f'{data_key}="{tmp_path / "demos"}"'] if data_key else []  # one recording for every run
    sets += ["eval.final=false"] if recipe.startswith("debug_text") else []
    one = _train(recipe, tmp_path / "one", *sets)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _train(recipe, tmp_path / "two", *sets, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert f"data parallel: 2 processes (gloo), {announce}" in two.stderr
    assert two.stdout.count("step 6:") == 1  # rank 0 alone reports
    curve = _curve(tmp_path / "two")
    assert [s for s, _, _ in curve] == list(range(1, STEPS + 1))  # rank 0 alone wrote metrics: no duplicates
    _close(curve, _curve(tmp_path / "one"))  # the global batch's loss and gradient norm, as one process's
    assert (tmp_path / "two" / exported).is_file()
    # saved by 2 processes after step 3, resumed by 1: the same remaining curve
    cut = killed_after(tmp_path / "two", tmp_path / "resumed", 3)
    resumed = _train(recipe, cut, *sets)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "step_000003" in resumed.stderr
    _close(_curve(cut), curve)
    assert (cut / exported).is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe",
    [
        pytest.param("debug_generator_sft", marks=pytest.mark.extended),
        pytest.param("debug_generator_dpo", marks=pytest.mark.extended),
        "debug_generator_nft",
    ],
)
@pytest.mark.timeout(600)  # three trainings in sequence on a 2-core machine (its subprocess limit is 600 s)
def test_generator_trainers_train_the_single_process_curve_on_two_processes(recipe: str, tmp_path: Path) -> None:
    """The Cosmos3 generator trainers data parallel: every rank makes the whole batch's draws and computes
    its share (NFT: its share of the rollout's groups too, joined on every rank), weighted; rank 0 alone
    evaluates and exports. The curve, the held-out evaluations and a resume at one process are the
    single-process run's (gradient norms within 1e-4 relative: DPO's beta = 100 magnifies rounding). DPO and
    NFT run sharded (``train.fsdp``: the same data-parallel split with the transformer's parameters,
    gradients and AdamW state sharded; SFT's update is theirs without the old policy and the references, so
    it runs replicated), and one process resumes the two-process run's checkpoint."""
    one = _train(recipe, tmp_path / "one", "train.steps=4", "train.ckpt_every=2")
    assert one.returncode == 0, one.stderr[-3000:]
    fsdp = recipe != "debug_generator_sft"
    source = tmp_path / ("fsdp" if fsdp else "two")
    extra = ["train.fsdp=true"] if fsdp else []
    two = _train(recipe, source, "train.steps=4", "train.ckpt_every=2", *extra, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "data parallel: 2 processes (gloo)" in two.stderr
    if fsdp:  # rollouts / references on whole copies, rank 0 evaluating and exporting a whole copy gathered
        # from the shards; its checkpoints are the one-process form
        assert "fsdp: the transformer's parameters, gradients and AdamW state sharded over 2" in two.stderr
    curve = _curve(tmp_path / "one")
    assert [s for s, _, _ in _curve(source)] == [1, 2, 3, 4]
    for (step, loss_a, grad_a), (_, loss_b, grad_b) in zip(_curve(source), curve, strict=True):
        assert loss_a == pytest.approx(loss_b, abs=1e-5) and grad_a == pytest.approx(grad_b, rel=1e-4), step
    evals = [(tmp_path / r / "evals.jsonl").read_text().splitlines() for r in ("one", source.name)]
    assert len(evals[0]) == 2 and [json.loads(e)["heldout_reward"] for e in evals[1]] == pytest.approx(
        [json.loads(e)["heldout_reward"] for e in evals[0]], abs=1e-4
    )
    assert (source / "final" / "model_index.json").is_file()
    cut = killed_after(source, tmp_path / "resumed", 2)  # saved by 2 processes, resumed by one
    resumed = _train(recipe, cut, "train.steps=4", "train.ckpt_every=2")
    assert resumed.returncode == 0 and "step_000002 (step 2)" in resumed.stdout + resumed.stderr, resumed.stderr[-3000:]
    for (_, loss_a, grad_a), (_, loss_b, grad_b) in zip(_curve(cut)[2:], curve[2:], strict=True):
        assert loss_a == pytest.approx(loss_b, abs=1e-5) and grad_a == pytest.approx(grad_b, rel=1e-4)


@pytest.mark.slow
@pytest.mark.extended
def test_sharded_lora_dpo_takes_its_reference_from_the_shards_with_adapters_off(tmp_path: Path) -> None:
    """Flow-DPO with LoRA under ``train.fsdp``: the reference is the sharded transformer with its adapters
    disabled (in lockstep on every rank), the held-out implicit accuracy rank 0's whole copy with its
    adapters disabled; the curve is the replicated run's."""
    sets = ("train.steps=2", "train.ckpt_every=2", "lora.rank=4", "eval.initial=false")
    two = _train("debug_generator_dpo", tmp_path / "two", *sets, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    sharded = _train("debug_generator_dpo", tmp_path / "fsdp", *sets, "train.fsdp=true", nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    for (step, loss_a, grad_a), (_, loss_b, grad_b) in zip(
        _curve(tmp_path / "fsdp"), _curve(tmp_path / "two"), strict=True
    ):
        assert loss_a == pytest.approx(loss_b, abs=1e-5) and grad_a == pytest.approx(grad_b, rel=1e-4), step
    losses = [json.loads(e)["heldout_dpo_loss"] for e in (tmp_path / "fsdp" / "evals.jsonl").read_text().splitlines()]
    reference = [json.loads(e)["heldout_dpo_loss"] for e in (tmp_path / "two" / "evals.jsonl").read_text().splitlines()]
    assert losses == pytest.approx(reference, abs=1e-4)


def _without_ema(tmp_path: Path) -> str:
    """The debug recipe without its EMA."""
    recipe = tmp_path / "debug_no_ema.toml"
    lines = Path(find_recipe("debug")).read_text().splitlines()
    recipe.write_text("\n".join(line for line in lines if not line.startswith("ema_decay")) + "\n")
    return str(recipe)


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe",
    [
        "debug",
        # text FSDP's crossing both ways runs in make test as the bf16 test below (float32 masters)
        pytest.param("debug_text_sft", marks=pytest.mark.extended),
        pytest.param("debug_sft_pi05", marks=pytest.mark.extended),
        pytest.param("debug_sft_groot", marks=pytest.mark.extended),
    ],
)
def test_fsdp_trains_the_single_process_curve_and_its_checkpoints_cross_both_ways(recipe: str, tmp_path: Path) -> None:
    """FSDP2 (parameters, gradients, AdamW state and, for the flow policy, the EMA sharded over 2 processes;
    the flow policy's and Qwen3's ranks take their parts of the batch in 2 micro-batches) against one process; a sharded
    run resumed whole by one process, and a one-process run resumed sharded by two. pi0.5 is sharded by its
    projections and MLPs (its joint attention never calls a Gemma layer's forward), GR00T by its DiT blocks;
    both export from a fresh copy of the init folder holding the gathered weights."""
    data_key = RECIPES[recipe][0]
    sets = [f'{data_key}="{tmp_path / "demos"}"'] if data_key else []
    one = _train(recipe, tmp_path / "one", *sets)
    assert one.returncode == 0, one.stderr[-3000:]
    accum = {"debug": ["train.grad_accum=2"], "debug_text_sft": ["optim.micro_batch_size=1"]}.get(recipe, [])
    two = _train(recipe, tmp_path / "two", *sets, *accum, "train.fsdp=true", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "fsdp: parameters, gradients and AdamW state sharded over 2 processes" in two.stderr
    curve = _curve(tmp_path / "two")
    _close(curve, _curve(tmp_path / "one"))
    assert (tmp_path / "two" / "final" / "manifest.json").is_file()  # exported from the gathered weights
    if data_key:  # the exported weights (the flow policy's EMA, gathered from its shards) are one process's
        a, b = (load_file(tmp_path / r / "final" / "model.safetensors") for r in ("one", "two"))
        assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) < 2e-5
    whole = _train(recipe, killed_after(tmp_path / "two", tmp_path / "whole", 3), *sets)
    assert whole.returncode == 0 and "step_000003" in whole.stderr, whole.stderr[-3000:]
    _close(_curve(tmp_path / "whole"), curve)
    cut = killed_after(tmp_path / "one", tmp_path / "sharded", 3)
    sharded = _train(recipe, cut, *sets, "train.fsdp=true", nproc=2)
    assert sharded.returncode == 0 and "step_000003" in sharded.stderr, sharded.stderr[-3000:]
    _close(_curve(cut), curve)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["debug", pytest.param("debug_sft_pi05", marks=pytest.mark.extended)])
def test_fsdp_in_bf16_gathers_bf16_and_follows_the_one_process_bf16_curve(recipe: str, tmp_path: Path) -> None:
    """Robot SFT with ``train.precision = "bf16"`` under FSDP: float32 master shards gathered in bf16
    (MixedPrecisionPolicy) beside autocast; close to one process's autocast curve, not equal."""
    sets = (f'data.root="{tmp_path / "demos"}"', 'train.precision="bf16"', "train.steps=4")
    one = _train(recipe, tmp_path / "one", *sets)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _train(recipe, tmp_path / "two", *sets, "train.fsdp=true", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    for (step, la, ga), (_, lb, gb) in zip(_curve(tmp_path / "two"), _curve(tmp_path / "one"), strict=True):
        assert abs(la - lb) < 5e-3 and abs(ga - gb) < 0.02 * gb, (step, la, lb, ga, gb)


def _near(a: list[tuple[int, float, float]], b: list[tuple[int, float, float]]) -> None:
    """bfloat16 curves of other reduction orders: losses within 1e-3, gradient norms within 2%."""
    assert [s for s, _, _ in a] == [s for s, _, _ in b]
    for (step, loss_a, grad_a), (_, loss_b, grad_b) in zip(a, b, strict=True):
        assert abs(loss_a - loss_b) <= 1e-3 and abs(grad_a - grad_b) <= 0.02 * grad_b, (step, loss_a, loss_b)


@pytest.mark.slow
def test_fsdp_in_bf16_keeps_float32_masters_and_crosses_with_the_one_process_bf16_run(tmp_path: Path) -> None:
    """A bfloat16 text run under FSDP: float32 master shards computed in bf16 (MixedPrecisionPolicy),
    saved in the one-process bf16 run's form (bf16 weights, AdamW state, float32 masters): it resumes
    itself exactly, resumes in one process and takes over a one-process run."""
    sets = ('train.dtype="bfloat16"',)
    one = _train("debug_text_sft", tmp_path / "one", *sets)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _train("debug_text_sft", tmp_path / "two", *sets, "train.fsdp=true", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "float32 masters computed in bfloat16" in two.stderr
    curve = _curve(tmp_path / "two")
    _near(curve, _curve(tmp_path / "one"))
    saved = torch.load(tmp_path / "two" / "checkpoints" / "step_000006" / "trainer_state.pt", weights_only=False)
    assert set(saved["optimizer"]) == {"inner", "master"}  # the one-process bf16 form
    assert all(m.dtype == torch.float32 for m in saved["optimizer"]["master"])
    again = _train("debug_text_sft", killed_after(tmp_path / "two", tmp_path / "again", 3), *sets, "train.fsdp=true",
                   nproc=2)  # fmt: skip
    assert again.returncode == 0 and "step_000003" in again.stderr, again.stderr[-3000:]
    _close(_curve(tmp_path / "again"), curve, tol=1e-6)  # the masters survive the round trip exactly
    whole = _train("debug_text_sft", killed_after(tmp_path / "two", tmp_path / "whole", 3), *sets)
    assert whole.returncode == 0 and "step_000003" in whole.stderr, whole.stderr[-3000:]
    _near(_curve(tmp_path / "whole"), curve)
    cut = killed_after(tmp_path / "one", tmp_path / "sharded", 3)
    sharded = _train("debug_text_sft", cut, *sets, "train.fsdp=true", nproc=2)
    assert sharded.returncode == 0 and "step_000003" in sharded.stderr, sharded.stderr[-3000:]
    _near(_curve(cut), _curve(tmp_path / "one"))


@pytest.mark.slow
@pytest.mark.extended  # make test keeps the RL form (flow policy, sharded files, resume, consolidated export) below
def test_sharded_checkpoints_resume_at_another_world_size_and_export_consolidated(tmp_path: Path) -> None:
    """``train.checkpoint_format = "sharded"``: each of 2 FSDP processes writes its own shards
    (torch.distributed.checkpoint); one process resumes from them, and ``cosmos-robot export`` joins them
    into the same weights as a whole checkpoint of the same step."""
    recipe, sets = _without_ema(tmp_path), [f'data.root="{tmp_path / "demos"}"']
    whole = _train(recipe, tmp_path / "whole", *sets, "train.fsdp=true", nproc=2)
    assert whole.returncode == 0, whole.stderr[-3000:]
    two = _train(recipe, tmp_path / "two", *sets, "train.fsdp=true", 'train.checkpoint_format="sharded"', nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    step3 = tmp_path / "two" / "checkpoints" / "step_000003"
    assert (step3 / "sharded" / ".metadata").is_file() and not (step3 / "model.safetensors").exists()
    assert len(list((step3 / "sharded").glob("*.distcp"))) == 2  # one file per rank: nothing gathered
    curve = _curve(tmp_path / "two")
    _close(curve, _curve(tmp_path / "whole"))
    cut = killed_after(tmp_path / "two", tmp_path / "resumed", 3)
    resumed = _train(recipe, cut, *sets)  # one process, whole checkpoints from here on
    assert resumed.returncode == 0 and "step_000003" in resumed.stderr, resumed.stderr[-3000:]
    _close(_curve(cut), curve)
    exported = subprocess.run(
        [sys.executable, "-m", "cosmos_robot.cli", "export", str(step3), "--out", str(tmp_path / "export")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = exported.stdout + exported.stderr
    assert exported.returncode == 0 and "consolidated from its shards" in said, said[-3000:]
    joined = load_file(str(tmp_path / "export" / "model.safetensors"))
    reference = load_file(str(tmp_path / "whole" / "checkpoints" / "step_000003" / "model.safetensors"))
    assert joined.keys() == reference.keys()
    assert all(torch.equal(joined[k], reference[k]) for k in joined)


@pytest.mark.slow
def test_text_sharded_checkpoints_resume_at_another_world_size(tmp_path: Path) -> None:
    """Text SFT with ``train.checkpoint_format = "sharded"``: 2 FSDP processes write one shard file each (no
    gathering), log the whole-checkpoint run's curve, and one process resumes from the shards."""
    sets = ["eval.final=false", "train.fsdp=true"]
    whole = _train("debug_text_sft", tmp_path / "whole", *sets, nproc=2)
    assert whole.returncode == 0, whole.stderr[-3000:]
    two = _train("debug_text_sft", tmp_path / "two", *sets, 'train.checkpoint_format="sharded"', nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    step3 = tmp_path / "two" / "checkpoints" / "step_000003"
    assert (step3 / "sharded" / ".metadata").is_file() and not (step3 / "model.safetensors").exists()
    assert len(list((step3 / "sharded").glob("*.distcp"))) == 2  # one file per rank
    curve = _curve(tmp_path / "two")
    _close(curve, _curve(tmp_path / "whole"))
    assert (tmp_path / "two" / "final" / "config.json").is_file()  # final/ is still an HF folder
    cut = killed_after(tmp_path / "two", tmp_path / "resumed", 3)
    resumed = _train("debug_text_sft", cut, "eval.final=false")  # one process, whole checkpoints from here
    assert resumed.returncode == 0 and "step_000003" in resumed.stderr, resumed.stderr[-3000:]
    _close(_curve(cut), curve)


# --- data-parallel RL learners --------------------------------------------------------------------------

RL_KEYS_EXACT = ("train_success", "episode_return", "episode_length", "env_steps", "decisions")
RL_SKIP = ("time/", "wall_s", "iter_wall_s", "env_steps_per_s", "ratio_dev_first_mb")


def _rl(recipe: str, out: Path, *sets: str, nproc: int = 1) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cosmos_robot.cli", "train", recipe, f"--nproc={nproc}"]
    cmd += [f"--set={s}" for s in (f'output.dir="{out}"', *sets)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def _same_iterations(a: Path, b: Path) -> None:
    """Equal episodes (success, return, lengths, env steps) and losses / norms within float rounding
    (2 ranks sum the gradient in another order: 4e-7 relative on a norm of 39 here). The split-half
    cosine of two small gradients (norm 0.07 in debug NFT) is the most sensitive of them: 1e-3."""
    ra, rb = read_metrics(a), read_metrics(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb, strict=True):
        assert all(x[k] == y[k] for k in RL_KEYS_EXACT), (x, y)
        for k, v in x.items():
            if isinstance(v, float) and not k.startswith(RL_SKIP) and math.isfinite(v):
                tol = 1e-3 if k == "grad_cosine_split_half" else 1e-4
                assert abs(v - y[k]) <= tol * max(1.0, abs(v)), (x["step"], k, v, y[k])


@pytest.mark.slow
def test_two_ppo_learner_ranks_with_ray_env_actors_train_and_resume(tmp_path: Path) -> None:
    """Joint PPO on 2 learner processes whose envs are Ray actors on one local Ray instance collects
    and learns what one learner with 2 Ray rollout workers does (the same dealing of episode groups
    and seeds); cut after iteration 1, it resumes on 2 processes, and on one, with the same iteration 2."""
    pytest.importorskip("ray")
    two = _rl("debug_joint_ppo", tmp_path / "two", 'env.vector_mode="ray"', nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "data parallel: 2 learner processes (gloo)" in two.stderr
    assert two.stdout.count("step 2:") == 1  # rank 0 alone reports and writes
    assert [r["step"] for r in read_metrics(tmp_path / "two")] == [1, 2]
    assert (tmp_path / "two" / "final" / "model.safetensors").is_file()
    one = _rl("debug_joint_ppo", tmp_path / "one", "rollout.num_workers=2")
    assert one.returncode == 0, one.stderr[-3000:]
    _same_iterations(tmp_path / "two", tmp_path / "one")
    again = killed_after(tmp_path / "two", tmp_path / "again", 1)
    resumed = _rl("debug_joint_ppo", again, 'env.vector_mode="ray"', nproc=2)
    assert resumed.returncode == 0 and "step_000001" in resumed.stderr, resumed.stderr[-3000:]
    _same_iterations(again, tmp_path / "two")
    alone = killed_after(tmp_path / "two", tmp_path / "alone", 1)
    resumed = _rl("debug_joint_ppo", alone, "rollout.num_workers=2")  # saved by 2 learners, resumed by 1
    assert resumed.returncode == 0 and "step_000001" in resumed.stderr, resumed.stderr[-3000:]
    _same_iterations(alone, tmp_path / "two")


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe",
    [
        "debug_grpo",
        pytest.param("debug_nft", marks=pytest.mark.extended),
        pytest.param("debug_dpo", marks=pytest.mark.extended),
    ],
)
def test_two_learner_ranks_match_two_rollout_workers_for_every_online_algorithm(recipe: str, tmp_path: Path) -> None:
    """GRPO, DiffusionNFT and Flow-DPO on 2 learner processes (each its share of every minibatch, with
    the whole minibatch's flow draws) against one learner with 2 Ray rollout workers, and sharded
    (``train.fsdp``: the learner in FSDP2 shards, the rollouts on each rank's whole copy) against
    replicated. The debug GRPO and DPO runs skip their first update (no group splits, no pair), so
    their first checkpoint holds an optimizer that never stepped (gathering it must not step it)."""
    pytest.importorskip("ray")
    two = _rl(recipe, tmp_path / "two", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    one = _rl(recipe, tmp_path / "one", "rollout.num_workers=2")
    assert one.returncode == 0, one.stderr[-3000:]
    _same_iterations(tmp_path / "two", tmp_path / "one")
    sharded = _rl(recipe, tmp_path / "fsdp", "train.fsdp=true", nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "fsdp: learner parameters, gradients and AdamW state sharded over 2 processes" in sharded.stderr
    _same_iterations(tmp_path / "fsdp", tmp_path / "two")


@pytest.mark.slow
def test_sharded_ppo_learners_match_replicated_ones_and_their_checkpoints_cross(tmp_path: Path) -> None:
    """Joint PPO with ``train.fsdp`` on 2 processes learns what 2 replicated learners do (the same
    episodes, losses and per-group gradient norms; the split-half cosine from the shards' gradients);
    cut after iteration 1, a sharded run's checkpoint resumes replicated with the same iteration 2 (a
    replicated one resumes sharded: the pi0.5 test below)."""
    two = _rl("debug_joint_ppo", tmp_path / "two", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    sharded = _rl("debug_joint_ppo", tmp_path / "fsdp", "train.fsdp=true", nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "each keeps a whole copy for its rollouts" in sharded.stderr
    assert all("grad_cosine_split_half" in r for r in read_metrics(tmp_path / "fsdp"))
    _same_iterations(tmp_path / "fsdp", tmp_path / "two")
    exported = load_file(tmp_path / "fsdp" / "final" / "model.safetensors")
    reference = load_file(tmp_path / "two" / "final" / "model.safetensors")
    assert max(float((exported[k] - reference[k]).abs().max()) for k in reference) < 1e-5
    replicated = killed_after(tmp_path / "fsdp", tmp_path / "replicated", 1)
    resumed = _rl("debug_joint_ppo", replicated, nproc=2)
    assert resumed.returncode == 0 and "step_000001" in resumed.stderr, resumed.stderr[-3000:]
    _same_iterations(replicated, tmp_path / "two")


@pytest.mark.slow
def test_sharded_rl_checkpoints_resume_replicated_and_export_consolidated(tmp_path: Path) -> None:
    """``train.checkpoint_format = "sharded"`` for an RL learner: every rank writes its shards (debug GRPO's
    first checkpoint holds an optimizer that never stepped: nothing of it is written, and the resume keeps
    it fresh); replicated learners resume them with the same iteration 2, and ``cosmos-robot export``
    consolidates the last one into the weights ``final/`` holds."""
    sharded = _rl("debug_grpo", tmp_path / "fsdp", "train.fsdp=true", 'train.checkpoint_format="sharded"', nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert (tmp_path / "fsdp" / "checkpoints" / "step_000001" / "sharded" / ".metadata").is_file()
    assert not (tmp_path / "fsdp" / "checkpoints" / "step_000001" / "model.safetensors").exists()
    cut = killed_after(tmp_path / "fsdp", tmp_path / "cut", 1)
    resumed = _rl("debug_grpo", cut, nproc=2)
    assert resumed.returncode == 0 and "step_000001" in resumed.stderr, resumed.stderr[-3000:]
    _same_iterations(cut, tmp_path / "fsdp")
    cmd = [sys.executable, "-m", "cosmos_robot.cli", "export", str(tmp_path / "fsdp"), "--out", str(tmp_path / "x")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    exported = load_file(tmp_path / "x" / "model.safetensors")
    final = load_file(tmp_path / "fsdp" / "final" / "model.safetensors")
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)


@pytest.mark.slow
@pytest.mark.extended
def test_sharded_pi05_in_bf16_matches_replicated_learners_and_takes_their_checkpoint(tmp_path: Path) -> None:
    """pi0.5 (its units: the vision layers and each Gemma projection and MLP, ``Pi05Model.fsdp_units``),
    loaded as LeRobot loads it in bf16 (float32 vision path, norms and action projections beside bf16
    Gemma layers: each unit's minority dtype stays whole), sharded over 2 learner processes, learns what
    2 replicated learners do within bf16 rounding, and resumes their checkpoint. (GR00T's units, its DiT
    blocks, are the default ModuleList blocks the flow policy's tests cover; checked by hand.)"""
    recipe, init = "debug_joint_ppo_pi05", tmp_path / "pi05_bf16"
    shutil.copytree(ROOT / "checkpoints" / "pi05_tiny", init)
    config = json.loads((init / "config.json").read_text())
    (init / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    sets = [f'init="{init}"']
    two = _rl(recipe, tmp_path / "two", *sets, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    sharded = _rl(recipe, tmp_path / "fsdp", *sets, "train.fsdp=true", nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert re.search(r"sharded over 2 processes \(([1-9]\d*) of \d+ whole\)", sharded.stderr)  # float32 minority
    _near_iterations(tmp_path / "fsdp", tmp_path / "two")
    # the replicated run's checkpoint asks for the fused AdamW kernel, which this sharded learner (whole
    # float32 tensors beside bf16 shards) cannot take: it keeps its own kernels
    cut = killed_after(tmp_path / "two", tmp_path / "resharded", 1)
    resumed = _rl(recipe, cut, *sets, "train.fsdp=true", nproc=2)
    assert resumed.returncode == 0 and "step_000001" in resumed.stderr, resumed.stderr[-3000:]
    _near_iterations(cut, tmp_path / "two")


def _near_iterations(a: Path, b: Path) -> None:
    """bf16 weights: the same episodes, the losses within 5e-4 and the gradient norms within 1e-3 relative
    (the replicated learners average bf16 gradients in another order and step AdamW fused; measured:
    policy losses 1.8e-5 apart at iteration 1 and 1.5e-4 at iteration 2, gradient norms 5.4e-5)."""
    ra, rb = read_metrics(a), read_metrics(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb, strict=True):
        assert all(x[k] == y[k] for k in RL_KEYS_EXACT), (x, y)
        assert abs(x["policy_loss"] - y["policy_loss"]) < 5e-4 and abs(x["value_loss"] - y["value_loss"]) < 5e-4
        assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-3 * y["grad_norm"], (x["grad_norm"], y["grad_norm"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "announce"),
    [
        ("debug_text_grpo", "text_grpo: qwen3"),
        pytest.param("debug_text_ppo", "text_ppo: qwen3", marks=pytest.mark.extended),
        pytest.param("debug_text_opd", "text_opd: student", marks=pytest.mark.extended),
        pytest.param("debug_text_dpo", "text_dpo (", marks=pytest.mark.extended),
        # image prompts: each rank builds every prompt's images and gives the joined groups theirs back
        pytest.param("debug_text_grpo_vl", "text_grpo: qwen3_vl", marks=pytest.mark.extended),
        ("debug_text_ppo_vl", "text_ppo: qwen3_vl"),
    ],
)
def test_text_rl_on_two_processes_trains_and_resumes_exactly(recipe: str, announce: str, tmp_path: Path) -> None:
    """Text GRPO, PPO, OPD and online DPO data parallel: each process samples and scores its half of the
    prompts (its own sampling seed, so not the one-process completions: the engine seeds a whole batch), the groups are
    joined as JSON, and each process takes its share of every minibatch. Rank 0 alone writes; cut after
    iteration 1 and resumed on 2 processes, the run repeats iteration 2."""
    sets = ["eval.prompts=4", *(["algo.filter_groups=false"] if "grpo" in recipe else [])]  # all completions train
    two = _rl(recipe, tmp_path / "two", *sets, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "data parallel: 2 processes (gloo); each samples its share of the prompts" in two.stderr
    assert two.stderr.count(announce) == 1
    records = [r for r in read_metrics(tmp_path / "two") if "reward_mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    if "grpo" in recipe:
        assert all(r["trained_completions"] == 16 for r in records)  # 4 prompts x 4 completions, joined
    again = killed_after(tmp_path / "two", tmp_path / "again", 1)
    resumed = _rl(recipe, again, *sets, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    redo = [r for r in read_metrics(again) if "reward_mean" in r]
    for key in ("reward_mean", "loss", "grad_norm", "logprob_gap_max", "completion_tokens", "teacher_kl"):
        if key in records[1]:
            assert redo[1][key] == pytest.approx(records[1][key], abs=1e-6), key


def test_a_vision_tower_stays_in_the_root_unit_of_a_sharded_lm() -> None:
    """Micro-batches without images skip the vision tower, and ranks need not agree on which have them;
    FSDP gathers a unit only in its own forward, so only the language model's blocks are units."""
    _, config = load_train_recipe("debug_text_grpo_vl")
    lm = load_lm(config.init, config.model, "float32", "cpu")
    names = {id(m): n for n, m in lm.model.named_modules()}
    units = [names[id(u)] for u in language_units(lm.model)]
    assert units and all(n.startswith("model.language_model.layers.") for n in units), units
    stacks = [n for n, m in lm.model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    assert "model.visual.blocks" in stacks  # what the default (every ModuleList) would have sharded


def _same_text_steps(a: Path, b: Path) -> None:
    """Every logged number equal within float rounding, timings aside."""
    ra, rb = read_metrics(a), read_metrics(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb, strict=True):
        for k, v in x.items():
            if isinstance(v, float) and "per_s" not in k and not k.startswith(("time/", "train_wall")):
                assert abs(v - y[k]) <= 1e-5 * max(1.0, abs(v)), (x["step"], k, v, y[k])


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["debug_text_grpo", pytest.param("debug_text_ppo_vl", marks=pytest.mark.extended)])
def test_sharded_text_rl_matches_replicated_and_its_checkpoints_cross(recipe: str, tmp_path: Path) -> None:
    """Text GRPO and image-text PPO with ``train.fsdp`` on 2 processes: the policy in FSDP2 shards, the
    rollout engine on each rank's whole copy (refreshed after every update), the scoring passes and the
    micro-batches of 3 (uneven over 2 ranks) in lockstep; the PPO critic starts from the whole copy. They
    log what 2 replicated processes do, and a sharded GRPO run cut after iteration 1 resumes replicated."""
    sets = ["eval.prompts=4", "optim.micro_batch_size=3", *(["algo.filter_groups=false"] if "grpo" in recipe else [])]
    two = _rl(recipe, tmp_path / "two", *sets, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    sharded = _rl(recipe, tmp_path / "fsdp", *sets, "train.fsdp=true", nproc=2)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "fsdp: parameters, gradients and AdamW state sharded over 2 processes" in sharded.stderr
    _same_text_steps(tmp_path / "fsdp", tmp_path / "two")
    if "vl" in recipe:
        return
    again = killed_after(tmp_path / "fsdp", tmp_path / "again", 1)
    resumed = _rl(recipe, again, *sets, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _same_text_steps(again, tmp_path / "two")
