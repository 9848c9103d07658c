"""ModelInfer messages received straight into the model's arena slot: over gRPC too, the tensor
bytes land once.

A large ModelInfer message arrives over many DATA frames (``protocols/http2.py`` hands a large
frame over in pieces as the reads bring it). When its first piece holds every field before the raw
contents, and those fields are a signature the front end already decoded and checked once
(``grpc_service``'s plans), the rest of the message is known octet for octet: each raw input's
tag and length, then its bytes. Those bytes are then copied from each piece straight to where the
engine finds them in a slot lent by the model's runtime (``slot_layout.adopt_inputs``: each input
at an offset aligned to ``ALIGN``); the few other octets are kept apart. That copy is the only
one: no message buffer, no joined frame, no copy at admission.

Invariants
  1. A lent slot has exactly one owner (lent_slot.py): this ``SlotMessage`` until admission takes
     it, else ``release`` returns it; the connection releases it on every path that ends the call
     (``GrpcConnection._end``), and nothing is written into it after.
  2. Nothing is lent before the message's length was checked against the body limit, its leading
     fields matched a known signature exactly, and that signature's raw contents add up to the
     length; and never past the runtime's own bound (a quarter of its slots).
  3. Octets that are not where the signature puts them (a tag or length protobuf would not write)
     are no error here: the message is rebuilt from the slot and the kept octets, exactly as sent,
     and takes the ordinary path, which names what is wrong.
  4. The memory lent may be revoked when the model closes: ``feed`` then raises ValueError and the
     call is answered UNAVAILABLE.
"""

from typing import Any

from lumenrt.ingress.lent_slot import LentSlot
from lumenrt.protocols import grpc_wire as wire

ALIGN = 64  # each input's offset in the slot (a cache line; any dtype's alignment divides it)


class SlotMessage(LentSlot):
    """One ModelInfer message arriving into a lent slot. ``pieces`` cut the message into runs: the
    leading fields and each input's tag and length (kept, in ``kept``) and each input's bytes (into
    ``payload`` at ``offsets``)."""

    __slots__ = ("_at", "expected", "kept", "length", "offsets", "pieces", "plan", "request_id", "seen")

    def __init__(
        self,
        runtime: Any,
        slot: int,
        payload: memoryview,
        plan: Any,
        request_id: str | None,
        head: bytes,
        layout: list[tuple[bytes, int]],
        offsets: list[int],
        length: int,
    ) -> None:
        super().__init__(runtime, slot, payload)
        self.plan = plan  # the signature (grpc_service's _Plan)
        self.request_id = request_id
        self.length = length  # the message's octets (without gRPC's 5-octet prefix)
        self.seen = 0  # octets of it received so far
        self.offsets = offsets  # each input's offset in ``payload``
        self.kept = bytearray()  # the octets that are not tensor bytes, as received
        self.expected = bytearray(head)  # what they should be (invariant 3)
        # (start, stop, offset in payload or -1 for kept octets), in message order
        self.pieces: list[tuple[int, int, int]] = []
        at = 0
        for (framing, start), offset, (_, _, _, _, nbytes) in zip(layout, offsets, plan.inputs, strict=True):
            self.pieces.append((at, start, -1))
            self.pieces.append((start, start + nbytes, offset))
            self.expected += framing
            at = start + nbytes
        self._at = 0  # the piece the next octet belongs to

    @classmethod
    def lend(
        cls,
        runtime: Any,
        plan: Any,
        request_id: str | None,
        head: bytes,
        layout: list[tuple[bytes, int]],
        length: int,
    ) -> "SlotMessage | None":
        """A slot for the message, or None when the runtime lends none (invariant 2)."""
        offsets: list[int] = []
        end = 0
        for *_, nbytes in plan.inputs:
            start = -(-end // ALIGN) * ALIGN
            offsets.append(start)
            end = start + nbytes
        lent = runtime.receive_slot(end)
        if lent is None:
            return None
        return cls(runtime, lent[0], lent[1], plan, request_id, head, layout, offsets, length)

    def feed(self, data: memoryview) -> None:
        """The message's next octets (a DATA frame's piece): tensor bytes to the slot, the rest
        kept. GrpcWireError past the message's end; ValueError once the slot was revoked."""
        seen = self.seen
        if seen + len(data) > self.length:
            raise wire.GrpcWireError(wire.UNIMPLEMENTED, "a second message on a unary call")
        pieces, payload, i = self.pieces, self.payload, self._at
        at, end = 0, len(data)
        while at < end:
            start, stop, offset = pieces[i]
            take = min(stop - seen, end - at)
            if offset < 0:
                self.kept += data[at : at + take]
            else:
                into = offset + seen - start
                payload[into : into + take] = data[at : at + take]
            at += take
            seen += take
            if seen == stop:
                i += 1
        self.seen, self._at = seen, i

    @property
    def complete(self) -> bool:
        return self.seen == self.length

    @property
    def as_expected(self) -> bool:
        """Every kept octet is what the signature said (invariant 3)."""
        return self.kept == self.expected

    def rebuild(self) -> bytes:
        """The message as it was sent (invariant 3)."""
        out: list[bytes | bytearray | memoryview] = []
        kept_at = 0
        for start, stop, offset in self.pieces:
            if offset < 0:
                out.append(self.kept[kept_at : kept_at + stop - start])
                kept_at += stop - start
            else:
                out.append(self.payload[offset : offset + stop - start])
        return b"".join(out)
