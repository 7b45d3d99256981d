"""The pi05 family: LeRobot's folder format, the native model, the request path and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cosmos_robot.policies import CheckpointError, detect_family, load_policy_folder
from cosmos_robot.policies.pi05.policy import Pi05Policy, resolve_attention
from cosmos_robot_client.spec import ObservationError
from tests.policies._pi05_helpers import libero_obs, tiny_pi05

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def policy() -> Pi05Policy:
    return tiny_pi05(seed=0)


@pytest.fixture(scope="module")
def folder(policy: Pi05Policy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return policy.save_pretrained(tmp_path_factory.mktemp("pi05") / "ckpt")


def _copy(folder: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(folder, dst)
    return dst


def test_folder_is_lerobots_layout_and_detected(folder: Path) -> None:
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"} <= names
    assert any(n.endswith("_normalizer_processor.safetensors") for n in names)
    config = json.loads((folder / "config.json").read_text())
    assert config["type"] == "pi05" and config["chunk_size"] == 10 and config["n_action_steps"] == 5
    keys = load_file(str(folder / "model.safetensors")).keys()
    assert "model.paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight" in keys
    assert "model.paligemma_with_expert.gemma_expert.lm_head.weight" in keys  # LeRobot's strict loader needs it
    assert detect_family(folder) == "pi05"


def test_roundtrip_gives_identical_actions(policy: Pi05Policy, folder: Path) -> None:
    loaded = load_policy_folder(folder)
    assert isinstance(loaded, Pi05Policy)
    obs = [libero_obs(0), libero_obs(1)]
    for a, b in zip(policy.infer_batch(obs), loaded.infer_batch(obs), strict=True):
        assert a["actions"].shape == (5, 7) and a["actions"].dtype == np.float32
        np.testing.assert_array_equal(a["actions"], b["actions"])


def test_serving_is_deterministic_and_batch_independent(policy: Pi05Policy) -> None:
    alone = policy.infer(libero_obs(3))["actions"]
    batched = policy.infer_batch([libero_obs(4), libero_obs(3)])
    np.testing.assert_allclose(batched[1]["actions"], alone, atol=1e-5)
    assert np.abs(batched[0]["actions"] - alone).max() > 1e-4  # a different observation moves the chunk


def test_lerobot_keys_and_float_images_match_openpi_keys(policy: Pi05Policy) -> None:
    obs = libero_obs(5)
    lerobot = {
        "observation.images.image": obs["observation/image"].astype(np.float32).transpose(2, 0, 1) / 255.0,
        "observation.images.image2": obs["observation/wrist_image"],
        "observation.state": obs["observation/state"],
        "task": obs["prompt"],
    }
    np.testing.assert_allclose(policy.infer(lerobot)["actions"], policy.infer(obs)["actions"], atol=1e-5)


def test_prompt_and_state_condition_the_chunk(policy: Pi05Policy) -> None:
    base = policy.infer(libero_obs(6))["actions"]
    other_prompt = policy.infer(libero_obs(6, prompt="open the top drawer"))["actions"]
    moved = libero_obs(6)
    moved["observation/state"] = -moved["observation/state"]
    assert np.abs(other_prompt - base).max() > 1e-4
    assert np.abs(policy.infer(moved)["actions"] - base).max() > 1e-4


def test_bad_observations_name_the_key(policy: Pi05Policy) -> None:
    obs = libero_obs(0)
    del obs["observation/wrist_image"]
    with pytest.raises(ObservationError, match="observation.images.image2.*missing.*observation/wrist_image"):
        policy.infer(obs)
    obs = libero_obs(0)
    obs["observation/state"] = np.zeros(5)
    with pytest.raises(ObservationError, match=r"observation/state.*\(8,\)"):
        policy.infer(obs)
    obs = libero_obs(0)
    obs["observation/image"] = np.zeros((64, 64), np.uint8)
    with pytest.raises(ObservationError, match="observation/image"):
        policy.infer(obs)
    obs = libero_obs(0)
    obs["task"] = "also a prompt"
    with pytest.raises(ObservationError, match="'prompt' and 'task' are the same input|'task' and 'prompt'"):
        policy.infer(obs)
    obs = libero_obs(0)
    obs["observation/image"] = np.full((3, 64, 64), 7.0, np.float32)
    with pytest.raises(ObservationError, match=r"must be in \[0, 1\]"):
        policy.infer(obs)


def test_metadata_announces_chunk_action_space_and_keys(policy: Pi05Policy) -> None:
    meta = policy.metadata
    assert meta["type"] == "pi05" and meta["action_horizon"] == 5 and meta["chunk_size"] == 10
    assert meta["action_space"]["dim"] == 7
    assert "observation/wrist_image" in meta["expected_keys"]["observation.images.image2"]
    assert meta["expected_keys"]["task"] == ["task", "prompt"]


def test_missing_file_is_named(folder: Path, tmp_path: Path) -> None:
    bad = _copy(folder, tmp_path / "bad")
    (bad / "policy_postprocessor.json").unlink()
    with pytest.raises(CheckpointError, match="missing policy_postprocessor.json"):
        load_policy_folder(bad)


def test_wrong_tensor_shape_is_named(folder: Path, tmp_path: Path) -> None:
    bad = _copy(folder, tmp_path / "bad")
    tensors = load_file(str(bad / "model.safetensors"))
    key = "model.action_in_proj.weight"
    tensors[key] = torch.zeros(32, 9)
    del tensors["model.time_mlp_out.bias"]
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_policy_folder(bad)
    assert "'model.action_in_proj.weight' has shape (32, 9)" in str(err.value)
    assert "missing tensors: time_mlp_out.bias" in str(err.value)


def test_unknown_size_without_architecture_file_is_named(folder: Path, tmp_path: Path) -> None:
    bad = _copy(folder, tmp_path / "bad")
    (bad / "pi05_architecture.json").unlink()
    # the config names the released sizes; the weights are tiny: the shape check says so
    with pytest.raises(CheckpointError, match="has shape .* the architecture needs"):
        load_policy_folder(bad)
    config = json.loads((bad / "config.json").read_text())
    config["paligemma_variant"] = "gemma_7b"
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="paligemma_variant 'gemma_7b' is not a released size"):
        load_policy_folder(bad)


def test_missing_tokenizer_is_named(folder: Path, tmp_path: Path) -> None:
    import shutil

    bad = _copy(folder, tmp_path / "bad")
    shutil.rmtree(bad / "tokenizer")
    with pytest.raises(CheckpointError, match="no tokenizer: put the tokenizer files in"):
        load_policy_folder(bad)


def test_flow_loss_trains(policy: Pi05Policy) -> None:
    model = policy.model
    inputs = policy.prepare([libero_obs(0), libero_obs(1)])
    gen = torch.Generator().manual_seed(0)
    actions = torch.rand((2, model.arch.chunk_size, model.arch.max_action_dim), generator=gen) * 2 - 1
    noise = torch.randn(actions.shape, generator=gen)
    t = torch.tensor([0.3, 0.8])
    model.train()
    try:
        loss = model.flow_loss(inputs.images, inputs.image_masks, inputs.tokens, inputs.token_mask, actions, noise, t)
        loss.mean().backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert (
            "paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight" in grads
        )
        assert "paligemma_with_expert.gemma_expert.model.layers.1.input_layernorm.dense.weight" in grads
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


def test_parity_with_lerobot_pi05() -> None:
    """LeRobot's PI05Policy and ours load one LeRobot-written folder and agree: in float32 bitwise
    (the "eager" attention that a float32 model picks by default runs LeRobot's op order;
    benchmarks/parity_pi05.py)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "parity_pi05.py"), "--size", "tiny"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads(out.stdout[out.stdout.index("{") :])
    assert report["ok"] and report["action_max_abs_diff"] == 0.0 and report["action_scale"] > 0.1


def test_numerics_stages_are_all_equal_to_lerobot_on_the_tiny_model(tmp_path: Path) -> None:
    """benchmarks/numerics_pi05_stages.py, which names the first stage where our float32 pi0.5 departs from
    LeRobot's on the H200: on the CPU every stage is bitwise LeRobot's, our layers fed LeRobot's embeddings
    included (so a non-zero row there on a GPU is the GPU's, not the script's)."""
    out = tmp_path / "stages.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "numerics_pi05_stages.py"), "--size", "tiny", "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert any("LeRobot's embeddings in" in name for name in rows) and "chunk (model space)" in rows
    assert all(value == 0.0 for value in rows.values()), {k: v for k, v in rows.items() if v}


def test_bf16_parity_with_lerobot_keeps_its_float32_islands() -> None:
    """In bfloat16 LeRobot keeps the vision path, the norms and the action projections in float32;
    ``precision="mixed"`` (the default) does too, and lands within 2e-3 of it on actions of scale ~7."""
    from cosmos_robot.policies.pi05.checkpoint import param_dtype

    bf16, f32 = torch.bfloat16, torch.float32
    assert (
        param_dtype("paligemma_with_expert.paligemma.model.vision_tower.vision_model.post_layernorm.weight", bf16)
        == f32
    )
    assert param_dtype("paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight", bf16) == f32
    assert param_dtype("paligemma_with_expert.gemma_expert.model.layers.0.mlp.up_proj.weight", bf16) == bf16
    assert (
        param_dtype("action_in_proj.weight", bf16) == f32 and param_dtype("action_in_proj.weight", bf16, "bf16") == bf16
    )
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "parity_pi05.py"), "--size", "tiny", "--dtype", "bfloat16",
         "--atol", "2e-3"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_graph_buckets_are_powers_of_two() -> None:
    from cosmos_robot.policies.cuda_graphs import bucket_size, pad_rows

    assert [bucket_size(n) for n in (1, 2, 3, 4, 5, 8, 9, 33)] == [1, 2, 4, 4, 8, 8, 16, 64]
    with pytest.raises(ValueError, match="at least 1"):
        bucket_size(0)
    t = torch.arange(6.0).reshape(3, 2)
    padded = pad_rows(t, 4)
    assert padded.shape == (4, 2) and torch.equal(padded[3], t[2]) and torch.equal(padded[:3], t)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_matches_eager_for_any_batch_size() -> None:
    policy = tiny_pi05(seed=2)
    policy.model.cuda()
    graphed = Pi05Policy(
        policy.model, policy.lerobot_config, policy.preprocessor, policy.postprocessor, policy.tokenizer,
        cuda_graphs=True,
    )  # fmt: skip
    eager = Pi05Policy(
        policy.model, policy.lerobot_config, policy.preprocessor, policy.postprocessor, policy.tokenizer,
        cuda_graphs=False,
    )  # fmt: skip
    for n in (1, 3, 5):
        obs = [libero_obs(i) for i in range(n)]
        for a, b in zip(graphed.infer_batch(obs), eager.infer_batch(obs), strict=True):
            np.testing.assert_allclose(a["actions"], b["actions"], atol=1e-4)
    assert sorted(k[0][0][0][0] for k in graphed.graphed.graphs) == [1, 4, 8]  # type: ignore[union-attr]


def test_trimming_the_prompt_padding_changes_no_output() -> None:
    """The graphed path cuts LeRobot's right padding of the prompt: pads are masked and take no position."""
    from cosmos_robot.policies.pi05.modeling import trim_text

    policy = tiny_pi05(seed=3)
    obs = [libero_obs(0), libero_obs(1, prompt="open the drawer")]
    with torch.inference_mode():
        x = policy.prepare(obs)
        extra = 40  # more right padding, as a 200-token tokenizer leaves after a short prompt
        padded = torch.cat([x.tokens, torch.zeros(2, extra, dtype=x.tokens.dtype)], dim=1)
        padded_mask = torch.cat([x.token_mask, torch.zeros(2, extra, dtype=x.token_mask.dtype)], dim=1)
        longest = int(x.token_mask.sum(dim=1).max())
        tokens, mask = trim_text(padded, padded_mask, longest + 3)
        assert tokens.shape[1] == longest + 3 and int(mask.sum()) == int(x.token_mask.sum())
        assert trim_text(padded, padded_mask, longest - 1)[0].shape == padded.shape  # a longer prompt: whole
        gen = torch.Generator().manual_seed(0)
        noise = torch.randn(2, policy.arch.chunk_size, policy.arch.max_action_dim, generator=gen)
        full = policy.model.generate(x.images, x.image_masks, padded, padded_mask, noise, 4)
        cut = policy.model.generate(x.images, x.image_masks, tokens, mask, noise, 4)
    torch.testing.assert_close(cut, full, atol=1e-5, rtol=0)
    left = torch.zeros_like(x.token_mask)
    left[:, -3:] = True  # a left-padded batch is left alone
    assert trim_text(x.tokens, left, 8)[0].shape == x.tokens.shape


def test_math_attention_equals_fused_attention() -> None:
    """``attention="math"`` (matmuls + float32 softmax, for Inductor to fuse) computes the chunk the
    fused SDPA kernel computes, padded prompts included; a bad name is refused."""
    policy = tiny_pi05(seed=4)
    obs = [libero_obs(0), libero_obs(1, prompt="open the drawer")]
    with torch.inference_mode():
        x = policy.prepare(obs)
        noise = torch.randn(
            2, policy.arch.chunk_size, policy.arch.max_action_dim, generator=torch.Generator().manual_seed(0)
        )
        fused = policy.model.generate(x.images, x.image_masks, x.tokens, x.token_mask, noise, 4)
        policy.model.set_attention("math")
        math = policy.model.generate(x.images, x.image_masks, x.tokens, x.token_mask, noise, 4)
    torch.testing.assert_close(math, fused, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="attention 'flash' is not one of"):
        policy.model.set_attention("flash")


def test_eager_path_embeds_each_camera_alone_as_lerobot_does() -> None:
    """The float32 reference path (``eager``) calls SigLIP once per camera, LeRobot's order: one batched
    call for both cameras rounds differently on a GPU, 5.1e-5 on the prefix that 18 random layers
    amplified to 1.2e-2 on the chunk at the released shape (docs/pi05.md). The fast paths keep one
    batched call; both give the same prefix here on the CPU within float32 rounding."""
    policy = tiny_pi05(seed=5)
    obs = [libero_obs(0), libero_obs(1, prompt="open the drawer")]
    model = policy.model
    calls: list[int] = []
    inner = model.embed_images

    def counting(images: torch.Tensor) -> torch.Tensor:
        calls.append(images.shape[0])
        return inner(images)

    model.embed_images = counting  # type: ignore[method-assign]
    with torch.inference_mode():
        x = policy.prepare(obs)
        n_cams = len(x.images)
        assert n_cams >= 2
        model.set_attention("eager")
        eager, pad_e = model.embed_prefix(x.images, x.image_masks, x.tokens, x.token_mask)
        assert calls == [2] * n_cams
        calls.clear()
        model.set_attention("sdpa")
        batched, pad_b = model.embed_prefix(x.images, x.image_masks, x.tokens, x.token_mask)
        assert calls == [2 * n_cams]
    assert torch.equal(pad_e, pad_b)
    torch.testing.assert_close(eager, batched, atol=1e-5, rtol=0)


def test_attention_is_a_loader_option(folder: Path) -> None:
    loaded = Pi05Policy.from_pretrained(folder, attention="math")
    assert loaded.model.attention == "math"
    with pytest.raises(ValueError, match=r"attention 'fast' is not one of \['auto', 'sdpa', 'math', 'eager'\]"):
        Pi05Policy.from_pretrained(folder, attention="fast")


def test_auto_attention_is_math_only_under_compile(folder: Path) -> None:
    """The default picks what measured fastest: math attention only where Inductor compiles it
    (under the CUDA graph), the fused kernel otherwise; a float32 model runs LeRobot's own attention
    (the reference precision)."""
    assert resolve_attention("auto", compiled=True) == "math"
    assert resolve_attention("auto", compiled=False) == "sdpa"
    assert resolve_attention("auto", compiled=False, float32=True) == "eager"
    assert resolve_attention("auto", compiled=True, float32=True) == "eager"
    assert resolve_attention("sdpa", compiled=True) == "sdpa" and resolve_attention(None, compiled=True) is None
    assert Pi05Policy.from_pretrained(folder).model.attention == "eager"  # the tiny folder is float32
    assert Pi05Policy.from_pretrained(folder, dtype="bfloat16").model.attention == "sdpa"
    # CPU: compiled, no graph
    assert Pi05Policy.from_pretrained(folder, dtype="bfloat16", compile=True).model.attention == "sdpa"


@pytest.mark.slow
def test_compile_without_cuda_graphs_compiles_and_matches(folder: Path) -> None:
    """``compile`` is honoured off CUDA too (Inductor on the CPU), with the eager chunk; ``trim_prompt``
    needs the graphs or the compiled shapes it pins the prompt for and says so instead of being ignored."""
    eager = Pi05Policy.from_pretrained(folder)
    compiled = Pi05Policy.from_pretrained(folder, compile=True)
    assert hasattr(compiled.model.velocity, "_torchdynamo_orig_callable")  # torch.compile's wrapper
    obs = [libero_obs(0), libero_obs(1, prompt="open the drawer")]
    a = np.stack([r["actions"] for r in compiled.infer_batch(obs)])
    b = np.stack([r["actions"] for r in eager.infer_batch(obs)])
    np.testing.assert_allclose(a, b, atol=1e-4)
    with pytest.raises(ValueError, match="trim_prompt pins .* needs cuda_graphs or compile"):
        Pi05Policy.from_pretrained(folder, trim_prompt=16)


def test_trim_prompt_takes_a_token_count() -> None:
    """``-a trim_prompt=N``: a positive token count below the tokenizer's length, 0/false for off;
    ``true`` (the old rounding to multiples of 32, a new graph per prompt length) is refused, saying why."""
    from cosmos_robot.policies.pi05.policy import check_trim_prompt

    assert check_trim_prompt(False, 48) == 0 and check_trim_prompt(0, 48) == 0 and check_trim_prompt(32, 48) == 32
    for bad in (True, 48, -1, "32", 1.5):
        with pytest.raises(ValueError, match=r"tokens to pin, between 1 and the tokenizer's 47"):
            check_trim_prompt(bad, 48)


def test_example_observation_is_served(policy: Pi05Policy) -> None:
    """What `serve --warmup` runs: LeRobot's own keys, one valid observation."""
    example = policy.example_observation()
    assert "observation.state" in example and "task" in example
    assert policy.infer(example)["actions"].shape == (policy.lerobot_config.n_action_steps, policy.action_dim)


def test_a_failed_capture_serves_eagerly(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """If a GPU stack refuses the chunk's capture, serving goes on eagerly (logged) with the same chunks."""
    from cosmos_robot.policies.cuda_graphs import GraphCaptureError

    policy = tiny_pi05(seed=5)
    expected = policy.infer_batch([libero_obs(0)])[0]["actions"]

    class Refusing:
        def __call__(self, *args: object) -> None:
            raise GraphCaptureError("capturing _generate as a CUDA graph failed: test")

    policy.graphed = Refusing()  # type: ignore[assignment]
    with caplog.at_level("ERROR"):
        got = policy.infer_batch([libero_obs(0)])[0]["actions"]
    assert policy.graphed is None and "serving eagerly" in caplog.text
    np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("attention", ["sdpa", "math"])
def test_the_graphed_chunk_traces_without_host_syncs(attention: str) -> None:
    """``generate`` is what the CUDA graph captures: no host reads (dynamo would break its graph at
    each), checked on the CPU so CI guards the GPU path."""
    policy = tiny_pi05(seed=0)
    policy.model.set_attention(attention)
    with torch.inference_mode():
        x = policy.prepare([libero_obs(0), libero_obs(1, prompt="open the drawer")])
        noise = torch.randn(2, policy.arch.chunk_size, policy.arch.max_action_dim)
        explained = torch._dynamo.explain(policy.model.generate)(
            x.images, x.image_masks, x.tokens, x.token_mask, noise, 4
        )
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
