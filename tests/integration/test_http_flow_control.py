"""HTTP write-side flow control: a client that pipelines requests and does not read its answers
makes the server stop reading and stop answering (the transport's write buffer stays near its
high-water mark) until it reads; then every answer arrives, in order, whole. The two reasons
reading pauses (pipelined queue full, write buffer full) are independent, and the sweeper tells
a stalled client (aborted after ``idle_timeout_s``) from a slow one (left alone).

Real-socket tests run a server in a thread and probe its connection on the server's loop; the
rest drive ``HttpConnection`` over a mock transport with explicit clock values. No assertion
depends on timing: waits are for conditions, with generous deadlines."""

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from lumenrt.engine.engine import Engine
from lumenrt.ingress import http_server
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.http_server import MAX_PIPELINED, HttpConnection, HttpRequest, HttpServer, Response
from lumenrt.ingress.service import InferenceService, ServeLimits
from lumenrt.models.builtin import builtin_examples
from tests.integration.flow_clients import WAIT_S, Sampler, Sender, non_reading_client, probe, wait_for
from tests.mock_transport import MockTransport

PATIENT = ServeLimits(
    max_body_bytes=1 << 20, max_elements=1 << 16, receive_timeout_s=30.0, idle_timeout_s=60.0
)
# 2 s: a reader descheduled for a second on a busy machine is still not a stalled one
HASTY = ServeLimits(max_body_bytes=1 << 20, max_elements=1 << 16, receive_timeout_s=2.0, idle_timeout_s=2.0)


# ---- real sockets ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(models=["digits_mlp"]) as e:
        yield e


@pytest.fixture(scope="module")
def patient(engine: Engine) -> Iterator[ServerThread]:
    with ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None, limits=PATIENT)) as st:
        yield st


@pytest.fixture
def hasty(engine: Engine) -> Iterator[ServerThread]:
    with ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None, limits=HASTY)) as st:
        yield st


def request(method: str, path: str, body: bytes = b"") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def infer_body(rows: int) -> bytes:
    x = builtin_examples("digits_mlp", rows)["input"]
    doc = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]
    }
    return json.dumps(doc).encode()


Check = Callable[[int, bytes], None]


def workload(n: int) -> tuple[bytes, list[Check]]:
    """``n`` pipelined requests of four kinds in turn, and for each a check of its answer that
    tells it from its neighbours (a missing model is named by the request's index)."""
    bodies = {rows: infer_body(rows) for rows in range(1, 9)}
    raw: list[bytes] = []
    checks: list[Check] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            raw.append(request("GET", "/v2/models/digits_mlp/config"))
            checks.append(
                lambda status, body: _expect(status == 200 and json.loads(body)["name"] == "digits_mlp")
            )
        elif kind == 1:
            rows = (i // 4) % 8 + 1
            raw.append(request("POST", "/v2/models/digits_mlp/infer", bodies[rows]))

            def infer_check(status: int, body: bytes, rows: int = rows) -> None:
                outputs = json.loads(body)["outputs"]
                _expect(status == 200 and all(o["shape"][0] == rows for o in outputs))

            checks.append(infer_check)
        elif kind == 2:
            raw.append(request("GET", "/v2/health/ready"))
            checks.append(lambda status, body: _expect(status == 200 and body == b'{"ready":true}'))
        else:
            raw.append(request("GET", f"/v2/models/missing{i}"))

            def missing_check(status: int, body: bytes, i: int = i) -> None:
                _expect(status == 404 and f"'missing{i}'" in json.loads(body)["error"])

            checks.append(missing_check)
    return b"".join(raw), checks


def _expect(ok: bool) -> None:
    assert ok


def check_in_order(checks: list[Check], answers: list[tuple[int, bytes]]) -> None:
    """Answer i is request i's; a mismatch names its index and shows its neighbours."""
    assert len(answers) == len(checks)
    for i, (status, body) in enumerate(answers):
        try:
            checks[i](status, body)
        except AssertionError:
            near = [(k, s, b[:80]) for k, (s, b) in enumerate(answers) if abs(k - i) <= 3]
            raise AssertionError(
                f"answer {i} is not its request's: {status} {body[:200]!r}; near: {near}"
            ) from None


def read_response(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """One response (status, body); ``buf`` carries the bytes read past it."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a whole response")
        buf += chunk
    end = buf.index(b"\r\n\r\n")
    lines = bytes(buf[:end]).decode().split("\r\n")
    status = int(lines[0].split()[1])
    length = next(
        int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")
    )
    while len(buf) < end + 4 + length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a body")
        buf += chunk
    body = bytes(buf[end + 4 : end + 4 + length])
    del buf[: end + 4 + length]
    return status, body


N = 12_000  # ~5.6 MB of requests, ~7.5 MB of answers: far over the high-water mark and socket buffers


def test_a_client_that_does_not_read_stops_the_server_then_gets_every_answer(patient: ServerThread) -> None:
    raw, checks = workload(N)
    with non_reading_client(patient, "http") as sock:
        sampler = Sampler(lambda: probe(patient, sock, "http"))
        sampler.start()
        sender = Sender(sock, raw)
        sender.start()
        try:
            wait_for(
                "the server pauses writing and reading",
                lambda: (
                    (p := probe(patient, sock, "http")) is not None and p.write_paused and not p.reading and p
                ),
            )
            time.sleep(0.5)  # the client still reads nothing: the server stays (or is again) paused
            again = wait_for(
                "the server is paused while the client reads nothing",
                lambda: (
                    (p := probe(patient, sock, "http")) is not None and p.write_paused and not p.reading and p
                ),
            )
            assert sender.is_alive() or again.queued > 0  # requests are left: unread or unanswered

            buf = bytearray()
            answers = [read_response(sock, buf) for _ in range(N)]
            sender.join(WAIT_S)
            assert not sender.is_alive() and sender.error is None
        finally:
            sampler.stop()
        check_in_order(checks, answers)  # each answer is the one for its request
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing more: exactly one answer each
    largest = max(len(body) + 200 for _, body in answers)  # an answer with its head
    assert sampler.probes > 0 and sampler.high > 0
    # the buffer held at most the high-water mark, the answer that crossed it, and the answer of
    # the request that was in the engine when it did
    assert sampler.most <= sampler.high + 2 * largest, (sampler.most, sampler.high, largest)


def test_a_client_that_stops_reading_is_aborted_after_the_idle_timeout(hasty: ServerThread) -> None:
    raw, _ = workload(N)
    with non_reading_client(hasty, "http") as sock:
        sender = Sender(sock, raw)
        sender.start()
        wait_for(
            "the server pauses writing",
            lambda: (p := probe(hasty, sock, "http")) is not None and p.write_paused,
        )
        wait_for("the server drops the stalled connection", lambda: probe(hasty, sock, "http") is None)
        answered = 0
        buf = bytearray()
        with pytest.raises(ConnectionError):  # reset (or closed): not a timeout
            while True:
                read_response(sock, buf)
                answered += 1
        assert answered < N
        sender.join(WAIT_S)
        assert not sender.is_alive()
    with socket.create_connection(("127.0.0.1", hasty.ports["http"]), timeout=WAIT_S) as other:
        other.sendall(request("GET", "/v2/health/live"))
        assert read_response(other, bytearray())[0] == 200


def test_a_slow_reader_is_not_taken_for_a_stalled_one(hasty: ServerThread) -> None:
    """It reads a little at a time for several idle timeouts: its writes pause and resume, and it
    gets every answer."""
    n = N
    raw, checks = workload(n)
    with non_reading_client(hasty, "http") as sock:
        sender = Sender(sock, raw)
        sender.start()
        wait_for(
            "the server pauses writing",
            lambda: (p := probe(hasty, sock, "http")) is not None and p.write_paused,
        )
        buf = bytearray()
        answers = []
        for _ in range(n):
            answers.append(read_response(sock, buf))
            if len(answers) % 50 == 0:
                time.sleep(0.02)  # 240 pauses: several idle timeouts in all
        sender.join(WAIT_S)
        assert not sender.is_alive() and sender.error is None
    check_in_order(checks, answers)


# ---- a mock transport: the two pause reasons and the sweeper --------------------------------------


class Harness:
    """One ``HttpConnection`` on a mock transport, on a private loop. Its routes (``route`` is
    replaced): ``GET /{id}/{size}`` answers ``{id}:`` and ``size`` bytes at once; ``GET
    /slow/{id}/{size}`` the same once ``gate(id)`` opens, as if from the engine."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, high: int, limits: ServeLimits | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.gates: dict[str, asyncio.Event] = {}
        self.limits = limits or ServeLimits(receive_timeout_s=5.0, idle_timeout_s=10.0)
        service = cast(
            InferenceService, SimpleNamespace(limits=self.limits, limiter=None, gate=None, shared_memory=None)
        )
        monkeypatch.setattr(http_server, "route", self._route)

        async def make() -> HttpConnection:
            return HttpConnection(HttpServer(service))

        self.conn = self.loop.run_until_complete(make())
        self.transport = MockTransport(self.loop, high, low=high // 4)
        self.transport.attach(self.conn)

    def _route(self, service: InferenceService, req: HttpRequest) -> Any:
        parts = req.path.strip("/").split("/")
        if parts[0] != "slow":
            return Response(200, parts[0].encode() + b":" + b"x" * int(parts[1]))
        gate = self.gates.setdefault(parts[1], asyncio.Event())

        async def answer() -> Response:
            await gate.wait()
            return Response(200, parts[1].encode() + b":" + b"y" * int(parts[2]))

        return answer()

    def gate(self, rid: str) -> None:
        self.gates.setdefault(rid, asyncio.Event()).set()
        self.settle()

    def feed(self, *paths: str) -> None:
        self.conn.data_received(b"".join(f"GET {p} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for p in paths))
        self.settle()

    def settle(self) -> None:
        for _ in range(20):
            self.loop.run_until_complete(asyncio.sleep(0))

    def answers(self) -> list[str]:
        """The ids of the answers the client has read, in order (each whole, 200)."""
        data, ids = bytes(self.transport.received), []
        while data:
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert len(rest) >= length, "a partial answer"
            ids.append(rest[:length].split(b":")[0].decode())
            data = rest[length:]
        return ids

    def state(self) -> tuple[bool, bool, bool]:
        """(queue holds reading paused, write buffer holds it paused, the transport reads)."""
        return self.conn.load_paused, self.conn.write_paused, self.transport.reading

    def close(self) -> None:
        self.transport.close()
        self.settle()
        self.loop.close()


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(high: int, limits: ServeLimits | None = None) -> Harness:
        made.append(Harness(monkeypatch, high, limits))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_a_full_write_buffer_stops_handling_until_it_drains(harness: Callable[..., Harness]) -> None:
    h = harness(4096)
    h.feed(*(f"/{i}/1000" for i in range(10)))
    assert h.state() == (False, True, False)
    assert len(h.conn._queue) == 6  # the 4th answer crossed 4096 bytes: nothing after it started
    assert h.transport.most <= h.transport.high + 1100
    h.transport.client_reads()
    assert h.state() == (False, True, False)  # four more, then full again
    assert len(h.conn._queue) == 2
    h.transport.client_reads()
    assert h.state() == (False, False, True)  # all answered, the buffer under its mark
    h.transport.client_reads()
    assert h.answers() == [str(i) for i in range(10)]


def test_write_resuming_does_not_undo_the_queue_pause(harness: Callable[..., Harness]) -> None:
    h = harness(100_000)
    h.feed("/slow/a/200000", "/slow/b/10", *(f"/{i}/10" for i in range(MAX_PIPELINED + 5)))
    assert h.state() == (True, False, False)  # a in the engine, MAX_PIPELINED + 6 wait
    h.gate("a")  # its answer crosses the high-water mark
    assert h.state() == (True, True, False)
    h.transport.client_reads()  # drained: b goes to the engine, the queue still holds reading
    assert h.state() == (True, False, False)
    assert h.conn._busy and len(h.conn._queue) == MAX_PIPELINED + 5
    h.gate("b")  # the queue is worked off: reading resumes
    assert h.state() == (False, False, True)
    h.transport.client_reads()
    assert h.answers() == ["a", "b", *(str(i) for i in range(MAX_PIPELINED + 5))]


def test_the_queue_emptying_does_not_undo_the_write_pause(harness: Callable[..., Harness]) -> None:
    h = harness(100_000)
    small = [f"/{i}/10" for i in range(MAX_PIPELINED - 1)]
    h.feed("/slow/c/10", *small, "/big/200000")
    assert h.state() == (True, False, False)
    h.gate("c")  # the last answer crosses the mark as the queue empties
    assert not h.conn._queue
    assert h.state() == (False, True, False)
    h.transport.client_reads()
    assert h.state() == (False, False, True)
    assert h.answers() == ["c", *(str(i) for i in range(MAX_PIPELINED - 1)), "big"]


def test_a_request_arriving_while_writes_pause_is_answered_after_the_rest(
    harness: Callable[..., Harness],
) -> None:
    h = harness(4096)
    h.feed("/0/5000", "/1/10")  # the first fills the buffer; the second waits
    assert h.state() == (False, True, False)
    h.feed("/2/10")  # the rest of a chunk read before the pause
    assert len(h.conn._queue) == 2
    h.transport.client_reads()
    assert h.state() == (False, False, True)
    h.transport.client_reads()
    assert h.answers() == ["0", "1", "2"]


def test_sweeper_aborts_a_stalled_client_not_a_slow_one(harness: Callable[..., Harness]) -> None:
    h = harness(4096)
    idle = h.limits.idle_timeout_s
    h.feed("/0/100000", "/1/10", "/2/10")
    assert h.state() == (False, True, False)
    t = time.monotonic()
    for step in range(1, 6):  # the client reads a little between sweeps: slow, not stalled
        h.transport.client_reads(1000)
        h.conn.check_timeouts(t + step * idle)
        assert not h.transport.closing
    assert h.conn.write_paused  # never drained under the low-water mark
    h.conn.check_timeouts(t + 5.5 * idle)  # nothing read since
    assert not h.transport.closing
    h.conn.check_timeouts(t + 7 * idle + 0.1)
    assert h.transport.aborted and not h.conn._queue  # buffered and queued answers dropped


def test_sweeper_aborts_a_closed_connection_whose_last_answer_is_never_read(
    harness: Callable[..., Harness],
) -> None:
    h = harness(1 << 20)
    idle = h.limits.idle_timeout_s
    h.feed("/0/100000")  # answered at once: buffered, under the high-water mark
    t = time.monotonic()
    h.conn.close()  # as after an answer that says connection: close; the flush is pending
    h.conn.check_timeouts(t + idle / 2)
    assert not h.transport.aborted
    h.transport.client_reads(1000)  # the client reads some of it: the clock restarts
    h.conn.check_timeouts(t + 1.5 * idle)
    assert not h.transport.aborted
    h.conn.check_timeouts(t + 3 * idle)  # nothing read since
    assert h.transport.aborted and h.transport.get_write_buffer_size() == 0


def test_sweeper_does_not_count_time_in_the_engine_as_idle(harness: Callable[..., Harness]) -> None:
    h = harness(4096)
    idle = h.limits.idle_timeout_s
    h.feed("/slow/s/10")
    t = time.monotonic()
    h.conn.check_timeouts(t + 3 * idle)
    assert not h.transport.closing
    h.gate("s")
    h.conn.check_timeouts(t + 3.5 * idle)
    assert not h.transport.closing  # the idle clock started at the last sweep that saw it busy
    h.conn.check_timeouts(t + 4.5 * idle)
    assert h.transport.closing
    assert h.answers() == [] and h.transport.buffer.startswith(b"HTTP/1.1 200 ")


def test_the_receive_clock_stops_while_the_server_does_not_read(harness: Callable[..., Harness]) -> None:
    h = harness(4096, ServeLimits(receive_timeout_s=2.0, idle_timeout_s=100.0))
    recv = h.limits.receive_timeout_s
    # the first answer fills the buffer; a second request's head arrived in the same chunk
    h.conn.data_received(b"GET /0/10000 HTTP/1.1\r\nHost: x\r\n\r\nGET /1/10 HTTP/1.1\r\nHo")
    assert h.state() == (False, True, False)
    t = time.monotonic()
    h.conn.check_timeouts(t + 10 * recv)
    assert not h.transport.closing  # the server is the one not reading: no 408
    h.transport.client_reads()
    assert h.state() == (False, False, True)
    resumed = time.monotonic()
    h.conn.check_timeouts(resumed + recv / 2)
    assert not h.transport.closing  # its clock restarted when reading did
    h.conn.check_timeouts(resumed + recv + 1.0)
    assert h.transport.closing
    h.transport.client_reads()
    assert b"408 Request Timeout" in h.transport.received
