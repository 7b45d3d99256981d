"""The modular joint-PPO trainer matches the single-file reference PPO (house style item 9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cosmos_robot.policies import load_policy_folder
from cosmos_robot_trainers.launch import load_train_recipe
from cosmos_robot_trainers.reference.ppo_flow import Args
from cosmos_robot_trainers.reference.ppo_flow import main as reference_ppo
from cosmos_robot_trainers.rl import run_rl

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "checkpoints" / "flow_tabletop"


@pytest.mark.slow
def test_modular_joint_ppo_matches_the_reference_on_a_tiny_budget(tmp_path: Path) -> None:
    overrides = [
        f"init={json.dumps(str(CKPT))}",
        f"output.dir={json.dumps(str(tmp_path))}",
        "env.max_steps=25",
        'env.tasks=["reach", "push"]',
        "train.iterations=2",
        "rollout.start_noise=fresh",  # the reference draws each chunk's start noise afresh
    ]
    _, config = load_train_recipe("debug_joint_ppo", overrides)
    result = run_rl(config, log=lambda _: None)
    assert result.final_dir is not None
    ours = load_policy_folder(result.final_dir).model.state_dict()  # type: ignore[attr-defined]

    r, a, o = config.rollout, config.algo, config.optim
    args = Args(
        init=str(CKPT),
        tasks=list(config.env.tasks),
        num_envs=config.env.num_envs,
        image_size=config.env.image_size,
        max_steps=config.env.max_steps,
        env_seed=config.env.seed,
        episodes_per_iter=r.episodes_per_iter,
        replan_steps=r.replan_steps,
        num_flow_steps=r.num_flow_steps or 10,
        noise_level=0.5,
        gamma=a.gamma,
        lam=a.lam,
        clip=a.clip,
        dual_clip=a.dual_clip or 3.0,
        value_coef=a.value_coef,
        value_clip=a.value_clip or 0.2,
        huber_delta=a.huber_delta,
        actor_lr=o.actor_lr,
        critic_lr=o.critic_lr,
        betas=o.betas,
        weight_decay=o.weight_decay,
        grad_clip=o.grad_clip or 1.0,
        critic_grad_clip=o.critic_grad_clip or 1.0,
        logprob_dims=list(config.logprob_dims(7)),
        epochs=o.epochs,
        minibatch_size=o.minibatch_size,
        iterations=config.train.iterations,
        seed=config.train.seed,
    )
    reference = reference_ppo(args).model.state_dict()
    start = load_policy_folder(CKPT).model.state_dict()  # type: ignore[attr-defined]
    moved = [k for k in start if not torch.equal(start[k], reference[k])]
    assert moved, "the reference run did not train"
    # same float32 arithmetic in the same order: the weights agree to the bit (AdamW would turn any float
    # noise in a near-zero gradient, e.g. the zero-initialised value head's first layer, into lr-sized steps)
    for key in start:
        assert torch.equal(ours[key], reference[key]), key
    # and the two policies compute the same function
    model_a, model_b = load_policy_folder(result.final_dir).model, load_policy_folder(CKPT).model  # type: ignore[attr-defined]
    model_b.load_state_dict(reference)
    gen = torch.Generator().manual_seed(0)
    cfg = model_a.config
    batch = {
        "images": torch.randint(0, 256, (3, 2, 3, cfg.image_size, cfg.image_size), generator=gen, dtype=torch.uint8),
        "state": torch.randn((3, cfg.state_dim), generator=gen),
        "prompt": ["reach the red target", "push the blue cube to the green goal", "open the drawer"],
    }
    x = torch.randn((3, cfg.chunk_size, cfg.action_dim), generator=gen)
    with torch.no_grad():
        ca, cb = model_a.encode(batch), model_b.encode(batch)
        assert torch.allclose(model_a.velocity(x, 0.5, ca), model_b.velocity(x, 0.5, cb), atol=1e-5)
        assert torch.allclose(model_a.value(ca), model_b.value(cb), atol=1e-5)
