"""HTTP request bodies received straight into the model's arena slot: the tensor bytes land once.

When the headers of a binary-extension infer request give its length, a large body's tensor bytes
go into an arena slot lent by the model's runtime (``ModelRuntime.receive_slot``), at the offsets
where the engine then finds them (``slot_layout.adopt_inputs``): no joined body, no second copy at
admission. The JSON header, a few hundred bytes, is kept apart. The body bytes that arrive with
the request's headers are copied in as the parser hands them over (``feed``); once the JSON header
is in, the transport reads the rest of the payload straight into the slot (``rest``, the HTTP
front end's ``get_buffer``): the kernel's copy is then the only one. Anything else (small bodies, JSON data, compressed or chunked
bodies, a model without an arena, an unknown model, a client the gate would refuse) takes the
ordinary path.

Invariants
  1. A lent slot has exactly one owner at a time (lent_slot.py): the ``SlotBody`` until admission
     takes it, else ``release`` returns it. Every path that drops a body (answered without the
     engine, refused, the connection lost or failed mid-body) ends in ``release``.
  2. Nothing is lent before the body's size was checked (Content-Length against the body limit,
     in ``check_head``) and before the gate would let the client infer; a runtime lends at most
     a quarter of its slots, so slow senders cannot starve admitted requests.
  3. The memory lent may be revoked when the model closes (``feed`` then raises ValueError: the
     request is answered 503 and the rest of the body dropped).
"""

from typing import Any
from urllib.parse import unquote

from lumenrt.ingress.lent_slot import LentSlot


def infer_target(url: bytes) -> tuple[str, str | None] | None:
    """(model, version) of ``POST /v2/models/{m}[/versions/{v}]/infer``; None for any other path."""
    path = url.decode("latin-1").split("?", 1)[0]
    if "%" in path:
        path = unquote(path)
    parts = path.strip("/").split("/")
    if len(parts) == 4 and parts[:2] == ["v2", "models"] and parts[3] == "infer":
        return parts[2], None
    if len(parts) == 6 and parts[:2] == ["v2", "models"] and parts[3] == "versions" and parts[5] == "infer":
        return parts[2], parts[4]
    return None


class SlotBody(LentSlot):
    """One body arriving into a lent slot: the first ``header_length`` bytes (the JSON header)
    into ``header``, the rest into ``payload`` in wire order."""

    __slots__ = ("header", "header_length", "seen", "total")

    def __init__(self, runtime: Any, slot: int, payload: memoryview, header_length: int) -> None:
        super().__init__(runtime, slot, payload)  # payload: the body's length less the header's
        self.header = bytearray()
        self.header_length = header_length
        self.total = header_length + len(payload)  # the body's length (Content-Length)
        self.seen = 0  # body bytes received so far (never past Content-Length)

    def rest(self) -> memoryview:
        """The payload not received yet, for the transport to read straight into (the JSON header
        is in); raises ValueError once the slot was revoked (invariant 3)."""
        return self.payload[self.seen - self.header_length :]

    def feed(self, chunk: bytes) -> None:
        """One chunk of the body as the parser hands it over: its tensor bytes' one copy."""
        seen, head = self.seen, self.header_length
        self.seen = seen + len(chunk)
        if seen < head:
            take = head - seen
            if take >= len(chunk):
                self.header += chunk
                return
            self.header += chunk[:take]
            self.payload[0 : len(chunk) - take] = memoryview(chunk)[take:]
            return
        at = seen - head
        self.payload[at : at + len(chunk)] = chunk
