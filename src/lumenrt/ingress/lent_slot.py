"""A model's arena slot lent to a front end to receive a request's tensor bytes into as they
arrive (``ModelRuntime.receive_slot``): the HTTP body (http_body.py) and the TCP frame payload
(tcp_server.py) land there once, and admission finds the inputs where they already lie.

Invariants
  1. A lent slot has exactly one owner at a time: the ``LentSlot`` until ``take`` hands it to the
     runtime's admission (``service.submit(received=)``, which then frees it or makes it the
     request's slot), else ``release`` returns it. Every path that drops the request (answered
     without the engine, refused, the connection lost or failed mid-receive) ends in ``release``;
     a second ``release``, or one after ``take``, does nothing.
  2. The memory lent may be revoked when the model closes: writing into ``payload`` then raises
     ValueError, and the front end answers 503.
"""

from typing import Any

RECEIVE_IN_SLOT_MIN = 64 << 10  # guessed: a smaller payload arrives in one or two reads, no join worth it


class LentSlot:
    """One slot lent by ``runtime``, and ``payload``: the memory to receive the tensor bytes
    into, exactly their length (``receive_slot``)."""

    __slots__ = ("payload", "runtime", "slot")

    def __init__(self, runtime: Any, slot: int, payload: memoryview) -> None:
        self.runtime = runtime
        self.slot = slot
        self.payload = payload

    @classmethod
    def borrow(cls, runtime: Any, payload_bytes: int) -> "LentSlot | None":
        """A slot from ``runtime`` for ``payload_bytes`` of tensor bytes, or None when it lends
        none (no arena, too big for a slot, a quarter of its slots already lent)."""
        lent = runtime.receive_slot(payload_bytes)
        return None if lent is None else cls(runtime, lent[0], lent[1])

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
