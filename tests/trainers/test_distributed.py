"""Data-parallel SFT (issue 22): two real processes (torchrun, gloo on this CPU) train the same curve as one
process on the same global batch, write one run folder, and the run resumes at another world size."""

from __future__ import annotations

import os
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
    shard_range,
    world_from_env,
)
from cosmos_robot_trainers.common import read_metrics
from cosmos_robot_trainers.launch import check_world_size, load_train_recipe
from cosmos_robot_trainers.sft import run_sft
from cosmos_robot_trainers.sft.data import TrainData
from tests.trainers.test_rl import killed_after

STEPS = 6


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


def test_trainers_without_data_parallelism_refuse_several_processes() -> None:
    check_world_size("sft", 2)
    check_world_size("grpo", 1)
    with pytest.raises(ConfigError, match="trainer 'grpo' runs in one process.*built for: sft"):
        check_world_size("grpo", 2)


def test_recipes_refuse_what_sharding_cannot_do_naming_the_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"train\.fsdp with train\.ema_decay"):
        load_train_recipe("debug", ["train.fsdp=true"])  # the debug recipe keeps an EMA
    with pytest.raises(ConfigError, match=r"train\.fsdp shards float32 models"):
        load_train_recipe("debug_text_sft", ["train.fsdp=true", 'train.dtype="bfloat16"'])
    _, config = load_train_recipe("debug", ["train.batch_size=9"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("torch.distributed.is_initialized", lambda: True)  # no process group is started
    monkeypatch.setattr("torch.distributed.get_backend", lambda: "gloo")
    with pytest.raises(ConfigError, match=r"train\.batch_size=9 is not divisible by the 2 training processes"):
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
    # GR00T: LeRobot's masked loss divided by the mask's sum, on cached backbone features
    "debug_sft_groot": ("data.root", "4 samples of each batch per process", "final/model.safetensors"),
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
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


def _without_ema(tmp_path: Path) -> str:
    """The debug recipe without its EMA, which FSDP refuses (the EMA would hold shards)."""
    recipe = tmp_path / "debug_no_ema.toml"
    lines = Path(find_recipe("debug")).read_text().splitlines()
    recipe.write_text("\n".join(line for line in lines if not line.startswith("ema_decay")) + "\n")
    return str(recipe)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["debug", "debug_text_sft"])
def test_fsdp_trains_the_single_process_curve_and_its_checkpoints_cross_both_ways(recipe: str, tmp_path: Path) -> None:
    """FSDP2 (parameters, gradients and AdamW state sharded over 2 processes) against one process; a
    sharded run resumed whole by one process, and a one-process run resumed sharded by two."""
    path = _without_ema(tmp_path) if recipe == "debug" else recipe
    sets = [f'data.root="{tmp_path / "demos"}"'] if recipe == "debug" else []
    one = _train(path, tmp_path / "one", *sets)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _train(path, tmp_path / "two", *sets, "train.fsdp=true", nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "fsdp: parameters, gradients and AdamW state sharded over 2 processes" in two.stderr
    curve = _curve(tmp_path / "two")
    _close(curve, _curve(tmp_path / "one"))
    assert (tmp_path / "two" / "final" / "manifest.json").is_file()  # exported from the gathered weights
    whole = _train(path, killed_after(tmp_path / "two", tmp_path / "whole", 3), *sets)
    assert whole.returncode == 0 and "step_000003" in whole.stderr, whole.stderr[-3000:]
    _close(_curve(tmp_path / "whole"), curve)
    cut = killed_after(tmp_path / "one", tmp_path / "sharded", 3)
    sharded = _train(path, cut, *sets, "train.fsdp=true", nproc=2)
    assert sharded.returncode == 0 and "step_000003" in sharded.stderr, sharded.stderr[-3000:]
    _close(_curve(cut), curve)


@pytest.mark.slow
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


def test_fsdp_is_refused_for_a_family_that_wraps_its_base_modules(tmp_path: Path) -> None:
    """GR00T's SFT model is the base checkpoint's own action head: FSDP could not rebuild it whole for export."""
    done = _train("debug_sft_groot", tmp_path / "x", f'data.root="{tmp_path / "demos"}"', "train.fsdp=true", nproc=2)
    assert done.returncode != 0
    assert "train.fsdp: the Gr00tSFTAdapter family wraps its base checkpoint's own modules" in done.stderr
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_nproc_refuses_a_trainer_without_data_parallelism(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "cosmos_robot.cli", "train", "debug_grpo", "--nproc=2"]
    cmd += [f'--set=output.dir="{tmp_path / "x"}"']
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "trainer 'grpo' runs in one process" in result.stderr
    assert not (tmp_path / "x").exists()
