"""A lean KServe V2 gRPC client of lumenrt's own: unary calls over HTTP/2 on one connection, framed by
``protocols/http2.py``, with the generated protobuf messages. It speaks to any gRPC server
(lumenrt, Triton); it exists because grpcio's Python client costs more CPU per call than a whole
small-model request costs the server (benchmarks/grpc_floor.py), which the load generator, sharing
the machine with the server, would otherwise measure as the server's.

    from lumenrt.client.grpc import GrpcClient
    with GrpcClient("127.0.0.1", 8001) as client:
        client.infer("digits_mlp", {"input": x}).outputs["label"]

``GrpcClient`` is blocking, one call at a time; ``AsyncGrpcClient`` runs any number of concurrent
calls as streams of one connection (up to the server's SETTINGS_MAX_CONCURRENT_STREAMS; more
wait their turn). A call that fails raises ``GrpcError``: an ``InferenceError`` whose ``status`` is
the HTTP-style status of its gRPC code (INVALID_ARGUMENT 400, NOT_FOUND 404, DEADLINE_EXCEEDED
504, UNAVAILABLE 503, ...) and whose ``code`` is the gRPC code itself. A connection that ends, or
that the server ends with a connection error, fails the calls on it with ConnectionError.
"""

import asyncio
import contextlib
import functools
import socket
import ssl as ssl_module
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import numpy as np

from lumenrt.client.errors import InferenceError
from lumenrt.client.result import InferResult
from lumenrt.client.sockets import open_socket, open_transport, send_parts, set_nodelay
from lumenrt.protocols import dtypes
from lumenrt.protocols import grpc_wire as wire
from lumenrt.protocols.http2 import REFUSED_STREAM, H2Session, H2Stream, LocalSettings
from lumenrt.protocols.raw import from_raw, to_raw

SERVICE = "/inference.GRPCInferenceService/"  # Triton's wire name
RECV_BYTES = 256 << 10  # one read (guessed: a large answer in few reads)
MAX_STREAMS = 1024  # calls at once on one connection, whatever the server allows (guessed)
CLOSE_WAIT_S = 5.0  # close: how long to wait for TLS to finish (guessed)
IDLE_CHECK_S = 1.0  # a call after this long idle first reads what the server sent (as TcpClient's)
MAX_MESSAGE_BYTES = 256 << 20  # an answer's message is refused past this (the server's limit is its own)
# gRPC code -> the HTTP-style status InferenceError carries (the inverse of the server's mapping)
HTTP_STATUS = {
    wire.CANCELLED: 499,
    wire.INVALID_ARGUMENT: 400,
    wire.DEADLINE_EXCEEDED: 504,
    wire.NOT_FOUND: 404,
    wire.PERMISSION_DENIED: 403,
    wire.RESOURCE_EXHAUSTED: 429,
    wire.UNIMPLEMENTED: 501,
    wire.UNAVAILABLE: 503,
    wire.UNAUTHENTICATED: 401,
}


def _pb() -> Any:
    from lumenrt.protocols.proto import grpc_service_pb2  # generated when the package is built

    return grpc_service_pb2


class GrpcError(InferenceError):
    """The server answered a call with a gRPC status other than OK."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(HTTP_STATUS.get(code, 500), message)
        self.code = code
        self.code_name = wire.STATUS_NAMES[code] if 0 <= code < len(wire.STATUS_NAMES) else str(code)

    def __str__(self) -> str:
        return f"[{self.code_name}] {self.message}"


# ---- ModelInfer's messages ------------------------------------------------------------------------


def encode_infer(
    model: str,
    inputs: Mapping[str, Any],
    outputs: Iterable[str] | None = None,
    version: str | int | None = None,
    timeout_s: float | None = None,
    timing: bool = False,
    priority: int = 0,
) -> bytes:
    """A serialized ModelInferRequest: raw input contents, the timeout (µs) and timing flag as
    parameters."""
    pb = _pb()
    request = pb.ModelInferRequest(
        model_name=model, model_version=str(version) if version is not None else ""
    )
    for name, value in inputs.items():
        array = np.asarray(value)
        datatype, data = to_raw(array)
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(bytes(data))
    for name in outputs or ():
        request.outputs.add(name=name)
    if timeout_s is not None:
        request.parameters["timeout"].int64_param = max(1, round(timeout_s * 1e6))
    if timing:
        request.parameters["lumenrt_timing"].bool_param = True
    if priority:
        request.parameters["priority"].int64_param = priority
    return bytes(request.SerializeToString())


def decode_infer(message: bytes) -> InferResult:
    """A ModelInferResponse as an InferResult (outputs read from raw_output_contents)."""
    response = _pb().ModelInferResponse.FromString(message)
    outputs: dict[str, Any] = {}
    raw = response.raw_output_contents
    for i, tensor in enumerate(response.outputs):
        shape = tuple(tensor.shape)
        if i < len(raw):
            outputs[tensor.name] = from_raw(raw[i], tensor.datatype, shape, f"output {tensor.name!r}", _bad)
        else:
            outputs[tensor.name] = np.empty(shape, dtype=dtypes.to_numpy(tensor.datatype))
    timing = {
        key.removeprefix("lumenrt_"): value.int64_param
        for key, value in response.parameters.items()
        if key.startswith("lumenrt_")
    }
    return InferResult(response.model_name, response.model_version, outputs, timing)


def _bad(message: str) -> Exception:
    return InferenceError(502, f"the server's answer: {message}")


# ---- one connection's HTTP/2 session ---------------------------------------------------------------


class _Answer:
    """What a call's stream has brought back so far."""

    __slots__ = ("done", "error", "message", "reader", "started")

    def __init__(self, done: Callable[["_Answer"], None], max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.reader = wire.MessageReader(max_bytes)
        self.started = False  # the response head arrived
        self.message: bytes | None = None
        self.error: BaseException | None = None
        self.done = done


class _ClientSession(H2Session):
    __slots__ = ("lost",)

    def __init__(
        self,
        write: Callable[[bytes], None],
        writelines: Callable[[list[bytes | memoryview]], None] | None = None,
    ) -> None:
        super().__init__(
            client=True, write=write, local=LocalSettings(max_concurrent_streams=0), writelines=writelines
        )
        self.lost: BaseException | None = None

    def on_headers(self, stream: H2Stream, fields: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        answer: _Answer | None = stream.call
        if answer is None:
            return
        if not answer.started:
            answer.started = True
            status = _field(fields, b":status")
            if status != b"200":
                self._finish(stream, GrpcError(_http_code(status), f"HTTP status {status!r} from the server"))
                return
            coding = _field(fields, b"grpc-encoding")
            if coding not in (None, b"identity"):
                answer.reader.coding = coding
            if not end_stream:
                return
        if not end_stream:
            self._finish(stream, GrpcError(wire.INTERNAL, "a second header block without END_STREAM"))
            return
        code = _field(fields, b"grpc-status")
        if code is None or not code.isdigit():
            self._finish(stream, GrpcError(wire.UNKNOWN, f"the call ended without a grpc-status ({code!r})"))
            return
        if int(code) != wire.OK:
            text = wire.decode_message_text(_field(fields, b"grpc-message") or b"")
            self._finish(stream, GrpcError(int(code), text))
            return
        try:
            answer.message = answer.reader.end()
        except wire.GrpcWireError as exc:
            self._finish(stream, GrpcError(exc.code, f"the server's answer: {exc}"))
            return
        self._finish(stream, None)

    def on_data(self, stream: H2Stream, data: memoryview, end_stream: bool) -> None:
        answer: _Answer | None = stream.call
        if answer is None:
            return
        try:
            reader = answer.reader
            message = None if reader.started or reader.coding else wire.whole_message(data, reader.max_bytes)
            if message is not None:
                reader.message = message
            else:
                reader.feed(data)
        except wire.GrpcWireError as exc:
            self._finish(stream, GrpcError(exc.code, f"the server's answer: {exc}"))
            self.reset(stream, 0x8)  # CANCEL
            return
        if end_stream:
            self._finish(stream, GrpcError(wire.INTERNAL, "the answer ended without trailers"))

    def on_reset(self, stream: H2Stream, code: int) -> None:
        if code == REFUSED_STREAM:
            self._finish(
                stream, GrpcError(wire.UNAVAILABLE, "the server refused the stream (REFUSED_STREAM)")
            )
        else:
            self._finish(
                stream, GrpcError(wire.INTERNAL, f"the server reset the stream (HTTP/2 error {code})")
            )

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        """The calls the server did not take fail now (a caller may retry them on a new
        connection); the ones it took still finish. No new call goes on this connection."""
        why = ConnectionError(f"the server sent GOAWAY ({code}): {debug.decode('utf-8', 'replace')}")
        for stream_id, stream in list(self.streams.items()):
            if stream_id > last_stream_id:
                self.streams.pop(stream_id, None)
                self.forget(stream)
                self._finish(stream, why)
        if code != 0:
            self.lost = why

    @property
    def usable(self) -> bool:
        """New calls may go on this connection: not lost, no GOAWAY from the server."""
        return self.lost is None and self.goaway_received < 0 and not self.closed

    def on_error(self, code: int, message: str) -> None:
        self.drop(ConnectionError(f"HTTP/2 error {code}: {message}"))

    def drop(self, why: BaseException) -> None:
        """The connection is over: every call still on it fails with ``why``."""
        if self.lost is None:
            self.lost = why
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self.forget(stream)
            self._finish(stream, why)

    def _finish(self, stream: H2Stream, error: BaseException | None) -> None:
        answer: _Answer | None = stream.call
        if answer is None:
            return
        stream.call = None
        answer.error = error
        answer.done(answer)


def _field(fields: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in fields:
        if key == name:
            return value
    return None


def _http_code(status: bytes | None) -> int:
    """gRPC's mapping of an HTTP status in place of a gRPC answer (doc/http-grpc-status-mapping.md)."""
    return {
        b"400": wire.INTERNAL,
        b"401": wire.UNAUTHENTICATED,
        b"403": wire.PERMISSION_DENIED,
        b"404": wire.UNIMPLEMENTED,
        b"429": wire.UNAVAILABLE,
        b"502": wire.UNAVAILABLE,
        b"503": wire.UNAVAILABLE,
        b"504": wire.UNAVAILABLE,
    }.get(status or b"", wire.UNKNOWN)


class _Head:
    """A call's request header block, made once per (method, deadline) and reused."""

    def __init__(self, host: str, port: int, tls: bool, api_key: str | None) -> None:
        self.authority = f"{host}:{port}".encode()
        self.scheme = b"https" if tls else b"http"
        self.extra: list[tuple[bytes, bytes]] = []
        if api_key is not None:
            self.extra.append((b"authorization", b"Bearer " + api_key.encode("latin-1")))
        self._blocks: dict[tuple[str, float | None], bytes] = {}
        self._framed: tuple[bytes, bytes] | None = None  # the last request, and it with its prefix

    def framed(self, request: bytes) -> bytes:
        """``request`` with gRPC's length prefix; a client that sends the same request object
        again (a load generator) has it framed once, not copied again per call."""
        last = self._framed
        if last is not None and last[0] is request:
            return last[1]
        framed = wire.frame_prefix(len(request)) + request
        self._framed = (request, framed)
        return framed

    def block(self, session: H2Session, method: str, timeout_s: float | None) -> bytes:
        key = (method, timeout_s)
        block = self._blocks.get(key)
        if block is None:
            fields = [
                (b":method", b"POST"),
                (b":scheme", self.scheme),
                (b":path", (SERVICE + method if not method.startswith("/") else method).encode()),
                (b":authority", self.authority),
                (b"content-type", wire.CONTENT_TYPE),
                (b"te", b"trailers"),
            ]
            if timeout_s is not None:
                fields.append((b"grpc-timeout", wire.encode_timeout(timeout_s)))
            block = session.header_block(fields + self.extra)
            if len(self._blocks) < 64:  # a few methods and deadlines (guessed)
                self._blocks[key] = block
        return block


def _tls_context(ctx: ssl_module.SSLContext) -> ssl_module.SSLContext:
    ctx.set_alpn_protocols(["h2"])  # gRPC servers require it
    return ctx


# ---- the blocking client ---------------------------------------------------------------------------


class GrpcClient:
    """A blocking client over one HTTP/2 connection (opened at the first call or ``connect``)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8001,
        *,
        connect_timeout_s: float = 10.0,
        network_timeout_s: float | None = None,
        idle_check_s: float = IDLE_CHECK_S,
        api_key: str | None = None,
        ssl: "ssl_module.SSLContext | None" = None,
    ) -> None:
        """``network_timeout_s``: how long a send or receive may block (None: no limit). A call's own
        deadline is ``timeout_s`` (sent as grpc-timeout). ``idle_check_s``: a call after this long
        without traffic first reads what the server sent meanwhile (its GOAWAY when it closes an
        idle connection), so that it goes on a new connection. ``api_key``: sent as
        ``authorization: Bearer``; ``ssl``: TLS with this context (ALPN h2 is set on it)."""
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.network_timeout_s = network_timeout_s
        self.idle_check_s = idle_check_s
        self._last_io = 0.0
        self._ssl = _tls_context(ssl) if ssl is not None else None
        self._head = _Head(host, port, ssl is not None, api_key)
        self._sock: socket.socket | None = None
        self._session: _ClientSession | None = None

    def _read_idle(self) -> None:
        """What an idle connection received meanwhile, without waiting (a GOAWAY, a PING, the
        end): a connection the server is done with is replaced before the next call."""
        sock, session = self._sock, self._session
        if sock is None or session is None:
            return
        timeout = sock.gettimeout()
        sock.setblocking(False)
        try:
            while True:
                data = sock.recv(RECV_BYTES)
                if not data:
                    session.drop(ConnectionError("closed by the server while idle"))
                    break
                session.receive(data)
        except (BlockingIOError, ssl_module.SSLWantReadError, ssl_module.SSLWantWriteError):
            pass
        except OSError as exc:
            session.drop(ConnectionError(f"{self.host}:{self.port}: {exc}"))
        finally:
            if not session.lost:
                sock.settimeout(timeout)
        if not session.usable:
            self.close()

    def connect(self) -> None:
        if self._sock is not None and self._session is not None and self._session.usable:
            return
        self.close()
        sock = open_socket(self.host, self.port, self.connect_timeout_s, self.network_timeout_s, self._ssl)
        self._sock = sock
        # a large message's frames go out unjoined (H2Session's writelines; sockets.send_parts)
        self._session = _ClientSession(sock.sendall, functools.partial(send_parts, sock))
        self._session.initiate()
        self._last_io = time.monotonic()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if self._session is not None:
            self._session.drop(ConnectionError("the client closed the connection"))
            self._session = None
        if sock is not None:
            sock.close()

    def __enter__(self) -> "GrpcClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, request: bytes, timeout_s: float | None = None) -> bytes:
        """One unary call (``method``: ``ModelInfer`` or a whole ``/pkg.Service/Method`` path) with a
        serialized request; the serialized answer, or GrpcError."""
        if self._sock is not None and time.monotonic() - self._last_io >= self.idle_check_s:
            self._read_idle()  # the server may have sent GOAWAY (its idle timeout) or closed
        self.connect()
        session, sock = self._session, self._sock
        assert session is not None and sock is not None
        result: list[_Answer] = []
        try:
            stream = session.open_stream()
            stream.call = _Answer(result.append)
            head = self._head.block(session, method, timeout_s)
            session.send(stream, head, self._head.framed(request))
            while not result:
                data = sock.recv(RECV_BYTES)
                if not data:
                    session.drop(ConnectionError(f"connection closed by {self.host}:{self.port}"))
                    break
                session.receive(data)
        except OSError as exc:
            session.drop(ConnectionError(f"{self.host}:{self.port}: {exc}"))
        self._last_io = time.monotonic()
        if not result:  # pragma: no cover - drop() finishes every stream
            raise ConnectionError(f"{self.host}:{self.port}: the call was not answered")
        answer = result[0]
        if not session.usable:
            self.close()
        if answer.error is not None:
            raise answer.error
        assert answer.message is not None
        return answer.message

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Iterable[str] | None = None,
        version: str | int | None = None,
        timeout_s: float | None = None,
        timing: bool = False,
        priority: int = 0,
    ) -> InferResult:
        """One ModelInfer call: outputs by name (every output unless ``outputs`` names some)."""
        request = encode_infer(model, inputs, outputs, version, timeout_s, timing, priority)
        return decode_infer(self.call("ModelInfer", request, timeout_s))


# ---- the asyncio client ----------------------------------------------------------------------------


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.session: _ClientSession | None = None
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.closed = asyncio.Event()
        self.ready = asyncio.Event()  # the server's SETTINGS came: its stream limit is known
        self.slots: asyncio.Semaphore | None = None  # the server's stream limit, once known

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        set_nodelay(transport)
        self.session = _ClientSession(self.transport.write, self.transport.writelines)
        self.session.initiate()

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is not None:
            session.receive(data)
            if session.settings_seen and not self.ready.is_set():
                # a server that allows 0 refuses each call (REFUSED_STREAM) rather than hang it here
                self.slots = asyncio.Semaphore(max(1, min(session.peer_max_concurrent, MAX_STREAMS)))
                self.ready.set()
            if session.lost is not None and self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is not None:
            self.session.drop(ConnectionError(f"connection lost: {exc or 'closed by the server'}"))
        self.can_write.set()
        self.ready.set()
        self.closed.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()


def _resolver(future: "asyncio.Future[_Answer]") -> Callable[[_Answer], None]:
    """Sets the call's future, unless its task was cancelled first (then the answer is dropped)."""

    def resolve(answer: _Answer) -> None:
        if not future.done():
            future.set_result(answer)

    return resolve


class AsyncGrpcClient:
    """An asyncio client: any number of concurrent calls as streams of one connection."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8001,
        *,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        ssl: "ssl_module.SSLContext | None" = None,
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self._ssl = _tls_context(ssl) if ssl is not None else None
        self._head = _Head(host, port, ssl is not None, api_key)
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None

    def _usable(self) -> bool:
        p = self._protocol
        return p is not None and p.session is not None and p.session.usable and not p.closed.is_set()

    async def connect(self) -> None:
        if self._usable():
            return
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._usable():
                return
            _, protocol = await open_transport(
                _Protocol, self.host, self.port, self._ssl, self.connect_timeout_s
            )
            try:  # the server's SETTINGS first: calls past its stream limit would be refused
                await asyncio.wait_for(protocol.ready.wait(), self.connect_timeout_s)
            except BaseException:
                if protocol.transport is not None:
                    protocol.transport.close()
                raise
            if protocol.session is None or protocol.session.lost is not None:
                raise ConnectionError(
                    f"{self.host}:{self.port}: {protocol.session and protocol.session.lost}"
                )
            self._protocol = protocol

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            if protocol.session is not None:
                protocol.session.drop(ConnectionError("the client closed the connection"))
            protocol.transport.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(protocol.closed.wait(), CLOSE_WAIT_S)

    async def __aenter__(self) -> "AsyncGrpcClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, method: str, request: bytes, timeout_s: float | None = None) -> bytes:
        """As ``GrpcClient.call``, concurrently with other calls on the same connection."""
        if not self._usable():
            await self.connect()
        protocol = self._protocol
        assert protocol is not None
        session = protocol.session
        assert session is not None
        assert protocol.slots is not None
        async with protocol.slots:
            return await self._call(protocol, session, method, request, timeout_s)

    async def _call(
        self,
        protocol: "_Protocol",
        session: _ClientSession,
        method: str,
        request: bytes,
        timeout_s: float | None,
    ) -> bytes:
        if not protocol.can_write.is_set():
            await protocol.can_write.wait()
        if not session.usable:
            raise ConnectionError(f"connection to {self.host}:{self.port} lost: {session.lost or 'GOAWAY'}")
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        stream = session.open_stream()
        stream.call = _Answer(_resolver(future))
        head = self._head.block(session, method, timeout_s)
        session.send(stream, head, self._head.framed(request))
        try:
            answer = await future
        except asyncio.CancelledError:
            if stream.call is not None:
                stream.call = None
                session.reset(stream, 0x8)  # CANCEL
            raise
        if answer.error is not None:
            raise answer.error
        assert answer.message is not None
        return answer.message

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Iterable[str] | None = None,
        version: str | int | None = None,
        timeout_s: float | None = None,
        timing: bool = False,
        priority: int = 0,
    ) -> InferResult:
        request = encode_infer(model, inputs, outputs, version, timeout_s, timing, priority)
        return decode_infer(await self.call("ModelInfer", request, timeout_s))
