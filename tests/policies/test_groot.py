"""The groot family: a tiny GR00T N1.7 built offline through LeRobot's own classes, served as a BatchPolicy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cosmos_robot.policies import CheckpointError, detect_family, load_policy_folder
from cosmos_robot.policies.groot.policy import Gr00tPolicy
from cosmos_robot.policies.groot.tiny import build_tiny_groot
from cosmos_robot_client.spec import ObservationError
from tests.policies._pi05_helpers import libero_obs


@pytest.fixture(scope="module")
def groot_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_groot(tmp_path_factory.mktemp("groot"))


@pytest.fixture(scope="module")
def policy(groot_folder: Path) -> Gr00tPolicy:
    p = load_policy_folder(groot_folder)
    assert isinstance(p, Gr00tPolicy)
    return p


def test_folder_is_lerobots_groot_layout(groot_folder: Path) -> None:
    names = {p.name for p in groot_folder.iterdir()}
    assert {"config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"} <= names
    config = json.loads((groot_folder / "config.json").read_text())
    assert config["type"] == "groot" and Path(config["base_model_path"]).is_dir()
    assert detect_family(groot_folder) == "groot"


def test_chunks_have_the_right_shape_and_are_reproducible(policy: Gr00tPolicy) -> None:
    a = policy.infer_batch([libero_obs(0), libero_obs(1)])
    assert a[0]["actions"].shape == (8, 7) and a[0]["actions"].dtype == np.float32
    assert np.isfinite(a[0]["actions"]).all()
    again = policy.infer(libero_obs(0))["actions"]
    np.testing.assert_allclose(again, a[0]["actions"], atol=1e-5)  # same observation, same chunk
    assert np.abs(a[0]["actions"] - a[1]["actions"]).max() > 1e-4


def test_example_observation_is_served(policy: Gr00tPolicy) -> None:
    assert policy.infer(policy.example_observation())["actions"].shape == (8, 7)


def test_metadata_and_bad_observations(policy: Gr00tPolicy) -> None:
    meta = policy.metadata
    assert meta["type"] == "groot" and meta["action_horizon"] == 8 and meta["action_dim"] == 7
    assert meta["action_space"]["embodiment_tag"] == "libero_sim"
    assert "observation/wrist_image" in meta["expected_keys"]["observation.images.wrist_image"]
    obs = libero_obs(0)
    del obs["prompt"]
    with pytest.raises(ObservationError, match="task.*missing"):
        policy.infer(obs)


def test_bad_folders_are_named(groot_folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(groot_folder, bad)
    (bad / "policy_preprocessor.json").unlink()
    with pytest.raises(CheckpointError, match="missing policy_preprocessor.json"):
        load_policy_folder(bad)
    bad2 = tmp_path / "bad2"
    shutil.copytree(groot_folder, bad2)
    config = json.loads((bad2 / "config.json").read_text())
    config["base_model_path"] = str(tmp_path / "no_such_base")
    (bad2 / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="base_model_path .* does not exist"):
        load_policy_folder(bad2)


def _lerobot_chunks(policy: Gr00tPolicy, obs: list[dict]) -> np.ndarray:
    """LeRobot's own pipeline: preprocessor -> GrootPolicy.predict_action_chunk -> postprocessor."""
    import torch

    with torch.inference_mode(), torch.random.fork_rng():
        torch.manual_seed(policy.serve_seed)
        out = policy.postprocessor(policy.policy.predict_action_chunk(policy.preprocessor(policy.io.batch(obs))))
    return out.float().numpy()


def test_served_loop_is_lerobots_predict_action_chunk(policy: Gr00tPolicy) -> None:
    """Our flow loop (graphed on CUDA) computes what LeRobot's get_action computes, from the same noise."""
    obs = [libero_obs(0), libero_obs(1)]
    ours = np.stack([a["actions"] for a in policy.infer_batch(obs)])
    np.testing.assert_allclose(ours, _lerobot_chunks(policy, obs), atol=1e-6)


def test_fast_backbone_is_lerobots_backbone_with_padded_prompts(policy: Gr00tPolicy) -> None:
    """The capturable backbone (planned once per layout, images batched in one attention) returns
    LeRobot's features, image mask and attention mask, here with left-padded prompts of two lengths."""
    import torch

    from cosmos_robot.policies.groot.backbone import FastQwen3Backbone

    obs = [libero_obs(0), libero_obs(1), libero_obs(2)]
    obs[1]["prompt"] = "open the top drawer of the cabinet and put the black bowl inside it"
    groot = policy.policy._groot_model
    inputs = policy.policy._filter_groot_inputs(policy.preprocessor(policy.io.batch(obs)), include_action=False)
    with torch.inference_mode():
        backbone_inputs, _ = groot.prepare_input(inputs)
        assert not bool(backbone_inputs["attention_mask"].all())  # the batch is padded
        ref = groot.backbone(backbone_inputs)
        fast = FastQwen3Backbone(groot.backbone)
        plan = fast.plan(dict(backbone_inputs))
        assert fast.plan(dict(backbone_inputs)) is plan  # cached per layout
        features = fast.features(backbone_inputs["pixel_values"], backbone_inputs["input_ids"], plan)
    torch.testing.assert_close(features, ref["backbone_features"], atol=1e-6, rtol=0)
    assert torch.equal(plan.image_mask, ref["image_mask"])
    assert torch.equal(plan.attention_mask, ref["backbone_attention_mask"])


def test_padded_batches_give_lerobots_chunks(policy: Gr00tPolicy) -> None:
    """Three observations run as a bucket of four (the last one repeated) and still equal LeRobot's
    chunks row for row; the chunk went through the fast path."""
    obs = [libero_obs(3), libero_obs(4), libero_obs(5)]
    obs[2]["prompt"] = "put the bowl on the stove"
    ours = np.stack([a["actions"] for a in policy.infer_batch(obs)])
    np.testing.assert_allclose(ours, _lerobot_chunks(policy, obs), atol=1e-6)
    assert policy._noise_dtype is not None  # set by the fast path only


def test_bf16_weights_stay_close_to_float32_for_the_same_noise(
    groot_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dtype=bfloat16`` (the fast GPU setting) changes rounding, not the chunk: from the same noise
    its actions are within a few thousandths of float32's (1.5e-3 mean here, actions of scale ~0.8).
    The noise is drawn in the features' dtype as LeRobot draws it, so without this patch a bf16
    policy's chunk for a seed is another sample than a float32 policy's."""
    import torch

    fixed = torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(1))

    def same_noise(self: Gr00tPolicy, batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        head = self.policy._groot_model.action_head
        assert (head.config.action_horizon, head.action_dim) == tuple(fixed.shape[1:])
        return fixed[:batch].to(dtype=dtype, device=device)

    monkeypatch.setattr(Gr00tPolicy, "_noise", same_noise)
    obs = [libero_obs(i) for i in range(4)]
    f32 = np.stack([a["actions"] for a in Gr00tPolicy.from_pretrained(groot_folder).infer_batch(obs)])
    bf16 = np.stack(
        [a["actions"] for a in Gr00tPolicy.from_pretrained(groot_folder, dtype="bfloat16").infer_batch(obs)]
    )
    diff = np.abs(bf16 - f32)
    assert diff.mean() < 5e-3 and diff.max() < 3e-2, (diff.mean(), diff.max())
    assert diff.max() > 0  # bf16 did run


def test_a_failed_capture_falls_back_to_the_stepwise_path(
    groot_folder: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """If the whole chunk cannot be captured on some GPU stack, serving goes on (logged) with
    LeRobot's backbone and the graphed loop, which compute the same chunk."""
    from cosmos_robot.policies.cuda_graphs import GraphCaptureError

    p = Gr00tPolicy.from_pretrained(groot_folder)

    def refuse(*_a: object, **_k: object) -> None:
        raise GraphCaptureError("capturing chunk_from_inputs as a CUDA graph failed: test")

    monkeypatch.setattr(p, "_predict_fast", refuse)
    obs = [libero_obs(0), libero_obs(1)]
    with caplog.at_level("ERROR"):
        ours = np.stack([a["actions"] for a in p.infer_batch(obs)])
    assert p._chunk is None and "serving with LeRobot's backbone" in caplog.text
    np.testing.assert_allclose(ours, _lerobot_chunks(p, obs), atol=1e-6)


def test_caching_processor_gives_lerobots_preprocessed_batches(groot_folder: Path) -> None:
    """The served preprocessor keeps the tokenised prompts; batch after batch it returns what
    LeRobot's own pipeline returns, for repeated, new and mixed prompts."""
    import torch
    from lerobot.policies.factory import make_pre_post_processors

    from cosmos_robot.policies.groot.processing import CachingVLProcessor

    served = Gr00tPolicy.from_pretrained(groot_folder)
    step = next(s for s in served.preprocessor.steps if type(s).__name__ == "GrootN17VLMEncodeStep")
    assert isinstance(step.proc, CachingVLProcessor)
    plain, _ = make_pre_post_processors(served.policy.config, pretrained_path=str(groot_folder))
    other = libero_obs(5)
    other["prompt"] = "close the microwave"
    batches = [[libero_obs(0), libero_obs(1)], [libero_obs(2), libero_obs(3)], [libero_obs(4), other], [libero_obs(6)]]
    for obs in batches:
        ours, ref = served.preprocessor(served.io.batch(obs)), plain(served.io.batch(obs))
        assert sorted(ours) == sorted(ref)
        for key, value in ref.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(ours[key], value), key
    assert step.proc.hits == 1  # the second batch reused the first one's prompts
    import copy

    copied = copy.deepcopy(served.preprocessor)  # the RL trainer copies policies
    obs = batches[0]
    assert torch.equal(copied(served.io.batch(obs))["input_ids"], plain(served.io.batch(obs))["input_ids"])


def test_the_graphed_chunk_traces_without_host_syncs(policy: Gr00tPolicy) -> None:
    """What a CUDA graph captures must not read tensors back to the host (``.item()``, ``.tolist()``,
    ``nonzero``): dynamo breaks its graph at each such read, so zero breaks on the CPU stands for
    capture safety on the GPU, checked here in CI where no GPU is."""
    import functools

    import torch

    from cosmos_robot.policies.groot.fast import chunk_from_inputs

    groot = policy.policy._groot_model
    inputs = policy.policy._filter_groot_inputs(
        policy.preprocessor(policy.io.batch([libero_obs(0), libero_obs(1)])), include_action=False
    )
    with torch.inference_mode():
        backbone_inputs, action_inputs = groot.prepare_input(inputs)
        assert policy._backbone is not None
        plan = policy._backbone.plan(dict(backbone_inputs))
        head = groot.action_head
        noise = torch.randn(2, head.config.action_horizon, head.action_dim)
        fn = functools.partial(chunk_from_inputs, policy._backbone, head)
        explained = torch._dynamo.explain(fn)(
            backbone_inputs["pixel_values"], backbone_inputs["input_ids"], action_inputs.state,
            action_inputs.embodiment_id, noise, *plan.tensors(), num_images=plan.num_images,
        )  # fmt: skip
    torch._dynamo.reset()
    # once LeRobot's own backbone has run, transformers' output-recording hooks sit on its layers and
    # read a ContextVar (plain Python, no device read): dynamo breaks there too, harmlessly
    syncs = [str(b.reason) for b in explained.break_reasons if "ContextVar" not in str(b.reason)]
    assert not syncs, syncs


def test_graph_cache_runs_eagerly_off_cuda() -> None:
    import torch

    from cosmos_robot.policies.cuda_graphs import GraphCache

    cache = GraphCache(lambda x, y, scale: x * scale + (0 if y is None else y), enabled=True)
    x = torch.ones(2, 3)
    assert torch.equal(cache(x, None, scale=2.0), torch.full((2, 3), 2.0)) and not cache.graphs
    with pytest.raises(ValueError, match="at least one tensor"):
        cache(None, None, scale=1.0)


@pytest.mark.gpu
def test_cuda_graph_loop_matches_eager(groot_folder: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    graphed = Gr00tPolicy.from_pretrained(groot_folder, device="cuda")
    eager = Gr00tPolicy.from_pretrained(groot_folder, device="cuda", cuda_graphs=False)
    obs = [libero_obs(i) for i in range(3)]
    for _ in range(2):  # the second call replays the captured graph
        a = np.stack([r["actions"] for r in graphed.infer_batch(obs)])
    b = np.stack([r["actions"] for r in eager.infer_batch(obs)])
    np.testing.assert_allclose(a, b, atol=1e-4)
    np.testing.assert_allclose(b, _lerobot_chunks(eager, obs), atol=1e-4)
    assert len(graphed._chunk.graphs) == 1  # type: ignore[union-attr]  # 3 observations: one bucket of 4
