"""No compilation and no graph capture after ``/readyz``, at any batch size up to ``--max-batch``.

A shape the warm-up did not cover compiles (``torch.compile``) or captures (CUDA graph) in the middle
of serving: the p99 spike a robot sees. These tests serve tiny torch policies through the real
server on loopback with the warm-up ``serve`` runs, send client-side batches of every size from 1
to ``max_batch`` (each one policy call of exactly that size) and read the server's
``cosmos_robot_after_ready_total`` counters. On this CPU there are no CUDA graphs; the graph caches
count the signatures they would have captured (``shape_misses``), and pi0.5 is compiled with
torch.compile's ``eager`` backend (Dynamo's tracing and guards, no code generation), which
recompiles exactly when Inductor would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosmos_robot.cli.common import load_ckpt_policy
from cosmos_robot.cli.serve import warmup_batches
from cosmos_robot.policies.groot.policy import Gr00tPolicy
from cosmos_robot.policies.groot.tiny import build_tiny_groot
from cosmos_robot.policies.pi05.policy import Pi05Policy
from cosmos_robot.policies.pi05.tiny import build_tiny_pi05
from cosmos_robot.policies.shape_events import dynamo_compiles
from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from tests.policies._pi05_helpers import libero_obs

MAX_BATCH = 4
REPO = Path(__file__).resolve().parents[2]


@contextmanager
def served(
    policy: Any, warmup: tuple[int, ...], max_batch: int = MAX_BATCH
) -> Iterator[tuple[WebsocketClientPolicy, str]]:
    config = ServerConfig(port=0, transports=("ws",), max_batch_size=max_batch, warmup_batches=warmup)
    server = PolicyServer(policy, config).start_in_thread(timeout_s=600)
    client = WebsocketClientPolicy("127.0.0.1", server.ports["ws"])
    try:
        yield client, f"http://127.0.0.1:{server.ports['ws']}/metrics"
    finally:
        client.close()
        server.stop()


def after_ready(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    found = re.findall(r'^cosmos_robot_after_ready_total\{kind="(\w+)"\} (\S+)$', text, flags=re.M)
    return {kind: float(value) for kind, value in found}


def every_batch_size(
    client: WebsocketClientPolicy, obs: list[dict[str, Any]], sizes: Iterable[int] = range(1, MAX_BATCH + 1)
) -> None:
    for n in sizes:
        replies = client.infer_batch(obs[:n])
        assert [r["server_timing"]["batch_size"] for r in replies] == [n] * n  # one call of exactly n
        assert all(np.isfinite(r["actions"]).all() for r in replies)


@pytest.fixture(scope="module")
def pi05_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a 160-byte prompt: room for trim_prompt to pin the tests' prompts (56-79 bytes, 120 the long one)
    return build_tiny_pi05(tokenizer_max_length=160).save_pretrained(tmp_path_factory.mktemp("pi05") / "ckpt")


@pytest.fixture(scope="module")
def groot_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_groot(tmp_path_factory.mktemp("groot"))


TRIM_PROMPT = 96
LONG_PROMPT = "pick up the black bowl next to the ramekin and put it on the plate"  # 120 bytes with the state


def compiled_pi05_counts(folder: str) -> dict[str, Any]:
    """Serve a compiled tiny pi0.5 with ``trim_prompt`` and the ``auto`` warm-up for max_batch 4 (batch 8
    allowed); send every batch size 1-4 with short prompts of several lengths (pinned to 96 tokens) and
    with a long one among them (the full length), read the after-ready counters, then 5-8 and read them
    again."""
    policy = Pi05Policy.from_pretrained(folder, compile=True, compile_backend="eager", trim_prompt=TRIM_PROMPT)
    assert policy.graphed is not None
    warm = warmup_batches("auto", MAX_BATCH, "cuda")
    before = dynamo_compiles()
    short = [libero_obs(i, prompt=["put the bowl on the plate", "open the drawer", "go"][i % 3]) for i in range(8)]
    mixed = [libero_obs(i, prompt=LONG_PROMPT) if i == 0 else o for i, o in enumerate(short)]
    with served(policy, warm, max_batch=8) as (client, metrics):
        warmed = dynamo_compiles() - before
        long_before = policy.graphed.long_prompt_calls
        every_batch_size(client, short, sizes=range(1, MAX_BATCH + 1))
        every_batch_size(client, mixed, sizes=range(1, MAX_BATCH + 1))
        covered = after_ready(metrics)
        long_served = policy.graphed.long_prompt_calls - long_before
        every_batch_size(client, short, sizes=range(MAX_BATCH + 1, 9))
        beyond = after_ready(metrics)
    return {
        "warm": list(warm),
        "warm_up_compiles": warmed,
        "covered": covered,
        "beyond": beyond,
        "long_served": long_served,
    }


def test_compiled_pi05_never_recompiles_after_warm_up(pi05_folder: Path) -> None:
    """``serve --warmup auto`` batch sizes (powers of two up to max_batch, and max_batch) and, with
    ``trim_prompt=N``, both prompt shapes (pinned N and full: ``warmup_observations``): every batch size
    and prompt length then replays a compiled bucket (pi0.5 compiled without CUDA graphs used to run
    each batch size at its own shape and recompile for 3; trimming to the batch's own length, rounded to
    32, compiled again for each new length, and pi0.5's prompt holds the state as text). Then the
    counters are shown not to be blind: batches of 5-8, allowed by ``max_batch=8`` but not warmed, meet
    bucket 8 while serving.

    In a process of its own: in torch 2.11, once a compiled function has run on a thread that exited
    (a server's policy thread), later Dynamo work on another thread can segfault (a torch-only
    reproduction is in docs/benchmarks.md); the rest of the test session must not inherit that."""
    script = (
        "import json, sys\n"
        "from tests.policies.test_shape_events import compiled_pi05_counts\n"
        "print(json.dumps(compiled_pi05_counts(sys.argv[1])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(pi05_folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["warm"] == [1, 2, 4] and result["warm_up_compiles"] > 0  # the counter sees compilations
    assert result["covered"] == {"compiles": 0, "graph_captures": 0, "shape_misses": 0}
    assert result["long_served"] == MAX_BATCH  # the mixed batches ran at the full length, the short ones pinned
    beyond = result["beyond"]
    assert beyond["shape_misses"] == 1 and beyond["compiles"] >= 1 and beyond["graph_captures"] == 0


def test_groot_meets_no_new_shape_after_warm_up(groot_folder: Path) -> None:
    """As ``serve --ckpt`` loads it (the family's serve options: ``text_tokens=128``), GR00T meets no new
    shape after a warm-up on its example observation, whose prompt ("do something") is not the clients'."""
    policy = load_ckpt_policy(str(groot_folder), "cpu", {})
    assert isinstance(policy, Gr00tPolicy) and policy.text_tokens == 128
    assert load_ckpt_policy(str(groot_folder), "cpu", {"text_tokens": 0}).text_tokens == 0  # -a wins
    obs = [libero_obs(i) for i in range(MAX_BATCH)]
    with served(policy, warmup_batches("auto", MAX_BATCH, "cuda")) as (client, metrics):
        every_batch_size(client, obs)
        counts = after_ready(metrics)
    assert counts == {"compiles": 0, "graph_captures": 0, "shape_misses": 0}


def test_groot_text_tokens_give_every_prompt_one_shape(groot_folder: Path) -> None:
    """LeRobot pads GR00T's tokens to the batch's longest prompt, so a new prompt length is a new
    graph; ``text_tokens`` pads every ordinary prompt to one length (and moves chunks slightly:
    GR00T attends to pad tokens unmasked, see ``DEFAULT_TEXT_TOKENS``)."""
    prompts = ["go", "put the bowl on the plate", "pick up the black bowl next to the ramekin and put it on the plate"]
    counts = {}
    for text_tokens in (0, 128):
        policy = Gr00tPolicy.from_pretrained(groot_folder, text_tokens=text_tokens)
        for prompt in prompts:
            policy.infer(libero_obs(0, prompt=prompt))
        counts[text_tokens] = policy.runtime_counters()["shape_misses"]
    assert counts == {0: 3, 128: 1}
    with pytest.raises(ValueError, match="text_tokens must be a non-negative int"):
        Gr00tPolicy.from_pretrained(groot_folder, text_tokens=-1)


@pytest.mark.parametrize("family", ["pi05", "groot"])
def test_replicas_share_weights_give_the_same_chunks_and_meet_no_new_shape(
    family: str, pi05_folder: Path, groot_folder: Path
) -> None:
    """``serve --replicas 2``: the replica shares every weight tensor but owns its graph caches and
    processors; warm-up covers both, so concurrent clients (each call may land on either replica)
    meet no new shape, and each client gets the chunk the policy alone gives for its observation.
    Batches of 1 here: GR00T, as LeRobot, draws a batch's noise as one tensor, so a chunk depends on
    its row in the batch; the two replicas still run at once (three clients, two workers)."""
    folder = pi05_folder if family == "pi05" else groot_folder
    policy = load_ckpt_policy(str(folder), "cpu", {})
    twin = policy.replica()
    weights = {id(p) for p in policy.model.parameters()} if family == "pi05" else None
    if family == "pi05":
        assert {id(p) for p in twin.model.parameters()} == weights
    else:
        assert twin.policy is policy.policy and twin._backbone._plans is not policy._backbone._plans
    assert not {id(c) for c in twin.graph_caches() if c} & {id(c) for c in policy.graph_caches() if c}
    assert twin.preprocessor is not policy.preprocessor
    obs = [libero_obs(i, prompt=["put the bowl on the plate", "open the drawer"][i % 2]) for i in range(6)]
    alone = [policy.infer(o)["actions"] for o in obs]
    config = ServerConfig(port=0, transports=("ws",), max_batch_size=1, replicas=2, warmup_batches=(1,))
    server = PolicyServer(policy, config).start_in_thread(timeout_s=600)
    got: dict[int, np.ndarray] = {}

    def client(indices: list[int]) -> None:
        remote = WebsocketClientPolicy("127.0.0.1", server.ports["ws"])
        try:
            for _ in range(2):
                for i in indices:
                    got[i] = remote.infer(obs[i])["actions"]
        finally:
            remote.close()

    try:
        threads = [threading.Thread(target=client, args=([i, i + 3],)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        counts = after_ready(f"http://127.0.0.1:{server.ports['ws']}/metrics")
    finally:
        server.stop()
    assert sorted(got) == list(range(6))
    for i in range(6):
        np.testing.assert_allclose(got[i], alone[i], rtol=1e-5, atol=1e-5)
    assert counts == {"compiles": 0, "graph_captures": 0, "shape_misses": 0}
