"""What each Isaac-GR00T client generation sends on our ZMQ port, and what it can decode.

Two generations speak msgpack to a GR00T ``PolicyServer`` and differ in ways a server must follow:

- N1.5 (``gr00t/eval/service.py``): ``get_action``'s ``data`` is the observation itself; its decoder
  builds a ``ModalityConfig`` with ``json.loads(obj["as_json"])``, so ``as_json`` must be a JSON string.
- N1.6/N1.7 (``gr00t/policy/server_client.py``): ``data = {"observation", "options"}``; ``reset``
  exists; its decoder calls ``ModalityConfig(**obj["as_json"])``, so ``as_json`` must be a map.

No value satisfies both decoders (``json.loads`` takes only str/bytes, ``**`` only a mapping), and
both generations ask for the modality config with the same bytes (``{"endpoint":
"get_modality_config"}``, no ``data``). So the server learns the generation from the *other*
requests: ``GenerationTracker`` remembers, per ZMQ peer (one REQ socket = one client), what its
``get_action`` / ``reset`` revealed; a peer that asks before revealing anything gets the generation
the last revealing peer had (one deployment runs one GR00T release), else N1.6.
``ServerConfig.groot_generation`` pins it when a fresh N1.5 client asks first (as N1.5's
``inference_service.py --client`` does).

Releases before msgpack (GR00T N1 and early N1.5, ``TorchSerializer``) put ``torch.save`` pickles on
the wire. We refuse them on purpose: unpickling runs whatever the sender wrote.
``refused_encoding`` recognises such a stream so the error names why instead of a generic decode
error (the old client, which ``torch.load``-s our msgpack reply, still fails on its side; the
server log carries the explanation too).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from cosmos_robot_server.core import RequestError

__all__ = ["GENERATIONS", "GenerationTracker", "refused_encoding", "request_generation", "wrap_modality_config"]

log = logging.getLogger(__name__)

GENERATIONS = ("n1.5", "n1.6")
DEFAULT_GENERATION = "n1.6"
_N16_DATA_KEYS = ({"observation", "options"}, {"observation"})
_MAX_PEERS = 4096  # peers remembered (least recently seen forgotten first); a peer costs ~100 bytes


def request_generation(endpoint: str, data: Any) -> str | None:
    """The generation a request reveals, or ``None`` when N1.5 and N1.6 send it alike."""
    if endpoint == "reset":
        return "n1.6"  # N1.5's clients have no reset endpoint
    if endpoint != "get_action" or not isinstance(data, Mapping):
        return None
    n16 = set(data) in _N16_DATA_KEYS and isinstance(data.get("observation"), Mapping)
    return "n1.6" if n16 else "n1.5"


class GenerationTracker:
    """Which generation each ZMQ peer speaks (see the module docstring); ``mode`` ``auto`` learns it."""

    def __init__(self, mode: str = "auto", max_peers: int = _MAX_PEERS) -> None:
        if mode not in ("auto", *GENERATIONS):
            raise ValueError(f"groot_generation: {mode!r}; choose from {['auto', *GENERATIONS]}")
        self.mode, self.max_peers = mode, max_peers
        self._peers: OrderedDict[str, str] = OrderedDict()
        self._last: str | None = None

    def observe(self, peer: str, endpoint: str, data: Any) -> None:
        generation = request_generation(endpoint, data)
        if generation is None:
            return
        self._peers[peer] = generation
        self._peers.move_to_end(peer)
        while len(self._peers) > self.max_peers:
            self._peers.popitem(last=False)
        self._last = generation

    def generation(self, peer: str) -> str:
        if self.mode != "auto":
            return self.mode
        return self._peers.get(peer) or self._last or DEFAULT_GENERATION

    def modality_config_reply(self, config: Any, peer: str) -> dict[str, Any]:
        return wrap_modality_config(config, self.generation(peer))


def wrap_modality_config(config: Any, generation: str) -> dict[str, Any]:
    """``{name: {"__ModalityConfig_class__": True, "as_json": ...}}`` as ``generation``'s decoder reads it."""
    if not isinstance(config, Mapping):
        raise RequestError(f"server metadata 'modality_config' must be a map, got {type(config).__name__}")
    if generation not in GENERATIONS:
        raise ValueError(f"unknown GR00T generation {generation!r}; expected one of {list(GENERATIONS)}")
    out: dict[str, Any] = {}
    for name, table in config.items():
        if not isinstance(table, Mapping):
            out[str(name)] = table
            continue
        as_json: Any = json.dumps(_plain(table)) if generation == "n1.5" else table
        out[str(name)] = {"__ModalityConfig_class__": True, "as_json": as_json}
    return out


def _plain(value: Any) -> Any:
    """Tuples and numpy values -> JSON types (a layout's tables may hold either)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def refused_encoding(body: bytes | memoryview) -> str | None:
    """Why an undecodable request is refused when it is a pickle or ``torch.save`` stream, else ``None``.

    ``torch.save`` writes a zip archive (``PK\\x03\\x04``) since torch 1.6 and a pickle before;
    pickles of protocol 2-5 start with ``\\x80`` and the protocol number. (For msgpack ``\\x80`` is an
    empty map, so such a stream reaches us as "trailing bytes" and is only inspected after failing.)
    """
    if bytes(body[:4]) == b"PK\x03\x04":
        what = "a torch.save archive (zip)"
    elif len(body) >= 2 and body[0] == 0x80 and 2 <= body[1] <= 5:
        what = f"a Python pickle (protocol {body[1]})"
    else:
        return None
    message = (
        f"refused: the request is {what}, which Isaac-GR00T releases before msgpack (N1 and early N1.5, "
        "TorchSerializer) send. This server never unpickles what a client sends (it could run arbitrary "
        "code); use a GR00T client from N1.5 with msgpack (Aug 2025) or later, or cosmos_robot_client's "
        "ZmqClientPolicy"
    )
    log.warning("zmq: %s", message)
    return message
