"""The server's frame receiver: the transport reads straight into its buffer (no I/O here).

``FrameDecoder`` (tcp.py) takes the ``bytes`` a transport made for each read; this one is the
other half of ``asyncio.BufferedProtocol``: ``get_buffer()`` hands out the free end of one
buffer owned by the connection, the transport ``recv_into``s it, and ``buffer_updated(n)``
delivers the frames completed by those ``n`` bytes, in order. A request's bytes are copied once
by the kernel into this buffer; arrays over the payload are views of it; the engine copies them
once more into an arena slot when a request is queued (the lane reads them in place).

Buffers (owned by the receiver, reused for the connection's life)
  - ``_buf``: ``buffer_bytes`` (64 KiB) holding whole small frames and the start of the next one.
    Delivered frames are dropped by moving the undelivered tail to the front, only when the free
    end is too small for the next read.
  - ``_big``: a frame larger than ``_buf``, allocated at its exact size once its header passed the
    limits (``max_frame_bytes``), filled by the transport directly, dropped once delivered.

Invariants
  1. A frame handed to ``on_frame`` is valid only during that call: its ``data`` is a read-only
     view of a buffer that is reused afterwards. The callee copies what it keeps (the server's
     front end queues a copy or runs the model before it returns; ``meta`` is always a copy).
  2. Nothing is allocated for a size the peer claims before the header carrying it passed the
     limits (``read_header``); ``_buf`` grows only while delivery is paused, by what the
     transport actually read (it stops reading once paused).
  3. Frames are delivered in order, exactly once; a fatal ProtocolError is raised once framing
     breaks (after the frames before it) and again by every later ``buffer_updated``.
"""

from collections.abc import Callable
from typing import NoReturn

from lumenrt.protocols.tcp import HEADER_BYTES, MAX_PAYLOAD_BYTES, Frame, ProtocolError, read_header

Header = tuple[int, int, int, int, int, int]  # kind, flags, request id, metadata, payload bytes, priority
BUFFER_BYTES = 64 << 10  # guessed: holds many small frames per read; bigger frames get their own
MIN_READ_BYTES = 4096  # guessed: the least free space handed to a read before compacting


class FrameReceiver:
    """See the top. ``pause()``/``resume()`` and ``frames``/``buffered_bytes`` as FrameDecoder."""

    __slots__ = (
        "_big",
        "_big_have",
        "_big_head",
        "_buf",
        "_end",
        "_error",
        "_ro",
        "_start",
        "_view",
        "frames",
        "max_frame_bytes",
        "max_meta_bytes",
        "on_frame",
        "paused",
    )

    def __init__(
        self,
        on_frame: Callable[[Frame], None],
        *,
        max_frame_bytes: int = MAX_PAYLOAD_BYTES,
        max_meta_bytes: int = 1 << 20,
        buffer_bytes: int = BUFFER_BYTES,
    ) -> None:
        self.on_frame = on_frame
        self.max_frame_bytes = max_frame_bytes
        self.max_meta_bytes = max_meta_bytes
        self.frames = 0
        self.paused = False
        self._buf = bytearray(max(buffer_bytes, HEADER_BYTES + MIN_READ_BYTES))
        self._view = memoryview(self._buf)
        self._ro = self._view.toreadonly()  # what frames get (invariant 1)
        self._start = 0  # first byte not yet delivered
        self._end = 0  # end of the bytes received
        self._big: bytearray | None = None  # a frame larger than _buf, being received
        self._big_have = 0
        self._big_head: Header = (0, 0, 0, 0, 0, 0)  # its header, read when it started
        self._error: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame (or of frames held while paused)."""
        return self._end - self._start + self._big_have

    # ---- the transport's side (asyncio.BufferedProtocol) ---------------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next read lands: the rest of a big frame, or the free end of ``_buf``."""
        big = self._big
        if big is not None:
            return memoryview(big)[self._big_have :]
        if len(self._buf) - self._end < MIN_READ_BYTES and (self._start or self._end == len(self._buf)):
            self._make_room()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._error is not None:
            raise self._error
        if self._big is not None:
            self._big_have += nbytes
            if self._big_have == len(self._big) and not self.paused:
                self._deliver_big()
            return
        self._end += nbytes
        if not self.paused:
            self._run()

    # ---- delivery -------------------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Deliver the frames held while paused (may pause again part way)."""
        self.paused = False
        if self._error is not None:
            return
        if self._big is not None:
            if self._big_have == len(self._big):
                self._deliver_big()
            return
        self._run()

    def _run(self) -> None:
        buf, pos, end = self._buf, self._start, self._end
        while end - pos >= HEADER_BYTES:
            try:
                head = read_header(buf, pos, self.max_meta_bytes, self.max_frame_bytes)
            except ProtocolError as err:
                self._fail(err)
            need = HEADER_BYTES + head[3] + head[4]
            if end - pos < need:
                if need > len(buf):  # larger than the buffer: its own, of exactly its size
                    self._start_big(pos, end, need, head)
                    return
                break
            self._start = pos + need  # before the call: a raising callee keeps the frames after it
            self._deliver(self._ro, pos, head)
            pos += need
            if self.paused:
                return
        if pos == end:
            self._start = self._end = 0  # all delivered: the next read starts at the front

    def _deliver(self, view: memoryview, at: int, head: Header) -> None:
        """Hand the frame at ``view[at:]`` (its header ``head`` already read) to ``on_frame``."""
        kind, flags, rid, meta_len, payload_len, priority = head
        body = at + HEADER_BYTES
        self.frames += 1
        self.on_frame(
            Frame(
                kind,
                flags,
                rid,
                bytes(view[body : body + meta_len]),
                view,
                body + meta_len,
                payload_len,
                priority,
            )
        )

    def _start_big(self, pos: int, end: int, need: int, head: Header) -> None:
        big = bytearray(need)  # its header passed the limits (invariant 2)
        have = end - pos
        big[:have] = self._view[pos:end]
        self._big, self._big_have, self._big_head = big, have, head
        self._start = self._end = 0

    def _deliver_big(self) -> None:
        big = self._big
        assert big is not None
        self._big, self._big_have = None, 0
        self._deliver(memoryview(big).toreadonly(), 0, self._big_head)

    def _make_room(self) -> None:
        """Move the undelivered tail to the front (a copy of at most one partial frame, or of the
        frames held while paused); with the buffer still full (held frames), double it: reading
        is paused by then, so it grows by what reads already under way bring (invariant 2)."""
        start, end = self._start, self._end
        if start:
            self._buf[: end - start] = bytes(self._view[start:end])  # not overlapping: a copy first
            self._start, self._end = 0, end - start
        if self._end == len(self._buf):
            grown = bytearray(2 * len(self._buf))
            grown[: self._end] = self._view[: self._end]
            self._buf, self._view = grown, memoryview(grown)
            self._ro = self._view.toreadonly()

    def _fail(self, err: ProtocolError) -> NoReturn:
        self._error = err
        self._start = self._end = 0
        self._big, self._big_have = None, 0
        raise err
