"""The HTTP/1.x request headers that change what the body or the request means, and the bounded
decoder of a compressed body (no I/O: ``lumenrt.ingress.http_server`` calls these from its parser callbacks).

Every such header is honoured or refused with a status and a message that names it, never passed
over. Per header (RFC 9110 and 9112):

  protocol version   HTTP/1.1 and HTTP/1.0 are served. 1.0: the connection closes after the answer
                     unless the request says ``Connection: keep-alive``, and then the answer says
                     it too (a 1.0 client assumes close otherwise). Anything else (0.9, 1.2, 2.0,
                     the HTTP/2 prior-knowledge preface ``PRI * HTTP/2.0``) -> 505.
  Upgrade            ignored, as RFC 9110 §7.8 lets a server do: the request is answered over
                     HTTP/1.1 and the connection goes on (``curl --http2`` then stays on 1.1).
                     CONNECT -> 405 (it would turn the connection into a tunnel).
  Transfer-Encoding  ``chunked`` is decoded by the parser (llhttp) as it arrives; the decoded bytes
                     count against ``max_body_bytes`` while they stream (413 once over). Any other
                     coding (``gzip, chunked`` included) -> 501 naming it. Content-Length as well
                     -> 400: two framings that can disagree are the request-smuggling pattern. In an
                     HTTP/1.0 request -> 400 (RFC 9112 §6.1: such framing is to be treated as faulty).
                     Trailer fields are dropped, never merged into the headers (RFC 9110 §6.5.1).
  Content-Encoding   ``identity``: nothing to do. ``gzip`` (``x-gzip``) and ``deflate`` (zlib,
                     RFC 1950) are decoded rather than refused, because Triton decodes them and
                     tritonclient's ``request_compression_algorithm`` sends them, so refusing would
                     break a drop-in client. The decoded size is bounded before it is allocated
                     (zlib's ``max_length``): 413 once it would pass ``max_body_bytes``. With the
                     binary tensor extension, ``Inference-Header-Content-Length`` counts bytes of
                     the decoded body (tritonclient compresses JSON and tensors together, as Triton
                     expects). Two codings, or any other -> 415 naming it, with ``Accept-Encoding:
                     gzip, deflate`` in the answer (RFC 9110 §15.5.16).
  Expect             ``100-continue`` -> ``HTTP/1.1 100 Continue`` once the head passed every check
                     here (so a body over the limit gets its 413 without being sent), and only
                     after the answers still owed on the connection. Ignored in an HTTP/1.0 request
                     (RFC 9110 §10.1.1). Any other expectation -> 417.
  Accept-Encoding    ignored: a preference, not a change of meaning. Answers are not compressed,
                     and RFC 9110 §12.5.3 says a server that finds no acceptable coding SHOULD send
                     the answer without one, so this is right even for ``identity;q=0``.
"""

import zlib
from dataclasses import dataclass

from lumenrt.protocols.errors import ServerError, bad_request

DECODED_CODINGS = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}  # Content-Encoding -> ours
ACCEPTED_ENCODINGS = b"gzip, deflate"  # the Accept-Encoding sent with a 415
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # zlib's container selectors


class HttpError(ServerError):
    """A ServerError whose answer carries extra headers."""

    def __init__(self, status: int, message: str, headers: list[tuple[bytes, bytes]]) -> None:
        super().__init__(status, message)
        self.headers = headers


@dataclass(frozen=True, slots=True)
class HeadPlan:
    """What the head of a request asks of the connection."""

    decoder: "ContentDecoder | None" = None  # Content-Encoding to undo on the body
    send_continue: bool = False  # Expect: 100-continue, and a body is coming


_PLAIN = HeadPlan()  # most requests: nothing to do (no allocation per request)


def _codings(value: bytes) -> list[str]:
    return [c.strip().lower() for c in value.decode("latin-1").split(",") if c.strip()]


def check_head(version: str, method: bytes, headers: dict[bytes, bytes], max_body_bytes: int) -> HeadPlan:
    """The checks of the module docstring, in order, on a head whose fields are complete
    (``headers``: lower-case names, repeated fields joined with ", "); raises ServerError."""
    if version not in ("1.0", "1.1"):
        raise ServerError(505, f"HTTP version {version} is not supported: use HTTP/1.1 (or HTTP/1.0)")
    if method == b"CONNECT":
        raise ServerError(405, "method CONNECT is not supported (this server is not a proxy)")
    length = headers.get(b"content-length")
    chunked = False
    te = headers.get(b"transfer-encoding")
    if te is not None:
        if length is not None:
            raise smuggling_error()
        if version == "1.0":
            raise bad_request("Transfer-Encoding is not allowed in an HTTP/1.0 request (send Content-Length)")
        codings = _codings(te)
        if codings != ["chunked"]:
            raise ServerError(
                501, f"Transfer-Encoding {te.decode('latin-1')!r} is not supported: only 'chunked' is"
            )
        chunked = True
    if length is not None and length.isdigit() and int(length) > max_body_bytes:
        raise ServerError(413, f"body of {int(length)} bytes is over the limit of {max_body_bytes} bytes")
    decoder: ContentDecoder | None = None
    ce = headers.get(b"content-encoding")
    if ce is not None:
        codings = [c for c in _codings(ce) if c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in DECODED_CODINGS):
            shown = ce.decode("latin-1")
            why = "more than one coding" if len(codings) > 1 else "supported: gzip, deflate, identity"
            raise HttpError(
                415,
                f"Content-Encoding {shown!r} is not supported ({why})",
                [(b"accept-encoding", ACCEPTED_ENCODINGS)],
            )
        if codings:
            decoder = ContentDecoder(DECODED_CODINGS[codings[0]], max_body_bytes)
    send_continue = False
    expect = headers.get(b"expect")
    if expect is not None and version != "1.0":
        if expect.strip().lower() != b"100-continue":
            raise ServerError(
                417, f"Expect {expect.decode('latin-1')!r} is not supported: only '100-continue' is"
            )
        send_continue = chunked or (length is not None and length not in (b"", b"0"))
    if decoder is None and not send_continue:
        return _PLAIN
    return HeadPlan(decoder, send_continue)


def smuggling_error() -> ServerError:
    return bad_request(
        "Content-Length and Transfer-Encoding in one request: refused, since the two framings can "
        "disagree (request smuggling); send one of them"
    )


def parser_error(message: str) -> ServerError:
    """The answer to a request that llhttp refused before our callbacks saw it (``message`` is its
    error text): the headers above named, the rest a plain 400."""
    lower = message.lower()
    if "http version" in lower:
        return ServerError(505, "HTTP version not supported: use HTTP/1.1 (or HTTP/1.0)")
    if "pri/upgrade" in lower:
        return ServerError(505, "HTTP/2 is not supported (prior-knowledge preface): use HTTP/1.1")
    if "content-length" in lower and "transfer-encoding" in lower:
        return smuggling_error()
    if "request has invalid `transfer-encoding`" in lower:
        return ServerError(501, "Transfer-Encoding is not supported: only 'chunked' is")
    if "transfer-encoding" in lower:
        return bad_request(f"malformed Transfer-Encoding ({message}): only 'chunked' is supported")
    if "content-length" in lower:
        return bad_request(f"malformed Content-Length: {message}")
    return bad_request(f"malformed HTTP request: {message}")


class ContentDecoder:
    """A gzip or deflate body, decoded as it arrives into at most ``limit_bytes`` bytes.

    Owns the decoded parts until :meth:`finish` hands them over joined. zlib is given
    ``max_length`` = room left + 1, so it never produces more than one byte past the limit; that
    byte means "over", answered 413. A gzip body may hold several members (RFC 1952 §2.2)."""

    __slots__ = ("_parts", "_z", "coding", "fed", "limit_bytes", "size")

    def __init__(self, coding: str, limit_bytes: int) -> None:
        self.coding = coding
        self.limit_bytes = limit_bytes
        self.size = 0  # decoded bytes so far
        self.fed = False
        self._z = zlib.decompressobj(_WBITS[coding])
        self._parts: list[bytes] = []

    def feed(self, data: bytes) -> None:
        """Decode the next bytes of the body; raises ServerError (400 corrupt, 413 too large)."""
        self.fed = self.fed or bool(data)
        while data:
            try:
                out = self._z.decompress(data, self.limit_bytes - self.size + 1)
            except zlib.error as exc:
                raise bad_request(
                    f"Content-Encoding {self.coding}: the body is not valid {self.coding} data ({exc})"
                ) from None
            self.size += len(out)
            if self.size > self.limit_bytes:
                raise ServerError(
                    413,
                    f"Content-Encoding {self.coding}: the decoded body is over the limit of "
                    f"{self.limit_bytes} bytes",
                )
            if out:
                self._parts.append(out)
            if self._z.eof:
                data = self._z.unused_data
                if data:
                    if self.coding != "gzip":
                        raise bad_request(
                            f"Content-Encoding {self.coding}: {len(data)} bytes after the end of the data"
                        )
                    self._z = zlib.decompressobj(_WBITS["gzip"])  # the next gzip member
            else:
                tail = self._z.unconsumed_tail  # empty: under max_length zlib takes all its input
                if not out and len(tail) == len(data):  # no progress: never spin on the event loop
                    raise bad_request(f"Content-Encoding {self.coding}: the decoder made no progress")
                data = tail

    def finish(self) -> bytes:
        """The decoded body; raises ServerError (400) if the compressed data stopped short."""
        if self.fed and not self._z.eof:
            raise bad_request(f"Content-Encoding {self.coding}: the body ends inside the compressed data")
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)
