"""The binary TCP protocol front end: one ``asyncio.BufferedProtocol`` per connection on the server's
loop.

Wire format: docs/tcp-protocol.md; codecs: ``lumenrt.protocols.tcp``.

Invariants (flow control, timeouts, the sweeper and the shutdown order:
``lumenrt.ingress.connection``):
  - Every request frame gets exactly one response or error frame carrying its id, unless the
    connection is lost (or aborted for not reading) first: the request then still runs to its
    end in the engine and its answer is dropped. Answers go out as they complete, so they may
    overtake earlier requests.
  - A frame that breaks framing (bad magic or version, a size over a limit, a frame not received
    whole within ``receive_timeout_s``) is answered by an error frame (the frame's id when its
    header was readable, else 0); then the connection half-closes and input is discarded until
    the peer closes or ``LINGER_S`` passes (closing at once with unread input would reset the
    connection and could destroy the error frame before the peer reads it).
  - Backpressure: at most ``MAX_IN_FLIGHT`` requests are served per connection; at that point
    reading pauses for load until ``RESUME_IN_FLIGHT``; while it is paused for either reason the
    receiver keeps what was read and delivers no frame. The write buffer thus holds at
    most its high-water mark plus the answers of the requests in flight when it crossed it.
  - A frame in progress is the receiver's buffered tail; its identity is the count of frames
    delivered before it, so ``buffer_updated`` reads no clock for the receive timeout.
  - Everything here runs on the one event loop; the service is never called from another thread.

Buffers: the kernel reads into the front end's read buffer, shared by its connections, or into the
connection's own while it holds part of a frame (``lumenrt.protocols.tcp_receiver``; the sweeper
gives an idle connection's own buffer back, ``_release_idle``, so an idle connection holds none);
a request's input arrays are read-only views of it, valid while ``_on_frame`` runs:
the lane runs the model on them before it returns, and ``service.submit`` copies them into an
arena slot before it returns. A frame larger than that buffer, for a model with an arena, is
received into a slot the model lends (``_payload_into``, lent_slot.py): admission then finds the
inputs where they lie, and copies nothing. An answer's tensors are joined into one buffer when small, else
written as views of the output arrays, which the transport holds until they are sent.

Shutdown (``ServerApp.shutdown``, then ``Listener.close``): the service answers new requests with
503 error frames from ``stop_accepting``; requests still queued when the connections close are
finished by the engine and their answers dropped (``_write`` writes nothing once closing).
"""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from lumenrt.ingress.auth import ApiKey
from lumenrt.ingress.connection import Connection, Listener
from lumenrt.ingress.errors import as_server_error
from lumenrt.ingress.lent_slot import RECEIVE_IN_SLOT_MIN, LentSlot
from lumenrt.ingress.service import (
    InferenceService,
    InferOutcome,
    WireInput,
    timing_parameters,
)
from lumenrt.protocols.errors import ServerError
from lumenrt.protocols.raw import split_payload
from lumenrt.protocols.tcp import (
    AUTH,
    FLAG_TIMING,
    KIND_NAMES,
    KNOWN_FLAGS,
    REQUEST,
    TIMING_FIELDS,
    Frame,
    ProtocolError,
    RequestMeta,
    ResponseEncoder,
    decode_auth,
    decode_request_meta,
    encode_auth_ok,
    encode_error,
)
from lumenrt.protocols.tcp_receiver import FrameReceiver, ReadBuffer
from lumenrt.protocols.tensors import check_shape

MAX_IN_FLIGHT = 256  # requests served at once per connection before reading pauses (guessed)
RESUME_IN_FLIGHT = MAX_IN_FLIGHT // 2
LINGER_S = 1.0  # after a fatal error: how long unread input is discarded before closing (guessed)
PLAN_CACHE_ENTRIES = 4096  # decoded request metadata kept per front end ...
PLAN_CACHE_MAX_BYTES = 512  # ... only for blocks this small: at most 2 MiB of keys
DISCARD_BYTES = 4096  # a draining connection's reads, into one buffer per front end (guessed)


@dataclass(slots=True)
class _Plan:
    """A request metadata block decoded, shape-checked, and (once seen with a runtime) checked
    against that runtime's config: while the service returns the same runtime object for it,
    later requests with these bytes skip the name/datatype checks (they depend on nothing else)."""

    meta: RequestMeta
    runtime: Any = None
    outputs: list[str] = field(default_factory=list)


class _Request:
    """A checked request on its way to the workers, from its frame to its answer: the service's
    ``PendingAnswer`` (no Task, coroutine or Future per request; the engine calls back)."""

    __slots__ = (
        "conn",
        "engine_request",
        "outputs",
        "priority",
        "received_ns",
        "request_id",
        "runtime",
        "timing",
    )
    protocol = "tcp"  # the metrics' label (service.PendingAnswer)

    def __init__(
        self,
        conn: "TcpConnection",
        request_id: int,
        timing: bool,
        runtime: Any,
        outputs: list[str],
        received_ns: int,
        priority: int,
    ) -> None:
        self.conn, self.request_id, self.timing = conn, request_id, timing
        self.runtime, self.outputs, self.received_ns = runtime, outputs, received_ns
        self.priority = priority
        self.engine_request: Any = None  # set by the service's submit

    def answer(self, outcome: InferOutcome) -> None:
        conn = self.conn
        try:
            answer = conn._encode(self.request_id, outcome, self.timing)
        except Exception as exc:  # encoding failed: still exactly one answer
            err = as_server_error(exc)
            answer = encode_error(self.request_id, err.status, err.message)
        conn._answered(self, answer)

    def fail(self, error: ServerError) -> None:
        self.conn._answered(self, encode_error(self.request_id, error.status, error.message))


class TcpConnection(Connection, asyncio.BufferedProtocol):
    """One client connection. The transport reads straight into the receiver's buffer
    (``get_buffer``/``buffer_updated``, tcp_receiver.py): a request's bytes are copied once by
    the kernel, then once into an arena slot if it is queued (none if the lane runs it)."""

    def __init__(self, front: "TcpFrontEnd") -> None:
        super().__init__(front, front.limits)
        self.front = front
        self.service = front.service
        limits = self.limits
        self.decoder = FrameReceiver(
            self._on_frame,
            max_frame_bytes=limits.max_body_bytes,
            max_meta_bytes=limits.max_header_bytes,
            payload_into=self._payload_into,
            on_revoked=self._revoked,
            shared=front.read_buffer,
        )
        self.in_flight = 0
        self.pending: set[_Request] = set()  # with the workers: cancelled if the client goes
        self.draining = False  # after a fatal error: input discarded until close (implies closing)
        self.draining_since = 0.0
        self.peer_eof = False
        self._received_ns = 0
        # authentication (ingress/auth.py): the key of the connection's last AUTH frame
        self.key: ApiKey | None = None
        self.key_generation = 0  # the gate's generation when ``key`` was found (a reload re-finds it)
        self.presented = False  # an AUTH frame came (a key not found or removed answers 401)

    # ---- asyncio.BufferedProtocol ----------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.draining:
            return self.front.discard
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.received += 1
        if self.draining:
            return
        self._received_ns = time.monotonic_ns()
        try:
            self.decoder.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._fatal(exc)

    def eof_received(self) -> bool:
        """The peer will send no more: it has gone (or half-closed). Its requests still queued are
        cancelled: dropped before they run, answered with 499 if it still reads; the answers of
        those already running are written; then the connection closes."""
        self.peer_eof = True
        self._cancel_pending()
        return self.in_flight > 0 and not self.draining  # True keeps the transport open to write

    def connection_lost(self, exc: Exception | None) -> None:
        self.decoder.drop()  # a payload arriving into a lent slot: the slot goes back
        self._cancel_pending()
        super().connection_lost(exc)

    def _cancel_pending(self) -> None:
        if self.pending:
            cancel = self.service.cancel
            for request in list(self.pending):
                cancel(request)

    # ---- requests ----------------------------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        if self.closing:
            return
        rid = frame.request_id
        if frame.kind != REQUEST:
            if frame.kind == AUTH:
                self._authenticate(frame)
                return
            name = KIND_NAMES.get(frame.kind, "unknown")
            self._reply_error(
                rid, 400, f"frame kind {frame.kind} ({name}) is not accepted by the server: send requests (1)"
            )
            return
        if rid == 0:
            self._fatal(ProtocolError("request id 0 is reserved for connection errors", fatal=True))
            return
        try:
            if frame.flags & ~KNOWN_FLAGS:
                raise ProtocolError(f"request flags 0x{frame.flags:02x} have unknown bits set")
            plan = self.front.plan(frame.meta)
            meta = plan.meta
            if meta.payload_bytes != frame.payload_bytes:
                raise ProtocolError(
                    f"request payload is {frame.payload_bytes} bytes but its inputs total {meta.payload_bytes}"
                )
            arrays = split_payload(frame.data, frame.payload_at, meta.slots, "input", ProtocolError)
            service = self.service
            if service.gate is not None:
                self._check_key()
            rt = service.runtime(meta.model, meta.version or None)
            if service.limiter is not None:
                service.admit_client(self._client(), rt, "tcp", self._received_ns)
            if rt is plan.runtime:  # names and datatypes already checked against this runtime
                checked = {s.name: a for s, a in zip(meta.slots, arrays, strict=True)}
            else:
                checked = self.front.check(plan, rt, arrays)
            outputs = plan.outputs
        except (ServerError, ProtocolError) as exc:
            self._reply_error(rid, exc.status, exc.message)
            return
        except Exception as exc:
            err = as_server_error(exc)
            self._reply_error(rid, err.status, err.message)
            return
        timing = bool(frame.flags & FLAG_TIMING)
        timeout_s = meta.timeout_us / 1e6 if meta.timeout_us else None
        priority = frame.priority
        if priority:
            try:
                self.service.check_priority(rt, priority, "the header's priority field")
            except ServerError as exc:
                self._reply_error(rid, exc.status, exc.message)
                return
        try:  # a small model: answered here and now when its queue is empty
            out = self.service.infer_inline(
                rt,
                checked,
                outputs,
                timeout_s=timeout_s,
                timing=timing,
                received_ns=self._received_ns,
                protocol="tcp",
                request_id=rid,
                priority=priority,
            )
        except ServerError as exc:
            self._reply_error(rid, exc.status, exc.message)
            return
        if out is not None:
            self._answer(rid, out, timing)
            return
        self.in_flight += 1  # before: the engine may answer inside submit (spin_us)
        request = _Request(self, rid, timing, rt, outputs, self._received_ns, priority)
        self.pending.add(request)
        try:
            lent = self.decoder.lent  # the slot the payload arrived in, if one was lent
            received = lent if isinstance(lent, LentSlot) else None
            self.service.submit(request, checked, timeout_s, received=received)
        except ServerError as exc:  # refused at once: answered here, never called back
            self.pending.discard(request)
            self.in_flight -= 1
            self._reply_error(rid, exc.status, exc.message)
            return
        if self.in_flight >= MAX_IN_FLIGHT:
            self._pause_for_load()

    def _payload_into(self, meta: bytes, payload_bytes: int) -> LentSlot | None:
        """Where a large request frame's payload is received (tcp_receiver.py): a slot lent by its
        model (lent_slot.py), when the metadata names a model with an arena that this connection
        may use, and the payload is the inputs' total. Else None: the frame takes the ordinary
        path, which answers what is wrong with it."""
        service = self.service
        if payload_bytes < RECEIVE_IN_SLOT_MIN or self.closing or not service.accepting:
            return None
        try:
            plan = self.front.plan(meta)
            if plan.meta.payload_bytes != payload_bytes:
                return None
            if service.gate is not None:
                self._check_key()
            rt = service.runtime(plan.meta.model, plan.meta.version or None)
        except Exception:  # answered when the frame is delivered
            return None
        return LentSlot.borrow(rt, payload_bytes)

    def _revoked(self, request_id: int) -> None:
        """The model closed while a request's payload arrived into its slot (lent_slot.py)."""
        self._reply_error(request_id, 503, "the model was unloaded while the request arrived")

    # ---- authentication and rate limits -------------------------------------------------------

    def _authenticate(self, frame: Frame) -> None:
        """An AUTH frame: the connection's key from now on, answered AUTH_OK with its name; a key
        the server does not know ends the connection (401), so keys cannot be tried in a loop."""
        rid = frame.request_id
        gate = self.service.gate
        try:
            presented = decode_auth(frame.meta)
        except ProtocolError as exc:
            self._fatal(ProtocolError(exc.message, fatal=True, request_id=rid))
            return
        if gate is None:  # no keys configured: every endpoint is open, any key is accepted
            self._write(encode_auth_ok(rid, ""))
            return
        key = gate.keys.find(presented)
        if key is None:
            gate.refused["unauthenticated"] += 1
            self._fatal(ProtocolError("the API key is not valid", status=401, fatal=True, request_id=rid))
            return
        self.key, self.key_generation, self.presented = key, gate.generation, True
        self._write(encode_auth_ok(rid, key.name))

    def _check_key(self) -> None:
        """401/403 unless the connection's key may use the inference endpoints."""
        gate = self.service.gate
        assert gate is not None
        if gate.is_open("inference"):
            return
        key = self.key
        if key is not None and self.key_generation != gate.generation:  # keys reloaded
            key = self.key = gate.keys.by_digest.get(key.digest)
            self.key_generation = gate.generation
        gate.check("inference", key, self.presented)

    def _client(self) -> str:
        """Who sends, for the rate limits: the key's name, else the peer's address."""
        return self.key.name if self.key is not None else self.peer_host

    def _answered(self, request: _Request, answer: bytes | list[Any]) -> None:
        """The engine answered a queued request (``_Request``): write it, resume reading."""
        self.pending.discard(request)
        self.in_flight -= 1
        self._write(answer)
        if self.load_paused and self.in_flight <= RESUME_IN_FLIGHT:
            self._resume_for_load()
        if self.peer_eof and self.in_flight == 0 and not self.reading_paused:
            self.close()

    def _encode(self, request_id: int, out: InferOutcome, timing: bool) -> bytes | list[Any]:
        fields = None
        if timing:
            stages = timing_parameters(out.times)
            fields = [stages[k] for k in TIMING_FIELDS]
        return self.front.responses.encode(request_id, out.model, out.version, out.outputs, fields)

    def _answer(self, request_id: int, out: InferOutcome, timing: bool) -> None:
        """Write an inline answer (one answer: an encoding failure is answered as an error)."""
        try:
            answer = self._encode(request_id, out, timing)
        except Exception as exc:
            err = as_server_error(exc)
            answer = encode_error(request_id, err.status, err.message)
        self._write(answer)

    def _write(self, answer: bytes | list[Any]) -> None:
        transport = self.transport
        if self.closing or transport is None or transport.is_closing():
            return
        if isinstance(answer, bytes):
            transport.write(answer)
        elif len(answer) == 1:  # small frames come joined from the encoder
            transport.write(answer[0])
        else:
            transport.writelines(answer)

    def _reply_error(self, request_id: int, status: int, message: str) -> None:
        self._write(encode_error(request_id, status, message))

    def _fatal(self, exc: ProtocolError) -> None:
        """Answer, half-close, and discard input until the peer closes or LINGER_S passes."""
        if self.draining:
            return
        self._write(
            encode_error(exc.request_id, exc.status, exc.message, closing=True, version=exc.reply_version)
        )
        self.draining = self.closing = True  # from here on answers are dropped (the write side is shut)
        self.decoder.drop()
        self.draining_since = self._clock()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._read_while_closing()  # unread input would reset the connection
        if transport.can_write_eof():
            transport.write_eof()
        else:  # pragma: no cover - TCP transports can always half-close
            self._close_transport()

    # ---- connection hooks (lumenrt.ingress.connection) ---------------------------------------

    def _serving(self) -> bool:
        return self.in_flight > 0

    def _refuse(self, message: str) -> None:
        if self.transport is not None:
            self.transport.write(encode_error(0, 429, message, closing=True))

    def _partial(self) -> int:
        return self.decoder.frames if self.decoder.buffered_bytes else -1

    def _receive_timed_out(self) -> None:
        self._fatal(
            ProtocolError(
                f"frame not received whole within {self.limits.receive_timeout_s:g} s "
                f"({self.decoder.buffered_bytes} bytes of it arrived)",
                status=408,
                fatal=True,
            )
        )

    def _release_idle(self) -> None:
        self.decoder.trim()

    def _hold_input(self) -> None:
        self.decoder.pause()

    def _release_input(self) -> None:
        try:
            self.decoder.resume()  # may pause again part way
        except ProtocolError as exc:
            self._fatal(exc)

    def _check_closing(self, now: float, transport: asyncio.Transport) -> None:
        """Lingering after a fatal error comes first; then the flush of a closed connection."""
        if self.draining and not transport.is_closing():
            if now - self.draining_since >= LINGER_S:
                self._close_transport()
            return
        super()._check_closing(now, transport)


class TcpFrontEnd(Listener[TcpConnection]):
    """The listening socket, its connections and the sweeper (``Listener``; ``FrontEnd`` in
    app.py) and the caches shared by its connections."""

    def __init__(self, service: InferenceService, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(service.limits)
        self.service = service
        self.loop = loop
        self._plans: dict[bytes, _Plan] = {}
        self.responses = ResponseEncoder()
        # owned by the front end, lent to one connection's read at a time (tcp_receiver.py)
        self.read_buffer = ReadBuffer()
        self.discard = memoryview(bytearray(DISCARD_BYTES))  # read into and never looked at

    def _connection(self) -> TcpConnection:
        return TcpConnection(self)

    def plan(self, raw: bytes) -> _Plan:
        """Decoded and shape-checked request metadata; cached by its bytes (a client sends the same
        few blocks again and again)."""
        plan = self._plans.get(raw)
        if plan is not None:
            return plan
        meta = decode_request_meta(raw)
        max_elements = self.service.limits.max_elements
        for d in meta.inputs:
            check_shape(d.shape, f"input {d.name!r}", max_elements)
        plan = _Plan(meta)
        if len(raw) <= PLAN_CACHE_MAX_BYTES:
            if len(self._plans) >= PLAN_CACHE_ENTRIES:
                self._plans.clear()
            self._plans[raw] = plan
        return plan

    def check(self, plan: _Plan, rt: Any, arrays: list[Any]) -> dict[str, Any]:
        """The service's input and output checks; remembered in ``plan`` when they pass."""
        meta = plan.meta
        wire = [WireInput(d.name, d.datatype, d.shape, a) for d, a in zip(meta.inputs, arrays, strict=True)]
        checked = self.service.check_inputs(rt, wire)
        plan.outputs = self.service.check_outputs(rt, list(meta.outputs))
        plan.runtime = rt
        return checked


async def start_tcp(service: InferenceService, host: str, port: int, ssl: Any = None) -> TcpFrontEnd:
    """Listen on ``host:port`` (0: any free port; see ``.port``); ``ssl``: an ``ssl.SSLContext``
    for TLS (ingress/tls.py)."""
    front = TcpFrontEnd(service, asyncio.get_running_loop())
    await front.listen(host, port, ssl)
    return front
