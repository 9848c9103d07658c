"""Clients of the lumenrt binary TCP protocol (docs/tcp-protocol.md).

    with TcpClient("127.0.0.1", 8003) as client:            # blocking, one socket
        result = client.infer("digits_mlp", {"input": x}, timing=True)
        result.outputs["label"], result.timing["compute_ns"]
        ids = [client.send("digits_mlp", {"input": x}) for x in rows]   # pipelined
        results = [client.recv(i) for i in ids]

    async with AsyncTcpClient("127.0.0.1", 8003) as client:  # asyncio, one connection
        results = await asyncio.gather(*(client.infer("digits_mlp", {"input": x}) for x in rows))

Both send many requests over one connection and match answers to requests by id: answers may
arrive in any order. A request the server refuses raises :class:`InferenceError`; a connection
that is lost or broken raises ``ConnectionError`` for every request still waiting, and the next
request opens a new connection. Neither object is thread-safe (use one client per thread).

Latency: TCP_NODELAY is set; a small request is one ``send`` of header, metadata and tensor bytes
joined; the blocking socket has no timeout by default, because a socket timeout makes CPython
poll before every receive (one more system call per answer).
"""

import asyncio
import contextlib
import socket
import ssl as ssl_module
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

from lumenrt.client.errors import InferenceError
from lumenrt.client.result import InferResult
from lumenrt.client.sockets import open_socket, open_transport, set_nodelay
from lumenrt.protocols.tcp import (
    ERROR,
    FLAG_CLOSING,
    FLAG_TIMING,
    MAX_PAYLOAD_BYTES,
    RESPONSE,
    Frame,
    FrameDecoder,
    ProtocolError,
    RequestEncoder,
    ResponseDecoder,
    decode_error,
    encode_auth,
)

# One receive call's buffer. Kept under glibc's 128 KiB mmap threshold: recv(256 KiB) measured
# 14-19 us per call on the dev VM (a fresh mapping each time) against 3.0 us for recv(64 KiB).
RECV_BYTES = 64 << 10
IDLE_CHECK_S = 1.0  # after this long without traffic, check the server has not closed the socket
PIPELINE_WINDOW = 128  # infer_many: requests in flight at once (below the server's 256 per connection)
CLOSE_WAIT_S = 5.0  # AsyncTcpClient.close: the most it waits for the connection to close (guessed)
MAX_META_BYTES = 1 << 20  # response metadata accepted from a server


def _timeout_us(timeout_s: float | None) -> int:
    if timeout_s is None:
        return 0
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    return max(1, round(timeout_s * 1e6))


class _Codec:
    """Encodes requests and turns received frames into results or errors (both clients)."""

    def __init__(self) -> None:
        self.requests = RequestEncoder()
        self.responses = ResponseDecoder()

    def encode(
        self,
        request_id: int,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Iterable[str] | None,
        version: str | int | None,
        timeout_s: float | None,
        timing: bool,
        priority: int = 0,
    ) -> list[Any]:
        return self.requests.encode(
            request_id,
            model,
            inputs,
            "" if version is None else str(version),
            () if outputs is None else tuple(outputs),
            _timeout_us(timeout_s),
            FLAG_TIMING if timing else 0,
            priority,
        )

    def result(self, frame: Frame) -> InferResult:
        if frame.kind == RESPONSE:
            try:
                desc, outputs, timing = self.responses.decode(frame)
            except ProtocolError as exc:
                raise InferenceError(
                    502, f"bad response from the server: {exc.message}", frame.request_id
                ) from None
            return InferResult(desc.model, str(desc.version), outputs, timing, frame.request_id)
        if frame.kind == ERROR:
            raise self.error(frame)
        raise InferenceError(502, f"unexpected frame kind {frame.kind} from the server", frame.request_id)

    @staticmethod
    def error(frame: Frame) -> InferenceError:
        try:
            info = decode_error(frame.meta)
        except ProtocolError as exc:
            return InferenceError(502, f"bad error frame from the server: {exc.message}", frame.request_id)
        return InferenceError(info.status, info.message, frame.request_id)


class TcpClient:
    """A blocking client over one TCP connection (opened at the first request or ``connect``)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8003,
        *,
        connect_timeout_s: float = 10.0,
        network_timeout_s: float | None = None,
        idle_check_s: float = IDLE_CHECK_S,
        api_key: str | None = None,
        ssl: "ssl_module.SSLContext | None" = None,
    ) -> None:
        """``network_timeout_s``: how long a send or receive may block (None: no limit, fastest).
        A request's own deadline is ``infer(timeout_s=...)``, enforced by the server.
        ``idle_check_s``: a request sent after this long without traffic first checks (one
        non-blocking peek) that the server has not closed the connection, and reconnects if so."""
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.network_timeout_s = network_timeout_s
        self.idle_check_s = idle_check_s
        self._api_key = api_key  # sent in an AUTH frame first on every connection
        self._ssl = ssl  # TLS with this context (lumenrt.client.tls.client_context)
        self._sock: socket.socket | None = None
        self._decoder: FrameDecoder | None = None
        self._codec = _Codec()
        self._frames: dict[int, Frame] = {}  # answers received, not yet collected
        self._pending: set[int] = set()  # sent on the current connection, not yet collected
        self._lost: dict[int, BaseException] = {}  # sent on a connection that ended unanswered
        self._broken: BaseException | None = None  # why the current connection ended
        self._closing: InferenceError | None = None  # an error frame that ends the connection
        self._next_id = 1
        self._last_io = 0.0

    # ---- connection --------------------------------------------------------------------------

    def connect(self) -> None:
        if self._sock is not None:
            return
        sock = open_socket(self.host, self.port, self.connect_timeout_s, self.network_timeout_s, self._ssl)
        self._sock = sock
        self._decoder = FrameDecoder(
            self._on_frame, max_frame_bytes=MAX_PAYLOAD_BYTES, max_meta_bytes=MAX_META_BYTES
        )
        self._broken = None
        self._closing = None
        self._last_io = time.monotonic()
        if self._api_key is not None:  # not awaited: a refused key ends the connection with 401
            sock.sendall(encode_auth(self._take_id(), self._api_key))

    def _take_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1 if rid < (1 << 64) - 1 else 1
        return rid

    def close(self) -> None:
        """Close the connection; answers not yet collected are dropped."""
        self._close_socket()
        self._frames.clear()
        self._pending.clear()
        self._lost.clear()

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        self._decoder = None

    def __enter__(self) -> "TcpClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ready_socket(self) -> socket.socket:
        """The socket to send on: a new connection when the last one ended."""
        sock = self._sock
        if sock is not None and not self._pending and time.monotonic() - self._last_io >= self.idle_check_s:
            closed = _closed_while_idle(sock)
            if closed:
                self._drop(ConnectionError("closed by the server while idle"))
                sock = None
        if sock is None:
            self.connect()
            sock = self._sock
            assert sock is not None
        return sock

    def _drop(self, why: BaseException) -> None:
        """The connection ended: requests still unanswered on it fail with ``why``."""
        self._broken = why
        for rid in self._pending:
            if rid not in self._frames:
                self._lost[rid] = why
        self._pending = {rid for rid in self._pending if rid in self._frames}
        self._close_socket()

    # ---- requests ------------------------------------------------------------------------------

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
        """One request, answered: outputs by name (every output unless ``outputs`` names some).
        ``priority``: its priority level, 1 first (0: the model's default level)."""
        return self.recv(self.send(model, inputs, outputs, version, timeout_s, timing, priority))

    def send(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Iterable[str] | None = None,
        version: str | int | None = None,
        timeout_s: float | None = None,
        timing: bool = False,
        priority: int = 0,
    ) -> int:
        """Send a request without waiting; returns its id for ``recv``."""
        sock = self._ready_socket()
        rid = self._take_id()
        parts = self._codec.encode(rid, model, inputs, outputs, version, timeout_s, timing, priority)
        try:
            if len(parts) == 1:  # small frames come joined from the encoder
                sock.sendall(parts[0])
            else:
                for part in parts:
                    sock.sendall(part)
        except OSError as exc:
            self._drop(exc)
            raise ConnectionError(f"sending to {self.host}:{self.port} failed: {exc}") from exc
        self._pending.add(rid)
        return rid

    def recv(self, request_id: int) -> InferResult:
        """Wait for the answer to ``request_id``; raises InferenceError if it is an error."""
        if request_id not in self._pending:
            why = self._lost.pop(request_id, None)
            if why is not None:
                raise ConnectionError(f"request {request_id} unanswered: the connection ended ({why})")
            raise ValueError(f"request {request_id} is not pending on this client")
        frames = self._frames
        frame = frames.pop(request_id, None)
        while frame is None:
            self._receive()  # raises when the connection ends
            frame = frames.pop(request_id, None)
        self._pending.discard(request_id)
        return self._codec.result(frame)

    def infer_many(
        self,
        model: str,
        batch: Iterable[Mapping[str, Any]],
        outputs: Iterable[str] | None = None,
        version: str | int | None = None,
        timeout_s: float | None = None,
        timing: bool = False,
        window: int = PIPELINE_WINDOW,
    ) -> list[InferResult | InferenceError]:
        """Pipelined: keeps up to ``window`` requests in flight; results in the order of ``batch``
        (a refused request gives its InferenceError in its place instead of raising)."""
        wanted = list(outputs) if outputs is not None else None
        ids: list[int] = []
        results: list[InferResult | InferenceError] = []
        for inputs in batch:
            if len(ids) - len(results) >= window:
                results.append(self._collect(ids[len(results)]))
            ids.append(self.send(model, inputs, wanted, version, timeout_s, timing))
        while len(results) < len(ids):
            results.append(self._collect(ids[len(results)]))
        return results

    def _collect(self, request_id: int) -> InferResult | InferenceError:
        try:
            return self.recv(request_id)
        except InferenceError as exc:
            return exc

    def _receive(self) -> None:
        """Read once and file the frames; raises when the connection ends (the error frame of a
        connection-level error as InferenceError, else ConnectionError)."""
        sock, decoder = self._sock, self._decoder
        assert sock is not None and decoder is not None  # pending ids imply a connection
        try:
            data = sock.recv(RECV_BYTES)
        except OSError as exc:
            self._drop(exc)
            raise ConnectionError(f"receiving from {self.host}:{self.port} failed: {exc}") from exc
        self._last_io = time.monotonic()
        if not data:
            unanswered = len(self._pending) - len(self._frames)
            self._drop(ConnectionError("closed by the server"))
            raise ConnectionError(
                f"connection closed by {self.host}:{self.port}, {unanswered} requests unanswered"
            )
        try:
            decoder.feed(data)
        except ProtocolError as exc:
            self._drop(exc)
            raise ConnectionError(f"bad frame from the server: {exc.message}") from None
        closing, self._closing = self._closing, None
        if closing is not None:  # the server closes the connection after that error frame
            self._drop(closing)
            if closing.request_id == 0 or closing.request_id not in self._frames:
                raise closing

    def _on_frame(self, frame: Frame) -> None:
        rid = frame.request_id
        if rid in self._pending:
            self._frames[rid] = frame
        if frame.kind == ERROR and (rid == 0 or frame.flags & FLAG_CLOSING):
            # the server closes the connection after this frame: what else is pending fails
            self._closing = self._codec.error(frame)


def _closed_while_idle(sock: socket.socket) -> bool:
    """Whether the server closed an idle connection (its idle timeout): one non-blocking peek, or
    for TLS one non-blocking read (TLS cannot peek; an idle server sends nothing but session
    tickets, which the read takes in; anything else means the stream is no longer usable)."""
    if isinstance(sock, ssl_module.SSLSocket):
        timeout = sock.gettimeout()
        sock.setblocking(False)
        try:
            sock.recv(1)
            return True  # b"": closed; a byte nobody asked for: the stream is out of step
        except (ssl_module.SSLWantReadError, ssl_module.SSLWantWriteError, BlockingIOError):
            return False
        except OSError:
            return True
        finally:
            sock.settimeout(timeout)
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, client: "AsyncTcpClient") -> None:
        self.client = client
        self.decoder = FrameDecoder(
            self._on_frame, max_frame_bytes=MAX_PAYLOAD_BYTES, max_meta_bytes=MAX_META_BYTES
        )
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[Frame]] = {}
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.lost: BaseException | None = None
        self.closed = asyncio.Event()  # connection_lost ran: the socket is closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.decoder.feed(data)
        except ProtocolError as exc:
            self._fail(ConnectionError(f"bad frame from the server: {exc.message}"))
            if self.transport is not None:
                self.transport.close()

    def _on_frame(self, frame: Frame) -> None:
        future = self.pending.pop(frame.request_id, None)
        if future is not None and not future.done():
            future.set_result(frame)
        if frame.kind == ERROR and (frame.request_id == 0 or frame.flags & FLAG_CLOSING):
            self._fail(_Codec.error(frame))  # the server closes after this frame
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"connection lost: {exc or 'closed by the server'}"))
        self.can_write.set()
        self.closed.set()

    def _fail(self, why: BaseException) -> None:
        if self.lost is None:
            self.lost = why
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(why)

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()


class AsyncTcpClient:
    """An asyncio client: any number of concurrent ``await infer(...)`` over one connection."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8003,
        *,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        ssl: "ssl_module.SSLContext | None" = None,
    ) -> None:
        """``api_key``: sent in an AUTH frame first on every connection; ``ssl``: TLS with this
        context (``lumenrt.client.tls.client_context``)."""
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self._ssl = ssl
        self._api_key = api_key  # sent in an AUTH frame first on every connection
        self._protocol: _ClientProtocol | None = None
        self._codec = _Codec()
        self._next_id = 1
        self._connecting: asyncio.Lock | None = None

    async def connect(self) -> None:
        if self._protocol is not None and self._protocol.lost is None:
            return
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._protocol is not None and self._protocol.lost is None:
                return
            _, protocol = await open_transport(
                lambda: _ClientProtocol(self), self.host, self.port, self._ssl, self.connect_timeout_s
            )
            self._protocol = protocol
            if self._api_key is not None and protocol.transport is not None:
                protocol.transport.write(encode_auth(self._take_id(), self._api_key))

    def _take_id(self) -> int:
        rid = self._next_id
        self._next_id = rid + 1 if rid < (1 << 64) - 1 else 1
        return rid

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
            # TLS closes in a few loop turns (close_notify): wait, so that a loop closed right after
            # does not leave the socket open
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(protocol.closed.wait(), CLOSE_WAIT_S)

    async def __aenter__(self) -> "AsyncTcpClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            await self.connect()
            protocol = self._protocol
            assert protocol is not None
        if not protocol.can_write.is_set():
            await protocol.can_write.wait()
        transport = protocol.transport
        if protocol.lost is not None or transport is None:
            raise ConnectionError(f"connection to {self.host}:{self.port} lost: {protocol.lost}")
        rid = self._take_id()
        parts = self._codec.encode(rid, model, inputs, outputs, version, timeout_s, timing, priority)
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        protocol.pending[rid] = future
        if len(parts) == 1:
            transport.write(parts[0])
        else:
            transport.writelines(parts)
        try:
            frame = await future
        finally:
            protocol.pending.pop(rid, None)
        return self._codec.result(frame)
