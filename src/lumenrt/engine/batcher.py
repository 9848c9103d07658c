"""The dynamic batcher: one per worker, pulling from the model's request ring.

Triton's knobs: block for the first request, then keep gathering until ``max_batch_size`` rows or
until ``max_queue_delay_us`` has passed since the first was taken, dispatching early at a
``preferred_batch_size`` when nothing more is waiting. Batches keep forming while other workers
compute (each worker has its own batcher over the shared ring). A request whose rows would overflow
the batch is carried over to start the next one, so every request runs whole.
"""

import time
from dataclasses import dataclass

from lumenrt.engine.request import InferRequest, RequestTable
from lumenrt.native import Item, Ring


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_rows: int  # max_batch_size, or 1 for a model without a batch dimension
    max_queue_delay_ns: int = 0
    preferred_rows: frozenset[int] = frozenset()


class Batcher:
    def __init__(self, ring: Ring, table: RequestTable, policy: BatchPolicy) -> None:
        self._ring = ring
        self._table = table
        self._policy = policy
        self._carry: list[Item] = []  # taken from the ring but not fitting the last batch

    def next_batch(self) -> list[InferRequest]:
        """Blocks for the first request; raises RingClosed once the ring is closed and drained."""
        policy, records = self._policy, self._table.records
        if self._carry:
            first = self._carry.pop(0)
        else:
            popped = self._ring.pop()
            assert popped is not None  # pop() without timeout returns an item or raises
            first = popped
        t_first_ns = time.monotonic_ns()
        batch = [records[first.request_id]]
        rows = first.aux0
        while self._carry and rows + self._carry[0].aux0 <= policy.max_rows:
            item = self._carry.pop(0)
            batch.append(records[item.request_id])
            rows += item.aux0
        if rows >= policy.max_rows or self._carry:
            return batch
        deadline_ns = t_first_ns + policy.max_queue_delay_ns
        while rows < policy.max_rows:
            now_ns = time.monotonic_ns()
            wait_s = (deadline_ns - now_ns) / 1e9
            if wait_s <= 0 or (rows in policy.preferred_rows and len(self._ring) == 0):
                more = self._ring.pop_many(policy.max_rows - rows, timeout_s=0)
                if not more:
                    break
            else:
                more = self._ring.pop_many(policy.max_rows - rows, timeout_s=wait_s)
            for item in more:  # each item has >= 1 row, so some may not fit: carry them over
                if rows + item.aux0 > policy.max_rows:
                    self._carry.append(item)
                else:
                    batch.append(records[item.request_id])
                    rows += item.aux0
            if self._carry:
                break
        return batch
