"""Broken or hostile checkpoint folders: each one is refused with a ``CheckpointError`` naming the file.

Every folder here starts as a real tiny checkpoint of its family (written by the family's own
``save_pretrained`` / tiny builder) and is then damaged the way a bad copy or a hostile author would.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from cosmos_robot.manifest import write_manifest
from cosmos_robot.policies import CheckpointError, load_policy_folder
from cosmos_robot.policies.flow import FlowPolicy
from tests.policies._flow_helpers import scrambled_model, tiny_config, tiny_stats

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/policies/conftest.py


@pytest.fixture
def flow_ckpt(tmp_path: Path) -> Path:
    cfg = tiny_config()
    return FlowPolicy(scrambled_model(cfg), tiny_stats(cfg)).save_pretrained(tmp_path / "flow")


@pytest.fixture(scope="module")
def pi05_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.policies._pi05_helpers import tiny_pi05

    return tiny_pi05(seed=0).save_pretrained(tmp_path_factory.mktemp("pi05") / "ckpt")


@pytest.fixture(scope="module")
def groot_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cosmos_robot.policies.groot.tiny import build_tiny_groot

    return build_tiny_groot(tmp_path_factory.mktemp("groot"))


def _edit_json(path: Path, **fields: Any) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


# --- config.json that is not a JSON file ----------------------------------------------------------
def test_config_json_that_is_a_folder_is_named(flow_ckpt: Path) -> None:
    (flow_ckpt / "config.json").unlink()
    (flow_ckpt / "config.json").mkdir()
    with pytest.raises(CheckpointError, match=rf"{flow_ckpt / 'config.json'}: is a folder, expected a JSON file"):
        load_policy_folder(flow_ckpt)


def test_binary_config_json_is_named(flow_ckpt: Path) -> None:
    (flow_ckpt / "config.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary")
    with pytest.raises(CheckpointError, match=rf"{flow_ckpt / 'config.json'}: not a text JSON file \(byte 0"):
        load_policy_folder(flow_ckpt)


# --- config sizes the weights do not have: refused from the safetensors header, before allocating --
@pytest.mark.parametrize(
    ("field", "tensor"),
    [
        ("trunk_width", r"tensor 'trunk\.0\.weight' has shape \(32, 48\) in the file but the config builds "
         r"\(20000, 48\)"),
        ("expert_width", r"tensor 'blocks\.0\.fc1\.weight' has shape \(32, 32\) in the file but the config builds "
         r"\(20000, 20000\)"),
    ],
    ids=["trunk_width", "expert_width"],
)  # fmt: skip
def test_huge_width_is_refused_from_the_header_in_under_2s(flow_ckpt: Path, field: str, tensor: str) -> None:
    import torch

    from cosmos_robot.policies.flow import FlowModel

    with torch.device("meta"):  # torch's one-time set-up of meta-device modules is not what is timed
        FlowModel(tiny_config())
    _edit_json(flow_ckpt / "config.json", **{field: 20000})  # 4 x 10^8 floats per matrix if it were built
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as err:
        load_policy_folder(flow_ckpt)
    elapsed = time.perf_counter() - start
    msg = str(err.value)
    assert msg.startswith(f"{flow_ckpt / 'model.safetensors'}: weights do not match the config")
    assert re.search(tensor, msg), msg
    assert elapsed < 2.0, f"{elapsed:.2f}s: the model was built before the header was compared"


def test_header_mismatch_names_the_tensor_and_both_shapes(flow_ckpt: Path) -> None:
    _edit_json(flow_ckpt / "config.json", expert_width=40)
    with pytest.raises(CheckpointError, match=r"tensor '[\w.]+' has shape \(\d+, 32\) in the file but the config "):
        load_policy_folder(flow_ckpt)


def test_truncated_weights_without_manifest_are_named(flow_ckpt: Path) -> None:
    weights = flow_ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"{weights}: (not a readable safetensors|the tensor data cannot)"):
        load_policy_folder(flow_ckpt)


# --- manifest: a corrupted file is refused before it is parsed, naming it ---------------------------
@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_corrupted_file_in_a_folder_with_manifest_is_named(flow_ckpt: Path, name: str) -> None:
    write_manifest(flow_ckpt, {"family": "flow"})
    path = flow_ckpt / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, same size: only the sha256 can tell
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{path}: sha256 mismatch with manifest.json"):
        load_policy_folder(flow_ckpt)


def test_manifest_that_is_a_folder_is_not_silently_unverified(flow_ckpt: Path) -> None:
    (flow_ckpt / "manifest.json").mkdir()
    with pytest.raises(CheckpointError, match="manifest.json: is not a file"):
        load_policy_folder(flow_ckpt)


# --- pi05: processor stats and the tokenizer -------------------------------------------------------
def test_truncated_pi05_normalizer_is_named(pi05_ckpt: Path, tmp_path: Path) -> None:
    bad = Path(shutil.copytree(pi05_ckpt, tmp_path / "pi05"))
    stats = next(bad.glob("policy_preprocessor_step_*_normalizer_processor.safetensors"))
    stats.write_bytes(stats.read_bytes()[: stats.stat().st_size - 100])
    with pytest.raises(CheckpointError, match=rf"{stats}: not a complete safetensors file"):
        load_policy_folder(bad)


def _pi05_naming_an_uncached_tokenizer(pi05_ckpt: Path, tmp_path: Path) -> Path:
    bad = Path(shutil.copytree(pi05_ckpt, tmp_path / "pi05"))
    shutil.rmtree(bad / "tokenizer")
    pre = json.loads((bad / "policy_preprocessor.json").read_text())
    step = next(s for s in pre["steps"] if s["registry_name"] == "tokenizer_processor")
    step["config"]["tokenizer_name"] = "cosmos-robot-tests/paligemma-not-cached"
    (bad / "policy_preprocessor.json").write_text(json.dumps(pre))
    return bad


def _no_network(*args: object, **kwargs: object) -> None:
    raise OSError(f"this test forbids network connections {args}")


def test_pi05_missing_tokenizer_is_named_without_touching_the_network(
    pi05_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = _pi05_naming_an_uncached_tokenizer(pi05_ckpt, tmp_path)
    connects: list[object] = []
    monkeypatch.setattr(socket.socket, "connect", lambda *a, **k: connects.append(a) or _no_network(*a))
    with pytest.raises(CheckpointError) as err:
        load_policy_folder(bad)
    msg = str(err.value)
    assert "pi05 tokenizer 'cosmos-robot-tests/paligemma-not-cached'" in msg
    assert "not in the local Hugging Face cache" in msg and "models--cosmos-robot-tests--paligemma-not-cached" in msg
    assert "--allow-download" in msg and str(bad / "tokenizer") in msg
    assert connects == []


@pytest.mark.parametrize("command", ["serve", "eval"])
def test_allow_download_reaches_the_loader(
    command: str, pi05_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from cosmos_robot.cli import app

    bad = _pi05_naming_an_uncached_tokenizer(pi05_ckpt, tmp_path)
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    args = [command, "--ckpt", str(bad), "--device", "cpu"]
    if command == "eval":
        args += ["--out", str(tmp_path / "eval"), "--episodes-per-task", "1", "--num-envs", "1"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "pass --allow-download to fetch it" in refused.output
    assert "Traceback" not in refused.output
    asked = CliRunner().invoke(app, [*args, "--allow-download"])
    assert asked.exit_code == 2 and "could not be fetched" in asked.output  # it tried (no network here)


# --- GR00T: models named by the folder must not ship code ------------------------------------------
_EVIL = """
from pathlib import Path
Path({marker!r}).write_text("custom code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _groot_with_custom_code(groot_ckpt: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the tiny GR00T whose VLM processor model ships a tokenizer class in Python."""
    backbone = Path(json.loads((groot_ckpt.parent / "base" / "config.json").read_text())["model_name"])
    evil = Path(shutil.copytree(backbone, tmp_path / "Qwen" / "Qwen3-VL-evil"))
    (evil / "evil_tok.py").write_text(_EVIL.format(marker=str(evil / "EXECUTED")))
    _edit_json(evil / "tokenizer_config.json", auto_map={"AutoTokenizer": [None, "evil_tok.EvilTokenizer"]})
    policy = Path(shutil.copytree(groot_ckpt, tmp_path / "policy"))
    pre = json.loads((policy / "policy_preprocessor.json").read_text())
    step = next(s for s in pre["steps"] if "vlm" in s["registry_name"])
    step["config"]["model_name"] = str(evil)
    (policy / "policy_preprocessor.json").write_text(json.dumps(pre))
    return policy, evil


def test_groot_folder_naming_custom_code_is_refused_before_it_runs(groot_ckpt: Path, tmp_path: Path) -> None:
    policy, evil = _groot_with_custom_code(groot_ckpt, tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_policy_folder(policy)
    msg = str(err.value)
    assert str(evil / "tokenizer_config.json") in msg and "auto_map -> ['evil_tok.py']" in msg
    assert "-a trust_remote_code=true" in msg
    assert not (evil / "EXECUTED").exists()


def test_groot_custom_code_runs_only_after_the_explicit_opt_in(
    groot_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # the copied module lands here
    policy, evil = _groot_with_custom_code(groot_ckpt, tmp_path)
    served = load_policy_folder(policy, trust_remote_code=True)
    assert "trust_remote_code: running the custom code of GR00T VLM processor" in caplog.text
    served.infer(served.example_observation())  # LeRobot builds its VLM processor on first use
    assert (evil / "EXECUTED").read_text() == "custom code ran"  # what the refusal above prevents


def test_groot_named_model_missing_from_the_cache_is_refused(groot_ckpt: Path, tmp_path: Path) -> None:
    policy = Path(shutil.copytree(groot_ckpt, tmp_path / "policy"))
    pre = json.loads((policy / "policy_preprocessor.json").read_text())
    next(s for s in pre["steps"] if "vlm" in s["registry_name"])["config"]["model_name"] = "evil-org/not-cached"
    (policy / "policy_preprocessor.json").write_text(json.dumps(pre))
    with pytest.raises(CheckpointError, match=r"model_name 'evil-org/not-cached': .* pass --allow-download"):
        load_policy_folder(policy)
