"""The server's frame receiver: the transport reads straight into its buffer (no I/O here).

``FrameDecoder`` (tcp.py) takes the ``bytes`` a transport made for each read; this one is the
other half of ``asyncio.BufferedProtocol``: ``get_buffer()`` hands out the free end of one
buffer owned by the connection, the transport ``recv_into``s it, and ``buffer_updated(n)``
delivers the frames completed by those ``n`` bytes, in order. A request's bytes are copied once
by the kernel into this buffer; arrays over the payload are views of it; the engine copies them
once more into an arena slot when a request is queued (the lane reads them in place), unless the
payload was received into that slot in the first place (``payload_into``, below).

Buffers
  - ``shared`` (a ``ReadBuffer``, optional): owned by the server's front end, shared by the receivers
    of its event loop, which read into it while they hold nothing (no frame partly received, none
    held while paused). The frames a read completes are delivered from it at once; what is left
    (the start of the next frame, or frames held by a pause) is copied into the receiver's own
    buffer. So an idle connection holds no receive buffer, and a connection whose reads end on
    frame boundaries never makes one. Sound because the transport fills it (``get_buffer``) and
    hands it back (``buffer_updated``) in one call from the loop, with no other read between.
  - ``_own``: the receiver's own ``buffer_bytes`` (64 KiB), made by the first read that leaves
    bytes behind (at once without ``shared``), holding whole small frames and the start of the next
    one; reused while the connection is busy, given back by ``trim()`` when it is idle (the
    server's sweeper calls it). Delivered frames are dropped by moving the undelivered tail to the
    front, only when the free end is too small for the next read.
  - ``_big``: a frame larger than those (``buffer_bytes``), allocated at its exact size once its
    header passed the limits (``max_frame_bytes``), filled by the transport directly, dropped once
    delivered.
  - ``_lent``: for a request frame larger than ``buffer_bytes`` whose metadata is in, the memory
    ``payload_into(meta, payload_bytes)`` lends, if it lends any (the server lends the model's
    arena slot, ingress/lent_slot.py): the transport reads the payload straight into it, and no
    ``_big`` is made. While ``on_frame`` runs for that frame, ``lent`` is the loan, for the
    callee to take; the receiver releases it after the call (``release`` does nothing once taken)
    and whenever the frame is dropped (``drop``, a fatal error).

Invariants
  1. A frame handed to ``on_frame`` is valid only during that call: its ``data`` is a read-only
     view of a buffer that is reused afterwards (by another connection's read, when shared). The
     callee copies what it keeps (the server's front end queues a copy or runs the model before it
     returns; ``meta`` is always a copy).
  2. Nothing is allocated for a size the peer claims before the header carrying it passed the
     limits (``read_header``); ``_own`` grows only while delivery is paused, by what the
     transport actually read (it stops reading once paused).
  3. Frames are delivered in order, exactly once; a fatal ProtocolError is raised once framing
     breaks (after the frames before it) and again by every later ``buffer_updated``.
  4. A loan is released exactly once (above). If its memory is revoked while the payload arrives
     (the model closed: slicing it raises ValueError), the rest of the payload is read into
     the small buffer and dropped, and ``on_revoked(request_id)`` is called in the frame's place.
  5. The shared buffer holds a receiver's bytes only from its ``get_buffer`` to the end of its
     ``buffer_updated`` (a raising callee included): then what is undelivered is in ``_own``.
     A receiver with an own buffer reads into it, never into the shared one.
"""

from collections.abc import Callable
from typing import NoReturn, Protocol

from lumenrt.protocols.tcp import HEADER_BYTES, MAX_PAYLOAD_BYTES, REQUEST, Frame, ProtocolError, read_header

Header = tuple[int, int, int, int, int, int]  # kind, flags, request id, metadata, payload bytes, priority
BUFFER_BYTES = 64 << 10  # guessed: holds many small frames per read; bigger frames get their own
MIN_READ_BYTES = 4096  # guessed: the least free space handed to a read before compacting


class Loan(Protocol):
    """Memory lent to receive one frame's payload into (``payload_into``)."""

    payload: memoryview  # exactly the payload's length; raises ValueError once revoked

    def release(self) -> None: ...


PayloadInto = Callable[[bytes, int], Loan | None]  # (metadata, payload bytes) -> where, or None


class ReadBuffer:
    """A receive buffer and its views: ``view`` for the transport to write, ``ro`` for frames."""

    __slots__ = ("buf", "ro", "view")

    def __init__(self, nbytes: int = BUFFER_BYTES) -> None:
        self.buf = bytearray(nbytes)
        self.view = memoryview(self.buf)
        self.ro = self.view.toreadonly()  # what frames get (invariant 1)


class FrameReceiver:
    """See the top. ``pause()``/``resume()`` and ``frames``/``buffered_bytes`` as FrameDecoder."""

    __slots__ = (
        "_big",
        "_big_have",
        "_big_head",
        "_cur",
        "_end",
        "_error",
        "_lent",
        "_lent_meta",
        "_lost",
        "_own",
        "_shared",
        "_size",
        "_start",
        "frames",
        "lent",
        "max_frame_bytes",
        "max_meta_bytes",
        "on_frame",
        "on_revoked",
        "paused",
        "payload_into",
    )

    def __init__(
        self,
        on_frame: Callable[[Frame], None],
        *,
        max_frame_bytes: int = MAX_PAYLOAD_BYTES,
        max_meta_bytes: int = 1 << 20,
        buffer_bytes: int = BUFFER_BYTES,
        payload_into: PayloadInto | None = None,
        on_revoked: Callable[[int], None] | None = None,
        shared: ReadBuffer | None = None,
    ) -> None:
        self.on_frame = on_frame
        self.payload_into = payload_into
        self.on_revoked = on_revoked
        self.max_frame_bytes = max_frame_bytes
        self.max_meta_bytes = max_meta_bytes
        self.frames = 0
        self.paused = False
        self._size = max(buffer_bytes, HEADER_BYTES + MIN_READ_BYTES)
        self._shared = shared  # the front end's, read into while this receiver holds nothing (top)
        self._cur = shared or ReadBuffer(self._size)  # where bytes land: ``_own`` whenever there is one
        self._own = None if shared is not None else self._cur  # made when needed (top)
        self._start = 0  # first byte of ``_cur`` not yet delivered
        self._end = 0  # end of the bytes received into ``_cur``
        self._big: bytearray | None = None  # a frame larger than buffer_bytes, being received
        self._big_have = 0
        self._big_head: Header = (0, 0, 0, 0, 0, 0)  # its header, read when it started
        self._error: ProtocolError | None = None
        self._lent: Loan | None = None  # memory lent for the payload being received (top)
        self._lent_meta = b""  # that frame's metadata
        self._lost = False  # the loan was revoked: the rest of its payload is dropped
        self.lent: Loan | None = None  # the loan of the frame ``on_frame`` is given, during the call

    @property
    def own_buffer_bytes(self) -> int:
        """The size of the receiver's own small buffer; 0 while it has none (top)."""
        return 0 if self._own is None else len(self._own.buf)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame (or of frames held while paused)."""
        held = HEADER_BYTES + len(self._lent_meta) if self._lent is not None else 0
        return self._end - self._start + self._big_have + held

    # ---- the transport's side (asyncio.BufferedProtocol) ---------------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next read lands: the rest of a big frame or of a lent payload, or the free
        end of the own buffer, else the shared one."""
        lent = self._lent
        if lent is not None:
            if not self._lost:
                try:
                    return lent.payload[self._big_have :]
                except ValueError:  # revoked (invariant 4)
                    self._lost = True
            rest = self._big_head[4] - self._big_have  # read, to be dropped
            return self._cur.view[: min(rest, len(self._cur.view))]
        big = self._big
        if big is not None:
            return memoryview(big)[self._big_have :]
        own = self._own
        if own is None:  # holding nothing: the shared buffer, from its start
            shared = self._shared
            assert shared is not None
            self._cur, self._start, self._end = shared, 0, 0
            return shared.view
        if len(own.buf) - self._end < MIN_READ_BYTES and (self._start or self._end == len(own.buf)):
            self._make_room()
        return self._cur.view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._error is not None:
            raise self._error
        if self._lent is not None:
            self._big_have += nbytes
            if self._big_have == self._big_head[4] and not self.paused:
                self._deliver_lent()
            return
        if self._big is not None:
            self._big_have += nbytes
            if self._big_have == len(self._big) and not self.paused:
                self._deliver_big()
            return
        self._end += nbytes
        try:
            if not self.paused:
                self._run()
        finally:  # also when a callee raised: the frames after its frame are kept
            if self._cur is self._shared:
                self._keep()

    # ---- delivery -------------------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Deliver the frames held while paused (may pause again part way)."""
        self.paused = False
        if self._error is not None:
            return
        if self._lent is not None:
            if self._big_have == self._big_head[4]:
                self._deliver_lent()
            return
        if self._big is not None:
            if self._big_have == len(self._big):
                self._deliver_big()
            return
        self._run()

    def _run(self) -> None:
        buf, pos, end = self._cur.buf, self._start, self._end
        while end - pos >= HEADER_BYTES:
            try:
                head = read_header(buf, pos, self.max_meta_bytes, self.max_frame_bytes)
            except ProtocolError as err:
                self._fail(err)
            need = HEADER_BYTES + head[3] + head[4]
            if end - pos < need:
                if need > len(buf):  # larger than the buffer: lent memory, or its own buffer
                    if self.payload_into is not None and head[0] == REQUEST:
                        meta_end = pos + HEADER_BYTES + head[3]
                        if end < meta_end and meta_end - pos <= len(buf):
                            break  # the metadata first: it says where the payload goes
                        if end >= meta_end and self._start_lent(pos, end, head):
                            return
                    self._start_big(pos, end, need, head)
                    return
                break
            self._start = pos + need  # before the call: a raising callee keeps the frames after it
            self._deliver(self._cur.ro, pos, head)
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
        big[:have] = self._cur.view[pos:end]
        self._big, self._big_have, self._big_head = big, have, head
        self._start = self._end = 0

    def _start_lent(self, pos: int, end: int, head: Header) -> bool:
        """Receive the payload of the frame at ``pos`` into lent memory, if ``payload_into``
        lends any for its metadata; the payload bytes already read are copied there."""
        assert self.payload_into is not None
        at = pos + HEADER_BYTES + head[3]
        meta = bytes(self._cur.view[pos + HEADER_BYTES : at])
        lent = self.payload_into(meta, head[4])
        if lent is None:
            return False
        have = end - at
        lent.payload[:have] = self._cur.view[at:end]
        self._lent, self._lent_meta, self._lost = lent, meta, False
        self._big_head, self._big_have = head, have
        self._start = self._end = 0
        return True

    def _deliver_lent(self) -> None:
        """The lent payload is in: hand its frame over with ``lent`` set (invariant 4)."""
        lent, meta = self._lent, self._lent_meta
        assert lent is not None
        kind, flags, rid, _, payload_len, priority = self._big_head
        self._lent, self._lent_meta, self._big_have = None, b"", 0
        self.frames += 1
        try:
            data = None if self._lost else lent.payload.toreadonly()
        except ValueError:  # revoked while delivery was paused
            data = None
        self.lent = lent
        try:
            if data is None:
                if self.on_revoked is not None:
                    self.on_revoked(rid)
            else:
                self.on_frame(Frame(kind, flags, rid, meta, data, 0, payload_len, priority))
        finally:
            self.lent = None
            lent.release()

    def drop(self) -> None:
        """The connection is done with: a loan in progress goes back (invariant 4)."""
        lent, self._lent, self._lent_meta = self._lent, None, b""
        if lent is not None:
            self._big_have = 0
            lent.release()

    def _deliver_big(self) -> None:
        big = self._big
        assert big is not None
        self._big, self._big_have = None, 0
        self._deliver(memoryview(big).toreadonly(), 0, self._big_head)

    def _make_room(self) -> None:
        """Move the undelivered tail of the own buffer to its front (a copy of at most one partial
        frame, or of the frames held while paused); with the buffer still full (held frames),
        double it: reading is paused by then, so it grows by what reads already under way bring
        (invariant 2)."""
        own = self._own
        assert own is not None and self._cur is own
        start, end = self._start, self._end
        if start:
            own.buf[: end - start] = bytes(own.view[start:end])  # not overlapping: a copy first
            self._start, self._end = 0, end - start
        if self._end == len(own.buf):
            grown = ReadBuffer(2 * len(own.buf))
            grown.buf[: self._end] = own.view[: self._end]
            self._own = self._cur = grown

    def _keep(self) -> None:
        """After a read into the shared buffer: what it left (the start of a frame, frames held by
        a pause) moves to the own buffer, made now; the shared one is free for the next read."""
        start, end = self._start, self._end
        self._start = self._end = 0
        if start == end:
            return
        own = ReadBuffer(max(self._size, end - start))
        own.buf[: end - start] = self._cur.view[start:end]
        self._own = self._cur = own
        self._end = end - start

    def trim(self) -> None:
        """Give the own buffer back while it holds nothing (an idle connection): the next read
        lands in the shared one. Does nothing without a shared buffer, or with a frame partly
        received or held."""
        shared = self._shared
        if shared is None or self._own is None or self._start != self._end:
            return
        if self._big is not None or self._lent is not None:
            return
        self._own, self._cur, self._start, self._end = None, shared, 0, 0

    def _fail(self, err: ProtocolError) -> NoReturn:
        self._error = err
        self._start = self._end = 0
        self.drop()
        self._big, self._big_have = None, 0
        raise err
