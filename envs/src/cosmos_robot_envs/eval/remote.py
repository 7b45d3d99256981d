"""Connecting to a running policy server for evaluation.

Why a short connect deadline by default (10 s, not the client's 60 s): an evaluation is started by a
person or a CI job that wants "server unreachable" fast and naming the URL, not a minute of silent
retries. The per-request timeout keeps a hung server from hanging a headless run forever.
``refused_timeout_s`` goes further for a refused connection (nothing listens at that port): the
command line passes a fraction of a second, so a server that is not running costs no silent wait.
"""

from __future__ import annotations

from cosmos_robot_client.websocket_client_policy import WebsocketClientPolicy

__all__ = ["connect_websocket", "is_websocket_url"]


def is_websocket_url(policy: str) -> bool:
    return policy.startswith(("ws://", "wss://"))


def connect_websocket(
    url: str,
    *,
    api_key: str | None = None,
    connect_timeout_s: float = 10.0,
    request_timeout_s: float | None = 300.0,
    refused_timeout_s: float | None = None,
) -> WebsocketClientPolicy:
    """A connected client for ``ws://HOST:PORT``; raises ``ConnectionError`` naming the URL if unreachable
    (after ``refused_timeout_s`` when every attempt is refused; None: at the connect deadline)."""
    if not is_websocket_url(url):
        raise ValueError(f"--policy {url!r}: a server address must start with ws:// or wss://")
    return WebsocketClientPolicy(
        url,
        api_key=api_key,
        connect_timeout_s=connect_timeout_s,
        request_timeout_s=request_timeout_s,
        refused_timeout_s=refused_timeout_s,
    )
