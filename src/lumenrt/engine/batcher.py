"""The dynamic batcher: one per worker, pulling from the model's request ring.

Triton's knobs: block for the first request, then keep gathering until ``max_batch_size`` rows or
until ``max_queue_delay_us`` has passed since the first was taken, dispatching early at a
``preferred_batch_size`` when nothing more is waiting. Batches keep forming while other workers
compute (each worker has its own batcher over the shared ring). A request whose rows would overflow
the batch is carried over to start the next one, so every request runs whole.
"""

import time
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from lumenrt.native import Item, Latches, Ring

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_rows: int  # max_batch_size, or 1 for a model without a batch dimension
    max_queue_delay_ns: int = 0
    preferred_rows: frozenset[int] = frozenset()


class Source(Protocol[T]):
    def take(self, max_n: int, timeout_s: float | None) -> list[T]:
        """Up to max_n requests; timeout None blocks for at least one (RingClosed when drained)."""
        ...

    def rows(self, request: T) -> int: ...

    def waiting(self) -> int: ...


class RingSource:
    """Requests straight from a ring (thread mode): the item's aux0 is its row count. The latches
    of the requests completed since the last take (``signal``) are set by the next take, with the
    GIL released (see request.py)."""

    def __init__(self, ring: Ring, latches: Latches | None = None) -> None:
        self._ring = ring
        self._latches = latches
        self.signal: list[int] = []

    def take(self, max_n: int, timeout_s: float | None) -> list[Item]:
        return self._ring.pop_many(max_n, timeout_s=timeout_s, latches=self._latches, signal=self.signal)

    def rows(self, request: Item) -> int:
        return request.aux0

    def waiting(self) -> int:
        return len(self._ring)


class Batcher(Generic[T]):
    def __init__(self, source: Source[T], policy: BatchPolicy) -> None:
        self._source = source
        self._policy = policy
        self._carry: list[T] = []  # taken from the ring but not fitting the last batch

    def next_batch(self) -> list[T]:
        """Blocks for the first request; raises RingClosed once the ring is closed and drained."""
        policy, source = self._policy, self._source
        first = self._carry.pop(0) if self._carry else source.take(1, None)[0]
        t_first_ns = time.monotonic_ns()
        batch = [first]
        rows = source.rows(first)
        while self._carry and rows + source.rows(self._carry[0]) <= policy.max_rows:
            item = self._carry.pop(0)
            batch.append(item)
            rows += source.rows(item)
        if rows >= policy.max_rows or self._carry:
            return batch
        deadline_ns = t_first_ns + policy.max_queue_delay_ns
        while rows < policy.max_rows:
            wait_s = (deadline_ns - time.monotonic_ns()) / 1e9
            if wait_s <= 0 or (rows in policy.preferred_rows and source.waiting() == 0):
                more = source.take(policy.max_rows - rows, 0)
                if not more:
                    break
            else:
                more = source.take(policy.max_rows - rows, wait_s)
            for item in more:  # each item has >= 1 row, so some may not fit: carry them over
                if rows + source.rows(item) > policy.max_rows:
                    self._carry.append(item)
                else:
                    batch.append(item)
                    rows += source.rows(item)
            if self._carry:
                break
        return batch
