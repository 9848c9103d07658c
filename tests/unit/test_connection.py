"""The connection handling shared by the front ends (``lumenrt.ingress.connection``): the two read
pause reasons, and the sweeper's idle, receive and stalled-client timeouts. Each test body runs
against both front ends (HTTP and binary TCP) through a parametrized fixture, over a mock transport
that buffers what the client has not read yet, with a fake clock (no sockets, no sleeping)."""

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from lumenrt.ingress.connection import SWEEP_SLICE, Connection, Listener, sweep_interval_s
from lumenrt.ingress.http_server import MAX_PIPELINED, HttpConnection, HttpServer
from lumenrt.ingress.service import InferenceService, ServeLimits
from lumenrt.ingress.tcp_server import LINGER_S, MAX_IN_FLIGHT, TcpConnection, TcpFrontEnd
from lumenrt.protocols import tcp as tp
from tests.mock_transport import MockTransport
from tests.unit.tcp_fakes import FakeEngine, deliver_on
from tests.unit.tcp_fakes import request as tcp_request

LIMITS = ServeLimits(receive_timeout_s=2.0, idle_timeout_s=10.0)
RECV = LIMITS.receive_timeout_s
IDLE = LIMITS.idle_timeout_s


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def http_request(i: int) -> bytes:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [i, i]}]})
    head = f"POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return (head + body).encode()


def http_answers(data: bytes) -> list[tuple[int, str]]:
    """(status, error message or "") of each whole response in ``data``."""
    out: list[tuple[int, str]] = []
    while b"\r\n\r\n" in data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        if len(rest) < length:
            break
        status = int(head.split(b" ")[1])
        body = rest[:length]
        out.append((status, json.loads(body).get("error", "") if status != 200 else ""))
        data = rest[length:]
    return out


def tcp_answers(data: bytes) -> list[tuple[int, str]]:
    frames: list[tp.Frame] = []
    tp.FrameDecoder(frames.append).feed(data)
    out: list[tuple[int, str]] = []
    for f in frames:
        if f.kind == tp.ERROR:
            info = tp.decode_error(f.meta)
            out.append((info.status, info.message))
        else:
            out.append((200, ""))
    return out


@dataclass
class Rig:
    """One front end (its listener and one connection) on a private loop, over a fake engine
    whose model ``double`` answers when ``engine.hold`` is set."""

    kind: str
    loop: asyncio.AbstractEventLoop
    engine: FakeEngine
    clock: FakeClock
    front: Listener[Any]
    conn: Any  # HttpConnection | TcpConnection
    transport: MockTransport
    request: Callable[[int], bytes]  # a whole request (i >= 1)
    decode: Callable[[bytes], list[tuple[int, str]]]
    load_limit: int  # requests that pause reading for load while the engine holds them
    timeout_message: str
    made: list[Any] = field(default_factory=list)

    def feed(self, data: bytes) -> None:
        deliver_on(self.loop, self.conn, data)
        self.settle()

    def settle(self, until: Callable[[], bool] = lambda: False) -> None:
        for _ in range(1000):
            if until():
                return
            self.loop.run_until_complete(asyncio.sleep(0))

    def sweep_after(self, seconds: float) -> None:
        """The clock moves on; then the listener's sweep, as its task would run it."""
        self.clock.now += seconds
        self.front.sweep(self.clock.now)
        self.settle()

    def answers(self) -> list[tuple[int, str]]:
        """What the client has read, in order: (status, error message or "")."""
        return self.decode(bytes(self.transport.received))


@pytest.fixture(params=["http", "tcp"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    loop = asyncio.new_event_loop()
    engine = FakeEngine()
    engine.loop = loop
    clock = FakeClock()
    service = InferenceService(engine, LIMITS)  # type: ignore[arg-type]
    transport = MockTransport(loop, high=64)  # any answer crosses it
    conn: Connection
    if request.param == "http":
        front: Listener[Any] = HttpServer(service)
        front.clock = clock

        async def make() -> HttpConnection:
            return HttpConnection(cast(HttpServer, front))

        conn = loop.run_until_complete(make())
        r = Rig("http", loop, engine, clock, front, conn, transport, http_request, http_answers,
                MAX_PIPELINED + 1, "request not received whole within 2 s")  # fmt: skip
    else:
        front = TcpFrontEnd(service, loop)
        front.clock = clock
        conn = TcpConnection(cast(TcpFrontEnd, front))
        r = Rig("tcp", loop, engine, clock, front, conn, transport, tcp_request, tcp_answers,
                MAX_IN_FLIGHT, "frame not received whole within 2 s")  # fmt: skip
    transport.attach(conn)
    yield r
    engine.hold.set()
    loop.run_until_complete(front.close())
    r.settle()
    loop.close()


def test_an_idle_connection_is_closed_after_the_idle_timeout(rig: Rig) -> None:
    rig.transport.high = 1 << 20
    rig.feed(rig.request(1))
    rig.transport.client_reads()
    assert rig.answers() == [(200, "")]
    rig.sweep_after(0)  # sees what was received: the idle clock starts
    rig.sweep_after(IDLE * 0.75)
    assert not rig.transport.closing
    rig.sweep_after(IDLE * 0.25)
    assert rig.transport.closing and not rig.transport.aborted  # a graceful close, no answer
    rig.settle()
    assert rig.answers() == [(200, "")]
    assert rig.conn not in rig.front.connections


def test_a_request_in_the_engine_keeps_the_connection_open(rig: Rig) -> None:
    rig.transport.high = 1 << 20
    rig.engine.hold.clear()
    rig.feed(rig.request(1))
    rig.sweep_after(IDLE * 3)
    assert not rig.transport.closing
    rig.engine.hold.set()
    rig.settle()
    rig.sweep_after(IDLE / 2)  # the idle clock started at the last sweep that saw it busy
    assert not rig.transport.closing
    rig.sweep_after(IDLE / 2)
    assert rig.transport.closing


def test_a_partly_received_request_gets_the_receive_timeout_answer(rig: Rig) -> None:
    rig.feed(rig.request(1)[:30])
    rig.sweep_after(0)  # first seen: its receive clock starts
    rig.sweep_after(RECV * 0.75)
    assert not rig.conn.closing
    rig.sweep_after(RECV * 0.25)
    assert rig.conn.closing
    rig.transport.client_reads()
    [(status, message)] = rig.answers()
    assert status == 408 and rig.timeout_message in message


def test_each_new_partial_request_restarts_the_receive_clock(rig: Rig) -> None:
    rig.transport.high = 1 << 20
    first, second = rig.request(1), rig.request(2)
    rig.feed(first[:30])
    rig.sweep_after(0)
    rig.feed(first[30:] + second[:30])  # the first completes, the second begins
    rig.sweep_after(RECV)  # a different partial request: its clock starts here
    assert not rig.conn.closing
    rig.sweep_after(RECV)
    assert rig.conn.closing
    rig.transport.client_reads()
    assert [status for status, _ in rig.answers()] == [200, 408]


def test_the_receive_clock_stops_while_writes_are_paused(rig: Rig) -> None:
    rig.feed(rig.request(1) + rig.request(2)[:30])  # the first answer fills the buffer
    assert rig.conn.write_paused and rig.conn.reading_paused and not rig.transport.reading
    for _ in range(4):  # four receive timeouts, under one idle timeout
        rig.sweep_after(RECV)
    assert not rig.conn.closing  # the server is the one not reading: no receive timeout
    rig.transport.client_reads()  # drained: reading resumes, the clock restarts now
    assert not rig.conn.reading_paused and rig.transport.reading
    rig.sweep_after(RECV * 0.75)
    assert not rig.conn.closing
    rig.sweep_after(RECV * 0.25)
    assert rig.conn.closing
    rig.transport.client_reads()
    assert [status for status, _ in rig.answers()] == [200, 408]


def test_a_client_that_stops_reading_is_aborted_and_a_slow_one_is_not(rig: Rig) -> None:
    rig.feed(rig.request(1))
    assert rig.conn.write_paused
    for _ in range(5):  # a byte read between sweeps: slow, not stalled
        rig.transport.client_reads(1)
        rig.sweep_after(IDLE)
        assert not rig.transport.closing
    assert rig.conn.write_paused  # never drained under the low-water mark
    rig.sweep_after(IDLE * 0.75)  # nothing read since
    assert not rig.transport.closing
    rig.sweep_after(IDLE * 0.25)
    assert rig.transport.aborted and rig.transport.get_write_buffer_size() == 0
    assert rig.conn not in rig.front.connections


def test_a_closed_connection_whose_last_answer_is_never_read_is_aborted(rig: Rig) -> None:
    rig.transport.high = 1 << 20
    rig.feed(rig.request(1))  # answered: buffered, under the high-water mark, never read
    rig.sweep_after(0)
    rig.sweep_after(IDLE)  # idle: closed gracefully, its answer still to be flushed
    assert rig.transport.closing and not rig.transport.aborted
    assert rig.conn in rig.front.connections  # until the flush ends
    rig.transport.client_reads(5)  # the client reads some of it: the flush clock restarts
    rig.sweep_after(IDLE * 0.75)
    rig.sweep_after(IDLE * 0.75)
    assert not rig.transport.aborted
    rig.sweep_after(IDLE * 0.25)
    assert rig.transport.aborted and rig.transport.get_write_buffer_size() == 0
    assert rig.conn not in rig.front.connections


def test_the_two_pause_reasons_are_independent(rig: Rig) -> None:
    rig.transport.high = 1 << 20
    rig.engine.hold.clear()
    rig.feed(b"".join(rig.request(i) for i in range(1, rig.load_limit + 1)))
    assert rig.conn.load_paused and not rig.transport.reading
    rig.conn.pause_writing()  # as the transport would, over its high-water mark
    assert rig.conn.load_paused and rig.conn.write_paused
    rig.engine.hold.set()
    rig.settle()  # the engine answers what it holds: the load may ease ...
    assert not rig.transport.reading  # ... but the write buffer still holds reading paused
    rig.conn.resume_writing()
    rig.settle(until=lambda: not rig.conn.load_paused)
    assert rig.transport.reading and not rig.conn.reading_paused
    rig.settle(until=lambda: len(rig.answers()) == rig.load_limit)
    rig.transport.client_reads()
    assert rig.answers() == [(200, "")] * rig.load_limit


def test_a_closing_connection_never_pauses_reading(rig: Rig) -> None:
    rig.conn.close()
    rig.conn.pause_writing()
    assert not rig.conn.reading_paused and rig.transport.reading


@contextlib.contextmanager
def tcp_connection() -> Iterator[
    tuple[asyncio.AbstractEventLoop, FakeClock, TcpFrontEnd, TcpConnection, MockTransport]
]:
    """One TCP connection on a mock transport, its front end on a fake clock (TCP-only tests)."""
    loop = asyncio.new_event_loop()
    try:
        clock = FakeClock()
        front = TcpFrontEnd(InferenceService(FakeEngine(), LIMITS), loop)  # type: ignore[arg-type]
        front.clock = clock
        conn = TcpConnection(front)
        transport = MockTransport(loop, high=1 << 20)
        transport.attach(conn)
        yield loop, clock, front, conn, transport
        loop.run_until_complete(front.close())
    finally:
        loop.close()


def test_a_tcp_fatal_error_lingers_then_closes_and_flushes() -> None:
    """TCP only: after a broken frame the connection half-closes and reads on for LINGER_S, then
    closes; an error frame the client never reads is then dropped like any unread answer."""
    with tcp_connection() as (loop, clock, front, conn, transport):
        deliver_on(loop, conn, b"not a frame at all, just some bytes")
        assert conn.draining and transport.eof_written and transport.reading
        clock.now += LINGER_S
        front.sweep(clock.now)
        assert transport.closing and not transport.aborted
        clock.now += IDLE
        front.sweep(clock.now)
        assert transport.aborted


@pytest.mark.parametrize(
    ("receive_s", "idle_s", "interval_s"),
    [(30.0, 300.0, 1.0), (2.0, 10.0, 0.5), (0.5, 1.0, 0.125), (0.001, 1.0, 0.01)],
)
def test_sweep_interval_is_a_quarter_of_the_shortest_timeout_within_bounds(
    receive_s: float, idle_s: float, interval_s: float
) -> None:
    limits = ServeLimits(receive_timeout_s=receive_s, idle_timeout_s=idle_s)
    assert sweep_interval_s(limits) == interval_s


def test_answers_that_come_back_inside_submit_cost_no_stack_depth(rig: Rig) -> None:
    """The engine may answer a queued request before ``submit`` returns (its spin_us poll). When
    writes resume over many requests received meanwhile, each is answered once, in order, in one
    loop: no recursion per request (that once hit Python's limit under load)."""
    rig.engine.inline = True
    n = 3000
    rig.feed(b"".join(rig.request(i) for i in range(1, n + 1)))  # one read: all of them arrive
    assert rig.conn.write_paused  # the first answer crossed the high-water mark
    rig.transport.high = rig.transport.low = 1 << 30  # from now on writes never pause
    rig.transport.client_reads()
    rig.transport.client_reads()  # what the resumed writes added
    rig.settle()
    rig.transport.client_reads()
    assert rig.answers() == [(200, "")] * n
    assert rig.engine.started == rig.engine.finished == n


def test_a_quiet_connection_is_checked_in_full_once_it_receives_again(rig: Rig) -> None:
    rig.transport.high = 1 << 20
    rig.feed(rig.request(1))
    rig.sweep_after(0)  # sees what was received
    rig.sweep_after(1)  # nothing since: quiet
    assert rig.conn.quiet and not rig.transport.closing
    rig.feed(rig.request(2)[:30])  # a request begins: the receive clock must run again
    rig.sweep_after(0)
    assert not rig.conn.quiet
    rig.sweep_after(RECV)
    assert rig.conn.closing
    rig.transport.client_reads()
    assert [status for status, _ in rig.answers()] == [200, 408]


def test_an_idle_tcp_connection_gives_its_receive_buffer_back() -> None:
    """TCP only: a request split over two reads leaves the connection its own receive buffer
    (tcp_receiver.py); once a sweep finds it idle since the sweep before, that buffer goes back."""
    with tcp_connection() as (loop, clock, front, conn, transport):
        frame = tcp_request(1)
        deliver_on(loop, conn, frame[:30])
        assert conn.decoder.own_buffer_bytes > 0  # the start of a frame, kept
        deliver_on(loop, conn, frame[30:])
        front.sweep(clock.now)  # busy at this sweep: kept for the next reads
        assert conn.decoder.own_buffer_bytes > 0
        clock.now += 1
        front.sweep(clock.now)  # nothing since the sweep before
        assert conn.decoder.own_buffer_bytes == 0 and not transport.closing


class CountingConnection:
    """A stand-in that records the sweeps that check it."""

    def __init__(self, seen: list[tuple[int, int]], index: int, sleeps: list[float]) -> None:
        self.seen, self.index, self.sleeps = seen, index, sleeps

    def check_timeouts(self, now: float) -> None:
        self.seen.append((len(self.sleeps), self.index))


def test_a_pass_over_many_connections_is_spread_over_the_interval_in_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant 5: each connection checked once a pass, at most SWEEP_SLICE between two waits,
    the waits adding up to one interval."""
    front: Listener[Any] = Listener(LIMITS)
    seen: list[tuple[int, int]] = []
    sleeps: list[float] = []
    n = 2 * SWEEP_SLICE + 10
    front.connections = {CountingConnection(seen, i, sleeps) for i in range(n)}  # type: ignore[assignment]
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        if len(sleeps) > 3:  # one pass: three slices
            raise asyncio.CancelledError
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(front._sweep_forever())
    finally:
        loop.close()
    assert sorted(i for _, i in seen) == list(range(n))  # each once
    per_wait = [sum(1 for w, _ in seen if w == k) for k in (1, 2, 3)]
    assert per_wait == [SWEEP_SLICE, SWEEP_SLICE, 10]
    assert sleeps[:3] == [front.sweep_interval_s / 3] * 3
