"""gRPC's conventions over HTTP/2, as lumenrt's own server and client speak them (no I/O): status codes,
the ``grpc-timeout`` header, ``grpc-message`` percent-encoding, the length-prefixed message and
the fixed header blocks of a unary answer. The source is gRPC's "gRPC over HTTP2" protocol
description (doc/PROTOCOL-HTTP2.md in grpc/grpc).

A call is: request HEADERS (``:method POST``, ``:path /package.Service/Method``,
``content-type application/grpc``, ``te trailers``, optional ``grpc-timeout``, ``grpc-encoding``
and metadata), DATA carrying length-prefixed messages (1 octet compressed flag, 4 octets length,
the message), END_STREAM; the answer is HEADERS (``:status 200``, ``content-type``), DATA, and
trailers (``grpc-status``, ``grpc-message``) with END_STREAM, or, when it fails before any message,
the trailers alone in the first HEADERS ("trailers-only").
"""

import base64
import binascii
import zlib
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from lumenrt.protocols.hpack import encode_block

# status codes (grpc/include/grpcpp/impl/codegen/status_code_enum.h; the same in every gRPC)
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
ALREADY_EXISTS, PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION = 6, 7, 8, 9
ABORTED, OUT_OF_RANGE, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED = (
    10, 11, 12, 13, 14, 15, 16,
)  # fmt: skip
STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip
STATUS_CODES = {name: code for code, name in enumerate(STATUS_NAMES)}

CONTENT_TYPE = b"application/grpc"
PREFIX_BYTES = 5  # a message's compressed flag and length
MAX_TIMEOUT_DIGITS = 8  # the protocol's bound on grpc-timeout's digits
_TIMEOUT_UNITS = {
    ord("H"): 3600.0,
    ord("M"): 60.0,
    ord("S"): 1.0,
    ord("m"): 1e-3,
    ord("u"): 1e-6,
    ord("n"): 1e-9,
}
# request codings we decode (grpc-encoding); what we answer with is always identity
ACCEPT_ENCODING = b"identity,deflate,gzip"
MAX_MESSAGE_LEN = 256  # grpc-message text kept in an answer (octets before encoding; guessed)


class GrpcWireError(ValueError):
    """A call that breaks gRPC's rules: answered with ``code`` and the message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_timeout(value: bytes) -> float:
    """A ``grpc-timeout`` value (1 to 8 digits and a unit) in seconds."""
    if not 2 <= len(value) <= MAX_TIMEOUT_DIGITS + 1 or not value[:-1].isdigit():
        raise GrpcWireError(INTERNAL, f"malformed grpc-timeout {value[:16]!r}")
    unit = _TIMEOUT_UNITS.get(value[-1])
    if unit is None:
        raise GrpcWireError(INTERNAL, f"malformed grpc-timeout {value[:16]!r} (unit H, M, S, m, u or n)")
    return int(value[:-1]) * unit


def encode_timeout(seconds: float) -> bytes:
    """``seconds`` as a ``grpc-timeout`` value: the finest unit whose count fits 8 digits,
    rounded up (a deadline is never shortened)."""
    seconds = max(seconds, 0.0)
    for unit, scale in ((b"n", 1e9), (b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600)):
        count = -int(-seconds * scale // 1)
        if count < 10**MAX_TIMEOUT_DIGITS:
            return b"%d%s" % (count, unit)
    return b"99999999H"


def encode_message_text(message: str) -> bytes:
    """``grpc-message``: UTF-8, percent-encoded outside the printable ASCII range and ``%``."""
    raw = message.encode("utf-8", "replace")[:MAX_MESSAGE_LEN]
    return quote(raw, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode("ascii")


def decode_message_text(value: bytes) -> str:
    return unquote_to_bytes(value).decode("utf-8", "replace")


def frame_prefix(length: int, compressed: bool = False) -> bytes:
    """The 5 octets before a message."""
    return (b"\x01" if compressed else b"\x00") + length.to_bytes(4, "big")


# ---- a unary call's answer, as header blocks made once -------------------------------------------

RESPONSE_HEAD = encode_block([(b":status", b"200"), (b"content-type", CONTENT_TYPE)])
OK_TRAILERS = encode_block([(b"grpc-status", b"0")])


def status_fields(code: int, message: str) -> list[tuple[bytes, bytes]]:
    fields = [(b"grpc-status", b"%d" % code)]
    if message:
        fields.append((b"grpc-message", encode_message_text(message)))
    return fields


def error_trailers(code: int, message: str) -> bytes:
    """Trailers after a response head: the call failed."""
    return encode_block(status_fields(code, message))


def trailers_only(code: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    """A whole answer in one header block (a call refused before any message)."""
    fields = [(b":status", b"200"), (b"content-type", CONTENT_TYPE), *status_fields(code, message)]
    if extra:
        fields.extend(extra)
    return encode_block(fields)


# ---- a call's message ---------------------------------------------------------------------------


class MessageReader:
    """The one message of a unary call, from its DATA frames. The length prefix is checked against
    ``max_bytes``, and the buffer then grows with what actually arrives (a prefix that claims
    64 MiB costs nothing until the bytes come); a compressed message is inflated within the same
    bound. ``message`` once ``complete``; ``held`` is what the buffer holds so far."""

    __slots__ = ("_buffer", "_compressed", "_length", "_prefix", "coding", "max_bytes", "message")

    def __init__(self, max_bytes: int, coding: bytes | None = None) -> None:
        self.max_bytes = max_bytes
        self.coding = coding  # grpc-encoding: None/identity, gzip or deflate
        self._prefix = b""
        self._buffer: bytearray | None = None
        self._length = 0
        self._compressed = False
        self.message: bytes | None = None  # set once whole

    @property
    def started(self) -> bool:
        return bool(self._prefix) or self._buffer is not None or self.message is not None

    @property
    def held(self) -> int:
        return len(self._prefix) + (len(self._buffer) if self._buffer is not None else 0)

    def feed(self, data: memoryview) -> None:
        """Take one DATA frame's payload (copied)."""
        at, end = 0, len(data)
        while at < end:
            if self.message is not None:
                raise GrpcWireError(UNIMPLEMENTED, "a second message on a unary call")
            buffer = self._buffer
            if buffer is None:
                take = min(PREFIX_BYTES - len(self._prefix), end - at)
                self._prefix += bytes(data[at : at + take])
                at += take
                if len(self._prefix) < PREFIX_BYTES:
                    return
                flag = self._prefix[0]
                length = int.from_bytes(self._prefix[1:5], "big")
                if flag > 1:
                    raise GrpcWireError(INTERNAL, f"a message's compressed flag is {flag}")
                if length > self.max_bytes:
                    raise GrpcWireError(
                        RESOURCE_EXHAUSTED,
                        f"a message of {length} bytes is over the server's limit of {self.max_bytes}",
                    )
                self._compressed = bool(flag)
                if flag and self.coding in (None, b"identity"):
                    raise GrpcWireError(INTERNAL, "a compressed message without grpc-encoding")
                self._prefix = b""
                self._length = length
                self._buffer = buffer = bytearray()
            take = min(self._length - len(buffer), end - at)
            buffer += data[at : at + take]
            at += take
            if len(buffer) == self._length:
                self._buffer = None
                self._finish(bytes(buffer))

    def _finish(self, body: bytes) -> None:
        if self._compressed:
            body = inflate(body, self.coding or b"", self.max_bytes)
        self.message = body

    def end(self) -> bytes:
        """The message, at the call's END_STREAM."""
        if self.message is None:
            if self.started:
                raise GrpcWireError(INTERNAL, "the call ended inside its message")
            raise GrpcWireError(UNIMPLEMENTED, "a unary call without a request message")
        return self.message


def whole_message(data: memoryview, max_bytes: int) -> bytes | None:
    """The message, when ``data`` (a call's first DATA) is exactly one whole uncompressed message
    within ``max_bytes``; else None (a ``MessageReader`` takes it)."""
    if len(data) < PREFIX_BYTES or data[0] != 0:
        return None
    length = int.from_bytes(data[1:5], "big")
    if length != len(data) - PREFIX_BYTES or length > max_bytes:
        return None
    return bytes(data[PREFIX_BYTES:])


def inflate(body: bytes, coding: bytes, max_bytes: int) -> bytes:
    """A gzip or deflate message inflated, never past ``max_bytes`` (a bomb stops there)."""
    if coding == b"gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif coding == b"deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise GrpcWireError(
            UNIMPLEMENTED, f"grpc-encoding {coding[:32]!r} is not supported (identity, deflate, gzip)"
        )
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise GrpcWireError(INTERNAL, f"a {coding.decode()} message that does not inflate: {exc}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise GrpcWireError(
            RESOURCE_EXHAUSTED, f"a message that inflates past the server's limit of {max_bytes} bytes"
        )
    if not inflater.eof or inflater.unused_data:
        raise GrpcWireError(
            INTERNAL, f"a {coding.decode()} message that is cut short or has bytes after its end"
        )
    return out


@dataclass(frozen=True, slots=True)
class CallHead:
    """What a request's header block says, checked (``parse_request_head``)."""

    path: str
    timeout_s: float | None
    coding: bytes | None
    metadata: tuple[tuple[str, str | bytes], ...]  # custom headers: ``-bin`` values decoded to bytes


_RESERVED = frozenset(
    (b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"user-agent")
)


class HeadError(Exception):
    """A request head that is not a gRPC call: answered with an HTTP ``status`` (or a gRPC code)."""

    def __init__(self, http_status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.code = code


def parse_request_head(fields: list[tuple[bytes, bytes]]) -> CallHead:
    """Check a request's header fields as a gRPC call's (HeadError: how to refuse it)."""
    method = path = content_type = None
    timeout_s: float | None = None
    coding: bytes | None = None
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in fields:
        if name[:1] == b":":
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name not in (b":scheme", b":authority"):
                raise HeadError(400, INTERNAL, f"pseudo-header {name.decode('latin-1')!r} in a request")
            continue
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            try:
                timeout_s = parse_timeout(value)
            except GrpcWireError as exc:
                raise HeadError(400, INTERNAL, str(exc)) from None
        elif name == b"grpc-encoding":
            coding = value
        elif name not in _RESERVED and not name.startswith(b"grpc-"):
            key = name.decode("latin-1")
            if key.endswith("-bin"):
                try:
                    metadata.append((key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)))
                except binascii.Error:
                    raise HeadError(400, INTERNAL, f"metadata {key!r}: not base64") from None
            else:
                metadata.append((key, value.decode("latin-1")))
    if method != b"POST":
        raise HeadError(405, INTERNAL, f"method {method!r}: gRPC calls are POST")
    if content_type is None or not (
        content_type == CONTENT_TYPE
        or content_type.startswith(b"application/grpc+")
        or content_type.startswith(b"application/grpc;")
    ):
        raise HeadError(415, INTERNAL, f"content-type {content_type!r} is not application/grpc")
    if not path or path[:1] != b"/":
        raise HeadError(400, UNIMPLEMENTED, f"path {path!r}: not /Service/Method")
    return CallHead(path.decode("latin-1"), timeout_s, coding, tuple(metadata))
