"""KServe V2 over HTTP/1.1: asyncio (uvloop) + httptools, no framework on the hot path.

Routes (``{v}`` optional: ``/versions/{v}`` after the model name):
  GET  /v2/health/live | /v2/health/ready          200 / 503, {"live"|"ready": bool}
  GET  /v2                                         server metadata (extensions)
  GET  /v2/models/{m}[/versions/{v}]               model metadata
  GET  /v2/models/{m}[/versions/{v}]/ready         200 / 503
  GET  /v2/models/{m}[/versions/{v}]/config        Triton-compatible model config
  GET  /v2/models[/{m}[/versions/{v}]]/stats       Triton statistics
  GET  /metrics                                     Prometheus metrics (observability/metrics.py)
  POST /v2/models/{m}[/versions/{v}]/infer         JSON, JSON + binary, raw single input
  POST /v2/repository/index | /v2/repository/models/{m}/load | /unload
  GET  /v2/systemsharedmemory[/region/{r}]/status  system shared memory (--allow-client-shm)
  POST /v2/systemsharedmemory/region/{r}/register | [/region/{r}]/unregister

Connection invariants (flow control, timeouts and the sweeper: ``lumenrt.ingress.connection``)
  - Requests on one connection are answered in the order they arrived (HTTP/1.1 pipelining):
    ``_queue`` holds parsed requests, at most one is being handled at a time; reading pauses for
    load (``load_paused``) while ``MAX_PIPELINED`` wait.
  - While the write buffer is over its high-water mark (``write_paused``) no queued request is
    started either, so the buffer holds at most the high-water mark plus one answer (and the one
    the engine is computing); the buffer draining goes on with the queued requests.
  - A body is never buffered beyond ``limits.max_body_bytes``: Content-Length is checked when
    the headers are complete (before any body byte is kept), chunked bodies as they arrive, and a
    gzip/deflate body's decoded size as it is decoded (``http_headers`` says how each header that
    changes the meaning of a request is honoured or refused).
  - A body that arrived whole but cannot be decoded is answered in its turn (``HttpRequest.error``)
    and the connection goes on; a request whose framing cannot be trusted is answered and closed.
  - ``100 Continue`` is written only when no answer is still owed on the connection (else when
    the last one is written), and never once the body has begun to arrive.
  - A request not received whole within ``limits.receive_timeout_s`` is answered 408 and the
    connection closed; a message in progress is one begun (``_begun``) and not yet complete
    (``_finished``): counters, no clock, on the parse path.
  - Every request that was parsed whole gets exactly one response; a connection closed by the
    client, or aborted by the sweeper for not reading, drops the responses still owed to it (its
    requests still finish inside the engine).
  - A large binary body's tensor bytes are received straight into an arena slot (``http_body``);
    a slot lent for a body is returned whatever becomes of the request (``_drop_queued``, the end
    of each request's turn in ``_run_queue``), unless admission took it over.

Receiving (``asyncio.BufferedProtocol``)
  - The transport reads into the front end's one ``read_buffer`` (shared by its connections: the
    parser copies out what it keeps, so the buffer is free again when ``buffer_updated`` returns),
    and the parser is fed a view of it.
  - Once the headers and JSON header of a body received into a slot are in (``_direct_left``: the
    body bytes still to come), reads go straight into the slot (``SlotBody.rest``), past the
    parser: the parser expects those bytes no more, so the message is completed here and the
    parser replaced (it keeps no other state between messages). A read never goes past the body,
    so a pipelined request after it is parsed as usual; after a body whose request asked to close
    (``Connection: close``, HTTP/1.0), input is dropped, as llhttp does. If the slot is revoked
    meanwhile, the rest of the body is read into the shared buffer and dropped, and the request
    answered 503.
  - A read made from inside one of our callbacks (asyncio's own TLS transport reads while it
    closes) lands in a buffer of its own and is parsed after the bytes being parsed, in order:
    the shared buffer is never overwritten under the parser.
"""

import asyncio
import json
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httptools

from lumenrt.ingress.auth import Gate
from lumenrt.ingress.connection import Connection, Listener
from lumenrt.ingress.errors import REASONS, as_server_error, not_found, unavailable
from lumenrt.ingress.http_body import SlotBody, infer_target
from lumenrt.ingress.lent_slot import RECEIVE_IN_SLOT_MIN
from lumenrt.ingress.service import InferenceService, InferOutcome
from lumenrt.ingress.shared_memory import enabled
from lumenrt.ingress.v2_http import encode_infer_response, parse_infer_request, parse_raw_request
from lumenrt.protocols.bounds import DEFAULT_MAX_JSON_DEPTH, check_json_depth
from lumenrt.protocols.compact_json import compact_json
from lumenrt.protocols.errors import ServerError, bad_request
from lumenrt.protocols.http_headers import CONTINUE, ContentDecoder, HttpError, check_head, parser_error
from lumenrt.protocols.parameters import check_bool, check_count, refuse_load_parameters
from lumenrt.protocols.tcp_receiver import ReadBuffer

MAX_PIPELINED = 64  # parsed requests waiting on one connection before reading pauses (guessed)
HEADER_LENGTH = b"inference-header-content-length"
JOIN_BELOW_BYTES = 64 << 10  # a smaller answer is joined into one buffer (one write)
NESTED_READ_BYTES = 64 << 10  # a read from inside a callback (Receiving, at the top)
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
    client: str = ""  # who sent it, for the rate limits: its API key's name, else its address
    received: SlotBody | None = None  # its tensor bytes, received into an arena slot (http_body.py)


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
    return Response(status, compact_json(doc))


class HttpServer(Listener["HttpConnection"]):
    """The listening socket, its connections and the sweeper (``Listener``)."""

    def __init__(self, service: InferenceService) -> None:
        super().__init__(service.limits)
        self.service = service
        self.read_buffer = ReadBuffer()  # lent to one connection's read at a time (the top)

    def _connection(self) -> "HttpConnection":
        return HttpConnection(self)


async def start_http(service: InferenceService, host: str, port: int, ssl: Any = None) -> HttpServer:
    """``ssl``: an ``ssl.SSLContext`` for HTTPS (ingress/tls.py)."""
    server = HttpServer(service)
    await server.listen(host, port, ssl)
    return server


class HttpConnection(Connection, asyncio.BufferedProtocol):
    def __init__(self, server: HttpServer) -> None:
        super().__init__(server, server.limits)
        self.server = server
        self.service = server.service
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self._queue: deque[HttpRequest] = deque()
        self._busy = False
        self._in_next = False  # _next is running (see there)
        self._task: asyncio.Task[None] | None = None  # the request being answered
        self._submitted: _Submit | None = None  # the request last given to the workers
        # the message being parsed
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._header_count = 0
        self._chunks = 0  # of a chunked body
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._slot_body: SlotBody | None = None  # the body arriving into an arena slot
        self._direct_left = 0  # its bytes still to come, read past the parser (the top)
        self._after_close = False  # such a body's request asked to close: input is dropped
        self._feeding = False  # the parser is being fed from the shared read buffer
        self._nested: list[bytes] = []  # bytes read while it is (Receiving, at the top)
        self._nested_buf = memoryview(b"")
        self._headers_done = False  # header fields from here on are trailers (dropped)
        self._http_10 = False
        self._decoder: ContentDecoder | None = None
        self._body_error: ServerError | None = None
        self._continue_owed = False  # Expect: 100-continue waits for the answers owed before it
        self._begun = 0  # messages begun ...
        self._finished = 0  # ... and received whole: one in progress while they differ

    # ---- transport callbacks ------------------------------------------------------------------

    def connection_lost(self, exc: Exception | None) -> None:
        """The client went (or the server closed it): pipelined requests are dropped, and the one
        with the workers is cancelled: dropped before it runs (its answer, if any, is discarded)."""
        self._drop_queued()
        submitted = self._submitted
        if submitted is not None and self._busy:
            self.service.cancel(submitted)
        super().connection_lost(exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._feeding:  # a read from inside our own callback (asyncio's TLS on close): apart
            self._nested_buf = memoryview(bytearray(max(sizehint, NESTED_READ_BYTES)))
            return self._nested_buf
        view = self.server.read_buffer.view
        left = self._direct_left
        if not left:
            return view
        slot_body = self._slot_body
        if slot_body is not None:
            try:
                return slot_body.rest()
            except ValueError:  # the model closed and revoked the slot (http_body invariant 3)
                self._slot_revoked()
        return view[: min(left, len(view))]  # the rest of a body being dropped

    def buffer_updated(self, nbytes: int) -> None:
        if self._feeding:  # the nested read above: parsed after the bytes being parsed now
            self._nested.append(bytes(self._nested_buf[:nbytes]))
            return
        if self._after_close:  # a body read past the parser asked to close: nothing follows
            self.received += 1
            return
        left = self._direct_left
        if not left:
            self._parse(self.server.read_buffer.ro[:nbytes])
            return
        self.received += 1
        self._continue_owed = False
        self._body_bytes += nbytes
        self._direct_left = left - nbytes
        slot_body = self._slot_body
        if slot_body is not None:
            slot_body.seen += nbytes
        if self._direct_left:
            return
        parser = self.parser  # it still expects the body: it reads the request line and headers
        keep_alive = parser.should_keep_alive()
        self._feeding = True  # (a nested read waits for the new parser)
        try:
            self.on_message_complete()
        except Exception as exc:  # as a callback's error on the parser's path
            self._fail(as_server_error(exc))
        finally:
            self._feeding = False
            if self.parser is parser:
                self.parser = httptools.HttpRequestParser(self)
                # as llhttp after Connection: close (or HTTP/1.0): what the client sends after it
                # is not requests (the connection closes once this one is answered)
                self._after_close = not keep_alive
        nested, self._nested = self._nested, []
        if nested and not self._after_close:
            self._parse(b"".join(nested))

    def _parse(self, data: bytes | memoryview) -> None:
        """Feed the parser ``data``, then what reads made meanwhile brought (the top); then read
        the rest of a body past the parser if one is due."""
        self._feeding = True
        try:
            self.data_received(data)
            while self._nested:
                self.data_received(self._nested.pop(0))
        finally:
            self._feeding = False
            self._nested.clear()
        slot_body = self._slot_body
        if slot_body is not None and slot_body.seen >= slot_body.header_length and not self.closing:
            self._direct_left = slot_body.total - slot_body.seen  # > 0: it would be complete

    def data_received(self, data: bytes | memoryview) -> None:
        self.received += 1
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
        if self.closing:
            return
        self._drop_queued()
        self._write(error_response(err), keep_alive=False)

    # ---- connection hooks (lumenrt.ingress.connection) ----------------------------------------

    def _serving(self) -> bool:
        return self._busy

    def _partial(self) -> int:
        begun = self._begun
        return begun if begun != self._finished else -1

    def _receive_timed_out(self) -> None:
        self._fail(ServerError(408, f"request not received whole within {self.limits.receive_timeout_s:g} s"))

    def _writes_resumed(self) -> None:
        if not self._busy:
            self._next()

    def abort(self) -> None:
        self._drop_queued()
        super().abort()

    def _drop_queued(self) -> None:
        """The parsed requests not yet answered, and the body arriving, are dropped: their lent
        slots go back (http_body invariant 1)."""
        for req in self._queue:
            if req.received is not None:
                req.received.release()
        self._queue.clear()
        self._end_slot_body()
        self._direct_left = 0  # closing: what still comes is not looked at

    def _slot_revoked(self) -> None:
        self._end_slot_body()
        self._body_error = unavailable("the model was unloaded while the request body arrived")

    def _end_slot_body(self) -> None:
        slot_body, self._slot_body = self._slot_body, None
        if slot_body is not None:
            slot_body.release()

    def _refuse(self, message: str) -> None:
        if self.transport is not None:
            body = json.dumps({"error": message}).encode()
            self.transport.write(
                b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )

    # ---- httptools callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._header_count = 0
        self._chunks = 0
        self._body = []
        self._body_bytes = 0
        self._end_slot_body()  # none: the message before it completed or failed
        self._headers_done = False
        self._decoder = None
        self._body_error = None
        self._begun += 1

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self.limits.max_header_bytes:
            raise ServerError(431, f"request line and headers over {self.limits.max_header_bytes} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self.limits.max_header_bytes:
            raise ServerError(431, f"request line and headers over {self.limits.max_header_bytes} bytes")
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise ServerError(431, f"more than {self.limits.max_headers} header fields")
        if self._headers_done:
            return  # a trailer field (after a chunked body): counted above, never merged
        key = name.lower()
        seen = self._headers.get(key)
        # a repeated field is one comma-separated list (RFC 9110 §5.3), so that a second
        # Transfer-Encoding or Content-Encoding line cannot slip past the checks
        self._headers[key] = value if seen is None else seen + b", " + value

    def on_chunk_header(self) -> None:
        """A chunk of a chunked body begins: their number is bounded (each costs a callback)."""
        self._chunks += 1
        if self._chunks > self.limits.max_chunks:
            raise ServerError(413, f"chunked body of more than {self.limits.max_chunks} chunks")

    def on_headers_complete(self) -> None:
        self._headers_done = True
        version = self.parser.get_http_version()
        self._http_10 = version == "1.0"
        plan = check_head(version, self.parser.get_method(), self._headers, self.limits.max_body_bytes)
        self._decoder = plan.decoder
        if plan.decoder is None:
            self._slot_body = self._receive_in_slot()
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
        slot_body = self._slot_body
        if slot_body is not None:
            try:
                slot_body.feed(body)
            except ValueError:  # the model closed and revoked the slot (http_body invariant 3)
                self._slot_revoked()
            return
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
        elif self._slot_body is not None:
            body = bytes(self._slot_body.header)  # the JSON header; the tensors are in the slot
        else:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._decoder = None
        self._finished = self._begun
        received, self._slot_body = self._slot_body, None
        req = HttpRequest(
            self.parser.get_method(),
            self._url.decode("latin-1"),
            self._headers,
            body,
            self.parser.should_keep_alive(),
            time.monotonic_ns(),
            self._http_10,
            self._body_error,
            self.peer_host if self.service.limiter is not None or self.service.shared_memory else "",
            received,
        )
        self._queue.append(req)
        if len(self._queue) >= MAX_PIPELINED and not self.load_paused:
            self._pause_for_load()
        if not self._busy:
            self._next()

    def _receive_in_slot(self) -> SlotBody | None:
        """A slot to receive this body's tensor bytes into (http_body.py), when the headers say
        it is a large binary infer body for a model with an arena that this client may use."""
        headers = self._headers
        length, header = headers.get(b"content-length"), headers.get(HEADER_LENGTH)
        if length is None or header is None or not length.isdigit() or not header.isdigit():
            return None
        total, head = int(length), int(header)  # total was checked against the body limit
        if head > total or total - head < RECEIVE_IN_SLOT_MIN or self.parser.get_method() != b"POST":
            return None
        target = infer_target(self._url)
        service = self.service
        if target is None or not service.accepting:
            return None
        gate = service.gate
        if gate is not None and not gate.is_open("inference"):
            key, _ = gate.from_headers(headers)
            if key is None or not key.may("inference"):
                return None  # route() answers it 401/403, in its turn
        try:
            rt = service.runtime(*target)
        except ServerError:
            return None
        lent = rt.receive_slot(total - head)
        return None if lent is None else SlotBody(rt, lent[0], lent[1], head)

    # ---- handling -----------------------------------------------------------------------------

    def _next(self) -> None:
        """Handle queued requests in order until one has to wait for the engine or the write buffer
        is over its high-water mark (``resume_writing`` calls this again). Not re-entered: an
        answer that comes back inside ``submit`` (the engine polls ``spin_us`` for it) lets this
        loop go on instead of calling it again, so pipelined requests cost no stack depth."""
        if self._in_next:
            return
        self._in_next = True
        try:
            self._run_queue()
        finally:
            self._in_next = False

    def _run_queue(self) -> None:
        while self._queue and not self._busy and not self.write_paused and not self.closing:
            req = self._queue.popleft()
            try:
                if not self._handle(req):
                    return  # answered later: ``_answered`` (or ``_respond``) goes on
            finally:
                if req.received is not None:  # its slot, unless admission took it over
                    req.received.release()
        if self._queue or self._busy or self.closing:
            return  # the rest waits for the engine's answer or for the write buffer to drain
        if self._continue_owed:
            self._continue_owed = False
            self._write_continue()
        if self.load_paused:
            self._resume_for_load()  # unless the write buffer still holds reading paused

    def _handle(self, req: HttpRequest) -> bool:
        """Route one request and answer it, or hand it on; True if it was answered now."""
        try:
            result = error_response(req.error) if req.error is not None else route(self.service, req)
        except Exception as exc:
            result = error_response(as_server_error(exc))
        if isinstance(result, Response):
            self._write(result, req.keep_alive, req.http_10)
            return True
        if isinstance(result, _Submit):  # to the workers: the engine calls back (``_Submit``)
            result.conn, result.request = self, req
            self._submitted = result
            self._busy = True  # before: the engine may answer inside submit (spin_us)
            try:
                self.service.submit(result, result.take_arrays(), result.timeout_s, req.received)
            except ServerError as err:  # refused at once: answered now, never called back
                self._busy = False
                self._write(error_response(err), req.keep_alive, req.http_10)
                return True
            return not self._busy  # answered inside submit: go on here
        self._busy = True
        self._task = self.loop.create_task(self._respond(result, req))  # referenced while it runs
        return False

    def _answered(self, response: Response, req: HttpRequest) -> None:
        """The engine answered the request ``_next`` submitted: write it, go on in order."""
        self._busy = False
        self._submitted = None
        self._write(response, req.keep_alive, req.http_10)
        self._next()

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
        if not self.closing and self.transport is not None:
            self.transport.write(CONTINUE)

    def _write(self, response: Response, keep_alive: bool, http_10: bool = False) -> None:
        if self.closing or self.transport is None:
            return
        body = response.body
        if isinstance(body, list):
            length = 0
            for chunk in body:
                length += len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
        else:
            length = len(body)
        line = _STATUS_LINES.get((response.status, response.content_type))
        if line is None:
            line = _status_line(response.status, response.content_type)
        head = [b"%scontent-length: %d\r\n" % (line, length)]
        for name, value in response.extra_headers:
            head.append(b"%s: %s\r\n" % (name, value))
        if not keep_alive:
            head.append(b"connection: close\r\n")
        elif http_10:
            head.append(b"connection: keep-alive\r\n")
        head.append(b"\r\n")
        if isinstance(body, list) and length >= JOIN_BELOW_BYTES:
            self.transport.writelines([b"".join(head), *body])  # the transport holds the views
        elif isinstance(body, list):
            self.transport.write(b"".join([*head, *body]))  # one buffer: one copy, one write
        else:
            head.append(body)
            self.transport.write(b"".join(head))
        if not keep_alive:
            self.close()


# (status, content type) -> the response's first two lines, made once per pair
_STATUS_LINES: dict[tuple[int, bytes], bytes] = {}


def _status_line(status: int, content_type: bytes) -> bytes:
    line = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n" % (
        status,
        REASONS.get(status, "Unknown").encode(),
        content_type,
    )
    if len(_STATUS_LINES) < 256:  # a handful of statuses and types: bounded all the same
        _STATUS_LINES[(status, content_type)] = line
    return line


# ---- routing ----------------------------------------------------------------------------------------


# request path -> (model, version) of the infer routes seen: a client sends the same path again
# and again, so it is taken apart once (bounded: cleared when full; long paths are not kept)
_INFER_ROUTES: dict[str, tuple[str, str | None]] = {}
INFER_ROUTES_MAX = 1024
INFER_ROUTE_MAX_CHARS = 256


def route(service: InferenceService, req: HttpRequest) -> Any:
    """A Response, or a coroutine that produces one (inference, repository actions)."""
    target = _INFER_ROUTES.get(req.path)
    if target is not None:  # the same checks as below, in the same order
        if service.gate is not None:
            _allow(service.gate, req, "inference")
        _method(req.method == b"POST", req, "POST")
        return _infer(service, req, *target)
    path = req.path.split("?", 1)[0]
    if "%" in path:
        path = unquote(path)
    gate = service.gate
    if path == "/metrics":
        _method(req.method == b"GET", req, "GET")
        if gate is not None:
            _allow(gate, req, "metrics")
        return _metrics(service)
    parts = path.strip("/").split("/")
    if not parts or parts[0] != "v2":
        raise not_found(f"no route for {path!r} (the API is under /v2)")
    rest = parts[1:]
    get = req.method == b"GET"
    post = req.method == b"POST"
    if not rest:
        _method(get, req, "GET")
        if gate is not None:
            _allow(gate, req, "metadata")
        return json_response(service.server_metadata())
    if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
        _method(get, req, "GET")
        if gate is not None:
            _allow(gate, req, "health")
        # the status is the answer (the protocol's); the body says it too, as KServe's server does
        # and its Python SDK reads ({"live": true} / {"ready": false})
        ok = service.live() if rest[1] == "live" else service.ready()
        return json_response({rest[1]: ok}, 200 if ok else 503)
    if rest[0] == "repository":
        if gate is not None:
            _allow(gate, req, "model-repository")
        return _repository(service, req, rest[1:], post)
    if rest[0] == "systemsharedmemory":
        if gate is not None:
            _allow(gate, req, "shared-memory")
        return _shared_memory(service, req, rest[1:])
    if rest[0] != "models":
        raise not_found(f"no route for {path!r}")
    rest = rest[1:]
    if rest == ["stats"]:
        _method(get, req, "GET")
        if gate is not None:
            _allow(gate, req, "statistics")
        return json_response(service.statistics())
    if not rest:
        raise not_found("no route for '/v2/models' (name a model: /v2/models/{name})")
    name, rest = rest[0], rest[1:]
    version: str | None = None
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = rest[1], rest[2:]
    action = rest[0] if len(rest) == 1 else "" if not rest else None
    if gate is not None and action in _GROUPS:
        _allow(gate, req, _GROUPS[action])
    if action == "infer":
        _method(post, req, "POST")
        if len(req.path) <= INFER_ROUTE_MAX_CHARS:
            if len(_INFER_ROUTES) >= INFER_ROUTES_MAX:
                _INFER_ROUTES.clear()
            _INFER_ROUTES[req.path] = (name, version)
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


# a model route's action -> its endpoint group (ingress/auth.py)
_GROUPS = {
    "infer": "inference",
    "": "metadata",
    "config": "metadata",
    "ready": "health",
    "stats": "statistics",
}


def _allow(gate: Gate, req: HttpRequest, group: str) -> None:
    """401/403 unless ``req`` may use ``group``; an accepted key names the client (rate limits)."""
    if gate.is_open(group):
        return
    key, presented = gate.from_headers(req.headers)
    key = gate.check(group, key, presented)
    if key is not None:
        req.client = key.name


def _metrics(service: InferenceService) -> Response:
    """Prometheus's text format (observability/metrics.py); 404 when the server runs without."""
    metrics = service.metrics
    if metrics is None:
        raise not_found("metrics are off (lumenrt serve --no-metrics)")
    return Response(200, metrics.exposition(), metrics.content_type)


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


def _shared_memory(service: InferenceService, req: HttpRequest, rest: list[str]) -> Response:
    """``/v2/systemsharedmemory[/region/{name}]/status|register|unregister`` (Triton's system
    shared-memory extension; ingress/shared_memory.py)."""
    name = ""
    if len(rest) == 3 and rest[0] == "region" and rest[1]:
        name, rest = rest[1], rest[2:]
    if len(rest) != 1 or rest[0] not in ("status", "register", "unregister"):
        raise not_found(f"no route for {req.path!r}")
    action = rest[0]
    _method(
        (req.method == b"GET") if action == "status" else (req.method == b"POST"),
        req,
        "GET" if action == "status" else "POST",
    )
    registry = enabled(service.shared_memory)
    if action == "status":
        return json_response(registry.status(name))
    if action == "unregister":
        registry.unregister(name)
        return Response(200)
    if not name:
        raise not_found("register needs a region name: POST /v2/systemsharedmemory/region/{name}/register")
    doc = _json_object(req.body)
    key = doc.get("key")
    if not isinstance(key, str):
        raise bad_request(f"key: must be a string, got {type(key).__name__}")
    offset = check_count(doc.get("offset", 0), "offset")
    byte_size = doc.get("byte_size")
    if byte_size is None:
        raise bad_request("byte_size: required")
    registry.register(name, key, offset, check_count(byte_size, "byte_size"), req.client)
    return Response(200)


def _json_object(body: bytes) -> dict[str, Any]:
    """An optional JSON object body (empty: {})."""
    if not body:
        return {}
    check_json_depth(body, DEFAULT_MAX_JSON_DEPTH)
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise bad_request(f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


def _infer(service: InferenceService, req: HttpRequest, name: str, version: str | None) -> Any:
    rt = service.runtime(name, version)
    if service.limiter is not None:
        service.admit_client(req.client, rt, "http", req.received_ns)
    header = req.headers.get(HEADER_LENGTH)
    if header is not None:
        if not header.isdigit():
            raise bad_request(f"Inference-Header-Content-Length must be a number, got {header!r}")
        length = int(header)
        payload = _received_payload(req)
        if length == 0:
            parsed = parse_raw_request(req.body if payload is None else payload, rt.config)
        else:
            parsed = parse_infer_request(
                req.body, length, service.limits.max_elements, payload, service.shared_memory
            )
    else:
        parsed = parse_infer_request(req.body, None, service.limits.max_elements, None, service.shared_memory)
    arrays = service.check_inputs(rt, parsed.inputs)
    outputs = service.check_outputs(rt, list(parsed.outputs))
    service.check_priority(rt, parsed.priority, "parameters.priority")
    outcome = service.infer_inline(  # a small model: answered now when its queue is empty
        rt,
        arrays,
        outputs,
        timeout_s=parsed.timeout_s,
        timing=parsed.timing,
        received_ns=req.received_ns,
        protocol="http",
        request_id=parsed.request_id,
        priority=parsed.priority,
    )
    if outcome is not None:
        return _infer_response(outcome, parsed)
    return _Submit(rt, arrays, outputs, parsed, req.received_ns)


def _received_payload(req: HttpRequest) -> memoryview | None:
    """The tensor bytes received into an arena slot (http_body.py), if they were."""
    received = req.received
    if received is None:
        return None
    payload = received.payload
    try:
        payload.nbytes  # noqa: B018 - raises once the model closed and revoked it
    except ValueError:
        raise unavailable("the model was unloaded while the request was queued") from None
    return payload


class _Submit:
    """An inference request for the workers, and its answer: the service's ``PendingAnswer`` (no
    Task, coroutine or Future per request; the engine calls back on the loop's thread)."""

    __slots__ = (
        "_arrays",
        "conn",
        "engine_request",
        "outputs",
        "parsed",
        "priority",
        "received_ns",
        "request",
        "runtime",
        "timing",
    )
    protocol = "http"  # the metrics' label (service.PendingAnswer)

    def __init__(
        self, rt: Any, arrays: dict[str, Any], outputs: list[str], parsed: Any, received_ns: int
    ) -> None:
        self.runtime, self._arrays, self.outputs, self.parsed = rt, arrays, outputs, parsed
        self.timing: bool = parsed.timing
        self.priority: int = parsed.priority
        self.received_ns = received_ns
        self.engine_request: Any = None  # set by the service's submit
        self.conn: HttpConnection | None = None  # set by the connection that submits it
        self.request: HttpRequest | None = None

    @property
    def timeout_s(self) -> float | None:
        return self.parsed.timeout_s  # type: ignore[no-any-return]

    @property
    def request_id(self) -> str | None:
        """The V2 request's ``id`` (echoed in the answer; the access log's id)."""
        return self.parsed.request_id  # type: ignore[no-any-return]

    def take_arrays(self) -> dict[str, Any]:
        """The inputs, once: the engine copies them at submit, so the body is not kept after."""
        arrays, self._arrays = self._arrays, {}
        return arrays

    def answer(self, outcome: InferOutcome) -> None:
        try:
            response = _infer_response(outcome, self.parsed)
        except Exception as exc:  # encoding failed: still exactly one answer
            response = error_response(as_server_error(exc))
        self._reply(response)

    def fail(self, error: ServerError) -> None:
        self._reply(error_response(error))

    def _reply(self, response: Response) -> None:
        assert self.conn is not None and self.request is not None
        self.conn._answered(response, self.request)


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
