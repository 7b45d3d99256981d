"""Wire compatibility with the REAL openpi packages from PyPI, in both directions.

openpi-client 0.1.2 pins numpy<2, so it cannot share our venv; it lives in ``.venv-openpi`` and
runs ``tests/openpi_compat_script.py`` as a subprocess. Directions:

- openpi's ``WebsocketClientPolicy`` + ``ActionChunkBroker`` -> our server (what robots and LIBERO
  eval scripts written for openpi do);
- our ``WebsocketClientPolicy`` -> openpi-server 0.1.0 (our client is a drop-in for openpi servers),
  plus the contrast that motivates our server: openpi's server blocks its event loop during
  inference, so a client with short keepalive settings is dropped mid-request.

Without the venv the tests skip (``make test`` creates it); ``COSMOS_ROBOT_REQUIRE_OPENPI=1`` (CI)
turns the skip into a failure so compatibility is never silently untested.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy
from cosmos_robot_server import PolicyServer, ServerConfig
from cosmos_robot_server.example_policies import ConstantBatchPolicy, libero_input_spec

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "openpi_compat_script.py"
OPENPI_PY = REPO / ".venv-openpi" / "bin" / "python"


def openpi_python() -> Path:
    if OPENPI_PY.exists():
        return OPENPI_PY
    message = (
        f"{OPENPI_PY} is missing; `make test` creates it (python -m venv .venv-openpi && "
        ".venv-openpi/bin/pip install 'openpi-client==0.1.2' 'openpi-server==0.1.0' 'numpy<2')"
    )
    if os.environ.get("COSMOS_ROBOT_REQUIRE_OPENPI") == "1":
        pytest.fail(message + " and COSMOS_ROBOT_REQUIRE_OPENPI=1 forbids skipping")
    pytest.skip(message)


def run_openpi_client(url: str, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [str(openpi_python()), str(SCRIPT), "client", "--url", url, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"openpi client failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def test_openpi_client_against_our_server() -> None:
    openpi_python()
    policy = ConstantBatchPolicy(10, 7, spec=libero_input_spec())
    with PolicyServer(policy, ServerConfig(port=0, transports=("ws",))) as server:
        summary = run_openpi_client(f"ws://127.0.0.1:{server.ports['ws']}")
    assert summary["ok"] is True
    assert summary["actions_shape"] == [10, 7] and summary["actions_dtype"] == "float32"
    assert {"infer_ms", "prev_total_ms"} <= set(summary["server_timing_keys"])
    assert summary["broker_server_calls"] == 2
    assert "observation/image: expected dtype uint8, got float32" in summary["error"]
    print(f"openpi-client round trip, LIBERO request: p50 {summary['roundtrip_ms_p50']:.2f} ms")


def test_openpi_client_with_api_key() -> None:
    openpi_python()
    policy = ConstantBatchPolicy(10, 7, spec=libero_input_spec())
    with PolicyServer(policy, ServerConfig(port=0, api_key="k3y")) as server:
        summary = run_openpi_client(f"ws://127.0.0.1:{server.ports['ws']}", "--api-key", "k3y")
        assert summary["ok"] is True
        proc = subprocess.run(  # openpi's client without the key is refused at the handshake
            [str(openpi_python()), str(SCRIPT), "client", "--url", f"ws://127.0.0.1:{server.ports['ws']}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode != 0 and "HTTP 401" in proc.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def openpi_server() -> Iterator[int]:
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [str(openpi_python()), str(SCRIPT), "server", "--port", str(port)], stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"openpi-server did not come up on port {port}:\n{log.read()}")
                time.sleep(0.05)
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_our_client_against_openpi_server() -> None:
    openpi_python()
    state = np.arange(8, dtype=np.float64)
    obs = {"observation/image": np.zeros((224, 224, 3), np.uint8), "observation/state": state, "prompt": "go"}
    with openpi_server() as port, WebsocketClientPolicy("127.0.0.1", port, connect_timeout_s=10) as client:
        assert client.get_server_metadata() == {"reset_pose": [0, 1, 2]}
        reply = client.infer(obs)
        np.testing.assert_array_equal(reply["actions"], np.tile(state.astype(np.float32), (10, 1)))
        assert "infer_ms" in reply["server_timing"]
        client.reset()  # local no-op, like openpi's; an openpi server has no reset endpoint
        assert len(client.infer_batch([obs, obs])) == 2  # no batch endpoint there: one request each
        with pytest.raises(RuntimeError, match=r"(?s)Error in inference server:.*asked to fail: boom"):
            client.infer({"raise": "boom"})
        assert client.infer(obs)["actions"].shape == (10, 8)  # reconnected after openpi closed the socket


def test_openpi_server_drops_fast_keepalive_client_during_long_inference() -> None:
    # The contrast to tests/clients/test_websocket_client.py::test_keepalive_survives_long_inference:
    # the same client settings against openpi's server, whose event loop is blocked by the model call.
    openpi_python()
    with openpi_server() as port:
        client = WebsocketClientPolicy(
            "127.0.0.1", port, ping_interval_s=0.2, ping_timeout_s=0.2, retry_on_disconnect=False
        )
        with pytest.raises(ConnectionError, match="keepalive ping timeout"):
            client.infer({"sleep_s": 1.5})
        client.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
