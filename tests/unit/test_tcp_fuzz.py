"""Fuzzing the TCP protocol with hypothesis: random and mutated byte streams, fed in random
chunkings to the frame decoder, the metadata and tensor decoders, and a whole server connection
(mock transport), give frames or clean errors only: never another exception, never a hang (each
example has a deadline), never memory out of proportion to the input."""

import tracemalloc
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lumenrt.ingress.service import ServeLimits
from lumenrt.protocols import raw
from lumenrt.protocols import tcp as tp
from tests.unit.tcp_fakes import Harness, header, request

MAX_FRAME = 1 << 16
MAX_META = 1 << 12

FUZZ = settings(
    max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

VALID_FRAMES = [
    b"".join(bytes(p) for p in parts)
    for parts in (
        tp.encode_request(1, "m", {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}, outputs=["y"]),
        tp.encode_request(2, "m", {"s": np.array([b"ab", b""], dtype=object), "b": np.array([True])}),
        tp.encode_request(3, "m", {"e": np.zeros((0, 4), np.int64), "h": np.float16(1)}, version="2"),
        tp.encode_response(4, "m", 1, [("y", np.arange(3, dtype=np.int8))], [1, 2, 3, 4, 5, 6]),
        tp.encode_response(5, "m", 1, [("s", np.array([b"xyz"], dtype=object))]),
        [tp.encode_error(6, 404, "unknown model")],
    )
]


def decode_everything(frame: tp.Frame) -> None:
    """Every decoder a receiver would run on ``frame``: only ProtocolError may come out."""
    try:
        if frame.kind == tp.REQUEST:
            meta = tp.decode_request_meta(frame.meta)
            if meta.payload_bytes == frame.payload_bytes:
                raw.split_payload(frame.data, frame.payload_at, meta.slots, "input", tp.ProtocolError)
        elif frame.kind == tp.RESPONSE:
            tp.ResponseDecoder().decode(frame)
        elif frame.kind == tp.ERROR:
            tp.decode_error(frame.meta)
    except tp.ProtocolError as exc:
        assert exc.message and not exc.fatal


def feed_all(data: bytes, cuts: list[int]) -> tuple[list[tp.Frame], tp.ProtocolError | None]:
    frames: list[tp.Frame] = []
    dec = tp.FrameDecoder(frames.append, max_frame_bytes=MAX_FRAME, max_meta_bytes=MAX_META)
    error: tp.ProtocolError | None = None
    at = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut < at:
            continue
        try:
            dec.feed(data[at:cut])
        except tp.ProtocolError as exc:
            assert exc.fatal and exc.message
            error = exc
            break
        at = cut
        assert dec.buffered_bytes <= len(data)
        assert dec.buffered_bytes < tp.HEADER_BYTES + MAX_META + MAX_FRAME
    for frame in frames:
        decode_everything(frame)
    return frames, error


def check_bounded(data: bytes, cuts: list[int]) -> None:
    tracemalloc.start()
    try:
        feed_all(data, cuts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 64 * len(data) + (256 << 10), f"peak {peak} bytes for {len(data)} bytes of input"


def with_header(kind: int, meta: bytes, payload: bytes) -> bytes:
    return header(kind=kind, rid=9, meta=len(meta), payload=len(payload)) + meta + payload


cuts_st = st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=12)


@FUZZ
@given(data=st.binary(max_size=4096), cuts=cuts_st)
def test_random_bytes(data: bytes, cuts: list[int]) -> None:
    check_bounded(data, cuts)


@FUZZ
@given(
    kind=st.sampled_from([tp.REQUEST, tp.RESPONSE, tp.ERROR, 0, 200]),
    meta=st.binary(max_size=600),
    payload=st.binary(max_size=600),
    cuts=cuts_st,
)
def test_random_metadata_and_payload_behind_a_valid_header(
    kind: int, meta: bytes, payload: bytes, cuts: list[int]
) -> None:
    frames, error = feed_all(with_header(kind, meta, payload), cuts)
    assert error is None and len(frames) == 1


@st.composite
def mutated(draw: Any) -> bytes:
    """Valid frames, then bytes flipped, cut out, inserted or overwritten with extreme values."""
    frames = draw(st.lists(st.sampled_from(VALID_FRAMES), min_size=1, max_size=4))
    data = bytearray(b"".join(frames))
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "max", "zero"]))
        at = draw(st.integers(min_value=0, max_value=max(0, len(data) - 1)))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "cut":
            del data[at : at + draw(st.integers(min_value=1, max_value=16))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            n = draw(st.integers(min_value=1, max_value=8))
            data[at : at + n] = (b"\xff" if op == "max" else b"\x00") * n
    return bytes(data)


@FUZZ
@given(data=mutated(), cuts=cuts_st)
def test_mutated_valid_frames(data: bytes, cuts: list[int]) -> None:
    check_bounded(data, cuts)


@FUZZ
@given(frames=st.lists(st.sampled_from(VALID_FRAMES), min_size=1, max_size=6), cuts=cuts_st)
def test_valid_frames_in_any_chunking_all_arrive_intact(frames: list[bytes], cuts: list[int]) -> None:
    got, error = feed_all(b"".join(frames), cuts)
    assert error is None
    assert [bytes(f.data[f.payload_at - len(f.meta) - tp.HEADER_BYTES : f.payload_at + f.payload_bytes]) for f in got] == frames  # fmt: skip


@settings(max_examples=150, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=st.lists(
        st.one_of(
            st.sampled_from(
                [request(1), request(2, rows=3), request(3, model="nope"), request(4, outputs=["q"])]
            ),
            mutated(),
            st.binary(max_size=64),
        ),
        max_size=5,
    ),
    cuts=cuts_st,
)
def test_a_server_connection_survives_any_input(stream: list[bytes], cuts: list[int]) -> None:
    """data_received never raises; every answer is a whole frame; each frame is answered once
    unless a fatal error (then half-closed) cut the connection."""
    h = Harness(ServeLimits(max_body_bytes=MAX_FRAME, max_header_bytes=MAX_META, max_elements=1 << 12))
    try:
        data = b"".join(stream)
        at = 0
        for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
            if cut >= at:
                h.feed(data[at:cut])
                at = cut
            h.settle()
        frames = h.transport.frames()
        delivered = h.conn.decoder.frames
        if h.conn.draining:  # answers after the fatal error frame are dropped
            assert len(frames) <= delivered + 1
        else:  # every frame delivered got exactly one answer
            assert len(frames) == delivered
            assert h.conn.in_flight == 0
        for f in frames:
            assert f.kind in (tp.RESPONSE, tp.ERROR)
            if f.kind == tp.ERROR:
                assert tp.decode_error(f.meta).message
        if h.conn.decoder._error is not None:
            assert h.conn.draining and h.transport.eof_written
    finally:
        h.close()
