"""Runs inside .venv-openpi (openpi-client 0.1.2 pins numpy<2), never imported by pytest.

Two modes, driven by tests/policy_server/test_openpi_client_compat.py:

- ``client --url ws://host:port [--api-key K]``: the REAL openpi ``WebsocketClientPolicy`` talks to
  our server: metadata, a LIBERO request, timing keys, ``ActionChunkBroker``, and a bad request that
  must surface as openpi's ``RuntimeError`` carrying our message. Prints a JSON summary on stdout
  and exits non-zero on the first failed check.
- ``server --port P``: the REAL ``openpi-server`` 0.1.0 serving a trivial policy, so our client can
  be tested against an openpi server.

It imports nothing from cosmos-robot: the point is to see our server through openpi's code only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np


def libero_obs(image_dtype: Any = np.uint8) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3)).astype(image_dtype),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3)).astype(np.uint8),
        "observation/state": rng.standard_normal(8),  # float64, as LIBERO's example client sends
        "prompt": "put both the alphabet soup and the tomato sauce in the basket",
    }


def check(condition: bool, message: str) -> None:
    if not condition:
        print(json.dumps({"ok": False, "failed": message}))
        sys.exit(1)


def run_client(url: str, api_key: str | None, horizon: int, dim: int) -> None:
    from openpi_client import action_chunk_broker, base_policy, websocket_client_policy

    policy = websocket_client_policy.WebsocketClientPolicy(host=url, api_key=api_key)
    meta = policy.get_server_metadata()
    check(isinstance(meta, dict), f"metadata is {type(meta).__name__}")
    check(meta.get("server", {}).get("name") == "cosmos-robot-server", f"metadata: {meta}")

    replies = [policy.infer(libero_obs()) for _ in range(3)]
    first, second = replies[0], replies[1]
    actions = first["actions"]
    check(isinstance(actions, np.ndarray), f"actions is {type(actions).__name__}")
    check(actions.shape == (horizon, dim), f"actions shape {actions.shape}")
    check(actions.dtype == np.float32, f"actions dtype {actions.dtype}")
    check("infer_ms" in first["policy_timing"] and "infer_ms" in first["server_timing"], f"timing: {first}")
    check("prev_total_ms" not in first["server_timing"], "prev_total_ms on the first request")
    check("prev_total_ms" in second["server_timing"], "prev_total_ms missing on the second request")

    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        policy.infer(libero_obs())
        times.append((time.perf_counter() - t0) * 1000)

    class Counting(base_policy.BasePolicy):
        calls = 0

        def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
            Counting.calls += 1
            return policy.infer(obs)

    broker = action_chunk_broker.ActionChunkBroker(Counting(), action_horizon=horizon)
    steps = [broker.infer(libero_obs()) for _ in range(horizon + 2)]
    check(all(s["actions"].shape == (dim,) for s in steps), "broker step shape")
    check(Counting.calls == 2, f"broker made {Counting.calls} server calls for {horizon + 2} steps")
    broker.reset()

    bad = websocket_client_policy.WebsocketClientPolicy(host=url, api_key=api_key)
    error = ""
    try:
        bad.infer(libero_obs(image_dtype=np.float32))
    except RuntimeError as exc:
        error = str(exc)
    check(error.startswith("Error in inference server:"), f"bad request did not raise openpi's error: {error!r}")
    check("observation/image" in error and "float32" in error, f"error does not name key and dtype: {error!r}")
    check(policy.infer(libero_obs())["actions"].shape == (horizon, dim), "first client broken by the bad one")

    summary = {
        "ok": True,
        "metadata_keys": sorted(meta),
        "actions_shape": list(actions.shape),
        "actions_dtype": str(actions.dtype),
        "server_timing_keys": sorted(second["server_timing"]),
        "policy_timing_keys": sorted(second["policy_timing"]),
        "broker_server_calls": Counting.calls,
        "error": error,
        "roundtrip_ms_p50": float(np.percentile(times, 50)),
        "roundtrip_ms_p90": float(np.percentile(times, 90)),
    }
    print(json.dumps(summary))


class TrivialPolicy:
    """Actions are the state broadcast over a 10-step chunk; ``raise`` in the obs makes it fail."""

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        if "raise" in obs:
            raise ValueError(f"trivial policy was asked to fail: {obs['raise']}")
        if "sleep_s" in obs:
            time.sleep(float(obs["sleep_s"]))  # blocks openpi's event loop, as a real model call does
        state = np.asarray(obs.get("observation/state", np.zeros(7)), dtype=np.float32)
        return {"actions": np.tile(state, (10, 1))}

    def reset(self) -> None:
        pass


def run_server(port: int) -> None:
    from openpi_server import WebsocketPolicyServer

    server = WebsocketPolicyServer(TrivialPolicy(), host="127.0.0.1", port=port, metadata={"reset_pose": [0, 1, 2]})
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    client = sub.add_parser("client")
    client.add_argument("--url", required=True)
    client.add_argument("--api-key", default=None)
    client.add_argument("--horizon", type=int, default=10)
    client.add_argument("--dim", type=int, default=7)
    server = sub.add_parser("server")
    server.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if args.mode == "client":
        run_client(args.url, args.api_key, args.horizon, args.dim)
    else:
        run_server(args.port)


if __name__ == "__main__":
    main()
