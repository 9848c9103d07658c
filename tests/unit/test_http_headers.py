"""The checks on the HTTP headers that change what a request means, and the bounded decoder of a
compressed body (``lumenrt.protocols.http_headers``), without sockets."""

import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumenrt.protocols.errors import ServerError
from lumenrt.protocols.http_headers import ContentDecoder, HttpError, check_head, parser_error

LIMIT = 1 << 16


Head = tuple[str, bytes, dict[bytes, bytes], int]


def head(version: str = "1.1", method: bytes = b"POST", **fields: str) -> Head:
    """check_head's arguments: ``content_length="5"`` is the field ``content-length: 5``."""
    headers = {k.replace("_", "-").encode(): v.encode() for k, v in fields.items()}
    return version, method, headers, LIMIT


def refused(args: Head) -> ServerError:
    with pytest.raises(ServerError) as info:
        check_head(*args)
    return info.value


@pytest.mark.parametrize(
    ("args", "status", "fragment"),
    [
        (head("2.0"), 505, "HTTP version 2.0"),
        (head("0.9"), 505, "HTTP version 0.9"),
        (head(method=b"CONNECT"), 405, "CONNECT"),
        (head(transfer_encoding="gzip"), 501, "'gzip'"),
        (head(transfer_encoding="gzip, chunked"), 501, "'gzip, chunked'"),
        (head(transfer_encoding="chunked, chunked"), 501, "'chunked, chunked'"),
        (head(transfer_encoding="chunked", content_length="5"), 400, "Content-Length and Transfer-Encoding"),
        (head("1.0", transfer_encoding="chunked"), 400, "HTTP/1.0"),
        (head(content_length=str(LIMIT + 1)), 413, f"limit of {LIMIT}"),
        (head(content_encoding="br"), 415, "'br'"),
        (head(content_encoding="gzip, deflate"), 415, "more than one coding"),
        (head(content_encoding="gzip, gzip"), 415, "more than one coding"),
        (head(expect="100-continue, foo"), 417, "'100-continue, foo'"),
        (head(expect="200-ok"), 417, "'200-ok'"),
    ],
    ids=[
        "h2", "h09", "connect", "te-gzip", "te-gzip-chunked", "te-chunked-twice", "te-and-cl", "te-in-1.0",
        "too-long", "ce-br", "ce-two", "ce-gzip-twice", "expect-list", "expect-other",
    ],
)  # fmt: skip
def test_refused_heads_name_the_header(args: Head, status: int, fragment: str) -> None:
    err = refused(args)
    assert (err.status, fragment in err.message) == (status, True), err.message


def test_a_415_says_which_encodings_are_accepted() -> None:
    err = refused(head(content_encoding="zstd"))
    assert isinstance(err, HttpError)
    assert err.headers == [(b"accept-encoding", b"gzip, deflate")]


@pytest.mark.parametrize(
    ("args", "coding", "send_continue"),
    [
        (head(), None, False),
        (head("1.0", method=b"GET"), None, False),
        (head(transfer_encoding="Chunked"), None, False),
        (head(content_encoding="identity"), None, False),
        (head(content_encoding="GZIP"), "gzip", False),
        (head(content_encoding="x-gzip"), "gzip", False),
        (head(content_encoding="identity, deflate"), "deflate", False),
        (head(expect="100-Continue", content_length="10"), None, True),
        (head(expect="100-continue", transfer_encoding="chunked"), None, True),
        (head(expect="100-continue", content_length="0"), None, False),  # no body to wait for
        (head(expect="100-continue"), None, False),
        (head("1.0", expect="100-continue", content_length="10"), None, False),  # RFC 9110 §10.1.1
        (head("1.0", expect="anything"), None, False),
    ],
)
def test_accepted_heads(args: Head, coding: str | None, send_continue: bool) -> None:
    plan = check_head(*args)
    assert (plan.decoder.coding if plan.decoder else None) == coding
    assert plan.send_continue == send_continue


@pytest.mark.parametrize(
    ("message", "status", "fragment"),
    [
        ("Invalid HTTP version", 505, "HTTP version"),
        ("Pause on PRI/Upgrade", 505, "HTTP/2"),
        ("Content-Length can't be present with Transfer-Encoding", 400, "request smuggling"),
        ("Transfer-Encoding can't be present with Content-Length", 400, "request smuggling"),
        ("Request has invalid `Transfer-Encoding`", 501, "only 'chunked'"),
        ("Invalid `Transfer-Encoding` header value", 400, "malformed Transfer-Encoding"),
        ("Duplicate Content-Length", 400, "malformed Content-Length"),
        ("Invalid method encountered", 400, "malformed HTTP request"),
    ],
)
def test_parser_errors_name_the_header(message: str, status: int, fragment: str) -> None:
    err = parser_error(message)
    assert (err.status, fragment in err.message) == (status, True), err.message


# ---- ContentDecoder ---------------------------------------------------------------------------------


def decode(coding: str, data: bytes, limit: int = LIMIT, piece: int = 7) -> bytes:
    decoder = ContentDecoder(coding, limit)
    for at in range(0, len(data), piece):
        decoder.feed(data[at : at + piece])
    return decoder.finish()


def failure(coding: str, data: bytes, limit: int = LIMIT) -> ServerError:
    with pytest.raises(ServerError) as info:
        decode(coding, data, limit)
    return info.value


def test_gzip_and_deflate_round_trip_in_any_pieces() -> None:
    body = b'{"inputs": [' + b"1.5, " * 3000 + b"2]}"
    for piece in (1, 7, 4096, len(body)):
        assert decode("gzip", gzip.compress(body), piece=piece) == body
        assert decode("deflate", zlib.compress(body), piece=piece) == body


def test_gzip_members_are_concatenated() -> None:
    assert decode("gzip", gzip.compress(b"abc") + gzip.compress(b"def")) == b"abcdef"


def test_an_empty_body_is_empty() -> None:
    assert ContentDecoder("gzip", LIMIT).finish() == b""


def test_the_decoded_size_is_bounded_before_it_is_allocated() -> None:
    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in ~64 KiB
    decoder = ContentDecoder("gzip", LIMIT)
    with pytest.raises(ServerError) as info:
        decoder.feed(bomb)  # one call: zlib alone would inflate all of it
    assert info.value.status == 413 and f"limit of {LIMIT}" in info.value.message
    assert decoder.size == LIMIT + 1  # one byte past the limit, no more
    assert decode("gzip", gzip.compress(bytes(LIMIT))) == bytes(LIMIT)  # exactly the limit is fine


@pytest.mark.parametrize(
    ("coding", "data", "fragment"),
    [
        ("gzip", b"\x1f\x8b not gzip", "not valid gzip"),
        ("deflate", b"plain text", "not valid deflate"),
        ("deflate", gzip.compress(b"x"), "not valid deflate"),  # gzip sent as deflate
        ("gzip", gzip.compress(b"abc")[:-3], "ends inside"),
        ("deflate", zlib.compress(b"abc") + b"!", "after the end"),
        ("gzip", gzip.compress(b"abc") + b"\0\0\0\0", "not valid gzip"),
    ],
)
def test_corrupt_data_is_400(coding: str, data: bytes, fragment: str) -> None:
    err = failure(coding, data)
    assert err.status == 400 and fragment in err.message and f"Content-Encoding {coding}" in err.message


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=400) | st.builds(gzip.compress, st.binary(max_size=2000)),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
    coding=st.sampled_from(["gzip", "deflate"]),
    limit=st.integers(0, 1500),
)
def test_any_bytes_decode_or_fail_cleanly_within_the_limit(
    data: bytes, cuts: list[int], coding: str, limit: int
) -> None:
    decoder = ContentDecoder(coding, limit)
    at = 0
    try:
        for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
            decoder.feed(data[at:cut])
            at = max(at, cut)
        out = decoder.finish()
    except ServerError as err:
        assert err.status in (400, 413) and err.message
        assert decoder.size <= limit + 1
        return
    assert len(out) <= limit
