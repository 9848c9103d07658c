"""Adaptive batching: a worker learns what a row costs at each batch size, and forms batches no
larger than the cheapest.

Dynamic batching pays when a batch of n costs much less than n single requests (digits_mlp: a row
at batch 8 costs a fraction of a batch-1 request). On a small CPU it can cost more: in one phase of
this 2-CPU VM, SqueezeNet in ``lumenrt serve`` (HTTP, 8 clients, 2 workers) ran batches of 2 at
16.3 ms an image against 12.6 ms in a server given ``--batch-size 1``, and served 107-144 images/s
against 170; in later runs batches of 2 cost no more per image than single ones. Which holds
depends on the model, the CPU and what else runs beside the worker, so it is measured where it
matters: in the worker, under its load (README, ``batching``).

Engine key ``batching``: ``fixed`` forms batches as the model config says (Triton's rules, the
batcher's work conservation); ``adaptive`` does the same under a cap, the row count whose cost per
row (the worker's time for the whole batch: gather, run, answers) is the lowest seen so far, or
the smallest within ``TOLERANCE`` of it (as much work done, with less waiting).

Invariants
  1. One writer: each worker's batcher owns its ``BatchCost`` (no sharing, no lock); ``limit`` is
     read once per batch formed and ``observe`` called once per batch run, by the same thread.
     Costs are measured under the worker's real load (other workers, the event loop), which is
     what decides. A size's first ``WINDOW`` observations are averaged plainly (a cold first
     batch does not linger), then move its average by 1 / ``WINDOW``; a size measured rarely (not
     in the last ``PROBE_EVERY // 2`` batches: a probe's) moves it by ``PROBE_WEIGHT`` at least.
     Only batches that ran whole in one model call are measured (``Batcher.ran``), and a size not
     measured in the last ``STALE`` batches is not chosen (its cause may be gone).
  2. Never below one request: the cap bounds only what is added after a batch's first request,
     which runs whole whatever its rows (batcher.py), so no request is refused or split for it.
  3. Keeps measuring: the cap is the best size seen so far (1 before any: the second batch is the
     first upward probe), and one batch in ``PROBE_EVERY`` may grow to the model's
     ``max_batch_size`` (an upward probe) and one is held to half the best (a downward probe). So
     a size never formed under the cap, or slow once (a cold start, a burst of other work), is
     measured again, and the cap follows the load.
  4. Only where the measurement can decide: a model whose cheapest row costs under ``MIN_ROW_NS``
     is not capped (as ``fixed``); its downward probe forms the best size, so that size's cost
     stays current and a model that slows down is capped again.
  5. Bounded, and cheap per batch: three lists of ``max_batch_size + 1`` numbers (cost, count,
     last seen), updated in place; the best is found again by a scan only every ``RESCAN_EVERY``
     batches.
"""

PROBE_EVERY = 32  # one upward and one downward probe per this many batches
RESCAN_EVERY = 8  # the best size is looked for again every this many observations
WINDOW = 8  # the moving average's weight of a new observation of the best size: 1 / WINDOW
PROBE_WEIGHT = 0.5  # and of another size's (seen rarely: an old value must not outlive its cause)
STALE = 4 * PROBE_EVERY  # a size not seen in this many batches is not chosen again until it is
TOLERANCE = 0.05  # a smaller batch within 5% of the cheapest per row is preferred (less waiting)
# Below this cost per row nothing is capped. A worker's time for a batch misses what batching saves
# elsewhere (the ring hand-off, wake-ups, completions on the event loop: ~30-60 us a batch on the
# 2-CPU VM, README "lane") and includes waits for the GIL, both as large as a small model's rows:
# digits_mlp (~20 us a row) served 0.84x with the cap at concurrency 8 (benchmarks/batching.py,
# 4 rounds). At 1 ms a row that error is a few percent.
MIN_ROW_NS = 1_000_000


class BatchCost:
    """The cost per row of each batch size (ns, a moving average; 0.0: never seen)."""

    __slots__ = ("_batches", "_last", "_max_rows", "_per_row", "_seen", "best", "small")

    def __init__(self, max_rows: int) -> None:
        self._max_rows = max_rows
        self._per_row = [0.0] * (max_rows + 1)
        self._seen = [0] * (max_rows + 1)  # observations of each size, counted up to WINDOW
        self._last = [0] * (max_rows + 1)  # the batch count at each size's last observation
        # start on single requests, with the first upward probe at the second batch: a model that
        # batching helps gets there at once, one that it hurts never forms a run of big batches
        self._batches = PROBE_EVERY - 2
        self.best = 1
        self.small = False  # the cheapest row seen costs under MIN_ROW_NS: no cap

    def limit(self) -> int:
        """The most rows the next batch may gather (invariant 3)."""
        self._batches += 1
        turn = self._batches % PROBE_EVERY
        if turn == PROBE_EVERY // 2:  # uncapped, the best size is formed only here: measure it
            return self.best if self.small else max(1, self.best // 2)
        if turn == 0 or self.small:
            return self._max_rows
        return self.best

    def observe(self, rows: int, ns: int) -> None:
        """A batch of ``rows`` took ``ns`` to run and answer."""
        if not 0 < rows <= self._max_rows or ns <= 0:
            return
        per_row, best = self._per_row, self.best
        # a plain mean of a size's first observations (a cold first batch is outvoted at once),
        # then a moving average
        n = self._seen[rows] = min(self._seen[rows] + 1, WINDOW)
        rare = self._batches - self._last[rows] > PROBE_EVERY // 2  # a probe's size, not the usual
        self._last[rows] = self._batches
        weight = max(1 / n, PROBE_WEIGHT) if rare else 1 / n
        per_row[rows] += (ns / rows - per_row[rows]) * weight
        if self._batches % RESCAN_EVERY == 0 or per_row[best] == 0.0:
            self.best = self._scan()
        elif rows < best and per_row[rows] <= per_row[best] * (1 + TOLERANCE):
            self.best = rows  # as cheap, and smaller
        elif rows > best and per_row[rows] * (1 + TOLERANCE) < per_row[best]:
            self.best = rows  # cheaper by more than the tolerance
        self.small = per_row[self.best] < MIN_ROW_NS

    def _scan(self) -> int:
        """The smallest size within the tolerance of the cheapest seen in the last ``STALE``
        batches (1: none)."""
        since = self._batches - STALE
        fresh = [
            (rows, cost) for rows, cost in enumerate(self._per_row) if cost and self._last[rows] >= since
        ]
        if not fresh:
            return 1
        bound = min(cost for _, cost in fresh) * (1 + TOLERANCE)
        return next(rows for rows, cost in fresh if cost <= bound)

    def costs(self) -> dict[int, float]:
        """The sizes seen and their cost per row (ns), for tests and reports."""
        return {rows: cost for rows, cost in enumerate(self._per_row) if cost}
