"""HTTP transport: health and metrics probes, plus cosmos-framework's LIBERO JSON dialect.

Why HTTP at all: load balancers and Kubernetes probe over plain HTTP (``/healthz``, ``/readyz``,
``/metrics``), and cosmos-framework's LIBERO evaluation client speaks JSON over HTTP. We answer
that client unchanged (``GET /``, ``GET /info``, ``POST /``, ``/predict``, ``/predict_batch``), but
fix its server's footgun: a failure is an HTTP error with ``{"error": message}``, never a 200 with
an empty action list that an evaluation would silently score.

Why the stdlib threading server: one thread per connection keeps the code small and keeps PNG
decoding (the costly part of this dialect) off the event loop; the model call itself goes to the
shared ``ServingCore`` on the server's loop with ``run_coroutine_threadsafe``, so HTTP requests
join the same cross-connection batches as websocket and ZMQ ones. Bodies over
``max_message_bytes`` are refused from their Content-Length, before a byte of them is read; the
413 still reaches a client that sends the whole body (the body is discarded, bounded, after the
reply). A thread per connection is also what an attacker exhausts, so ``http_limits`` caps the
connections (``max_connections``, one more gets 503 JSON) and puts total deadlines on the request
head and body (``header_timeout_s``, ``body_timeout_s``); accept errors (EMFILE) pause accepting
briefly instead of spinning, and are logged rate-limited.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import io
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Coroutine
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import urlsplit

from cosmos_robot_server.batcher import PolicyError
from cosmos_robot_server.config import ServerConfig
from cosmos_robot_server.core import RequestError, ServingCore
from cosmos_robot_server.cosmos_dialect import (
    PolicyOutputError,
    action_list,
    error_reply,
    info_fields,
    parse_batch,
    parse_request,
    to_observation,
)
from cosmos_robot_server.http_limits import ConnectionGate, DeadlineReader
from cosmos_robot_server.ratelog import RateLimitedLog, install_library_filters
from cosmos_robot_server.transport import Transport

__all__ = ["HttpTransport"]

log = logging.getLogger(__name__)
rlog = RateLimitedLog(log)
T = TypeVar("T")

GET_ROUTES = frozenset({"/", "/info", "/healthz", "/readyz", "/metrics"})
PREDICT_ROUTES = frozenset({"/", "/predict"})
BATCH_ROUTE = "/predict_batch"
RESET_ROUTES = frozenset({"/reset", "/next_episode"})  # cosmos's client POSTs /next_episode after an episode
POST_ROUTES = PREDICT_ROUTES | RESET_ROUTES | {BATCH_ROUTE}
LINGER_S = 0.5  # after an error reply on a garbled stream, how long we keep discarding input
LINGER_BYTES = 4 * 1024 * 1024  # what we discard after an error reply on a garbled stream
DISCARD_BYTES = 64 * 1024 * 1024  # a refused body of known length is discarded up to max(this, 2 x max_message_bytes)
ACCEPT_PAUSE_S = 0.1  # out of file descriptors: wait this long before accepting again (instead of spinning)
_FD_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
IDLE_TIMEOUT_S = 120.0  # a keep-alive connection silent this long is closed (frees its thread)
JSON_TYPE = "application/json"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # listen backlog; socketserver's 5 made a burst of connects wait 1 s for SYN retries

    def __init__(self, address: tuple[str, int], transport: HttpTransport) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.transport = transport
        self.gate = ConnectionGate(transport.config.max_connections)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on a machine without DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("http connection %s ended with an error", client_address, exc_info=True)

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in _FD_ERRORS:  # the listening socket stays readable: do not spin on it
                rlog.warning("accept", "http: cannot accept a connection: %s; pausing accepts", exc.strerror)
                time.sleep(ACCEPT_PAUSE_S)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.gate.admit():
            self.transport.core.metrics.inc("cosmos_robot_errors_total", transport="http", kind="too_many_connections")
            rlog.warning("busy", "http: refused a connection, max_connections=%d", self.gate.limit)
            self.gate.refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.gate.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.gate.release()

    def service_actions(self) -> None:
        self.gate.service()  # finish the lingering closes of refused connections

    def server_close(self) -> None:
        super().server_close()
        self.gate.close_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the evaluation client sends one request per control step
    default_request_version = "HTTP/1.0"  # so even a garbled request line gets a status line, not a bare body
    server_version = "cosmos-robot-server"
    disable_nagle_algorithm = True  # headers and body go out in two writes; Nagle would delay the second
    timeout = IDLE_TIMEOUT_S
    server: _Server

    # -- connection lifecycle --------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # replaced by a reader with total deadlines (see http_limits)
        self._reader = DeadlineReader(self.connection, IDLE_TIMEOUT_S, self._timed_out)
        self.rfile = io.BufferedReader(self._reader, 65536)
        self.client_id = f"http:{self.client_address[0]}:{self.client_address[1]}"
        self._body_pending = False
        self._linger = False
        self.server.transport._opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
            if self._linger:
                self._drain()
        finally:
            self.server.transport._closed(self.connection, self.client_id)

    def handle_one_request(self) -> None:
        self._reader.expect_request(self.server.transport.config.header_timeout_s)
        super().handle_one_request()

    def _timed_out(self, phase: str) -> None:
        self.server.transport.core.metrics.inc("cosmos_robot_errors_total", transport="http", kind=f"{phase}_timeout")
        rlog.info(f"{phase}_timeout", "http %s: request %s not received in time; closing", self.client_id, phase)

    def _drain(self) -> None:
        """Closing with unread input makes the kernel send RST, which can destroy our error reply
        before the client reads it; so stop writing, then discard what the client still sends: the
        declared body (bounded) within ``body_timeout_s``, or anything for ``LINGER_S``."""
        cfg = self.server.transport.config
        declared = self._declared_length()
        budget, linger_s = LINGER_BYTES, LINGER_S
        if declared:  # a body the client will send in full before it reads our reply (http.client does)
            budget, linger_s = min(declared, max(DISCARD_BYTES, 2 * cfg.max_message_bytes)), cfg.body_timeout_s
        try:
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + linger_s
            discarded = 0
            while discarded < budget and time.monotonic() < deadline:
                self.connection.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                discarded += len(chunk)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.client_id, format % args)

    # -- dispatch --------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _dispatch(self) -> None:
        transport = self.server.transport
        self._body_pending = self._declared_length() != 0
        route = urlsplit(self.path).path.rstrip("/") or "/"
        method = "GET" if self.command == "HEAD" else self.command
        try:
            if method == "GET" and route in GET_ROUTES:
                self._get(route)
            elif method == "POST" and route in POST_ROUTES:
                self._post(route)
            elif route in GET_ROUTES or route in POST_ROUTES:
                allow = ", ".join(
                    m for m, routes in (("GET, HEAD", GET_ROUTES), ("POST", POST_ROUTES)) if route in routes
                )
                self._send_json(405, {"error": f"{self.command} not allowed on {route}; use {allow}"}, Allow=allow)
            else:
                self._send_json(404, {"error": "Not found"})
        except RequestError as exc:
            headers = {"WWW-Authenticate": "Api-Key"} if exc.status == 401 else {}
            status, payload = error_reply(transport.config.cosmos_errors, route, exc.status, str(exc))
            self._send_json(status, payload, **headers)
        except PolicyError as exc:
            self._send_json(*error_reply(transport.config.cosmos_errors, route, 500, str(exc)))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # one bad request must not take the connection thread down
            log.exception("http %s %s failed", self.command, route)
            transport.core.metrics.inc("cosmos_robot_errors_total", transport="http", kind="internal")
            message = f"internal server error: {type(exc).__name__}: {' '.join(str(exc).split())}"
            self._send_json(*error_reply(transport.config.cosmos_errors, route, 500, message))

    def _get(self, route: str) -> None:
        core = self.server.transport.core
        if route == "/":
            self._send_json(200, {"status": "ok"})
        elif route == "/info":
            self._send_json(200, info_fields(core.metadata))
        else:
            answer = core.http_get(route)
            assert answer is not None, route  # every GET route but / and /info is the core's
            status, content_type, body = answer
            self._send(status, body, content_type)

    def _post(self, route: str) -> None:
        transport = self.server.transport
        core = transport.core
        try:
            self._check_api_key()
            body = self._read_json(allow_empty=route in RESET_ROUTES)
            if route in RESET_ROUTES:
                transport.run(core.reset(client_id=self.client_id))
                self._send_json(200, {"status": "ok"})
                return
            spec = core.policy.input_spec
            if route == BATCH_ROUTE:
                batch = [to_observation(req, spec) for req in parse_batch(body)]
            else:
                single = to_observation(parse_request(body), spec)
        except RequestError as exc:
            transport.count_rejected(exc.status)
            raise
        try:
            if route == BATCH_ROUTE:
                replies = transport.run(core.infer_many(batch, transport="http", client_id=self.client_id))
                actions = [action_list(reply) for reply in replies]
                infer_ms = max(r["server_timing"]["infer_ms"] for r in replies)
                timing = {"infer_ms": infer_ms, "batch_size": len(replies)}
                self._send_json(200, {"actions": actions, "server_timing": timing})
            else:
                reply = transport.run(core.infer(single, transport="http", client_id=self.client_id))
                self._send_json(200, {"action": action_list(reply), "server_timing": reply.get("server_timing")})
        except PolicyOutputError:  # the core counted the call as answered; the answer was unusable
            core.metrics.inc("cosmos_robot_errors_total", transport="http", kind="policy_output")
            raise

    # -- request parts ---------------------------------------------------------------------
    def _check_api_key(self) -> None:
        core = self.server.transport.core
        if core.config.api_key is None:
            return
        provided = self.headers.get("X-Api-Key")
        if provided is None:
            scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
            provided = value.strip() if scheme.lower() == "api-key" else None
        if not core.check_api_key(provided):
            raise RequestError(
                "missing or wrong API key: send `X-Api-Key: <key>` or `Authorization: Api-Key <key>`", status=401
            )

    def _declared_length(self) -> int | None:
        """Content-Length as sent (``None`` when absent or unreadable); chunked bodies count as pending."""
        if self.headers.get("Transfer-Encoding"):
            return None
        raw = self.headers.get("Content-Length")
        if raw is None:
            return 0
        try:
            return int(raw)
        except ValueError:
            return None

    def _read_json(self, *, allow_empty: bool = False) -> Any:
        limit = self.server.transport.config.max_message_bytes
        if self.headers.get("Transfer-Encoding"):
            raise RequestError("chunked request bodies are not supported; send a Content-Length", status=411)
        raw = self.headers.get("Content-Length")
        if raw is None:
            if allow_empty:
                return {}
            raise RequestError("missing Content-Length header", status=411)
        try:
            length = int(raw)
            if length < 0:
                raise ValueError
        except ValueError:
            raise RequestError(f"bad Content-Length header: {raw!r}") from None
        if length > limit:
            raise RequestError(
                f"request body of {length} bytes exceeds the limit of max_message_bytes={limit}", status=413
            )
        if length == 0 and allow_empty:
            return {}
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if content_type != JSON_TYPE:
            raise RequestError(f"Content-Type must be {JSON_TYPE}, got {content_type or 'none'!r}", status=415)
        self._reader.expect_body(self.server.transport.config.body_timeout_s)
        try:
            data = self.rfile.read(length)
        except TimeoutError:
            self.close_connection = True
            raise RequestError(
                f"request body not received within body_timeout_s={self.server.transport.config.body_timeout_s}",
                status=408,
            ) from None
        self._body_pending = False
        if len(data) < length:
            self.close_connection = True
            raise RequestError(f"request body ended after {len(data)} of {length} bytes")
        max_elements = self.server.transport.config.max_elements
        if data.count(b",") >= max_elements:  # json.loads holds the GIL: 1M keys stalled every transport 1.4 s
            raise RequestError(f"JSON body has more than max_elements={max_elements} elements (counted by commas)")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise RequestError(f"invalid JSON body: {exc}") from None

    # -- responses -------------------------------------------------------------------------
    def _send_json(self, status: int, payload: Any, **headers: str) -> None:
        body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
        self._send(status, body, JSON_TYPE, **headers)

    def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.connection.settimeout(self.server.transport.config.body_timeout_s)  # a client that never reads
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        if getattr(self, "_body_pending", False):  # an unread body would be parsed as the next request
            self.send_header("Connection", "close")
            self.close_connection = True
            self._linger = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Protocol errors found by the stdlib parser (bad request line, huge headers) answer in JSON too."""
        try:
            text = message or HTTPStatus(code).phrase
        except ValueError:
            text = f"HTTP {code}"
        self._body_pending = True  # the stream is in an unknown state: close after answering
        self._send_json(code, {"error": text})


class HttpTransport(Transport):
    """``GET /healthz|/readyz|/metrics|/|/info``, ``POST /|/predict|/predict_batch|/reset``."""

    name = "http"

    def __init__(self, core: ServingCore, config: ServerConfig) -> None:
        super().__init__(core, config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    async def start(self) -> int:
        install_library_filters()  # asyncio's accept errors, for example, come in floods
        self._loop = asyncio.get_running_loop()
        self._httpd = _Server((self.config.host, self.config.http_port), self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="http-transport", daemon=True
        )
        self._thread.start()
        return int(self._httpd.server_address[1])

    async def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        await asyncio.get_running_loop().run_in_executor(None, httpd.shutdown)
        httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # wake threads parked on idle keep-alive connections
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(5.0)

    # -- called from connection threads ----------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a core coroutine on the server loop and wait for it in this connection's thread."""
        loop = self._loop
        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("loop closed")
            future = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:
            coro.close()
            raise RequestError("server is shutting down", status=503) from None
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise RequestError("server is shutting down", status=503) from None

    def count_rejected(self, status: int) -> None:
        """Requests refused before reaching the core (auth, size, dialect) still show in the metrics."""
        kind = {401: "unauthorized", 413: "too_large"}.get(status, "bad_request")
        self.core.metrics.inc("cosmos_robot_requests_total", transport="http", outcome=kind)
        self.core.metrics.inc("cosmos_robot_errors_total", transport="http", kind=kind)

    def _opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.add(conn)
        self.core.metrics.gauge_add("cosmos_robot_connections", 1, transport="http")

    def _closed(self, conn: socket.socket, client_id: str) -> None:
        with self._lock:
            self._conns.discard(conn)
        self.core.metrics.gauge_add("cosmos_robot_connections", -1, transport="http")
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:  # the batcher's bookkeeping belongs to the loop thread
                loop.call_soon_threadsafe(self.core.connection_closed, client_id)
            except RuntimeError:
                pass
