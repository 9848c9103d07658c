"""HTTP request bodies received straight into the model's arena slot: the tensor bytes land once.

When the headers of a binary-extension (or raw) infer request give its length, a large body's
tensor bytes are copied from each socket chunk into an arena slot lent by the model's runtime
(``ModelRuntime.receive_slot``), at the offsets where the engine then finds them
(``slot_layout.adopt_inputs``): no joined body, no second copy at admission. The JSON header, a
few hundred bytes, is kept apart. Anything else (small bodies, JSON data, compressed or chunked
bodies, a model without an arena, an unknown model, a client the gate would refuse) takes the
ordinary path.

Invariants
  1. A lent slot has exactly one owner at a time: the ``SlotBody`` until ``take`` hands it to the
     runtime's admission (which then frees it or makes it the request's slot), else ``release``
     returns it. Every path that drops a body (answered without the engine, refused, the
     connection lost or failed mid-body) ends in ``release``; a second ``release`` does nothing.
  2. Nothing is lent before the body's size was checked (Content-Length against the body limit,
     in ``check_head``) and before the gate would let the client infer; a runtime lends at most
     a quarter of its slots, so slow senders cannot starve admitted requests.
  3. The memory lent may be revoked when the model closes (``feed`` then raises ValueError: the
     request is answered 503 and the rest of the body dropped).
"""

from typing import Any
from urllib.parse import unquote

RECEIVE_IN_SLOT_MIN = 64 << 10  # guessed: a smaller payload arrives in one or two reads, no join worth it


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


class SlotBody:
    """One body arriving into a lent slot: the first ``header_length`` bytes (the JSON header)
    into ``header``, the rest into ``payload`` in wire order."""

    __slots__ = ("header", "header_length", "payload", "runtime", "seen", "slot")

    def __init__(self, runtime: Any, slot: int, payload: memoryview, header_length: int) -> None:
        self.runtime = runtime
        self.slot = slot
        self.payload = payload  # exactly the body's length less the header's (receive_slot)
        self.header = bytearray()
        self.header_length = header_length
        self.seen = 0  # body bytes fed so far (the parser never feeds past Content-Length)

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

    def take(self, runtime: Any) -> int:
        """The slot, for ``runtime``'s admission (invariant 1); -1 if it is another runtime's (the
        model was reloaded meanwhile: the inputs are then copied, and the slot released after)."""
        if runtime is not self.runtime or self.slot < 0:
            return -1
        slot, self.slot = self.slot, -1
        return slot

    def release(self) -> None:
        """Back to the runtime, unless admission took it (invariant 1)."""
        if self.slot >= 0:
            slot, self.slot = self.slot, -1
            self.runtime.return_slot(slot)
