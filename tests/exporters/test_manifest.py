"""``cosmos_robot.manifest``: every file's sha256 and size, verified (and refused, naming the file) on load."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos_robot.manifest import (
    MANIFEST_FILE,
    check_manifest,
    file_sha256,
    read_manifest,
    verify_manifest,
    write_manifest,
)
from cosmos_robot.policies import CheckpointError, load_policy_folder
from cosmos_robot.policies.flow import FlowPolicy
from tests.policies._flow_helpers import make_obs, scrambled_model, tiny_config, tiny_stats


def _folder(root: Path) -> Path:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "config.json").write_text('{"type": "x"}')
    (root / "sub" / "deep" / "weights.bin").write_bytes(bytes(range(256)) * 9000)  # > 2 MiB: several blocks
    (root / "sub" / "empty.txt").write_bytes(b"")
    return root


def test_written_manifest_lists_every_file_with_hash_and_size(tmp_path: Path) -> None:
    root = _folder(tmp_path / "f")
    path = write_manifest(root, {"family": "flow", "source": "runs/x", "target": "flow"})
    data = json.loads(path.read_text())
    assert path == root / MANIFEST_FILE
    assert set(data["files"]) == {"config.json", "sub/deep/weights.bin", "sub/empty.txt"}  # posix, manifest excluded
    entry = data["files"]["sub/deep/weights.bin"]
    assert entry == {"sha256": file_sha256(root / "sub/deep/weights.bin"), "size": 256 * 9000}
    assert data["format_version"] == 1 and data["cosmos_robot_version"] and data["created"].startswith("20")
    assert data["info"] == {"family": "flow", "source": "runs/x", "target": "flow"}
    assert verify_manifest(root) is True
    write_manifest(root)  # rewriting replaces it and still excludes itself
    assert MANIFEST_FILE not in json.loads(path.read_text())["files"]


def test_sha256_is_hashlibs(tmp_path: Path) -> None:
    import hashlib

    f = tmp_path / "a.bin"
    f.write_bytes(b"abc" * 1_000_000)
    assert file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_no_manifest_is_false_not_an_error(tmp_path: Path) -> None:
    assert verify_manifest(_folder(tmp_path / "f")) is False
    assert check_manifest(tmp_path / "f") is None


def test_changed_file_is_refused_naming_it_and_both_hashes(tmp_path: Path) -> None:
    root = _folder(tmp_path / "f")
    write_manifest(root)
    before = file_sha256(root / "sub/deep/weights.bin")
    blob = bytearray((root / "sub/deep/weights.bin").read_bytes())
    blob[1_500_000] ^= 0xFF  # one flipped byte in the second MiB block, same size
    (root / "sub/deep/weights.bin").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError) as err:
        verify_manifest(root)
    msg = str(err.value)
    assert "sub/deep/weights.bin: sha256 mismatch with manifest.json" in msg
    assert f"expected {before[:12]}..." in msg and "corrupted or was changed after export" in msg


def test_truncated_and_missing_files_are_refused(tmp_path: Path) -> None:
    root = _folder(tmp_path / "f")
    write_manifest(root)
    data = (root / "config.json").read_bytes()
    (root / "config.json").write_bytes(data[:-1])
    with pytest.raises(
        CheckpointError, match=r"config.json: size mismatch with manifest.json \(expected 13 bytes, got 12\)"
    ):
        verify_manifest(root)
    (root / "config.json").write_bytes(data)
    (root / "sub" / "empty.txt").unlink()
    with pytest.raises(CheckpointError, match=r"sub/empty.txt: listed in manifest.json but missing"):
        verify_manifest(root)


def test_files_added_after_export_are_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _folder(tmp_path / "f")
    write_manifest(root)
    (root / "README.md").write_text("notes")
    (root / ".cache" / "huggingface").mkdir(parents=True)  # what `hf download --local-dir` adds: ignored
    (root / ".cache" / "huggingface" / "x.metadata").write_text("m")
    with caplog.at_level(logging.WARNING, logger="cosmos_robot.manifest"):
        assert verify_manifest(root) is True
    assert "README.md" in caplog.text and "not listed" in caplog.text and ".cache" not in caplog.text
    check = check_manifest(root)
    assert check is not None and check.unlisted == ["README.md"] and len(check.verified) == 3


def test_malformed_manifests_are_named(tmp_path: Path) -> None:
    root = _folder(tmp_path / "f")
    (root / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="manifest.json: not valid JSON"):
        verify_manifest(root)
    write_manifest(root)
    data = json.loads((root / MANIFEST_FILE).read_text())
    data["format_version"] = 99
    (root / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="format_version 99 is newer"):
        read_manifest(root)
    data["format_version"] = 1
    data["files"]["../../etc/passwd"] = {"sha256": "0" * 64, "size": 1}
    (root / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="leaves the folder"):
        verify_manifest(root)


def test_manifest_module_is_torch_free() -> None:
    code = "import sys, cosmos_robot.manifest; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_load_policy_refuses_a_corrupted_weight_file(tmp_path: Path) -> None:
    """``cosmos_robot.policies.load_policy_folder`` (serve --ckpt / eval --ckpt) checks the manifest first."""
    config = tiny_config()
    folder = FlowPolicy(scrambled_model(config), tiny_stats(config)).save_pretrained(tmp_path / "policy")
    write_manifest(folder, {"family": "flow"})
    obs = make_obs(config)
    expected = load_policy_folder(folder).infer(obs)["actions"]
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    blob = bytearray((bad / "model.safetensors").read_bytes())
    blob[-10] ^= 0x01  # a flipped bit in the last tensor's data: safetensors still parses it
    (bad / "model.safetensors").write_bytes(bytes(blob))
    assert FlowPolicy.from_pretrained(bad).infer(obs)["actions"] is not None  # loads unverified...
    with pytest.raises(CheckpointError, match=r"bad/model.safetensors: sha256 mismatch with manifest.json"):
        load_policy_folder(bad)  # ...but not through load_policy_folder
    assert (load_policy_folder(folder).infer(obs)["actions"] == expected).all()


def test_export_refuses_a_corrupted_source_instead_of_vouching_for_it(tmp_path: Path) -> None:
    """Re-exporting a damaged export must not write a fresh manifest over the damaged bytes."""
    from cosmos_robot_exporters import export_checkpoint

    config = tiny_config()
    folder = FlowPolicy(scrambled_model(config), tiny_stats(config)).save_pretrained(tmp_path / "policy")
    write_manifest(folder, {"family": "flow"})
    blob = bytearray((folder / "model.safetensors").read_bytes())
    blob[-10] ^= 0x01
    (folder / "model.safetensors").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="model.safetensors: sha256 mismatch"):
        export_checkpoint(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_stale_temporary_manifest_is_never_listed(tmp_path: Path) -> None:
    root = _folder(tmp_path / "f")
    (root / f".{MANIFEST_FILE}.tmp").write_text("{}")  # left by a write_manifest killed before its rename
    write_manifest(root)
    assert verify_manifest(root)


def test_staged_folder_swaps_in_a_complete_folder_or_leaves_the_old_one(tmp_path: Path) -> None:
    from cosmos_robot.manifest import staged_folder

    out = tmp_path / "final"
    with staged_folder(out, {"family": "x"}) as tmp:
        (tmp / "a.txt").write_text("one")
    assert verify_manifest(out) and read_manifest(out)["info"] == {"family": "x"}  # type: ignore[index]
    with pytest.raises(RuntimeError, match="killed"), staged_folder(out) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("killed while writing")
    assert (out / "a.txt").read_text() == "one" and verify_manifest(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no .tmp / .old left behind
