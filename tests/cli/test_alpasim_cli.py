"""``cosmos-robot serve --alpasim-port``: AlpaSim's driver service beside the policy server, over real gRPC."""

from __future__ import annotations

import signal
from typing import Any

from tests.cli.test_cli import _start_serve
from tests.policy_server.test_alpasim import Driver


class _Stub(Driver):
    """The test client of tests/policy_server/test_alpasim.py, pointed at a server we did not start."""

    def __init__(self, pb: Any, port: int) -> None:
        import grpc

        self.pb, self.grpc = pb, grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb.grpc_mod.EgodriverServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()


def test_serve_answers_alpasim_beside_the_websocket(pb: Any) -> None:
    proc, ports = _start_serve("-a", "action_dim=2", "--alpasim-port", "0", "--alpasim-arg=--action-dt=0.2")
    try:
        assert {"ws", "alpasim"} <= set(ports)
        stub = _Stub(pb, ports["alpasim"])
        try:
            stub.ready("rollout-1")
            reply = stub.call("drive", stub.drive("rollout-1"))
            assert not isinstance(reply, Exception), reply
            poses = reply.trajectory.poses
            assert len(poses) == 6  # the anchor pose + the constant policy's 5 rows
            steps = [b.timestamp_us - a.timestamp_us for a, b in zip(poses[1:], poses[2:])]
            assert steps == [200_000] * 4  # --alpasim-arg=--action-dt=0.2 reached the driver
            stub.refused("drive", stub.drive("nobody"), "NOT_FOUND", "session")
        finally:
            stub.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_bad_alpasim_flags_are_a_clear_error() -> None:
    import subprocess

    from tests.cli.test_cli import CLI

    out = subprocess.run(
        [*CLI, "serve", "--policy", "cosmos_robot_server.example_policies:constant", "--alpasim-port", "0",
         "--alpasim-arg=--action-dt=fast"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--alpasim-arg" in out.stderr and "not valid" in out.stderr
