"""Command line for the AlpaSim driver without torch: the policy is a running cosmos-robot (or openpi)
websocket policy server, one connection per rollout, or a built-in straight-line policy for checking
the AlpaSim wiring before any model is involved.

    cosmos-robot serve --ckpt CKPT --port 8000 &          # the model, on the GPU machine
    python -m cosmos_robot_server.alpasim --policy ws://127.0.0.1:8000 --host 0.0.0.0 --port 6789 \\
        --camera camera_front_wide_120fov --camera-map camera_front_wide_120fov=image

then point AlpaSim's driver endpoint at this machine's port 6789.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cosmos_robot_client.base_policy import BasePolicy
from cosmos_robot_server.alpasim.config import ACTION_LAYOUTS, AlpasimDriverConfig

__all__ = ["StraightPolicy", "build_parser", "config_from_args", "main", "policy_factory"]

EXAMPLE = """examples:
  # drive with a model served by `cosmos-robot serve` (one websocket connection per AlpaSim rollout)
  python -m cosmos_robot_server.alpasim --policy ws://127.0.0.1:8000 --host 0.0.0.0 --port 6789 \\
      --camera camera_front_wide_120fov --camera-map camera_front_wide_120fov=image --image-size 224x224
  # check the AlpaSim plumbing: drive straight ahead at 5 m/s
  python -m cosmos_robot_server.alpasim --policy straight --speed 5 --host 0.0.0.0
"""


class StraightPolicy(BasePolicy):
    """Plans ``horizon`` waypoints straight ahead at ``speed_mps`` (x, y, yaw rows, ``dt_s`` apart)."""

    def __init__(self, speed_mps: float = 5.0, horizon: int = 50, dt_s: float = 0.1) -> None:
        if horizon < 1 or dt_s <= 0:
            raise ValueError(f"horizon must be >= 1 and dt_s > 0, got {horizon}, {dt_s}")
        self.speed_mps, self.horizon, self.dt_s = float(speed_mps), horizon, dt_s

    @property
    def cheap_inference(self) -> bool:
        return True

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        x = self.speed_mps * self.dt_s * np.arange(1, self.horizon + 1)
        return {"actions": np.column_stack([x, np.zeros_like(x), np.zeros_like(x)]).astype(np.float32)}


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"expected LOGICAL_ID=KEY, got {text!r}")
    return key, value


def _size(text: str) -> tuple[int, int]:
    h, sep, w = text.lower().partition("x")
    try:
        return int(h), int(w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW such as 224x224, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cosmos_robot_server.alpasim",
        description="Serve a policy to NVIDIA AlpaSim as its gRPC driver (egodriver.EgodriverService).",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--policy", required=True, help="ws://HOST:PORT (or wss://) of a policy server, or 'straight'")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 for AlpaSim in Docker)")
    p.add_argument("--port", type=int, default=6789, help="gRPC port AlpaSim's driver endpoint points to")
    p.add_argument("--api-key", default=os.environ.get("COSMOS_ROBOT_API_KEY"), help="policy server API key")
    p.add_argument("--connect-timeout", type=float, default=30.0, help="seconds to reach the policy server")
    p.add_argument("--request-timeout", type=float, default=60.0, help="seconds one inference may take")
    p.add_argument("--camera", action="append", dest="cameras", help="logical camera id the policy uses (repeat)")
    p.add_argument("--camera-map", action="append", type=_pair, default=[], help="LOGICAL_ID=KEY: observation/KEY")
    p.add_argument("--image-size", type=_size, default=None, help="resize every camera to HxW")
    p.add_argument("--history-length", type=int, default=16, help="rows of observation/ego_history")
    p.add_argument("--history-dt", type=float, default=0.1, help="seconds between ego_history rows")
    p.add_argument("--route-length", type=int, default=None, help="pad/truncate observation/route to N points")
    p.add_argument("--prompt", default=None, help="text sent as 'prompt' with every observation")
    p.add_argument("--action-layout", choices=ACTION_LAYOUTS, default="auto", help="columns of the actions")
    p.add_argument("--action-dt", type=float, default=0.1, help="seconds between action rows")
    p.add_argument("--no-current-pose", action="store_true", help="do not start the trajectory at the ego pose")
    p.add_argument("--max-sessions", type=int, default=64, help="concurrent rollouts")
    p.add_argument("--speed", type=float, default=5.0, help="m/s for --policy straight")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")
    return p


def config_from_args(args: argparse.Namespace) -> AlpasimDriverConfig:
    return AlpasimDriverConfig(
        cameras=tuple(args.cameras) if args.cameras else None,
        camera_map=dict(args.camera_map),
        image_size=args.image_size,
        history_length=args.history_length,
        history_dt_s=args.history_dt,
        route_length=args.route_length,
        prompt=args.prompt,
        action_layout=args.action_layout,
        action_dt_s=args.action_dt,
        include_current_pose=not args.no_current_pose,
        max_sessions=args.max_sessions,
    )


def policy_factory(args: argparse.Namespace) -> BasePolicy | Callable[[], BasePolicy]:
    """``straight``: one shared stateless policy; a URL: a new websocket connection per rollout."""
    if args.policy == "straight":
        return StraightPolicy(args.speed, dt_s=args.action_dt)
    if not args.policy.startswith(("ws://", "wss://")):
        raise SystemExit(f"--policy: expected ws://HOST:PORT, wss://... or 'straight', got {args.policy!r}")
    from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

    def connect() -> BasePolicy:
        return WebsocketClientPolicy(
            args.policy,
            api_key=args.api_key,
            connect_timeout_s=args.connect_timeout,
            request_timeout_s=args.request_timeout,
        )

    connect.__name__ = f"WebsocketClientPolicy({args.policy})"
    return connect


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    policy = policy_factory(args)
    from cosmos_robot_server.alpasim import serve_alpasim  # needs the [alpasim] extra

    serve_alpasim(policy, args.host, args.port, config=config)
    return 0
