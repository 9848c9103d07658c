"""KServe V2 over gRPC on lumenrt's own HTTP/2 server (the default; ``--grpc-server grpcio`` serves the
same calls on grpc.aio instead): tritonclient.grpc, perf_analyzer and the KServe SDK unchanged.

Why our own: a grpc.aio server costs a call more than our whole HTTP/1.1 path does (a Task, the
core's completion queue, a thread hop per call; benchmarks/grpc_floor.py measured its bare echo at
about 2x lumenrt's HTTP round trip). Here a unary call is parsed by ``protocols/http2.py`` and
``grpc_wire.py`` on the event loop and reaches the service the way HTTP's requests do: ModelInfer
runs inline when the model's lane takes it, else it is submitted with a call back
(``InferenceService.submit``), with no Task or Future; its answer (HEADERS, DATA, trailers) is one
write. The other rpcs (metadata, statistics, the repository, shared memory) run as a Task each
through ``grpc_service.GrpcServicer``, as on grpc.aio.

Every rpc of the .proto is served under Triton's name (``/inference.GRPCInferenceService/<rpc>``);
any other path is UNIMPLEMENTED, as grpc answers it. Requests may be identity, gzip or deflate
coded (``grpc-encoding``; inflated within the message limit); answers are identity.

Invariants (flow control, timeouts and the sweeper are ``connection.py``'s; HTTP/2's own rules are
``protocols/http2.py``'s)
  1. A call is ARRIVING (its request not whole), then RUNNING, then DONE, and ``_end`` moves it
     to DONE once, keeping ``_open``, ``_in_flight`` and ``calls`` in step, whatever ends it.
     Every call whose request arrived whole gets exactly one answer, on its stream: the rpc's
     message and ``grpc-status 0``, or a status that names the problem (a ServerError's status
     through ``errors.GRPC_CODES``; a call that breaks gRPC's rules gets grpc_wire's code). A
     call answered before its request ended (a message over the limit) is then reset with
     NO_ERROR, so the client stops sending. A call the client resets is dropped: a request not
     yet run is cancelled in the engine, a running one finishes and its answer is discarded.
  2. A message is never buffered beyond ``limits.max_body_bytes``: its length prefix is checked
     first, then its buffer grows with the bytes that arrive (``grpc_wire.MessageReader``), and a
     compressed one is inflated with the same bound. The calls arriving on one connection hold at
     most ``limits.max_body_bytes`` together; past that, the call that would pass it is answered
     RESOURCE_EXHAUSTED. A message received into a lent slot (invariant 7) is not counted there:
     the arena's memory is allocated already, and the runtime lends at most a quarter of it.
  3. At most ``MAX_STREAMS`` calls are open on a connection (SETTINGS_MAX_CONCURRENT_STREAMS; more
     are refused with REFUSED_STREAM, which clients retry). A call the client reset while it runs
     counts until its answer comes back and is dropped, so that resetting streams as fast as
     they open cannot start more work than that.
  4. A call whose request has not arrived whole ``limits.receive_timeout_s`` after the sweep that
     first saw it arriving is answered DEADLINE_EXCEEDED and reset; the connection goes on.
  5. Everything runs on the loop's thread, as the service's counters need.
  6. What handling one read writes (the answers of the calls it completed and ran inline, window
     updates, a PING's ACK) is held and written once at its end: a client with several calls in
     flight on one connection gets their answers for one system call, not one each. Answers that
     come back from the workers are written as they come.
  7. A large ModelInfer message of a signature already seen is received into an arena slot lent
     by its model (grpc_body.py) instead of a buffer: its tensor bytes are copied once, from the
     read to where the engine adopts them. The slot goes back on every path that ends the call
     (``_end``; the connection lost or closing while it arrives: ``cancel_calls`` answers it
     UNAVAILABLE), unless admission took it, and nothing is written into it after: DATA for a
     call no longer ARRIVING is dropped, and an answer is encoded before its slot goes back (the
     outputs may be views of it). Octets not where the signature puts them make
     the message rebuilt, as sent, for the ordinary path.

Shutdown order (driven by ``ServerApp.shutdown``)
  1. the service stops accepting: ModelInfer is answered UNAVAILABLE from now on;
  2. ``stop_listening``: the listening socket closes and every connection sends GOAWAY with the
     last stream it took: calls already begun are still served, a client opens new ones elsewhere;
  3. the app waits for the service's in-flight requests (at most ``limits.grace_s``);
  4. ``close``: rpc Tasks still running are cancelled, calls still queued in the engine are
     cancelled with them, and the connections close once their answers are flushed.
"""

import asyncio
import logging
import time
from typing import Any

from google.protobuf.message import DecodeError

from lumenrt.ingress.connection import Connection, Listener
from lumenrt.ingress.errors import GRPC_CODES, as_server_error, unavailable
from lumenrt.ingress.grpc_body import SlotMessage
from lumenrt.ingress.grpc_service import (
    GROUPS,
    SERVICE_NAME,
    GrpcServicer,
    PreparedInfer,
    infer_response_bytes,
    pb,
    prepare_infer_bytes,
    prepare_infer_slot,
    receive_plan,
    rpc_methods,
    snake,
)
from lumenrt.ingress.lent_slot import RECEIVE_IN_SLOT_MIN
from lumenrt.ingress.service import InferenceService, InferOutcome
from lumenrt.protocols import grpc_wire as wire
from lumenrt.protocols.errors import ServerError
from lumenrt.protocols.http2 import NO_ERROR, H2Session, H2Stream, LocalSettings

logger = logging.getLogger(__name__)

MAX_STREAMS = 100  # calls open at once on one connection (invariant 3; grpc's default too)
HEADS_KEPT = 64  # parsed request heads kept per connection (as hpack's CACHE_BLOCKS)
# a large ModelInfer's leading fields are looked for in this many octets of its first piece
# (grpc_body.py; guessed: names, shapes and parameters of a few inputs take a few hundred)
HEAD_SCAN_BYTES = 16 << 10
_INFER_PATH = f"/{SERVICE_NAME}/ModelInfer"


class _Rpc:
    """One rpc of the service: how its request is parsed and who handles it."""

    __slots__ = ("group", "handler", "name", "request_class")

    def __init__(self, name: str, request_class: Any, handler: Any) -> None:
        self.name = name
        self.request_class = request_class
        self.handler = handler
        self.group = GROUPS[name]


ARRIVING, RUNNING, DONE = 0, 1, 2  # a call's state (invariant 1)


class _Call:
    """One call on one stream, from its request headers to its answer; for ModelInfer also the
    service's ``PendingAnswer`` (the engine calls ``answer`` or ``fail`` back on the loop)."""

    __slots__ = (
        "buffered",
        "conn",
        "engine_request",
        "head",
        "message",
        "outputs",
        "prepared",
        "priority",
        "reader",
        "received_ns",
        "reset",
        "rpc",
        "runtime",
        "seen_s",
        "slot",
        "state",
        "stream",
        "task",
        "timing",
    )
    protocol = "grpc"  # the metrics' label (service.PendingAnswer)

    def __init__(self, conn: "GrpcConnection", stream: H2Stream, head: wire.CallHead, rpc: _Rpc) -> None:
        self.conn = conn
        self.stream = stream
        self.head = head
        self.rpc = rpc
        self.message: bytes | None = None  # the request, when its first DATA held it whole
        self.reader: wire.MessageReader | None = None  # else what takes it frame by frame
        self.slot: SlotMessage | None = None  # or a lent slot (grpc_body.py; invariant 7)
        self.state = ARRIVING
        self.buffered = 0  # bytes of its request held while it arrives (the connection's budget)
        self.seen_s = 0.0  # the sweep that first saw it arriving (its receive timeout; invariant 4)
        self.reset = False  # the client reset it while it ran: counted in the session's extra_streams
        self.received_ns = 0
        self.engine_request: Any = None  # set by the service's submit
        self.task: asyncio.Task[None] | None = None
        self.prepared: PreparedInfer | None = None  # ModelInfer's, checked
        # service.PendingAnswer's fields (from ``prepared`` when it goes to the workers)
        self.runtime: Any = None
        self.outputs: list[str] = []
        self.timing = False
        self.priority = 0

    @property
    def request_id(self) -> str | None:
        return self.prepared.request_id if self.prepared is not None else None

    # ---- the context the servicer's methods are given (grpc.aio's shape) ------------------------

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.head.metadata

    def peer(self) -> str:
        return self.conn.peer

    def time_remaining(self) -> float | None:
        timeout_s = self.head.timeout_s
        if timeout_s is None:
            return None
        return max(0.0, timeout_s - (time.monotonic_ns() - self.received_ns) / 1e9)

    # ---- service.PendingAnswer ------------------------------------------------------------------

    def answer(self, outcome: InferOutcome) -> None:
        self.conn._answer_infer(self, outcome)

    def fail(self, error: ServerError) -> None:
        self.conn._fail(self, error)


class _Session(H2Session):
    """The HTTP/2 session of one connection, its hooks handed to the connection."""

    __slots__ = ("conn",)

    def __init__(self, conn: "GrpcConnection", write: Any, local: LocalSettings) -> None:
        super().__init__(client=False, write=write, local=local)
        self.conn = conn

    def on_headers(self, stream: H2Stream, fields: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        self.conn._headers(stream, fields, end_stream)

    def on_data(self, stream: H2Stream, data: memoryview, end_stream: bool) -> None:
        self.conn._data(stream, data, end_stream)

    def on_reset(self, stream: H2Stream, code: int) -> None:
        self.conn._reset(stream)

    def on_error(self, code: int, message: str) -> None:
        logger.debug("gRPC connection from %s: HTTP/2 error %d: %s", self.conn.peer, code, message)
        self.conn.close()


class GrpcH2Server(Listener["GrpcConnection"]):
    """The gRPC front end's listener (the app's FrontEnd)."""

    def __init__(self, service: InferenceService) -> None:
        super().__init__(service.limits)
        self.service = service
        servicer = GrpcServicer(service)
        self.rpcs: dict[str, _Rpc] = {}
        for method in rpc_methods():
            self.rpcs[f"/{SERVICE_NAME}/{method.name}"] = _Rpc(
                method.name, getattr(pb, method.input_type.name), getattr(servicer, snake(method.name))
            )
        self.settings = LocalSettings(
            max_concurrent_streams=MAX_STREAMS, max_header_list_bytes=service.limits.max_header_bytes
        )
        self.tasks: set[asyncio.Task[None]] = set()  # rpcs other than ModelInfer, while they run
        self.going_away = False

    def _connection(self) -> "GrpcConnection":
        return GrpcConnection(self)

    async def stop_listening(self) -> None:
        """Shutdown step 2."""
        await super().stop_listening()
        self.going_away = True
        for conn in list(self.connections):
            conn.goaway()

    async def close(self) -> None:
        """Shutdown step 4."""
        self.going_away = True
        for task in list(self.tasks):
            task.cancel()
        for conn in list(self.connections):
            conn.cancel_calls()
        await super().close()


async def start_grpc_h2(service: InferenceService, host: str, port: int, ssl: Any = None) -> GrpcH2Server:
    """Serve ``service`` over gRPC on host:port (0: any free port) on the running loop; ``ssl``: a
    server context that offers ALPN ``h2`` (``ServerTls.h2_context``)."""
    server = GrpcH2Server(service)
    await server.listen(host, port, ssl)
    return server


class GrpcConnection(Connection, asyncio.Protocol):
    __slots__ = (
        "_buffered",
        "_corked",
        "_heads",
        "_in_flight",
        "_open",
        "calls",
        "loop",
        "peer",
        "server",
        "service",
        "session",
    )

    def __init__(self, server: GrpcH2Server) -> None:
        super().__init__(server, server.limits)
        self.server = server
        self.service = server.service
        self.loop = self.service.loop or asyncio.get_event_loop()
        self.session: _Session | None = None
        self.calls: dict[int, _Call] = {}  # stream id -> its call, from its headers to its answer
        self._in_flight = 0  # calls dispatched and not answered yet
        self._open = 0  # calls whose request is still arriving
        self._buffered = 0  # the bytes their readers hold (at most limits.max_body_bytes: invariant 2)
        self.peer = "unknown"
        self._corked: list[bytes] | None = None  # writes held while a read is handled (invariant 6)
        # request heads by the identity of the decoder's shared field list (its block cache): a
        # client's repeated call is parsed once; the list is kept so that its id is not reused
        self._heads: dict[int, tuple[list[tuple[bytes, bytes]], wire.CallHead]] = {}

    # ---- asyncio --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.closing:  # refused (too many connections from this client)
            return
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple) and len(address) >= 2:
            host = str(address[0])
            self.peer = f"ipv6:[{host}]:{address[1]}" if ":" in host else f"ipv4:{host}:{address[1]}"
        self.session = _Session(self, self._write, self.server.settings)
        self.session.initiate()
        if self.server.going_away:
            self.session.goaway()

    def data_received(self, data: bytes) -> None:
        """Invariant 6: what answering this read writes goes out in one write."""
        self.received += 1
        session = self.session
        if session is None or self.closing:
            return
        self._corked = []
        try:
            session.receive(data)
        finally:
            self._flush()

    def _flush(self) -> None:
        corked, self._corked = self._corked, None
        if corked and self.transport is not None:
            self.transport.write(corked[0] if len(corked) == 1 else b"".join(corked))

    def _write(self, data: bytes) -> None:
        corked = self._corked
        if corked is not None:
            corked.append(data)
        elif self.transport is not None:
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.cancel_calls()

    def eof_received(self) -> bool | None:
        return None  # close: a client that half-closes is done (its calls' answers are dropped)

    # ---- connection.py's hooks ------------------------------------------------------------------

    def _serving(self) -> bool:
        return self._in_flight > 0

    def _partial(self) -> int:
        """The stream id of the oldest call still arriving (invariant 4); each such call is
        stamped with the sweep that first saw it."""
        if not self._open:
            return -1
        now = self._clock()
        oldest = -1
        for call in self.calls.values():
            if call.state == ARRIVING:
                if not call.seen_s:
                    call.seen_s = now
                if oldest < 0 or call.stream.id < oldest:
                    oldest = call.stream.id
        return oldest

    def _receive_timed_out(self) -> None:
        """Invariant 4: the calls arriving for ``receive_timeout_s`` since a sweep first saw them
        are answered and reset; the rest of the connection goes on."""
        timeout = self.limits.receive_timeout_s
        now = self._clock()
        for call in list(self.calls.values()):
            if call.state == ARRIVING and call.seen_s and now - call.seen_s >= timeout:
                self._fail(call, ServerError(408, f"the request did not arrive whole within {timeout:g}s"))

    def _release_input(self) -> None:
        """Reading resumed after a pause of ours: the arriving calls' clocks start again."""
        for call in self.calls.values():
            if call.state == ARRIVING:
                call.seen_s = 0.0

    def close(self) -> None:
        """Closed gracefully (idle, shutting down, a connection error): GOAWAY first, so that the
        client reconnects, and what is held (invariant 6) written before the transport closes."""
        if self.session is not None and not self.closing:
            self.session.goaway()
        self._flush()
        super().close()

    def goaway(self) -> None:
        if self.session is not None and not self.closing:
            self.session.goaway()

    def cancel_calls(self) -> None:
        """The connection is going: calls still running are cancelled (their answers, if any come
        back, are dropped)."""
        for call in list(self.calls.values()):
            if call.state == RUNNING:
                if call.engine_request is not None:
                    self.service.cancel(call)
                if call.task is not None:
                    call.task.cancel()
            elif call.slot is not None:  # its request is not taken now: the slot goes back
                self._answer_call(call, wire.UNAVAILABLE, "the server is closing the connection")

    # ---- the session's hooks --------------------------------------------------------------------

    def _headers(self, stream: H2Stream, fields: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        call = stream.call
        if call is not None:  # trailers from the client: nothing a unary call expects
            if end_stream:
                self._received(call)
            return
        heads = self._heads
        known = heads.get(id(fields))
        if known is not None and known[0] is fields:
            head = known[1]
        else:
            try:
                head = wire.parse_request_head(fields)
            except wire.HeadError as exc:
                self._refuse_head(stream, exc)
                return
            if self.session is not None and self.session.decoder.shared:  # this list comes again
                if len(heads) >= HEADS_KEPT:
                    heads.clear()
                heads[id(fields)] = (fields, head)
        rpc = self.server.rpcs.get(head.path)
        if rpc is None:
            self._answer_status(stream, wire.UNIMPLEMENTED, f"method {head.path} is not served here")
            return
        call = _Call(self, stream, head, rpc)
        stream.call = call
        self.calls[stream.id] = call
        self._open += 1
        if end_stream:
            self._received(call)

    def _data(self, stream: H2Stream, data: memoryview, end_stream: bool) -> None:
        call: _Call | None = stream.call
        if call is None or call.state != ARRIVING:  # answered, or ended, before its request did
            return
        if len(data):
            try:
                self._take(call, data)
            except wire.GrpcWireError as exc:
                self._answer_call(call, exc.code, str(exc))
                return
        if end_stream:
            self._received(call)

    def _take(self, call: _Call, data: memoryview) -> None:
        """A DATA frame's bytes (or a piece of one) into the call's message: into its lent slot
        (invariant 7), else a buffer within the connection's budget (invariant 2)."""
        slot = call.slot
        if slot is not None:
            try:
                slot.feed(data)
            except wire.GrpcWireError:
                raise
            except ValueError:  # the slot was revoked: the model closed (grpc_body invariant 4)
                raise wire.GrpcWireError(
                    wire.UNAVAILABLE, "the model was unloaded while the request arrived"
                ) from None
            return
        if call.reader is None and call.message is None and call.head.path == _INFER_PATH:
            slot = call.slot = self._receive_in_slot(call, data)
            if slot is not None:
                self._take(call, data[wire.PREFIX_BYTES :])
                return
        size = len(data)
        if self._buffered + size > self.limits.max_body_bytes:
            raise wire.GrpcWireError(
                wire.RESOURCE_EXHAUSTED,
                f"the requests arriving on this connection would hold more than {self.limits.max_body_bytes} "
                "bytes: send large requests fewer at a time",
            )
        self._buffered += size
        call.buffered += size
        reader = call.reader
        if reader is None:
            if call.message is None and call.head.coding is None:  # the usual: one frame, whole
                call.message = wire.whole_message(data, self.limits.max_body_bytes)
                if call.message is not None:
                    return
            reader = call.reader = wire.MessageReader(self.limits.max_body_bytes, call.head.coding)
            reader.message = call.message  # a frame after a whole message: the reader refuses it
        reader.feed(data)

    def _receive_in_slot(self, call: _Call, data: memoryview) -> SlotMessage | None:
        """A lent slot for a ModelInfer message whose first piece is ``data``, when it qualifies
        (grpc_body.py, invariant 2): not whole in this piece, uncompressed, within the body limit,
        large, its leading fields a known signature, a client the gate lets infer."""
        if call.head.coding is not None or len(data) < wire.PREFIX_BYTES or data[0] != 0:
            return None
        length = int.from_bytes(data[1 : wire.PREFIX_BYTES], "big")
        if not RECEIVE_IN_SLOT_MIN <= length <= self.limits.max_body_bytes:
            return None
        if length == len(data) - wire.PREFIX_BYTES:  # whole in one piece: whole_message takes it
            return None
        service = self.service
        if self.closing or not service.accepting:
            return None
        head = bytes(data[wire.PREFIX_BYTES : wire.PREFIX_BYTES + HEAD_SCAN_BYTES])
        found = receive_plan(service, head, length)
        if found is None:
            return None
        plan, request_id, at, layout = found
        gate = service.gate
        if gate is not None and not gate.is_open("inference"):
            key, _ = gate.from_metadata(call.head.metadata)
            if key is None or not key.may("inference"):
                return None  # refused in its turn, with the status that says why
        try:
            rt = service.runtime(plan.model_name, plan.model_version)
        except ServerError:
            return None
        return SlotMessage.lend(rt, plan, request_id, head[:at], layout, length)

    def _reset(self, stream: H2Stream) -> None:
        """The client reset the call's stream (or the session did, for a stream error)."""
        call: _Call | None = stream.call
        if call is None:
            return
        stream.call = None
        if call.state == ARRIVING:
            self._end(call)
            return
        if call.state == RUNNING and not call.reset:  # its answer comes later, and is dropped
            call.reset = True
            if self.session is not None:
                self.session.extra_streams += 1  # still counted against the stream limit
            if call.engine_request is not None:
                self.service.cancel(call)  # not run yet: dropped
            if call.task is not None:
                call.task.cancel()

    def _refuse_head(self, stream: H2Stream, exc: wire.HeadError) -> None:
        session = self.session
        assert session is not None
        if exc.http_status in (405, 415):  # not gRPC at all: an HTTP answer, as grpc gives one
            block = session.header_block([(b":status", b"%d" % exc.http_status)])
            session.send(stream, block)
        else:
            self._answer_status(stream, exc.code, str(exc))
            return
        if not stream.remote_closed:
            session.reset(stream, NO_ERROR)

    # ---- dispatch -------------------------------------------------------------------------------

    def _received(self, call: _Call) -> None:
        """The call's request is whole: run it (invariant 1 from here)."""
        if call.state != ARRIVING:
            return
        call.received_ns = time.monotonic_ns()
        slot = call.slot
        try:
            if slot is not None:
                if not slot.complete:
                    raise wire.GrpcWireError(wire.INTERNAL, "the call ended inside its message")
                message = None if slot.as_expected else slot.rebuild()  # invariant 7
            else:
                message = call.reader.end() if call.reader is not None else call.message
                if message is None:
                    raise wire.GrpcWireError(wire.UNIMPLEMENTED, "a unary call without a request message")
        except wire.GrpcWireError as exc:
            self._answer_call(call, exc.code, str(exc))
            return
        except ValueError:  # the slot was revoked: the model closed (grpc_body invariant 4)
            self._answer_call(call, wire.UNAVAILABLE, "the model was unloaded while the request arrived")
            return
        if message is not None and slot is not None:  # rebuilt: the ordinary path from here
            slot.release()
            call.slot = None
        call.state = RUNNING
        call.reader = call.message = None
        self._open -= 1
        self._buffered -= call.buffered
        call.buffered = 0
        self._in_flight += 1
        rpc = call.rpc
        try:
            gate = self.service.gate
            if gate is not None and not gate.is_open(rpc.group):
                key, presented = gate.from_metadata(call.head.metadata)
                gate.check(rpc.group, key, presented)
            try:
                if call.head.path == _INFER_PATH:
                    self._infer(call, message)
                    return
                assert message is not None  # a slot is lent to ModelInfer alone
                request = rpc.request_class.FromString(message)
            except DecodeError as exc:
                raise ServerError(400, f"{rpc.name}: the request message does not parse: {exc}") from None
            call.task = task = self.loop.create_task(self._run(call, request))
            self.server.tasks.add(task)
            task.add_done_callback(self.server.tasks.discard)
        except Exception as exc:
            self._fail(call, as_server_error(exc))
        finally:
            if call.slot is not None:  # admission took it, or it goes back now (invariant 7)
                call.slot.release()
                call.slot = None

    def _infer(self, call: _Call, message: bytes | None) -> None:
        """ModelInfer: inline when the lane takes it, else to the workers with a call back; the
        message, or (None) its inputs in the call's lent slot."""
        service = self.service
        remaining_s = call.time_remaining()
        slot = call.slot
        if slot is None:
            assert message is not None
            prepared = prepare_infer_bytes(service, message, call, remaining_s, call.received_ns)
        else:
            payload = slot.payload
            try:
                payload.nbytes  # noqa: B018 - raises once the model closed and revoked it
            except ValueError:
                raise unavailable("the model was unloaded while the request arrived") from None
            prepared = prepare_infer_slot(
                service,
                slot.plan,
                payload,
                slot.offsets,
                slot.request_id,
                call,
                remaining_s,
                call.received_ns,
            )
        call.prepared = prepared
        outcome = service.infer_inline(  # a small model: answered now when its queue is empty
            prepared.runtime,
            prepared.arrays,
            prepared.outputs,
            timeout_s=prepared.timeout_s,
            timing=prepared.timing,
            received_ns=call.received_ns,
            protocol="grpc",
            request_id=prepared.request_id,
            priority=prepared.priority,
        )
        if outcome is not None:
            self._answer_infer(call, outcome)
            return
        call.runtime, call.outputs = prepared.runtime, prepared.outputs
        call.timing, call.priority = prepared.timing, prepared.priority
        service.submit(call, prepared.arrays, prepared.timeout_s, slot)  # ServerError: refused now

    async def _run(self, call: _Call, request: Any) -> None:
        """Any rpc but ModelInfer: the servicer's coroutine, then its answer."""
        try:
            response = await call.rpc.handler(request, call)
        except asyncio.CancelledError:
            self._fail(call, ServerError(503, "the call was cancelled: the server is shutting down"))
            return
        except Exception as exc:
            self._fail(call, as_server_error(exc))
            return
        self._answer_message(call, [response.SerializeToString()])

    # ---- answers --------------------------------------------------------------------------------

    def _answer_infer(self, call: _Call, outcome: InferOutcome) -> None:
        if call.stream.call is not call:  # reset meanwhile: dropped
            self._end(call)
            return
        try:
            assert call.prepared is not None
            parts = infer_response_bytes(outcome, call.prepared)
        except Exception as exc:  # encoding failed: still exactly one answer
            self._fail(call, as_server_error(exc))
            return
        self._answer_message(call, parts)

    def _answer_message(self, call: _Call, parts: list[bytes | memoryview]) -> None:
        """The call's message (its serialized parts) and OK, one write with the call's other frames."""
        session, stream = self.session, call.stream
        if session is None or self.closing or stream.call is not call:
            self._end(call)
            return
        length = 0
        for part in parts:
            length += len(part)
        data = b"".join([wire.frame_prefix(length), *parts])  # before _end: parts may be views of its slot
        self._end(call)
        stream.call = None
        session.send(stream, wire.RESPONSE_HEAD, data, wire.OK_TRAILERS)

    def _fail(self, call: _Call, error: ServerError) -> None:
        code = wire.STATUS_CODES.get(GRPC_CODES.get(error.status, "INTERNAL"), wire.INTERNAL)
        self._answer_call(call, code, error.message)

    def _answer_call(self, call: _Call, code: int, message: str) -> None:
        """The call answered with a status alone, unless it was reset (then only ended)."""
        self._end(call)
        stream = call.stream
        if stream.call is call:
            self._answer_status(stream, code, message)

    def _end(self, call: _Call) -> None:
        """The call leaves the connection's books, once, whatever state it was in (invariant 1)."""
        state = call.state
        if state == DONE:
            return
        call.state = DONE
        if state == ARRIVING:
            self._open -= 1
            self._buffered -= call.buffered
            call.buffered = 0
        else:
            self._in_flight -= 1
        if call.reset:
            call.reset = False
            if self.session is not None:
                self.session.extra_streams -= 1
        self.calls.pop(call.stream.id, None)
        call.engine_request = None
        call.task = None
        call.reader = call.message = None
        if call.slot is not None:
            call.slot.release()
            call.slot = None

    def _answer_status(self, stream: H2Stream, code: int, message: str) -> None:
        """A call answered with a status alone (trailers-only); reset if its request had not ended."""
        session = self.session
        if session is None or self.closing:
            return
        stream.call = None
        session.send(stream, wire.trailers_only(code, message))
        if not stream.remote_closed:
            session.reset(stream, NO_ERROR)
