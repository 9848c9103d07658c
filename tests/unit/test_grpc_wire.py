"""gRPC's conventions over HTTP/2 (protocols/grpc_wire.py): timeouts, status text, the length-prefixed
message and its limits, and the request head's checks."""

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lumenrt.protocols import grpc_wire as wire
from lumenrt.protocols.hpack import HpackDecoder


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"1S", 1.0),
        (b"250m", 0.25),
        (b"3M", 180.0),
        (b"2H", 7200.0),
        (b"99999999u", 99.999999),
        (b"5n", 5e-9),
    ],
)
def test_timeouts_parse(value: bytes, seconds: float) -> None:
    assert wire.parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"1", b"1s", b"123456789S", b"-1S", b"1.5S", b"1 S"])
def test_malformed_timeouts_are_refused(value: bytes) -> None:
    with pytest.raises(wire.GrpcWireError, match="grpc-timeout"):
        wire.parse_timeout(value)


@given(st.floats(min_value=0, max_value=10**7, allow_nan=False))
def test_an_encoded_timeout_is_never_shorter(seconds: float) -> None:
    value = wire.encode_timeout(seconds)
    assert len(value) <= wire.MAX_TIMEOUT_DIGITS + 1
    assert wire.parse_timeout(value) >= seconds * (1 - 1e-12)


@given(st.text(max_size=80))
def test_status_text_round_trips_in_printable_ascii(text: str) -> None:
    encoded = wire.encode_message_text(text)
    assert all(0x20 <= b < 0x7F for b in encoded)
    expected = text.encode("utf-8", "replace")[: wire.MAX_MESSAGE_LEN].decode("utf-8", "replace")
    assert wire.decode_message_text(encoded) == expected


def _framed(message: bytes, compressed: bool = False) -> bytes:
    return wire.frame_prefix(len(message), compressed) + message


def test_a_message_split_anywhere_is_whole_once() -> None:
    body = _framed(b"abcdefghij")
    for cut in range(len(body) + 1):
        reader = wire.MessageReader(100)
        reader.feed(memoryview(body[:cut]))
        reader.feed(memoryview(body[cut:]))
        assert reader.end() == b"abcdefghij"


def test_a_whole_message_in_one_frame_takes_the_short_way() -> None:
    assert wire.whole_message(memoryview(_framed(b"xyz")), 100) == b"xyz"
    assert wire.whole_message(memoryview(_framed(b"xyz")[:6]), 100) is None  # not whole
    assert wire.whole_message(memoryview(_framed(b"xyz", compressed=True)), 100) is None
    assert wire.whole_message(memoryview(_framed(b"x" * 101)), 100) is None  # the reader refuses it


def test_an_empty_message_is_a_message() -> None:
    reader = wire.MessageReader(100)
    reader.feed(memoryview(_framed(b"")))
    assert reader.end() == b""


def test_a_claimed_length_costs_nothing_until_its_bytes_arrive() -> None:
    reader = wire.MessageReader(64 << 20)
    reader.feed(memoryview(wire.frame_prefix((64 << 20) - 1)))  # claims 64 MiB, sends none of it
    assert reader.held == 0
    reader.feed(memoryview(b"a" * 1000))
    assert reader.held == 1000


def test_a_message_over_the_limit_is_refused_from_its_prefix() -> None:
    reader = wire.MessageReader(1000)
    with pytest.raises(wire.GrpcWireError, match="over the server's limit") as info:
        reader.feed(memoryview(wire.frame_prefix(1 << 31)))  # nothing of it sent: nothing made
    assert info.value.code == wire.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("coding", "pack"),
    [(b"gzip", gzip.compress), (b"deflate", zlib.compress)],
)
def test_compressed_messages_are_inflated_within_the_limit(coding: bytes, pack: object) -> None:
    reader = wire.MessageReader(100, coding)
    reader.feed(memoryview(_framed(pack(b"m" * 50), compressed=True)))  # type: ignore[operator]
    assert reader.end() == b"m" * 50
    bomb = wire.MessageReader(10_000, coding)  # ~1 KB on the wire, 1 MB inflated
    with pytest.raises(wire.GrpcWireError, match="inflates past") as info:
        bomb.feed(memoryview(_framed(pack(b"\0" * 1_000_000), compressed=True)))  # type: ignore[operator]
    assert info.value.code == wire.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("coding", "body", "code"),
    [
        (None, _framed(b"x", compressed=True), wire.INTERNAL),  # compressed without a coding
        (b"br", _framed(b"x", compressed=True), wire.UNIMPLEMENTED),
        (b"gzip", _framed(b"not gzip", compressed=True), wire.INTERNAL),
        (None, b"\x02\0\0\0\0", wire.INTERNAL),  # a flag that is neither 0 nor 1
        (None, _framed(b"a") + _framed(b"b"), wire.UNIMPLEMENTED),  # two messages on a unary call
        (b"gzip", _framed(gzip.compress(b"z" * 50)[:-6], compressed=True), wire.INTERNAL),  # cut short
        (b"deflate", _framed(zlib.compress(b"z" * 50) + b"junk", compressed=True), wire.INTERNAL),
    ],
)
def test_broken_messages_name_their_problem(coding: bytes | None, body: bytes, code: int) -> None:
    reader = wire.MessageReader(100, coding)
    with pytest.raises(wire.GrpcWireError) as info:
        reader.feed(memoryview(body))
    assert info.value.code == code


def test_a_call_that_ends_early_or_empty() -> None:
    partial = wire.MessageReader(100)
    partial.feed(memoryview(_framed(b"abc")[:4]))
    with pytest.raises(wire.GrpcWireError, match="inside its message"):
        partial.end()
    with pytest.raises(wire.GrpcWireError, match="without a request message"):
        wire.MessageReader(100).end()


GOOD = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"h"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


def test_a_request_head_is_read() -> None:
    head = wire.parse_request_head(
        [
            *GOOD,
            (b"grpc-timeout", b"5S"),
            (b"grpc-encoding", b"gzip"),
            (b"x-api-key", b"k"),
            (b"trace-bin", b"AAE"),
        ]
    )
    assert head.path == "/inference.GRPCInferenceService/ModelInfer"
    assert head.timeout_s == 5.0
    assert head.coding == b"gzip"
    assert head.metadata == (("x-api-key", "k"), ("trace-bin", b"\x00\x01"))


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ((b":method", b"GET"), 405),
        ((b"content-type", b"application/json"), 415),
        ((b":path", b"nope"), 400),
        ((b"grpc-timeout", b"soon"), 400),
        ((b"x-bin", b"!!"), 400),
        ((b":protocol", b"websocket"), 400),
    ],
)
def test_heads_that_are_not_grpc_calls(change: tuple[bytes, bytes], status: int) -> None:
    fields = [f for f in GOOD if f[0] != change[0]] + [change]
    with pytest.raises(wire.HeadError) as info:
        wire.parse_request_head(fields)
    assert info.value.http_status == status


def test_the_fixed_answer_blocks_decode_as_grpc_expects() -> None:
    decoder = HpackDecoder()
    assert decoder.decode(wire.RESPONSE_HEAD) == [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
    ]
    assert decoder.decode(wire.OK_TRAILERS) == [(b"grpc-status", b"0")]
    only = decoder.decode(wire.trailers_only(wire.NOT_FOUND, "model 'x' 100% unknown"))
    assert (b"grpc-status", b"5") in only
    assert (b"grpc-message", b"model 'x' 100%25 unknown") in only
