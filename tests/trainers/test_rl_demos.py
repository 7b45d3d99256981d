"""Demonstration-augmented RL (``[bc]``, ``rl/demos.py``): the demonstrations reach the learner as the
frames SFT trained on, the demonstration loss is part of every optimizer step, and a run logs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from cosmos_robot.policies.flow.rl import FlowRLAdapter
from cosmos_robot_trainers.common import read_metrics
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.rl import RLConfig, run_rl
from cosmos_robot_trainers.rl.config import BCConfig, OptimConfig
from cosmos_robot_trainers.rl.demos import DemoTerm, demo_flow_loss, load_demos, sample_weights
from cosmos_robot_trainers.rl.learner import accumulated_step
from cosmos_robot_trainers.sft import SFTConfig, run_sft
from cosmos_robot_trainers.sft.data import load_train_data

ROOT = Path(__file__).resolve().parents[2]


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[SFTConfig, Path]:
    """The debug SFT recipe (it records 2 expert episodes per task at 32 px) and its final policy."""
    out = tmp_path_factory.mktemp("bc") / "sft"
    _, config = load_train_recipe("debug", [f"output.dir={json.dumps(str(out))}", "train.progress=false"])
    assert isinstance(config, SFTConfig)
    result = run_sft(config, log=quiet)
    return config, result.final_dir


def test_demonstrations_are_the_frames_sft_trained_on(sft_run: tuple[SFTConfig, Path]) -> None:
    """The adapter maps each recorded frame through the checkpoint's own wire transforms; SFT's loader
    normalised the same recording with the stats it wrote into that checkpoint: the two must agree."""
    config, final = sft_run
    adapter = FlowRLAdapter.from_checkpoint(str(final))
    demos = adapter.demonstrations(config.data.root)
    data = load_train_data(config.data, config.model)
    assert len(demos) == len(data) and demos.num_episodes == data.num_episodes == 8
    assert torch.allclose(demos.inputs["state"], data.state, atol=1e-5)
    assert torch.allclose(demos.chunks, data.actions, atol=1e-5)
    assert torch.equal(demos.pad, data.pad_mask)
    assert torch.equal(demos.inputs["images"], data.images)
    assert demos.prompts == data.prompts == demos.inputs["prompt"]

    few = adapter.demonstrations(config.data.root, max_episodes_per_task=1)
    assert few.num_episodes == 4 and sorted(set(few.prompts)) == sorted(set(data.prompts))
    assert 0 < len(few) < len(demos)


def test_bc_instructions_keep_only_those_tasks_demonstrations(sft_run: tuple[SFTConfig, Path]) -> None:
    config, final = sft_run
    adapter = FlowRLAdapter.from_checkpoint(str(final))
    every = adapter.demonstrations(config.data.root)
    hard = sorted(set(every.prompts))[:2]
    cfg = BCConfig(data=str(config.data.root), coef=1.0, instructions=hard)
    kept = load_demos(cfg, adapter)
    assert kept is not None and sorted(set(kept.prompts)) == hard and kept.num_episodes == 4
    rows = [i for i, p in enumerate(every.prompts) if p in hard]
    assert torch.equal(kept.chunks, every.chunks[rows]) and torch.equal(
        kept.inputs["state"], every.inputs["state"][rows]
    )
    with pytest.raises(ValueError, match=r"bc.instructions: \['fly to the moon'\] not in the recording; it holds"):
        load_demos(BCConfig(data=str(config.data.root), coef=1.0, instructions=["fly to the moon"]), adapter)


def test_the_demonstration_term_is_part_of_the_optimizer_step(sft_run: tuple[SFTConfig, Path]) -> None:
    """With a zero algorithm loss, steps driven only by ``aux`` lower the demonstration loss; without
    ``aux`` the same steps change nothing."""
    config, final = sft_run
    adapter = FlowRLAdapter.from_checkpoint(str(final))
    demos = adapter.demonstrations(config.data.root)
    model = adapter.model
    model.train()
    cfg = BCConfig(data=str(config.data.root), coef=1.0, batch_size=64)
    weights = sample_weights(demos.prompts, "balanced")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    optim = OptimConfig(grad_clip=None, critic_grad_clip=None)

    def no_loss(part: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        return sum(p.sum() * 0.0 for p in model.parameters()), {}

    def held_out_loss() -> float:
        with torch.no_grad():
            g = torch.Generator().manual_seed(123)
            return float(demo_flow_loss(model, demos, torch.arange(len(demos)), g))

    before = held_out_loss()
    accumulated_step(model, optimizer, torch.arange(4), no_loss, optim)
    assert held_out_loss() == before  # AdamW on zero gradients (no weight decay here): no move
    for it in range(30):
        term = DemoTerm.for_iteration(demos, weights, cfg, it, seed=it)
        _, metrics = accumulated_step(model, optimizer, torch.arange(4), no_loss, optim, aux=term)
        assert metrics["bc_coef"] == 1.0 and metrics["bc_loss"] > 0
    assert held_out_loss() < 0.8 * before


def test_a_grpo_run_with_demonstrations_logs_the_decaying_term(sft_run: tuple[SFTConfig, Path], tmp_path: Path) -> None:
    config, final = sft_run
    _, rl = load_train_recipe(
        "debug_grpo",
        [
            f"init={json.dumps(str(final))}",
            f"output.dir={json.dumps(str(tmp_path / 'grpo'))}",
            f"bc.data={json.dumps(str(config.data.root))}",
            "bc.coef=4.0",
            "bc.decay=0.5",
            "bc.batch_size=16",
            "rollout.replan_steps=4",  # the debug SFT policy plans 4 steps
            "algo.group_score='shaped'",  # every group is ranked, so both iterations update
            "reward.shaping_coef=1.0",
        ],
    )
    assert isinstance(rl, RLConfig)
    run_rl(rl, log=quiet)
    rows = read_metrics(tmp_path / "grpo")
    logged = [(r["step"], r["bc_coef"], r["bc_loss"]) for r in rows if "bc_coef" in r]
    assert [(s, c) for s, c, _ in logged] == [(1, 4.0), (2, 2.0)]
    assert all(0 < loss < 10 for _, _, loss in logged)


def test_bc_settings_that_would_do_nothing_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"bc.coef > 0 needs bc.data"):
        BCConfig(coef=1.0)
    with pytest.raises(ValidationError, match=r"bc.coef is 0: the demonstrations would never be used"):
        BCConfig(data="runs/demos/x")


def test_a_missing_demonstration_folder_fails_before_the_run_folder_exists(
    sft_run: tuple[SFTConfig, Path], tmp_path: Path
) -> None:
    _, final = sft_run
    _, rl = load_train_recipe(
        "debug_grpo",
        [
            f"init={json.dumps(str(final))}",
            f"output.dir={json.dumps(str(tmp_path / 'grpo'))}",
            f"bc.data={json.dumps(str(tmp_path / 'nowhere'))}",
            "bc.coef=1.0",
        ],
    )
    assert isinstance(rl, RLConfig)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        run_rl(rl, log=quiet)
    assert not (tmp_path / "grpo").exists()
