"""The dynamic batcher: one per worker, pulling from the model's request ring.

Triton's knobs: block for the first request, then keep gathering until ``max_batch_size`` rows or
until ``max_queue_delay_us`` has passed since the first was taken, dispatching early at a
``preferred_batch_size`` when nothing more is waiting. Batches keep forming while other workers
compute (each worker has its own batcher over the shared ring). A request whose rows would overflow
the batch is carried over to start the next one, so every request runs whole.

Work conservation (thread mode, several workers): a batcher whose peers are idle does not wait for
more requests, and takes only its fair share of those already queued (ceil(queued / (idle peers +
1)) rows), leaving the rest to the idle peers. With no queue delay configured, a batcher whose peers are all
busy likewise takes ceil(queued / workers) rows: they will be free soon. On CPU a batch of n costs about n single requests
(SqueezeNet under ONNX Runtime here: 287/s at batch 4 against 300/s at batch 1, 2 threads), so
one worker gathering every request while another sits idle halves throughput; measured with
`benchmarks/serve.py` (perf_analyzer, concurrency 4): batches of 3-4 on one worker, the other idle.
``IdleBoard`` is how batchers see each other: one flag per worker, written only by its owner.

Adaptive batching (``BatchPolicy.adaptive``, batch_cost.py): every rule above applies under a cap,
the row count whose cost per row this worker measured lowest (``ran`` reports each batch's time);
the first request of a batch is taken whole whatever the cap.

A model without ``dynamic_batching`` (``BatchPolicy.alone``) is never batched across requests, as in
Triton: each batch is exactly one request, with up to ``max_batch_size`` rows of its own. A model
that is not safe to batch (per-request state, an output that depends on the whole batch) never
sees another client's rows.

tests/unit/test_batcher.py checks each rule above against a scripted source and clock. A ring
closed and drained while a batch forms ends that batch, which still runs (``_more``); the next
``next_batch`` raises RingClosed, so requests still queued at close run before the worker ends.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from lumenrt.engine.batch_cost import BatchCost
from lumenrt.engine.descriptors import request_rows
from lumenrt.native import Item, Latches, Ring, RingClosed

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_rows: int  # max_batch_size, or 1 for a model without a batch dimension
    max_queue_delay_ns: int = 0
    preferred_rows: frozenset[int] = frozenset()
    adaptive: bool = False  # engine.batching 'adaptive': batches capped at the cheapest size per row
    alone: bool = False  # no dynamic batching: each batch is one request (its own rows only)


class Source(Protocol[T]):
    def take(self, max_n: int, timeout_s: float | None) -> list[T]:
        """Up to max_n requests; timeout None blocks for at least one (RingClosed when drained)."""
        ...

    def rows(self, request: T) -> int: ...

    def waiting(self) -> int: ...


class RingSource:
    """Requests straight from a ring (thread pool): each item is a request descriptor
    (descriptors.py). The latches
    of the requests completed since the last take (``signal``) are set by the next take, with the
    GIL released (see request.py)."""

    def __init__(self, ring: Ring, latches: Latches | None = None) -> None:
        self._ring = ring
        self._latches = latches
        self.signal: list[int] = []

    def take(self, max_n: int, timeout_s: float | None) -> list[Item]:
        return self._ring.pop_many(max_n, timeout_s=timeout_s, latches=self._latches, signal=self.signal)

    def rows(self, request: Item) -> int:
        return request_rows(request)

    def waiting(self) -> int:
        return len(self._ring)


class PrioritySource:
    """Requests from one ring per priority level (thread pool, ``priority_levels`` > 1), highest
    level first. A doorbell ring carries one token per request queued at any level; a worker blocks
    on the doorbell, and each token it takes entitles it to one request from the level rings.

    Invariant: at every instant, requests queued in the level rings >= tokens in the doorbell plus
    tokens taken whose request is not yet taken, because admission pushes the request before its
    token (runtime.py). So a worker holding n tokens finds n requests, scanning the levels from the
    highest; a request pushed whose token could not be (the doorbell closed under it, at unload)
    is answered by the runtime after the workers end (``ModelRuntime.close``)."""

    def __init__(self, rings: list[Ring], doorbell: Ring, latches: Latches | None = None) -> None:
        self._rings = rings
        self._doorbell = doorbell
        self._latches = latches
        self.signal: list[int] = []

    def take(self, max_n: int, timeout_s: float | None) -> list[Item]:
        tokens = len(
            self._doorbell.pop_many(max_n, timeout_s=timeout_s, latches=self._latches, signal=self.signal)
        )
        taken: list[Item] = []
        while len(taken) < tokens:
            closed = 0
            for ring in self._rings:
                try:
                    taken += ring.pop_many(tokens - len(taken), timeout_s=0)
                except RingClosed:
                    closed += 1  # closed and empty: the others hold the rest
                    continue
                if len(taken) == tokens:
                    break
            if closed == len(self._rings):  # unloaded, and the runtime answered what was left
                if taken:
                    return taken
                raise RingClosed("every priority level is closed and empty")
        return taken

    def rows(self, request: Item) -> int:
        return request_rows(request)

    def waiting(self) -> int:
        return len(self._doorbell)


class DelayingSource(Generic[T]):
    """Triton's ``timeout_action: DELAY`` (thread pool): a request taken past its DELAY timeout while
    other requests wait is put back once, at the tail of the lowest level (``requeue``), so the
    requests still on time run first; when a worker takes it again it runs. Wraps the model's
    source only when a level has that policy: other models pay nothing for it."""

    def __init__(self, inner: Source[T], records: list[Any], requeue: Callable[[Any], bool]) -> None:
        self._inner = inner
        self._records = records
        self._requeue = requeue
        self.signal: list[int] = getattr(inner, "signal", [])

    def take(self, max_n: int, timeout_s: float | None) -> list[T]:
        while True:
            items = self._inner.take(max_n, timeout_s)
            now_ns = time.monotonic_ns()
            kept: list[T] = []
            for item in items:
                req = self._records[item.request_id]  # type: ignore[attr-defined]
                if req.delay_ns and not req.delayed and now_ns > req.delay_ns and self._inner.waiting():
                    req.delayed = True  # before the push: another worker may take it at once
                    if self._requeue(req):
                        continue
                kept.append(item)
            if kept or timeout_s is not None or not items:
                return kept  # a blocking take returns at least one (all put back: take again)

    def rows(self, request: T) -> int:
        return self._inner.rows(request)

    def waiting(self) -> int:
        return self._inner.waiting()


class IdleBoard:
    """One flag per worker of a model: True while it waits for its first request. Each flag is
    written only by its own worker (no lock); readers may see a stale value for an instant, which
    costs at most one less-than-ideal batch."""

    def __init__(self, workers: int) -> None:
        self.flags = [False] * workers

    def idle_peers(self, me: int) -> int:
        flags = self.flags
        return sum(flags) - flags[me]


class Batcher(Generic[T]):
    def __init__(
        self, source: Source[T], policy: BatchPolicy, board: IdleBoard | None = None, me: int = 0
    ) -> None:
        self._source = source
        self._policy = policy
        self._board = board
        self._me = me
        self._carry: list[T] = []  # taken from the ring but not fitting the last batch
        self._drained = False  # the ring was found closed and empty while a batch formed
        self.cost = BatchCost(policy.max_rows) if policy.adaptive and policy.max_rows > 1 else None
        self._max_rows = policy.max_rows  # this batch's bound: the policy's, or the adaptive cap
        self._rows = 0  # rows of the batch last formed

    def ran(self, ns: int, rows: int) -> None:
        """The batch last formed took ``ns`` to run and answer, in one model call of ``rows`` rows
        (execute_batch's count). Adaptive batching learns from it only when that is every row
        formed: a batch with requests answered without running (expired, cancelled, failed, or
        split by shape) took less time than its size costs."""
        if self.cost is not None and rows == self._rows:
            self.cost.observe(rows, ns)

    def _bound(self) -> int:
        cost = self.cost
        self._max_rows = self._policy.max_rows if cost is None else cost.limit()
        return self._max_rows

    def _take_first(self) -> T:
        if self._carry:
            return self._carry.pop(0)
        board = self._board
        if board is None:
            return self._source.take(1, None)[0]
        board.flags[self._me] = True
        try:
            return self._source.take(1, None)[0]
        finally:
            board.flags[self._me] = False

    def next_batch(self) -> list[T]:
        """Blocks for the first request; raises RingClosed once the ring is closed and drained."""
        first = self._take_first()
        if self._policy.alone:
            self._rows = self._source.rows(first)
            return [first]
        self._bound()
        return self._fill(first, time.monotonic_ns())

    def try_next_batch(self) -> list[T]:
        """A batch of what is queued now, never waiting: [] when nothing is (a GPU worker with a
        batch still on its device asks this, so that it can answer that batch instead of sleeping).
        No queue delay is waited for either: the batch on the device is the delay. RingClosed once
        the ring is closed and drained."""
        if self._carry:
            first = self._carry.pop(0)
        else:
            taken = self._source.take(1, 0)
            if not taken:
                return []
            first = taken[0]
        if self._policy.alone:
            self._rows = self._source.rows(first)
            return [first]
        max_rows = self._bound()
        batch, rows = self._with_carry(first)
        if rows < max_rows and not self._carry:
            rows = self._add(batch, self._more(max_rows - rows, 0), rows)
        self._rows = rows
        return batch

    def _with_carry(self, first: T) -> tuple[list[T], int]:
        """``first`` and the carried requests that fit after it."""
        source, max_rows = self._source, self._max_rows
        batch = [first]
        rows = source.rows(first)
        while self._carry and rows + source.rows(self._carry[0]) <= max_rows:
            item = self._carry.pop(0)
            batch.append(item)
            rows += source.rows(item)
        return batch, rows

    def _fill(self, first: T, t_first_ns: int) -> list[T]:
        batch, rows = self._with_carry(first)
        self._rows = self._gather(batch, rows, t_first_ns)
        return batch

    def _gather(self, batch: list[T], rows: int, t_first_ns: int) -> int:
        """Add to ``batch`` (``rows`` so far) by the rules at the top; returns its rows."""
        policy, source, max_rows = self._policy, self._source, self._max_rows
        if rows >= max_rows or self._carry:
            return rows
        board = self._board
        if board is not None:
            peers = board.idle_peers(self._me)
            if peers or policy.max_queue_delay_ns == 0:
                # work conservation: no waiting, and a fair share of what is queued (among the
                # idle peers, or among all workers when every one is busy: they finish soon)
                share = -(-(rows + source.waiting()) // (peers + 1 if peers else len(board.flags)))
                if share > rows:
                    rows = self._add(batch, self._more(min(share, max_rows) - rows, 0), rows)
                return rows
        deadline_ns = t_first_ns + policy.max_queue_delay_ns
        while rows < max_rows:
            wait_s = (deadline_ns - time.monotonic_ns()) / 1e9
            if wait_s <= 0 or (rows in policy.preferred_rows and source.waiting() == 0):
                more = self._more(max_rows - rows, 0)
                if not more:
                    break
            else:
                more = self._more(max_rows - rows, wait_s)
            rows = self._add(batch, more, rows)
            if self._carry or self._drained:
                break
        return rows

    def _more(self, max_n: int, timeout_s: float) -> list[T]:
        """Requests to add to a batch already started: a ring closed and drained meanwhile ends
        the batch (it runs; RingClosed comes at the next ``next_batch``), never loses it."""
        if self._drained:
            return []
        try:
            return self._source.take(max_n, timeout_s)
        except RingClosed:
            self._drained = True
            return []

    def _add(self, batch: list[T], more: list[T], rows: int) -> int:
        """Append what fits (each item has >= 1 row); carry the rest over. Returns the rows."""
        source, max_rows = self._source, self._max_rows
        for item in more:
            if rows + source.rows(item) > max_rows:
                self._carry.append(item)
            else:
                batch.append(item)
                rows += source.rows(item)
        return rows
