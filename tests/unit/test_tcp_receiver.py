"""The two frame readers, one test body each: FrameDecoder (``feed(bytes)``, the clients') and
FrameReceiver (the server's: the transport reads into its buffer, ``get_buffer`` +
``buffer_updated``). Same frames for any chunking, pause/resume, errors; plus what only the
receiver does: frames valid during the call only, big frames in a buffer of their exact size or
received into lent memory (``payload_into``, the "lent" kind runs the shared bodies that way), no
buffer for a size refused by the header, and a read buffer shared between receivers (the "shared"
kind runs the shared bodies with another connection's read landing in it after every read) that
leaves an idle receiver holding no buffer of its own."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from lumenrt.protocols import tcp as tp
from lumenrt.protocols.tcp import Frame, FrameDecoder, ProtocolError
from lumenrt.protocols.tcp_receiver import BUFFER_BYTES, FrameReceiver, ReadBuffer


def snapshot(frame: Frame) -> Frame:
    """A frame that outlives the call (FrameReceiver's are valid during it only)."""
    return Frame(
        frame.kind, frame.flags, frame.request_id, frame.meta, bytes(frame.payload), 0, frame.payload_bytes
    )


class Loan:
    """Memory lent for one payload (tcp_receiver.Loan), counting its releases."""

    def __init__(self, meta: bytes, nbytes: int) -> None:
        self.meta = meta
        self.memory = bytearray(nbytes)
        self.payload = memoryview(self.memory)
        self.released = 0

    def release(self) -> None:
        self.released += 1


class Reader:
    """``feed``/``pause``/``resume`` over either implementation; ``got``: snapshots of the frames;
    kind "lent": the receiver with every big request's payload lent (``loans``); kind "shared":
    the receiver reading into a shared buffer, which a neighbour overwrites after every read."""

    def __init__(self, kind: str, on_frame: Callable[[Frame], None] | None = None, **limits: int) -> None:
        self.got: list[Frame] = []
        self.loans: list[Loan] = []

        def take(frame: Frame) -> None:
            self.got.append(snapshot(frame))
            if on_frame is not None:
                on_frame(frame)

        def lend(meta: bytes, nbytes: int) -> Loan:
            self.loans.append(Loan(meta, nbytes))
            return self.loans[-1]

        self.shared = ReadBuffer() if kind == "shared" else None
        self.impl: Any = (
            FrameDecoder(take, **limits)
            if kind == "decoder"
            else FrameReceiver(
                take,
                payload_into=lend if kind == "lent" else None,  # type: ignore[arg-type]
                shared=self.shared,
                **limits,
            )
        )
        self.kind = kind

    def feed(self, data: bytes) -> None:
        if self.kind == "decoder":
            self.impl.feed(data)
            return
        view = memoryview(data)
        while True:  # as a transport: as much as each buffer takes
            buf = self.impl.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            try:
                self.impl.buffer_updated(n)
            finally:
                if self.shared is not None:  # another connection's read lands in it next
                    self.shared.buf[: min(n, BUFFER_BYTES)] = b"\xee" * min(n, BUFFER_BYTES)
            view = view[n:]
            if not view:
                return


@pytest.fixture(params=["decoder", "receiver", "lent", "shared"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def request_frame(rid: int, nbytes: int) -> bytes:
    x = np.arange(nbytes // 4, dtype=np.float32).reshape(1, -1)
    return b"".join(bytes(p) for p in tp.encode_request(rid, "m", {"x": x}))


def stream() -> tuple[bytes, list[int]]:
    """Small frames around one larger than the receiver's buffer."""
    parts = [request_frame(1, 64), tp.encode_error(2, 400, "no"), request_frame(3, 3 * BUFFER_BYTES)]
    parts += [request_frame(4, 400), request_frame(5, 8)]
    return b"".join(parts), [1, 2, 3, 4, 5]


def expected() -> list[tuple[int, bytes, bytes]]:
    data, _ = stream()
    out: list[Frame] = []
    FrameDecoder(out.append).feed(data)
    return [(f.request_id, f.meta, bytes(f.payload)) for f in out]


@pytest.mark.parametrize("size", [1, 7, 24, 25, 1000, 4096, 70_000, 1 << 20])
def test_any_chunking_gives_the_same_frames(kind: str, size: int) -> None:
    data, ids = stream()
    r = Reader(kind)
    for at in range(0, len(data), size):
        r.feed(data[at : at + size])
    assert [(f.request_id, f.meta, bytes(f.payload)) for f in r.got] == expected()
    assert r.impl.frames == len(ids) and r.impl.buffered_bytes == 0
    if kind == "lent":  # the one frame bigger than the buffer, lent once, released once
        assert [(loan.meta, loan.released) for loan in r.loans] == [(expected()[2][1], 1)]
        assert bytes(r.loans[0].memory) == expected()[2][2]


def test_pause_holds_frames_until_resume(kind: str) -> None:
    data, ids = stream()
    r: Reader

    def pause(frame: Frame) -> None:
        r.impl.pause()

    r = Reader(kind, pause)
    r.feed(data)
    assert [f.request_id for f in r.got] == [1]
    assert r.impl.buffered_bytes == len(data) - len(request_frame(1, 64))
    while len(r.got) < len(ids):
        r.impl.resume()
    assert [f.request_id for f in r.got] == ids and r.impl.buffered_bytes == 0


def test_a_raising_callback_keeps_the_frames_after_it(kind: str) -> None:
    data, ids = stream()
    calls = []

    def boom(frame: Frame) -> None:
        calls.append(frame.request_id)
        if len(calls) == 1:
            raise RuntimeError("boom")

    r = Reader(kind, boom)
    first_two = len(request_frame(1, 64)) + len(tp.encode_error(2, 400, "no"))
    with pytest.raises(RuntimeError):
        r.feed(data[:first_two])
    r.feed(data[first_two:])  # the next read delivers the frame held since, and the rest
    assert [f.request_id for f in r.got] == ids


def test_a_broken_frame_is_fatal_after_the_frames_before_it(kind: str) -> None:
    r = Reader(kind)
    with pytest.raises(ProtocolError) as info:
        r.feed(tp.encode_error(1, 400, "x") + b"garbage-garbage-garbage-garbage")
    assert info.value.fatal and "not a lumenrt frame" in info.value.message
    assert [f.request_id for f in r.got] == [1]
    with pytest.raises(ProtocolError):  # stays broken
        r.feed(b"")


def test_an_oversize_frame_is_refused_from_its_header(kind: str) -> None:
    r = Reader(kind, max_frame_bytes=1 << 20)
    head = tp.encode_header(tp.REQUEST, 0, 77, 10, 10_000_000)
    with pytest.raises(ProtocolError) as info:
        r.feed(head)
    assert (info.value.status, info.value.request_id) == (413, 77)


def test_receiver_frames_are_views_valid_during_the_call_only() -> None:
    seen: list[Any] = []
    receiver = FrameReceiver(lambda f: seen.append((f.data, bytes(f.payload))))
    for rid in (1, 2):
        frame = request_frame(rid, 64)
        buf = receiver.get_buffer(len(frame))
        buf[: len(frame)] = frame
        receiver.buffer_updated(len(frame))
    (data1, payload1), (_, payload2) = seen
    assert isinstance(data1, memoryview) and data1.readonly  # a callee cannot write into it
    assert payload1 == payload2  # the same tensor: both read correctly during their calls
    assert receiver.buffered_bytes == 0


def test_a_big_frame_gets_a_buffer_of_its_exact_size_once_its_header_passed() -> None:
    got: list[int] = []
    receiver = FrameReceiver(lambda f: got.append(len(f.data)), max_frame_bytes=1 << 24)
    frame = request_frame(9, 5 * BUFFER_BYTES)
    buf = receiver.get_buffer(-1)
    buf[:10] = frame[:10]
    receiver.buffer_updated(10)
    assert len(receiver.get_buffer(-1)) >= BUFFER_BYTES - 10  # no header yet: the small buffer
    rest = receiver.get_buffer(-1)
    rest[: tp.HEADER_BYTES - 10] = frame[10 : tp.HEADER_BYTES]
    receiver.buffer_updated(tp.HEADER_BYTES - 10)
    big = receiver.get_buffer(-1)
    assert len(big) == len(frame) - tp.HEADER_BYTES  # the header passed: the rest, exactly
    big[:] = frame[tp.HEADER_BYTES :]
    receiver.buffer_updated(len(big))
    assert got == [len(frame)] and receiver.buffered_bytes == 0
    assert len(receiver.get_buffer(-1)) == BUFFER_BYTES  # back to the small buffer, from its start


def test_a_paused_receiver_grows_only_by_what_is_read() -> None:
    receiver = FrameReceiver(lambda f: receiver.pause())
    frames = b"".join(request_frame(i, 400) for i in range(1, 400))  # ~200 KB of small frames
    view = memoryview(frames)
    while view:
        buf = receiver.get_buffer(-1)
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        receiver.buffer_updated(n)
        view = view[n:]
    assert receiver.frames == 1 and receiver.buffered_bytes == len(frames) - len(request_frame(1, 400))
    assert len(receiver.get_buffer(-1)) <= len(frames)  # grown by what arrived, not more


def big_request(rid: int) -> bytes:
    return request_frame(rid, 3 * BUFFER_BYTES)


def lending_receiver(got: list[Any], revoked: list[int] | None = None) -> tuple[FrameReceiver, list[Loan]]:
    loans: list[Loan] = []

    def lend(meta: bytes, nbytes: int) -> Loan:
        loans.append(Loan(meta, nbytes))
        return loans[-1]

    receiver: FrameReceiver

    def on_frame(frame: Frame) -> None:
        got.append((frame.request_id, receiver.lent, bytes(frame.payload)))

    receiver = FrameReceiver(
        on_frame,
        max_frame_bytes=1 << 24,
        payload_into=lend,  # type: ignore[arg-type]
        on_revoked=None if revoked is None else revoked.append,
    )
    return receiver, loans


def write(receiver: FrameReceiver, data: bytes, piece: int = 1 << 30) -> None:
    view = memoryview(data)
    while view:
        buf = receiver.get_buffer(-1)
        n = min(len(buf), len(view), piece)
        buf[:n] = view[:n]
        receiver.buffer_updated(n)
        view = view[n:]


def test_a_lent_payload_is_read_straight_into_the_loan_given_during_the_call_then_released() -> None:
    got: list[Any] = []
    receiver, loans = lending_receiver(got)
    frame = big_request(4)
    write(receiver, frame[: tp.HEADER_BYTES])
    assert not loans  # no metadata yet: nothing asked for
    write(receiver, frame[tp.HEADER_BYTES :], piece=5000)
    [loan] = loans
    ((rid, lent, payload),) = got
    assert rid == 4 and lent is loan and loan.released == 1  # given during the call, released after
    assert payload == bytes(loan.memory) == frame[-len(loan.memory) :]
    assert receiver.lent is None and receiver.buffered_bytes == 0


def test_the_transport_writes_into_the_lent_memory_itself() -> None:
    got: list[Any] = []
    receiver, loans = lending_receiver(got)
    frame = big_request(4)
    write(receiver, frame[: len(frame) // 2])
    [loan] = loans
    buf = receiver.get_buffer(-1)
    address = np.frombuffer(buf, np.uint8).ctypes.data
    base = np.frombuffer(loan.memory, np.uint8).ctypes.data
    assert base <= address < base + len(loan.memory)  # no buffer of the receiver's own between
    assert receiver.buffered_bytes == len(frame) // 2


def test_a_revoked_loan_reports_its_request_and_the_frames_after_it_still_come() -> None:
    got: list[Any] = []
    revoked: list[int] = []
    receiver, loans = lending_receiver(got, revoked)
    frame = big_request(4)
    write(receiver, frame[: len(frame) // 2])
    loans[0].payload.release()  # the model closed: its memory is taken back
    write(receiver, frame[len(frame) // 2 :] + request_frame(5, 64))
    assert revoked == [4] and loans[0].released == 1
    assert [rid for rid, _, _ in got] == [5]


def test_drop_releases_the_loan_in_progress_once() -> None:
    """What the connection calls when it is lost or fails mid-frame."""
    receiver, loans = lending_receiver([])
    write(receiver, big_request(4)[:100_000])
    assert receiver.buffered_bytes == 100_000
    receiver.drop()
    receiver.drop()
    assert loans[0].released == 1 and receiver.buffered_bytes == 0


def test_a_payload_nobody_lends_gets_the_receivers_own_buffer() -> None:
    got: list[Any] = []
    receiver = FrameReceiver(
        lambda f: got.append(bytes(f.payload)), max_frame_bytes=1 << 24, payload_into=lambda meta, n: None
    )
    frame = big_request(4)
    write(receiver, frame, piece=7000)
    assert got == [bytes(frame[-3 * BUFFER_BYTES :])]


def test_frames_that_arrive_whole_leave_the_receiver_no_buffer_of_its_own() -> None:
    got: list[int] = []
    receiver = FrameReceiver(lambda f: got.append(f.request_id), shared=ReadBuffer())
    assert receiver.own_buffer_bytes == 0  # an idle connection holds none
    write(receiver, request_frame(1, 64) + request_frame(2, 400))
    write(receiver, request_frame(3, 8))
    assert got == [1, 2, 3] and receiver.own_buffer_bytes == 0


def test_a_partial_frame_moves_to_its_own_buffer_and_trim_gives_that_back_once_idle() -> None:
    shared = ReadBuffer()
    got: list[tuple[int, bytes]] = []
    one = FrameReceiver(lambda f: got.append((f.request_id, bytes(f.payload))), shared=shared)
    other = FrameReceiver(lambda f: got.append((f.request_id, bytes(f.payload))), shared=shared)
    frame = request_frame(1, 4000)
    write(one, frame[:1000])
    assert one.own_buffer_bytes == BUFFER_BYTES and one.buffered_bytes == 1000
    one.trim()  # mid-frame: kept
    assert one.own_buffer_bytes == BUFFER_BYTES
    write(other, request_frame(2, 4000))  # the neighbour's read overwrites the shared buffer
    write(one, frame[1000:])
    assert got == [(2, bytes(request_frame(2, 4000)[-4000:])), (1, frame[-4000:])]
    assert one.own_buffer_bytes == BUFFER_BYTES  # busy: kept for the next reads
    one.trim()
    assert one.own_buffer_bytes == 0 and other.own_buffer_bytes == 0
    write(one, request_frame(3, 64))
    assert [rid for rid, _ in got] == [2, 1, 3] and one.own_buffer_bytes == 0
