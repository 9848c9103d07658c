"""KServe V2 over HTTP/1.1: asyncio (uvloop) + httptools, no framework on the hot path.

Routes (``{v}`` optional: ``/versions/{v}`` after the model name):
  GET  /v2/health/live | /v2/health/ready          200 / 503, empty body
  GET  /v2                                         server metadata (extensions)
  GET  /v2/models/{m}[/versions/{v}]               model metadata
  GET  /v2/models/{m}[/versions/{v}]/ready         200 / 503
  GET  /v2/models/{m}[/versions/{v}]/config        Triton-compatible model config
  GET  /v2/models[/{m}[/versions/{v}]]/stats       Triton statistics
  POST /v2/models/{m}[/versions/{v}]/infer         JSON, JSON + binary, raw single input
  POST /v2/repository/index | /v2/repository/models/{m}/load | /unload

Connection invariants
  - Requests on one connection are answered in the order they arrived (HTTP/1.1 pipelining):
    ``_queue`` holds parsed requests, at most one is being handled at a time; reading pauses
    while ``MAX_PIPELINED`` wait.
  - Write-side backpressure: while the transport's write buffer is over its high-water mark
    (``pause_writing`` .. ``resume_writing``) reading pauses and no queued request is started, so
    the buffer holds at most the high-water mark plus one answer (and the one the engine is
    computing). The two pause reasons (queue full, buffer full) are separate flags: reading
    resumes only when neither holds, and the buffer draining goes on with the queued requests.
  - A body is never buffered beyond ``limits.max_body_bytes``: Content-Length is checked when
    the headers are complete (before any body byte is kept), chunked bodies as they arrive, and a
    gzip/deflate body's decoded size as it is decoded (``http_headers`` says how each header that
    changes the meaning of a request is honoured or refused).
  - A body that arrived whole but cannot be decoded is answered in its turn (``HttpRequest.error``)
    and the connection goes on; a request whose framing cannot be trusted is answered and closed.
  - ``100 Continue`` is written only when no answer is still owed on the connection (else when
    the last one is written), and never once the body has begun to arrive.
  - One sweeper task per server closes connections whose request has been arriving for longer
    than ``limits.receive_timeout_s`` (408) or that sat idle for ``limits.idle_timeout_s``: no
    timer per request. Idle means nothing received, no request in the engine and no written
    byte drained for that long. The receive clock stops while the server is not reading (either
    pause) and restarts when reading resumes. A connection whose writes are paused is never
    idle while the buffer drains (the sweeper compares its size between sweeps); a client that
    reads nothing for ``idle_timeout_s`` has stopped reading: the connection is aborted (its
    buffered and queued answers are dropped, as for a client that went away), which bounds
    what it holds. The same holds for a connection we closed whose last answer the client
    never reads.
  - Every request that was parsed whole gets exactly one response; a connection closed by the
    client drops the responses still owed to it (its requests still finish inside the engine).
"""

import asyncio
import json
import socket
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote

import httptools

from lumenrt.server.errors import REASONS, ServerError, as_server_error, bad_request, not_found
from lumenrt.server.http_headers import CONTINUE, ContentDecoder, HttpError, check_head, parser_error
from lumenrt.server.parameters import check_bool, refuse_load_parameters
from lumenrt.server.service import InferenceService, InferOutcome
from lumenrt.server.v2_http import encode_infer_response, parse_infer_request, parse_raw_request

MAX_PIPELINED = 64  # parsed requests waiting on one connection before reading pauses (guessed)
HEADER_LENGTH = b"inference-header-content-length"
_JSON = b"application/json"
_OCTETS = b"application/octet-stream"


@dataclass(slots=True)
class HttpRequest:
    method: bytes
    path: str
    headers: dict[bytes, bytes]
    body: bytes
    keep_alive: bool
    received_ns: int
    http_10: bool = False  # an HTTP/1.0 request: a kept-alive answer must say so
    error: ServerError | None = None  # its body could not be decoded: answered with this


@dataclass(slots=True)
class Response:
    status: int
    body: bytes | list[Any] = b""
    content_type: bytes = _JSON
    extra_headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def error_response(err: ServerError) -> Response:
    headers = list(err.headers) if isinstance(err, HttpError) else []
    return Response(err.status, json.dumps({"error": err.message}).encode(), extra_headers=headers)


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(doc, separators=(",", ":")).encode())


class HttpServer:
    """The listening socket, its connections and the sweeper."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.connections: set[HttpConnection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self._sweeper: asyncio.Task[None] | None = None

    async def listen(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: HttpConnection(self), host, port, backlog=1024)
        self.port = int(self.server.sockets[0].getsockname()[1])
        self._sweeper = loop.create_task(self._sweep())

    async def stop_listening(self) -> None:
        if self.server is not None:
            self.server.close()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.close()
        if self.server is not None:
            await self.server.wait_closed()

    async def _sweep(self) -> None:
        limits = self.service.limits
        interval = min(max(min(limits.receive_timeout_s, limits.idle_timeout_s) / 4, 0.05), 1.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.check_timeouts(now, limits.receive_timeout_s, limits.idle_timeout_s)


async def start_http(service: InferenceService, host: str, port: int) -> HttpServer:
    server = HttpServer(service)
    await server.listen(host, port)
    return server


class HttpConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.service = server.service
        self.limits = server.service.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._queue: deque[HttpRequest] = deque()
        self._busy = False
        self._task: asyncio.Task[None] | None = None  # the request being answered
        self._paused = False  # reading paused: MAX_PIPELINED requests wait
        self._write_paused = False  # the write buffer is over its high-water mark (pause_writing)
        self._write_buffer_seen = 0  # its size at the last sweep while paused: smaller = progress
        self._closing = False
        # the message being parsed
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._headers_done = False  # header fields from here on are trailers (dropped)
        self._http_10 = False
        self._decoder: ContentDecoder | None = None
        self._body_error: ServerError | None = None
        self._continue_owed = False  # Expect: 100-continue waits for the answers owed before it
        self._started = 0.0  # monotonic s when the current message began; 0 = between messages
        self._last_active = time.monotonic()

    # ---- transport callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._queue.clear()
        self.server.connections.discard(self)

    def pause_writing(self) -> None:
        """The write buffer is over its high-water mark: read nothing more and start no queued
        request until it drains (reading may already be paused for the queue: a separate flag)."""
        self._write_paused = True
        self._last_active = time.monotonic()  # the stall clock (check_timeouts) starts here
        if self.transport is not None and not self._closing:
            self._write_buffer_seen = self.transport.get_write_buffer_size()
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        """The buffer drained under its low-water mark: go on with the queued requests (which may
        fill it again), then read again unless the queue still holds reading paused."""
        self._write_paused = False
        self._last_active = time.monotonic()
        if not self._busy:
            self._next()
        self._resume_reading()

    def _resume_reading(self) -> None:
        """Read again once neither pause reason holds. A message that was arriving when reading
        paused gets its receive clock restarted: the wait was the server's, not the client's."""
        transport = self.transport
        if self._paused or self._write_paused or self._closing or transport is None:
            return
        if transport.is_reading() or transport.is_closing():
            return
        if self._started:
            self._started = time.monotonic()
        transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._last_active = time.monotonic()
        while data:
            try:
                self.parser.feed_data(data)
                return
            except ServerError as err:
                self._fail(err)
            except httptools.HttpParserCallbackError as exc:  # a callback below raised (a limit)
                cause = exc.__context__
                self._fail(cause if isinstance(cause, ServerError) else as_server_error(exc))
            except httptools.HttpParserUpgrade as exc:
                # Upgrade is ignored (http_headers): the request was parsed whole and is answered
                # over HTTP/1.1; llhttp stopped after it, so parsing goes on from there.
                offset = int(exc.args[0]) if exc.args else 0
                if offset > 0:
                    data = data[offset:]
                    continue
                self._fail(bad_request("malformed HTTP request: protocol upgrade at no offset"))
            except httptools.HttpParserError as exc:
                self._fail(parser_error(str(exc)))
            return

    def _fail(self, err: ServerError) -> None:
        """A request that cannot be parsed (or is over a limit): answer it, then close, since the
        stream can no longer be trusted to be in step."""
        if self._closing:
            return
        self._queue.clear()
        self._write(error_response(err), keep_alive=False)

    def close(self) -> None:
        if self.transport is not None and not self._closing:
            self._closing = True
            self._last_active = time.monotonic()  # the flush clock (check_timeouts) starts here
            self._write_buffer_seen = self.transport.get_write_buffer_size()
            self.transport.close()

    def check_timeouts(self, now: float, receive_timeout_s: float, idle_timeout_s: float) -> None:
        transport = self.transport
        if transport is None:
            return
        if self._closing:  # closed by us, its last answer still being flushed
            size = transport.get_write_buffer_size()
            if size < self._write_buffer_seen:
                self._last_active = now  # the client reads it
            self._write_buffer_seen = size
            if size and now - self._last_active > idle_timeout_s:
                transport.abort()  # it never reads its last answer: drop it, free the buffer
            return
        if self._busy:
            self._last_active = now  # a request in the engine: the idle clock starts after it
        if self._write_paused:
            size = transport.get_write_buffer_size()
            if size < self._write_buffer_seen:
                self._last_active = now  # the client reads, if slowly: not stalled
            self._write_buffer_seen = size
            if now - self._last_active > idle_timeout_s:
                # stalled: the client read nothing for idle_timeout_s. abort, since close()
                # would keep the buffer until it is flushed to a client that does not read
                self._closing = True
                self._queue.clear()
                transport.abort()
            return
        if self._paused:
            return  # not reading while MAX_PIPELINED wait (so one is in the engine): no clock runs
        if self._started and now - self._started > receive_timeout_s:
            self._fail(ServerError(408, f"request not received whole within {receive_timeout_s:g} s"))
        elif not self._started and not self._busy and now - self._last_active > idle_timeout_s:
            self.close()

    # ---- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._body_bytes = 0
        self._headers_done = False
        self._decoder = None
        self._body_error = None
        self._started = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self.limits.max_header_bytes:
            raise ServerError(431, f"request line and headers over {self.limits.max_header_bytes} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self.limits.max_header_bytes:
            raise ServerError(431, f"request line and headers over {self.limits.max_header_bytes} bytes")
        if self._headers_done:
            return  # a trailer field (after a chunked body): counted above, never merged
        key = name.lower()
        seen = self._headers.get(key)
        # a repeated field is one comma-separated list (RFC 9110 §5.3), so that a second
        # Transfer-Encoding or Content-Encoding line cannot slip past the checks
        self._headers[key] = value if seen is None else seen + b", " + value

    def on_headers_complete(self) -> None:
        self._headers_done = True
        version = self.parser.get_http_version()
        self._http_10 = version == "1.0"
        plan = check_head(version, self.parser.get_method(), self._headers, self.limits.max_body_bytes)
        self._decoder = plan.decoder
        if plan.send_continue:
            if self._busy or self._queue:
                self._continue_owed = True  # written by _next once the answers before it are
            else:
                self._write_continue()

    def on_body(self, body: bytes) -> None:
        self._continue_owed = False  # the client did not wait for it
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:
            raise ServerError(413, f"body is over the limit of {self.limits.max_body_bytes} bytes")
        if self._body_error is not None:
            return  # the rest of a body that failed to decode: read and dropped
        if self._decoder is None:
            self._body.append(body)
            return
        try:
            self._decoder.feed(body)
        except ServerError as err:
            self._body_error, self._decoder = err, None

    def on_message_complete(self) -> None:
        self._continue_owed = False  # the body is here (or there was none)
        if self._decoder is not None and self._body_error is None:
            try:
                body = self._decoder.finish()
            except ServerError as err:
                self._body_error, body = err, b""
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._decoder = None
        self._started = 0.0
        req = HttpRequest(
            self.parser.get_method(),
            self._url.decode("latin-1"),
            self._headers,
            body,
            self.parser.should_keep_alive(),
            time.monotonic_ns(),
            self._http_10,
            self._body_error,
        )
        self._queue.append(req)
        if len(self._queue) >= MAX_PIPELINED and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        if not self._busy:
            self._next()

    # ---- handling -----------------------------------------------------------------------------

    def _next(self) -> None:
        """Handle queued requests in order until one has to wait for the engine or the write buffer
        is over its high-water mark (``resume_writing`` calls this again)."""
        while self._queue and not self._busy and not self._write_paused and not self._closing:
            req = self._queue.popleft()
            try:
                result = error_response(req.error) if req.error is not None else route(self.service, req)
            except Exception as exc:
                result = error_response(as_server_error(exc))
            if isinstance(result, Response):
                self._write(result, req.keep_alive, req.http_10)
                continue
            self._busy = True
            self._task = self.loop.create_task(self._respond(result, req))  # referenced while it runs
            return
        if self._queue or self._busy or self._closing:
            return  # the rest waits for the engine's answer or for the write buffer to drain
        if self._continue_owed:
            self._continue_owed = False
            self._write_continue()
        if self._paused:
            self._paused = False
            self._resume_reading()  # unless the write buffer still holds reading paused

    async def _respond(self, pending: Awaitable[Response], req: HttpRequest) -> None:
        """Await the engine's answer and write it in the same step: the service counts the request
        in flight until then, so a drain that sees no request in flight has every answer written
        (a done-callback would write one loop pass later, after the connections were closed)."""
        try:
            response = await pending
        except asyncio.CancelledError:
            response = error_response(ServerError(503, "request cancelled: server shutting down"))
        except Exception as exc:
            response = error_response(as_server_error(exc))
        self._busy = False
        self._write(response, req.keep_alive, req.http_10)
        self._next()

    def _write_continue(self) -> None:
        if not self._closing and self.transport is not None:
            self.transport.write(CONTINUE)

    def _write(self, response: Response, keep_alive: bool, http_10: bool = False) -> None:
        if self._closing or self.transport is None:
            return
        body = response.body
        if isinstance(body, list):
            length = sum(len(c) if isinstance(c, bytes) else c.nbytes for c in body)
        else:
            length = len(body)
        head = [
            b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
            % (
                response.status,
                REASONS.get(response.status, "Unknown").encode(),
                response.content_type,
                length,
            )
        ]
        for name, value in response.extra_headers:
            head.append(b"%s: %s\r\n" % (name, value))
        if not keep_alive:
            head.append(b"connection: close\r\n")
        elif http_10:
            head.append(b"connection: keep-alive\r\n")
        head.append(b"\r\n")
        if isinstance(body, list):
            self.transport.writelines([b"".join(head), *body])
        else:
            head.append(body)
            self.transport.write(b"".join(head))
        if not keep_alive:
            self.close()


# ---- routing ----------------------------------------------------------------------------------------


def route(service: InferenceService, req: HttpRequest) -> Any:
    """A Response, or a coroutine that produces one (inference, repository actions)."""
    path = req.path.split("?", 1)[0]
    if "%" in path:
        path = unquote(path)
    parts = path.strip("/").split("/")
    if not parts or parts[0] != "v2":
        raise not_found(f"no route for {path!r} (the API is under /v2)")
    rest = parts[1:]
    get = req.method == b"GET"
    post = req.method == b"POST"
    if not rest:
        _method(get, req, "GET")
        return json_response(service.server_metadata())
    if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
        _method(get, req, "GET")
        ok = service.live() if rest[1] == "live" else service.ready()
        return Response(200 if ok else 503)
    if rest[0] == "repository":
        return _repository(service, req, rest[1:], post)
    if rest[0] != "models":
        raise not_found(f"no route for {path!r}")
    rest = rest[1:]
    if rest == ["stats"]:
        _method(get, req, "GET")
        return json_response(service.statistics())
    if not rest:
        raise not_found("no route for '/v2/models' (name a model: /v2/models/{name})")
    name, rest = rest[0], rest[1:]
    version: str | None = None
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = rest[1], rest[2:]
    action = rest[0] if len(rest) == 1 else "" if not rest else None
    if action == "infer":
        _method(post, req, "POST")
        return _infer(service, req, name, version)
    if action == "":
        _method(get, req, "GET")
        return json_response(service.model_metadata(name, version))
    if action == "ready":
        _method(get, req, "GET")
        return Response(200 if service.model_ready(name, version) else 503)
    if action == "config":
        _method(get, req, "GET")
        return json_response(service.model_config(name, version))
    if action == "stats":
        _method(get, req, "GET")
        return json_response(service.statistics(name, version))
    raise not_found(f"no route for {path!r}")


def _method(ok: bool, req: HttpRequest, allowed: str) -> None:
    if not ok:
        raise ServerError(405, f"method {req.method.decode()} not allowed for {req.path} (use {allowed})")


def _repository(service: InferenceService, req: HttpRequest, rest: list[str], post: bool) -> Any:
    _method(post, req, "POST")
    if rest == ["index"]:
        ready = _json_object(req.body).get("ready")
        return json_response(service.repository_index(ready is not None and check_bool(ready, "ready")))
    if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
        name, action = rest[1], rest[2]
        if action == "load":
            params = _json_object(req.body).get("parameters")
            if params is not None and not isinstance(params, dict):
                raise bad_request(f"parameters must be a JSON object, got {type(params).__name__}")
            refuse_load_parameters(params or {}, name)
        fn = service.load if action == "load" else service.unload

        async def run() -> Response:
            await asyncio.get_running_loop().run_in_executor(None, fn, name)
            return Response(200)

        return run()
    raise not_found(f"no route for {req.path!r}")


def _json_object(body: bytes) -> dict[str, Any]:
    """An optional JSON object body (empty: {})."""
    if not body:
        return {}
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise bad_request(f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


def _infer(service: InferenceService, req: HttpRequest, name: str, version: str | None) -> Any:
    rt = service.runtime(name, version)
    header = req.headers.get(HEADER_LENGTH)
    if header is not None:
        if not header.isdigit():
            raise bad_request(f"Inference-Header-Content-Length must be a number, got {header!r}")
        length = int(header)
        if length == 0:
            parsed = parse_raw_request(req.body, rt.config)
        else:
            parsed = parse_infer_request(req.body, length, service.limits.max_elements)
    else:
        parsed = parse_infer_request(req.body, None, service.limits.max_elements)
    arrays = service.check_inputs(rt, parsed.inputs)
    outputs = service.check_outputs(rt, list(parsed.outputs))
    outcome = service.infer_inline(  # a small model: answered now when its queue is empty
        rt, arrays, outputs, timeout_s=parsed.timeout_s, timing=parsed.timing, received_ns=req.received_ns
    )
    if outcome is not None:
        return _infer_response(outcome, parsed)

    async def run() -> Response:
        outcome = await service.infer(
            rt, arrays, outputs, timeout_s=parsed.timeout_s, timing=parsed.timing, received_ns=req.received_ns
        )
        return _infer_response(outcome, parsed)

    return run()


def _infer_response(outcome: InferOutcome, parsed: Any) -> Response:
    header_json, chunks = encode_infer_response(outcome, parsed)
    if not chunks:
        return Response(200, header_json)
    return Response(
        200,
        [header_json, *chunks],
        _OCTETS,
        [(b"inference-header-content-length", b"%d" % len(header_json))],
    )
