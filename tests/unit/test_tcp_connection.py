"""The TCP front end's connection protocol over a mock transport (no sockets): one answer per
request, error frames that keep or end the connection, backpressure, half-close, and the sweeper's
receive and idle timeouts driven with explicit clock values (no sleeping)."""

from collections.abc import Iterator

import numpy as np
import pytest

from lumenrt.ingress.service import ServeLimits
from lumenrt.ingress.tcp_server import LINGER_S, MAX_IN_FLIGHT, RESUME_IN_FLIGHT
from lumenrt.protocols import tcp as tp
from tests.unit.tcp_fakes import Harness, header, request


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness(
        ServeLimits(max_body_bytes=4096, max_header_bytes=512, receive_timeout_s=2, idle_timeout_s=10)
    )
    yield harness
    harness.close()


def answers(h: Harness) -> dict[int, tp.Frame]:
    frames = h.transport.frames()
    ids = [f.request_id for f in frames]
    assert len(ids) == len(set(ids)), f"a request answered twice: {ids}"
    return {f.request_id: f for f in frames}


def error_of(frame: tp.Frame) -> tp.ErrorInfo:
    assert frame.kind == tp.ERROR
    return tp.decode_error(frame.meta)


def test_each_request_gets_its_answer(h: Harness) -> None:
    h.feed(request(1) + request(2, rows=3) + request(3, flags=tp.FLAG_TIMING))
    h.settle()
    got = answers(h)
    assert sorted(got) == [1, 2, 3]
    dec = tp.ResponseDecoder()
    _, out, timing = dec.decode(got[2])
    np.testing.assert_array_equal(out["y"], np.arange(6, dtype=np.float32).reshape(3, 2) * 2)
    assert timing == {}
    _, _, timing = dec.decode(got[3])
    assert timing["compute_ns"] == 15 and timing["batch_size"] == 1 and timing["queue_ns"] == 10


def test_answers_come_in_completion_order(h: Harness) -> None:
    h.engine.hold.clear()
    h.feed(request(1))
    h.settle()
    h.feed(request(2, model="missing"))
    h.settle()
    assert list(answers(h)) == [2]
    h.engine.hold.set()
    h.settle()
    assert list(answers(h)) == [2, 1]


@pytest.mark.parametrize(
    ("frame", "status", "expected"),
    [
        (request(5, model="missing"), 404, "unknown model 'missing'"),
        (request(5, version="7"), 404, "unknown model 'double'"),
        (request(5, version="x"), 400, "version must be a positive integer"),
        (b"".join(bytes(p) for p in tp.encode_request(5, "double", {"x": np.zeros((1, 2), np.float64)})), 400, "datatype FP64 but the model takes FP32"),
        (b"".join(bytes(p) for p in tp.encode_request(5, "double", {"z": np.zeros((1, 2), np.float32)})), 400, "unknown input 'z'"),
        (request(5, outputs=["nope"]), 400, "unknown output 'nope'"),
        (request(5, flags=0x80), 400, "request flags 0x80 have unknown bits set"),
        (tp.encode_error(5, 400, "a client sent an error"), 400, "frame kind 3 (error) is not accepted"),
    ],
)  # fmt: skip
def test_a_bad_request_gets_an_error_frame_and_the_connection_goes_on(
    h: Harness, frame: bytes, status: int, expected: str
) -> None:
    h.feed(frame + request(6))
    h.settle()
    got = answers(h)
    info = error_of(got[5])
    assert info.status == status and expected in info.message
    assert got[5].flags == 0
    assert got[6].kind == tp.RESPONSE
    assert not h.transport.eof_written and not h.transport.closing


def test_too_many_elements_is_refused_by_the_shape_check() -> None:
    h = Harness(ServeLimits(max_elements=3))
    try:
        h.feed(request(1, rows=2))
        h.settle()
        info = error_of(answers(h)[1])
        assert info.status == 400 and "over the limit of 3 per tensor" in info.message
    finally:
        h.close()


def test_payload_that_does_not_match_the_descriptors_is_refused(h: Harness) -> None:
    good = request(1)
    meta_len = int.from_bytes(good[16:20], "little")
    body = good[24 : 24 + meta_len] + good[24 + meta_len :] + b"xx"  # two bytes too many
    h.feed(header(rid=1, meta=meta_len, payload=len(body) - meta_len) + body)
    h.settle()
    info = error_of(answers(h)[1])
    assert "request payload is 10 bytes but its inputs total 8" in info.message


@pytest.mark.parametrize(
    ("data", "rid", "status", "expected"),
    [
        (header(version=9), 0, 400, "protocol version 9 is not supported: this end speaks version 2"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "an HTTP client on the TCP protocol port?"),
        (header(rid=4, meta=100, payload=5000), 4, 413, "is over the limit of 4096 bytes"),
        (header(rid=4, meta=600), 4, 431, "frame metadata of 600 bytes is over the limit of 512"),
        (request(0), 0, 400, "request id 0 is reserved"),
    ],
)  # fmt: skip
def test_a_broken_frame_gets_one_error_then_the_connection_half_closes(
    h: Harness, data: bytes, rid: int, status: int, expected: str
) -> None:
    h.feed(request(1) + data)
    h.feed(request(2))  # after the error: discarded
    h.settle()
    got = answers(h)
    info = error_of(got[rid])
    assert info.status == status and expected in info.message
    assert got[rid].flags == tp.FLAG_CLOSING  # tells the client the connection ends here
    assert 2 not in got
    assert h.transport.eof_written and h.conn.draining
    assert h.transport.reading  # input is still read (and dropped) so the close does not reset
    h.conn.check_timeouts(h.conn.draining_since + LINGER_S / 2)
    assert not h.transport.closing
    h.conn.check_timeouts(h.conn.draining_since + LINGER_S)
    assert h.transport.closing


def test_oversize_frame_is_refused_before_its_body_arrives(h: Harness) -> None:
    h.feed(header(rid=8, meta=10, payload=10_000_000)[:24])
    info = error_of(answers(h)[8])
    assert info.status == 413 and "10000010 bytes" in info.message
    assert h.conn.decoder.buffered_bytes == 0


def test_reading_pauses_at_max_in_flight_and_resumes_when_half_answered(h: Harness) -> None:
    h.engine.hold.clear()
    h.feed(b"".join(request(i) for i in range(1, MAX_IN_FLIGHT + 11)))
    h.settle()
    assert h.conn.in_flight == MAX_IN_FLIGHT
    assert not h.transport.reading
    assert h.conn.decoder.buffered_bytes == 10 * len(request(1))  # held, not dropped
    h.engine.hold.set()
    h.settle()
    assert h.transport.reading
    got = answers(h)
    assert sorted(got) == list(range(1, MAX_IN_FLIGHT + 11))
    assert all(f.kind == tp.RESPONSE for f in got.values())
    assert RESUME_IN_FLIGHT < MAX_IN_FLIGHT


def test_a_full_write_buffer_pauses_reading(h: Harness) -> None:
    h.conn.pause_writing()
    assert not h.transport.reading
    h.conn.resume_writing()
    assert h.transport.reading


def test_half_close_answers_what_is_in_flight_then_closes(h: Harness) -> None:
    h.engine.hold.clear()
    h.feed(request(1) + request(2))
    h.settle()
    assert h.conn.eof_received() is True  # keep the transport open to answer
    assert not h.transport.closing
    h.engine.hold.set()
    h.settle()
    assert sorted(answers(h)) == [1, 2]
    assert h.transport.closing


def test_half_close_with_nothing_in_flight_closes_at_once(h: Harness) -> None:
    assert not h.conn.eof_received()


def test_connection_lost_drops_answers_but_requests_finish(h: Harness) -> None:
    h.engine.hold.clear()
    h.feed(request(1))
    h.settle()
    h.transport.close()
    h.settle()
    h.engine.hold.set()
    h.settle()
    assert h.engine.finished == 1
    assert h.conn.in_flight == 0 and h.service.in_flight == 0
    assert answers(h) == {}


def test_a_partial_frame_older_than_the_receive_timeout_is_cut_off(h: Harness) -> None:
    limits = h.service.limits
    h.feed(request(1)[:30])
    t0 = 1000.0
    h.conn.check_timeouts(t0)  # first seen
    h.conn.check_timeouts(t0 + limits.receive_timeout_s * 0.9)
    assert not h.conn.draining
    h.conn.check_timeouts(t0 + limits.receive_timeout_s)
    info = error_of(answers(h)[0])
    assert (
        info.status == 408 and "frame not received whole within 2 s (30 bytes of it arrived)" in info.message
    )
    assert h.conn.draining and h.transport.eof_written


def test_a_partial_frame_that_progresses_to_completion_is_not_cut_off(h: Harness) -> None:
    limits = h.service.limits
    frame = request(1)
    h.feed(frame[:30])
    h.conn.check_timeouts(1000.0)
    h.feed(frame[30:] + request(2)[:10])  # the first completes, a second starts
    h.conn.check_timeouts(1000.0 + limits.receive_timeout_s)  # the new partial frame's clock starts
    assert not h.conn.draining
    h.settle()
    assert sorted(answers(h)) == [1]


def test_an_idle_connection_is_closed_and_a_busy_one_is_not(h: Harness) -> None:
    limits = h.service.limits
    h.engine.hold.clear()
    h.feed(request(1))
    h.settle()
    t = h.conn.active_at
    h.conn.check_timeouts(t + limits.idle_timeout_s * 2)  # a request in flight: not idle
    assert not h.transport.closing
    h.engine.hold.set()
    h.settle()
    now = t + limits.idle_timeout_s * 2
    h.conn.check_timeouts(now + limits.idle_timeout_s / 2)
    assert not h.transport.closing
    h.conn.check_timeouts(now + limits.idle_timeout_s)
    assert h.transport.closing
    assert answers(h)[1].kind == tp.RESPONSE  # no error frame for an idle close


def test_close_leaves_what_is_still_running_to_the_engine_and_drops_its_answer() -> None:
    h = Harness()
    h.engine.hold.clear()
    h.feed(request(1))
    h.settle()
    assert h.engine.started == 1 and h.service.in_flight == 1
    h.loop.run_until_complete(h.front.close())
    written = len(h.transport.written)
    h.engine.hold.set()  # the engine answers after the connection closed
    h.settle()
    assert h.engine.finished == 1 and h.service.in_flight == 0
    assert h.engine.rt.released == 1  # its record released once
    assert len(h.transport.written) == written  # the answer was dropped
    h.loop.close()
