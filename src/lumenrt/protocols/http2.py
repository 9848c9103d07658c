"""HTTP/2 framing for lumenrt's gRPC server and client (RFC 9113): frames, settings, flow control and
stream bookkeeping for either role, with no I/O. ``H2Session`` is fed the bytes a transport read
(``receive``) and hands what it has to send to ``write``; a front end or a client subclasses it
and is told of streams through its hooks (``on_headers``, ``on_data``, ``on_reset``, ...).

What is served: the connection preface, SETTINGS (every RFC 9113 setting checked), PING (answered),
GOAWAY both ways, RST_STREAM, WINDOW_UPDATE, HEADERS with CONTINUATION, padding and priority
fields (priority ignored, as RFC 9113 allows), and DATA under flow control both ways. PUSH_PROMISE
is refused (we never enable push). Unknown frame types are ignored.

Invariants
  1. Nothing is kept for a size the peer claims before it passed a limit: a frame's length is
     checked against our SETTINGS_MAX_FRAME_SIZE before its payload is waited for, a header block
     spread over CONTINUATION frames against ``max_header_block_bytes`` as it grows, and the
     decoded list against ``max_header_list_bytes`` (hpack.py). A large unpadded DATA frame is not
     kept whole either: its payload goes to ``on_data`` piece by piece as the reads bring it
     (``end_stream`` with the last piece only), so a tensor in one DATA frame is copied once, by
     the hook, wherever the hook puts it.
  2. Every header block is decoded, also for a stream that is refused, reset or unknown, so that
     the HPACK state stays in step with the peer's; only then is the stream refused.
  3. Flow control, receiving: the peer may send at most the windows we granted; DATA past a window
     is FLOW_CONTROL_ERROR. The hooks take what ``on_data`` hands them at once, so the session
     grants the window back as data arrives: a stream's once half its window was used (and it is
     still open), the connection's once half of ``CONNECTION_WINDOW`` was. (A frame handed over
     in pieces counts whole when its header arrives, so the connection's window may be granted
     back while its payload is still coming: the peer then has at most one frame more in flight,
     which the session does not hold.) A unary call whose
     message fits its window costs no WINDOW_UPDATE at all.
  4. Flow control, sending: DATA never goes past the peer's windows (the connection's and the
     stream's) nor its SETTINGS_MAX_FRAME_SIZE; what does not fit waits on its stream, in the
     order it was given, and is sent as WINDOW_UPDATE or SETTINGS open the windows. A stream's
     trailers go after all its data.
  5. Streams: the peer opens them with rising ids of its parity (odd from a client), ours rise
     with ours; a stream is in ``streams`` from its opening HEADERS until both sides ended it or it
     was reset. Frames for a stream that was closed are ignored (DATA still counts against the
     connection window, which is granted back); frames for a stream never opened are a
     PROTOCOL_ERROR. A peer that opens more than our SETTINGS_MAX_CONCURRENT_STREAMS gets
     REFUSED_STREAM for the extra ones.
  6. Errors: a connection error (``H2Error``) sends GOAWAY with its code and ends the session
     (``closed``); every later ``receive`` does nothing. A stream error resets that stream alone
     (RST_STREAM) and tells the subclass (``on_reset``).

The frames a session writes are joined into one ``write`` per call that makes them, so a unary
answer (HEADERS, DATA, trailers) is one write and, on a socket, one system call.
"""

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lumenrt.protocols.hpack import HeaderListTooLarge, HpackDecoder, HpackError, encode_block

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # a client's first bytes (3.4)

# frame types (6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
# flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# error codes (7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT = 0x0, 0x1, 0x2, 0x3, 0x4
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
CONNECT_ERROR, ENHANCE_YOUR_CALM, INADEQUATE_SECURITY, HTTP_1_1_REQUIRED = 0xA, 0xB, 0xC, 0xD
# settings (6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

DEFAULT_WINDOW = 65535  # every window's size before SETTINGS or WINDOW_UPDATE change it (6.9.2)
MIN_FRAME_SIZE = 16384  # SETTINGS_MAX_FRAME_SIZE's initial value and least allowed (6.5.2)
MAX_FRAME_SIZE_LIMIT = (1 << 24) - 1
MAX_WINDOW = (1 << 31) - 1
# The connection's receive window we keep open (guessed: 16 MiB lets a few large tensors arrive
# at once without waiting on a WINDOW_UPDATE round trip; the memory bound is the calls' own).
CONNECTION_WINDOW = 16 << 20
# A header block in more frames than this is refused (ENHANCE_YOUR_CALM), whatever its size: empty
# CONTINUATIONs cost the receiver and never reach a size limit (guessed: a 64 KiB block in 16 KiB
# frames takes 4; clients split blocks only past the frame size).
MAX_CONTINUATIONS = 64
# A write of this many octets or more goes out through ``writelines`` where the session has one
# (its data not joined into one buffer; guessed: below it, one join and one buffer cost less)
WRITE_APART_BYTES = 64 << 10
# A DATA frame longer than this that a read does not bring whole is handed over in pieces
# (invariant 1; guessed: below it, waiting for the frame costs one small join)
PIECES_ABOVE = 16 << 10

_HEADER = struct.Struct(">BHBBL")  # a frame's 9 octets: length (24 bits as 8 + 16), type, flags, stream
_U32 = struct.Struct(">L")
_GOAWAY = struct.Struct(">LL")
_SETTING = struct.Struct(">HL")
_PING_ACK = struct.Struct(">BHBBL8s")


class H2Error(Exception):
    """A connection error: GOAWAY with ``code``, then the session is over."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class StreamError(Exception):
    """A stream error: RST_STREAM with ``code`` for ``stream_id``."""

    def __init__(self, stream_id: int, code: int, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.code = code


def frame_header(length: int, frame_type: int, flags: int, stream_id: int) -> bytes:
    return _HEADER.pack(length >> 16, length & 0xFFFF, frame_type, flags, stream_id)


def settings_frame(settings: Sequence[tuple[int, int]]) -> bytes:
    payload = b"".join(_SETTING.pack(key, value) for key, value in settings)
    return frame_header(len(payload), SETTINGS, 0, 0) + payload


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame_header(4, WINDOW_UPDATE, 0, stream_id) + _U32.pack(increment)


def rst_stream_frame(stream_id: int, code: int) -> bytes:
    return frame_header(4, RST_STREAM, 0, stream_id) + _U32.pack(code)


def goaway_frame(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame_header(8 + len(debug), GOAWAY, 0, 0) + _GOAWAY.pack(last_stream_id, code) + debug


@dataclass(frozen=True, slots=True)
class LocalSettings:
    """What we tell the peer in our SETTINGS, and hold it to."""

    max_concurrent_streams: int = 100  # streams the peer may have open at once (guessed)
    initial_window: int = 1 << 20  # each stream's receive window (guessed: one large tensor)
    # the largest frame we take (guessed: a 600 KB tensor in one DATA frame instead of 37; what a
    # connection holds unparsed is one frame)
    max_frame_size: int = 1 << 20
    header_table_size: int = 4096  # the HPACK table the peer's encoder may use
    max_header_list_bytes: int = 64 << 10  # decoded header list (names + values + 32 a field)

    @property
    def max_header_block_bytes(self) -> int:
        """An encoded header block (HEADERS + CONTINUATIONs) is refused past this."""
        return self.max_header_list_bytes

    def frame(self, client: bool) -> bytes:
        settings = [
            (HEADER_TABLE_SIZE, self.header_table_size),
            (MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
            (INITIAL_WINDOW_SIZE, self.initial_window),
            (MAX_FRAME_SIZE, self.max_frame_size),
            (MAX_HEADER_LIST_SIZE, self.max_header_list_bytes),
        ]
        if client:
            settings.append((ENABLE_PUSH, 0))
        return settings_frame(settings)


class H2Stream:
    """One stream's flow-control windows, ends and unsent data; ``call`` is the subclass's."""

    __slots__ = (
        "call",
        "id",
        "local_closed",
        "pending",
        "pending_end",
        "pending_trailers",
        "recv_unacked",
        "recv_window",
        "remote_closed",
        "send_window",
    )

    def __init__(self, stream_id: int, send_window: int, recv_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window  # what the peer lets us send on this stream
        self.recv_window = recv_window  # what we let the peer send (invariant 3)
        self.recv_unacked = 0  # received since our last WINDOW_UPDATE for it
        self.remote_closed = False  # the peer sent END_STREAM
        self.local_closed = False  # we sent END_STREAM (or queued it behind pending data)
        self.pending: list[memoryview] | None = None  # data waiting for a window (invariant 4)
        self.pending_trailers: bytes | None = None  # a header block to send after it (END_STREAM)
        self.pending_end = False  # the last of the waiting data ends the stream
        self.call: Any = None


class H2Session:
    """One connection, either role: see the module docstring. Subclasses override the hooks."""

    __slots__ = (
        "_block",
        "_block_bytes",
        "_block_flags",
        "_block_stream",
        "_blocked",
        "_data_end_stream",
        "_data_left",
        "_data_length",
        "_data_stream",
        "_rest",
        "_rest_bytes",
        "_rest_need",
        "client",
        "closed",
        "conn_recv_unacked",
        "conn_recv_window",
        "conn_send_window",
        "decoder",
        "extra_streams",
        "goaway_received",
        "goaway_sent",
        "last_peer_stream",
        "local",
        "next_stream_id",
        "peer_initial_window",
        "peer_max_concurrent",
        "peer_max_frame",
        "preface_left",
        "settings_seen",
        "streams",
        "table_update_owed",
        "write",
        "writelines",
    )

    def __init__(
        self,
        client: bool,
        write: Callable[[bytes], None],
        local: LocalSettings | None = None,
        writelines: Callable[[list[bytes | memoryview]], None] | None = None,
    ) -> None:
        """``write`` takes one buffer; ``writelines``, if given, a list of them, used for large
        writes (``WRITE_APART_BYTES`` or more) so that their data is not joined into one buffer
        (a transport's ``writelines``, which hands the buffers to one ``writev``)."""
        self.client = client
        self.write = write
        self.writelines = writelines
        self.local = local or LocalSettings()
        self.decoder = HpackDecoder(self.local.header_table_size, self.local.max_header_list_bytes)
        self.streams: dict[int, H2Stream] = {}
        # streams closed at the HTTP/2 level whose work the subclass still holds (a call the client
        # reset while its request runs): they count against our MAX_CONCURRENT_STREAMS, so that
        # resetting streams at once (a "rapid reset") cannot start unbounded work
        self.extra_streams = 0
        self.closed = False  # a connection error was sent or received (invariant 6)
        self.goaway_sent = -1  # the last stream id we promised to serve; -1: no GOAWAY sent
        self.goaway_received = -1  # the peer's last stream id from its GOAWAY; -1: none
        self.last_peer_stream = 0  # the highest stream id the peer opened
        self.next_stream_id = 1 if client else 2
        self.preface_left = 0 if client else len(PREFACE)  # a server waits for the client's magic
        self.settings_seen = False  # the peer's SETTINGS came (its first frame must be: 3.4)
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = MIN_FRAME_SIZE
        self.peer_max_concurrent = 1 << 31  # unlimited until the peer says
        self.conn_send_window = DEFAULT_WINDOW
        self.conn_recv_window = DEFAULT_WINDOW
        self.conn_recv_unacked = 0
        self.table_update_owed = False  # the peer lowered SETTINGS_HEADER_TABLE_SIZE (hpack.py)
        # the start of a frame not yet whole: the reads that brought it (joined once it is whole,
        # so that a large frame over many reads is copied once, not once a read)
        self._rest: list[bytes] = []
        self._rest_bytes = 0
        self._rest_need = 0  # what the frame needs in all (9 until its header is in)
        # a DATA frame handed over as its pieces arrive (invariant 1): its octets still to come,
        # its length, its END_STREAM flag and its stream (None: the frame is dropped)
        self._data_left = 0
        self._data_length = 0
        self._data_end_stream = False
        self._data_stream: H2Stream | None = None
        self._block: list[bytes] | None = None  # a header block in CONTINUATION frames
        self._block_bytes = 0  # its size so far
        self._block_stream = 0
        self._block_flags = 0
        self._blocked: dict[int, H2Stream] = {}  # streams with data waiting for a window, in order

    # ---- hooks ----------------------------------------------------------------------------------

    def on_headers(self, stream: H2Stream, fields: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        """A header block for ``stream``: the first opens it (``stream.call`` is None), a later one
        is trailers. ``fields`` may be shared: do not change it."""

    def on_data(self, stream: H2Stream, data: memoryview, end_stream: bool) -> None:
        """DATA for ``stream``: valid only during the call (copy what is kept)."""

    def on_reset(self, stream: H2Stream, code: int) -> None:
        """The stream was reset (by the peer, or by us after a stream error); it is gone."""

    def on_refused(self, stream_id: int, fields: list[tuple[bytes, bytes]] | None, reason: str) -> bool:
        """A new stream the session will not open (too many, or its header list too large:
        ``fields`` None). True: the subclass answered it itself; False: it is reset."""
        return False

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        """The peer will open no more streams and serves ours up to ``last_stream_id``."""

    def on_error(self, code: int, message: str) -> None:
        """A connection error was sent (GOAWAY): close the transport once it is written."""

    # ---- starting -----------------------------------------------------------------------------

    def initiate(self) -> None:
        """Our side of the preface: the client magic (client), our SETTINGS, and the connection
        window opened to ``CONNECTION_WINDOW``."""
        out = [PREFACE] if self.client else []
        out.append(self.local.frame(self.client))
        out.append(window_update_frame(0, CONNECTION_WINDOW - DEFAULT_WINDOW))
        self.conn_recv_window = CONNECTION_WINDOW
        self.write(b"".join(out))

    # ---- receiving ----------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Take what the transport read: every frame it completes is handled, in order."""
        if self.closed:
            return
        at = 0
        view = memoryview(data)
        if self._data_left:  # the rest of a DATA frame handed over in pieces (then no _rest)
            try:
                at = self._data_more(view, 0, len(data))
            except H2Error as exc:
                self.fail(exc.code, str(exc))
                return
            if self.closed or at == len(data):
                return
        elif self._rest:
            self._rest.append(data)
            self._rest_bytes += len(data)
            if self._rest_bytes < self._rest_need:
                return
            data = b"".join(self._rest)
            view = memoryview(data)
            self._rest.clear()
        if self.preface_left:
            at = self._preface(data)
            if self.closed or self.preface_left:
                return
        end = len(data)
        limit = self.local.max_frame_size
        unpack = _HEADER.unpack_from
        try:
            while end - at >= 9:
                hi, lo, frame_type, flags, stream_id = unpack(data, at)
                length = (hi << 16) | lo
                if length > limit:
                    raise H2Error(FRAME_SIZE_ERROR, f"a frame of {length} octets; our limit is {limit}")
                if end - at - 9 < length:
                    if (
                        frame_type == DATA
                        and length > PIECES_ABOVE
                        and not flags & PADDED
                        and self.settings_seen
                        and self._block is None
                    ):
                        at = self._data_first(view, at + 9, end, length, flags, stream_id & 0x7FFFFFFF)
                    break
                start = at + 9
                at = start + length
                stream_id &= 0x7FFFFFFF
                if not self.settings_seen:
                    if frame_type != SETTINGS or flags & ACK:
                        raise H2Error(PROTOCOL_ERROR, "the peer's first frame must be SETTINGS")
                    self.settings_seen = True
                if self._block is not None and frame_type != CONTINUATION:
                    raise H2Error(PROTOCOL_ERROR, "a header block interrupted by another frame")
                if frame_type == DATA:
                    self._data(view[start:at], flags, stream_id)
                elif frame_type == HEADERS:
                    self._headers(view[start:at], flags, stream_id)
                elif frame_type == CONTINUATION:
                    self._continuation(view[start:at], flags, stream_id)
                elif frame_type == WINDOW_UPDATE:
                    self._window_update(view[start:at], stream_id)
                elif frame_type == SETTINGS:
                    self._settings(view[start:at], flags, stream_id)
                elif frame_type == PING:
                    self._ping(view[start:at], flags, stream_id)
                elif frame_type == RST_STREAM:
                    self._rst_stream(view[start:at], stream_id)
                elif frame_type == GOAWAY:
                    self._goaway(view[start:at], stream_id)
                elif frame_type == PRIORITY:
                    if stream_id == 0:
                        raise H2Error(PROTOCOL_ERROR, "PRIORITY on stream 0")
                    if length != 5:
                        if stream_id not in self.streams:  # RST_STREAM is not sent on an idle stream
                            raise H2Error(FRAME_SIZE_ERROR, "PRIORITY is 5 octets")
                        self._stream_error(stream_id, FRAME_SIZE_ERROR, "PRIORITY is 5 octets")
                elif frame_type == PUSH_PROMISE:
                    raise H2Error(PROTOCOL_ERROR, "PUSH_PROMISE: push is not enabled")
                if self.closed:
                    return
        except H2Error as exc:
            self.fail(exc.code, str(exc))
            return
        if at < end:
            self._rest.append(data[at:])
            self._rest_bytes = end - at
            if end - at >= 9:
                hi, lo = data[at], int.from_bytes(data[at + 1 : at + 3], "big")
                self._rest_need = 9 + ((hi << 16) | lo)
            else:
                self._rest_need = 9

    def _preface(self, data: bytes) -> int:
        expected = PREFACE[len(PREFACE) - self.preface_left :]
        got = data[: len(expected)]
        if not expected.startswith(got):
            self.fail(PROTOCOL_ERROR, "not an HTTP/2 connection preface (a gRPC client speaks HTTP/2)")
            return len(data)
        self.preface_left -= len(got)
        return len(got)

    def _data(self, payload: memoryview, flags: int, stream_id: int) -> None:
        """A whole DATA frame."""
        length = len(payload)
        stream = self._data_begin(length, stream_id)
        if stream is None:
            return
        if flags & PADDED:
            payload = _unpad(payload, stream_id)
        end_stream = bool(flags & END_STREAM)
        self._data_end(stream, length, end_stream)
        self.on_data(stream, payload, end_stream)
        if end_stream and stream.local_closed and stream.pending is None:
            self.streams.pop(stream_id, None)

    def _data_first(
        self, view: memoryview, at: int, end: int, length: int, flags: int, stream_id: int
    ) -> int:
        """A DATA frame of ``length`` octets whose payload starts at ``at`` and is not all here: its
        flow control now, its payload as it arrives (invariant 1); where this read's bytes stop."""
        self._data_stream = self._data_begin(length, stream_id)
        self._data_left = self._data_length = length
        self._data_end_stream = bool(flags & END_STREAM)
        return self._data_more(view, at, end)

    def _data_more(self, view: memoryview, at: int, end: int) -> int:
        """The next piece of the DATA frame being handed over, from ``view[at:end]``; where it stops."""
        take = min(self._data_left, end - at)
        left = self._data_left = self._data_left - take
        stream = self._data_stream
        if stream is None or self.streams.get(stream.id) is not stream:  # dropped, or reset meanwhile
            if not left:
                self._data_stream = None
            return at + take
        if left:
            if take:
                self.on_data(stream, view[at : at + take], False)
            return at + take
        self._data_stream = None
        end_stream = self._data_end_stream
        self._data_end(stream, self._data_length, end_stream)
        self.on_data(stream, view[at : at + take], end_stream)
        if end_stream and stream.local_closed and stream.pending is None:
            self.streams.pop(stream.id, None)
        return at + take

    def _data_begin(self, length: int, stream_id: int) -> "H2Stream | None":
        """A DATA frame of ``length`` octets against the windows (invariant 3): its stream, or None
        when the frame is dropped (a closed or unknown stream, a stream error)."""
        if stream_id == 0:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        self.conn_recv_window -= length
        if self.conn_recv_window < 0:
            raise H2Error(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self.conn_recv_unacked += length
        if self.conn_recv_unacked >= CONNECTION_WINDOW // 2:
            self.write(window_update_frame(0, self.conn_recv_unacked))
            self.conn_recv_window += self.conn_recv_unacked
            self.conn_recv_unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            self._unknown_stream(stream_id, "DATA")
            return None
        if stream.remote_closed:
            self._stream_error(stream_id, STREAM_CLOSED, "DATA after the stream's END_STREAM")
            return None
        stream.recv_window -= length
        if stream.recv_window < 0:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, "DATA past the stream's window")
            return None
        return stream

    def _data_end(self, stream: "H2Stream", length: int, end_stream: bool) -> None:
        """A DATA frame's last octets came: the stream ends, or its window is granted back."""
        if end_stream:
            stream.remote_closed = True
            return
        stream.recv_unacked += length
        if stream.recv_unacked >= self.local.initial_window // 2:
            self.write(window_update_frame(stream.id, stream.recv_unacked))
            stream.recv_window += stream.recv_unacked
            stream.recv_unacked = 0

    def _headers(self, payload: memoryview, flags: int, stream_id: int) -> None:
        if stream_id == 0:
            raise H2Error(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = _unpad(payload, stream_id)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise H2Error(FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(bytes(payload), flags, stream_id)
            return
        self._check_block_size(len(payload))
        self._block, self._block_stream, self._block_flags = [bytes(payload)], stream_id, flags
        self._block_bytes = len(payload)

    def _continuation(self, payload: memoryview, flags: int, stream_id: int) -> None:
        block = self._block
        if block is None or stream_id != self._block_stream:
            raise H2Error(PROTOCOL_ERROR, "CONTINUATION without the HEADERS it continues")
        self._block_bytes += len(payload)
        self._check_block_size(self._block_bytes)
        if len(block) >= MAX_CONTINUATIONS:  # empty ones would never reach the size limit
            raise H2Error(ENHANCE_YOUR_CALM, f"a header block in more than {MAX_CONTINUATIONS} frames")
        block.append(bytes(payload))
        if flags & END_HEADERS:
            self._block = None
            self._header_block(b"".join(block), self._block_flags, stream_id)

    def _check_block_size(self, size: int) -> None:
        if size > self.local.max_header_block_bytes:
            # the block cannot be skipped (the HPACK state would fall out of step): the connection ends
            raise H2Error(
                ENHANCE_YOUR_CALM, f"a header block over {self.local.max_header_block_bytes} octets"
            )

    def _header_block(self, block: bytes, flags: int, stream_id: int) -> None:
        """A whole header block (invariant 2: decoded before anything else is decided)."""
        too_large = False
        fields: list[tuple[bytes, bytes]] = []
        try:
            fields = self.decoder.decode(block)
        except HeaderListTooLarge:
            too_large = True
        except HpackError as exc:
            raise H2Error(COMPRESSION_ERROR, str(exc)) from None
        end_stream = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers (or a client's answer headers)
            if stream.remote_closed:
                self._stream_error(stream_id, STREAM_CLOSED, "HEADERS after the stream's END_STREAM")
                return
            if too_large:
                self._stream_error(stream_id, PROTOCOL_ERROR, "a header list over our limit")
                return
            if end_stream:
                stream.remote_closed = True
            self.on_headers(stream, fields, end_stream)
            if end_stream and stream.local_closed and stream.pending is None:
                self.streams.pop(stream_id, None)
            return
        if self.client or stream_id % 2 == 0 or stream_id <= self.last_peer_stream:
            self._unknown_stream(stream_id, "HEADERS")
            return
        self.last_peer_stream = stream_id
        if self.goaway_sent >= 0 and stream_id > self.goaway_sent:
            return  # after our GOAWAY: ignored, the client retries it elsewhere
        if too_large:
            if not self.on_refused(stream_id, None, "the header list is over the server's limit"):
                self.write(rst_stream_frame(stream_id, REFUSED_STREAM))
            return
        if len(self.streams) + self.extra_streams >= self.local.max_concurrent_streams:
            reason = f"more than {self.local.max_concurrent_streams} streams at once on one connection"
            if not self.on_refused(stream_id, fields, reason):
                self.write(rst_stream_frame(stream_id, REFUSED_STREAM))
            return
        stream = H2Stream(stream_id, self.peer_initial_window, self.local.initial_window)
        stream.remote_closed = end_stream
        self.streams[stream_id] = stream
        self.on_headers(stream, fields, end_stream)

    def _unknown_stream(self, stream_id: int, what: str) -> None:
        """A frame for a stream not in ``streams`` (invariant 5)."""
        opened = self.next_stream_id if (stream_id % 2 == 1) == self.client else self.last_peer_stream + 1
        if stream_id < opened:
            return  # closed: ignored
        raise H2Error(PROTOCOL_ERROR, f"{what} on stream {stream_id}, which was never opened")

    def _window_update(self, payload: memoryview, stream_id: int) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "WINDOW_UPDATE is 4 octets")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise H2Error(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self.conn_send_window += increment
            if self.conn_send_window > MAX_WINDOW:
                raise H2Error(FLOW_CONTROL_ERROR, "the connection's send window past 2^31-1")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                self._unknown_stream(stream_id, "WINDOW_UPDATE")
                return
            if increment == 0:
                self._stream_error(stream_id, PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                self._stream_error(stream_id, FLOW_CONTROL_ERROR, "the stream's send window past 2^31-1")
                return
        if self._blocked:
            self._flush_blocked()

    def _settings(self, payload: memoryview, flags: int, stream_id: int) -> None:
        if stream_id != 0:
            raise H2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if len(payload):
                raise H2Error(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise H2Error(FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 octets")
        window: int | None = None  # the frame's last INITIAL_WINDOW_SIZE, applied once (below)
        for at in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, at)
            if key == HEADER_TABLE_SIZE:
                if value < 4096:
                    self.table_update_owed = True
            elif key == ENABLE_PUSH:
                if value > 1:
                    raise H2Error(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
                if value and self.client:
                    raise H2Error(PROTOCOL_ERROR, "a server may not enable push")
            elif key == MAX_CONCURRENT_STREAMS:
                self.peer_max_concurrent = value
            elif key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2Error(FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}")
                window = value
            elif key == MAX_FRAME_SIZE:
                if not MIN_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT:
                    raise H2Error(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self.peer_max_frame = value
        if window is not None and window != self.peer_initial_window:
            delta = window - self.peer_initial_window
            self.peer_initial_window = window
            for stream in self.streams.values():
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    raise H2Error(FLOW_CONTROL_ERROR, "a stream's send window past 2^31-1")
        self.write(frame_header(0, SETTINGS, ACK, 0))
        if self._blocked:
            self._flush_blocked()

    def _ping(self, payload: memoryview, flags: int, stream_id: int) -> None:
        if stream_id != 0:
            raise H2Error(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise H2Error(FRAME_SIZE_ERROR, "PING is 8 octets")
        if not flags & ACK:
            self.write(_PING_ACK.pack(0, 8, PING, ACK, 0, bytes(payload)))

    def _rst_stream(self, payload: memoryview, stream_id: int) -> None:
        if stream_id == 0:
            raise H2Error(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "RST_STREAM is 4 octets")
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            self._unknown_stream(stream_id, "RST_STREAM")
            return
        self._blocked.pop(stream_id, None)
        stream.pending = None
        self.on_reset(stream, _U32.unpack(payload)[0])

    def _goaway(self, payload: memoryview, stream_id: int) -> None:
        if stream_id != 0:
            raise H2Error(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise H2Error(FRAME_SIZE_ERROR, "GOAWAY is at least 8 octets")
        last, code = _GOAWAY.unpack_from(payload)
        self.goaway_received = last & 0x7FFFFFFF
        self.on_goaway(self.goaway_received, code, bytes(payload[8:]))

    def _stream_error(self, stream_id: int, code: int, message: str) -> None:
        self.write(rst_stream_frame(stream_id, code))
        stream = self.streams.pop(stream_id, None)
        self._blocked.pop(stream_id, None)
        if stream is not None:
            stream.pending = None
            self.on_reset(stream, code)

    def fail(self, code: int, message: str) -> None:
        """End the session with a connection error (invariant 6)."""
        if self.closed:
            return
        self.closed = True
        self.write(goaway_frame(self.last_peer_stream, code, message.encode("utf-8", "replace")[:256]))
        self.on_error(code, message)

    # ---- sending ------------------------------------------------------------------------------

    def open_stream(self) -> H2Stream:
        """A new stream of ours (a client's call); its HEADERS go out with ``send``."""
        stream_id = self.next_stream_id
        if stream_id > MAX_WINDOW:
            raise H2Error(PROTOCOL_ERROR, "stream ids used up: open a new connection")
        self.next_stream_id += 2
        stream = H2Stream(stream_id, self.peer_initial_window, self.local.initial_window)
        self.streams[stream_id] = stream
        return stream

    def header_block(self, fields: Sequence[tuple[bytes, bytes]]) -> bytes:
        """``fields`` encoded for this peer (hpack.encode_block: no dynamic table, so any block
        made once may be kept and sent again; ``_header_frames`` puts in a size update when owed)."""
        return encode_block(fields)

    def send(
        self,
        stream: H2Stream,
        head: bytes | None,
        data: bytes | memoryview | None = None,
        trailers: bytes | None = None,
        end_stream: bool = True,
    ) -> None:
        """Send on ``stream``, in order: the header block ``head``, ``data`` and the header
        block ``trailers``; the last frame ends the stream when ``end_stream``. Data past the
        windows waits (invariant 4), and the trailers with it."""
        if self.closed or stream.local_closed:
            return
        if stream.pending is not None:  # behind data still waiting for a window: queued after it
            if head is not None:
                raise RuntimeError("a header block sent while the stream's data waits for a window")
            if data:
                stream.pending.append(memoryview(data))
            stream.pending_trailers, stream.pending_end = trailers, end_stream
            stream.local_closed = end_stream
            return
        out: list[bytes | memoryview] = []
        if head is not None:
            flags = END_STREAM if end_stream and not data and trailers is None else 0
            self._header_frames(out, stream.id, head, flags)
        stream.local_closed = end_stream
        if data:
            view = memoryview(data)
            sent = self._data_frames(out, stream, view, end_stream and trailers is None)
            if sent < len(view):
                stream.pending = [view[sent:]]
                stream.pending_trailers, stream.pending_end = trailers, end_stream
                self._blocked[stream.id] = stream
                self._write_out(out)
                return
        if trailers is not None:
            self._header_frames(out, stream.id, trailers, END_STREAM)
        elif end_stream and not data and head is None:
            out.append(frame_header(0, DATA, END_STREAM, stream.id))
        self._write_out(out)
        if end_stream and stream.remote_closed:
            self.streams.pop(stream.id, None)

    def reset(self, stream: H2Stream, code: int) -> None:
        """Reset ``stream`` ourselves (a call cancelled, or answered before its request ended)."""
        if self.streams.pop(stream.id, None) is None:
            return
        self._blocked.pop(stream.id, None)
        stream.pending = None
        if not self.closed:
            self.write(rst_stream_frame(stream.id, code))

    def goaway(self, code: int = NO_ERROR, debug: bytes = b"") -> None:
        """Tell the peer we take no new streams (a server's graceful shutdown): the ones it opened
        so far are still served."""
        if self.closed or self.goaway_sent >= 0:
            return
        self.goaway_sent = self.last_peer_stream
        self.write(goaway_frame(self.last_peer_stream, code, debug))

    def _header_frames(self, out: list[bytes | memoryview], stream_id: int, block: bytes, flags: int) -> None:
        if self.table_update_owed:  # the first block after the peer lowered its table size
            block = b"\x20" + block  # (RFC 7541 6.3: a size update to 0, first in the block)
            self.table_update_owed = False
        size = self.peer_max_frame
        if len(block) <= size:
            out.append(frame_header(len(block), HEADERS, flags | END_HEADERS, stream_id))
            out.append(block)
            return
        out.append(frame_header(size, HEADERS, flags, stream_id))
        out.append(block[:size])
        at = size
        while at < len(block):
            part = block[at : at + size]
            at += len(part)
            out.append(
                frame_header(len(part), CONTINUATION, END_HEADERS if at >= len(block) else 0, stream_id)
            )
            out.append(part)

    def _data_frames(
        self, out: list[bytes | memoryview], stream: H2Stream, view: memoryview, end_stream: bool
    ) -> int:
        """Frames for as much of ``view`` as the windows allow; the octets framed."""
        room = min(self.conn_send_window, stream.send_window, len(view))
        if room <= 0:
            return 0
        size = self.peer_max_frame
        at = 0
        while at < room:
            n = min(size, room - at)
            last = at + n == len(view)
            out.append(frame_header(n, DATA, END_STREAM if last and end_stream else 0, stream.id))
            out.append(view[at : at + n])
            at += n
        self.conn_send_window -= room
        stream.send_window -= room
        return room

    def _flush_blocked(self) -> None:
        """Windows opened: send waiting data in the order it was queued (invariant 4)."""
        out: list[bytes | memoryview] = []
        for stream_id, stream in list(self._blocked.items()):
            if self.conn_send_window <= 0:
                break
            pending = stream.pending
            if pending is None:
                self._blocked.pop(stream_id, None)
                continue
            trailers, end = stream.pending_trailers, stream.pending_end
            while pending:
                view = pending[0]
                last = len(pending) == 1
                sent = self._data_frames(out, stream, view, last and end and trailers is None)
                if sent < len(view):
                    pending[0] = view[sent:]
                    break
                pending.pop(0)
            if pending:
                continue
            stream.pending = None
            del self._blocked[stream_id]
            if trailers is not None:
                stream.pending_trailers = None
                self._header_frames(out, stream_id, trailers, END_STREAM)
            if end and stream.remote_closed:
                self.streams.pop(stream_id, None)
        if out:
            self._write_out(out)

    def forget(self, stream: H2Stream) -> None:
        """Drop what ``stream`` still has waiting to be sent (its call failed or was dropped)."""
        stream.pending = None
        self._blocked.pop(stream.id, None)

    def _write_out(self, out: list[bytes | memoryview]) -> None:
        if len(out) == 1:
            self.write(out[0])  # type: ignore[arg-type]
        elif out:
            writelines = self.writelines
            if writelines is not None and len(out) > 2:
                size = 0
                for part in out:
                    size += len(part)
                if size >= WRITE_APART_BYTES:
                    writelines(out)
                    return
            self.write(b"".join(out))


def _unpad(payload: memoryview, stream_id: int) -> memoryview:
    if not len(payload):
        raise H2Error(PROTOCOL_ERROR, f"a PADDED frame on stream {stream_id} with no pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise H2Error(PROTOCOL_ERROR, f"padding of {pad} octets fills the frame on stream {stream_id}")
    return payload[1 : len(payload) - pad]
