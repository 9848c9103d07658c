"""Thread-mode worker: one per core, pinned, owning one model session (a GPU instance's worker:
one host thread feeding its device, engine/gpu/serving.py).

Loop: the batcher blocks for the first request (GIL released while it waits), gathers a batch,
the worker drops requests that expired or were cancelled (answered, never run), concatenates the
rest into its pre-allocated batch buffers, runs the session (ONNX Runtime, XGBoost and PyTorch
release the GIL while they compute), hands each request exactly its own rows, and completes it.
Requests whose variable dimensions differ cannot share a batch: they run as separate groups.

Invariants
  1. An Exception anywhere in a batch (the model, gathering, splitting) fails exactly the batch's
     requests that are not yet answered, with the error's text, and the worker goes on to the
     next batch (execute.py).
  2. The worker never ends with requests unanswered. Every descriptor it takes from the ring goes
     into its hold (``HeldSource``) before anything else can fail; when something escapes the loop
     (a BaseException from the model, a bug in the batcher or in execute.py: a death), the worker
     clears its readiness, fails each request of its hold that is still its own and unanswered
     (same generation, not released, not completed) with WorkerDied naming the model, the worker
     and the cause, sets the latches of what it completed, closes its session and reports the
     death to its supervisor (thread_pool.py), which may start a replacement.
  3. A replacement joins the worker it replaces before loading, so the two never take requests at
     the same time (a spsc ring's single consumer) and the dead one's answers are all out.

Shutdown order
  1. the runtime closes the request ring (no new request gets in);
  2. each worker drains what is left (ring pops succeed until empty), then sees RingClosed;
  3. the worker closes its session and ends; the runtime joins it. (RingClosed is the only normal
     end: anything else that ends the loop is a death, invariant 2.)
"""

import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lumenrt.backends.base import Backend, BackendSession, Placement
from lumenrt.engine.batcher import (
    Batcher,
    BatchPolicy,
    DelayingSource,
    IdleBoard,
    PrioritySource,
    RingSource,
    Source,
)
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.descriptors import request_generation
from lumenrt.engine.execute import (
    CANCELLED_MESSAGE,
    BatchPlan,
    current_records,
    execute_batch,
    timed_out_message,
)
from lumenrt.engine.histograms import DURATION_BOUNDS_NS, add_counts, duration_buckets
from lumenrt.engine.placing import bind_this_thread, narrow_after_load
from lumenrt.engine.request import (
    Array,
    EngineError,
    InferRequest,
    RequestCancelled,
    RequestTable,
    RequestTimeout,
    WorkerDied,
)
from lumenrt.engine.validate import numpy_dtype
from lumenrt.native import Item, Ring, RingClosed

log = logging.getLogger("lumenrt.engine")


@dataclass(slots=True)
class WorkerStats:
    """Written by its worker only; the runtime adds them up when asked."""

    requests: int = 0
    batches: int = 0
    failures: int = 0
    expired: int = 0
    cancelled: int = 0
    queue_ns: int = 0  # enqueued -> dequeued
    input_ns: int = 0  # dequeued -> compute start (batch formed, gathered)
    infer_ns: int = 0  # compute start -> end
    output_ns: int = 0  # compute end -> completed (split, complete)
    batch_rows: dict[int, int] = field(default_factory=dict)  # rows -> batches of that size
    # Histograms (engine/histograms.py: DURATION_BOUNDS_NS), one count per request run: its queue
    # wait (queue_ns) and its batch's model run (infer_ns). Batch sizes need none: batch_rows.
    queue_buckets: list[int] = field(default_factory=duration_buckets)
    compute_buckets: list[int] = field(default_factory=duration_buckets)
    # rows -> [input_ns, infer_ns, output_ns] summed over the batches of that size (Triton's
    # batch_stats; one entry allocated the first time a size runs)
    batch_ns: dict[int, list[int]] = field(default_factory=dict)

    def add(self, other: "WorkerStats") -> None:
        """Add ``other``'s counts to these (a runtime's total over its workers and its lane)."""
        self.requests += other.requests
        self.batches += other.batches
        self.failures += other.failures
        self.expired += other.expired
        self.cancelled += other.cancelled
        self.queue_ns += other.queue_ns
        self.input_ns += other.input_ns
        self.infer_ns += other.infer_ns
        self.output_ns += other.output_ns
        for rows, n in list(other.batch_rows.items()):
            self.batch_rows[rows] = self.batch_rows.get(rows, 0) + n
        add_counts(self.queue_buckets, other.queue_buckets)
        add_counts(self.compute_buckets, other.compute_buckets)
        for rows, times in list(other.batch_ns.items()):
            add_counts(self.batch_ns.setdefault(rows, [0, 0, 0]), times)


def zeros_for(config: ModelConfig, rows: int) -> dict[str, Array]:
    """Warm-up inputs: zeros, variable dims taken as 1."""
    lead = (rows,) if config.max_batch_size > 0 else ()
    out: dict[str, Array] = {}
    for spec in config.inputs:
        shape = lead + tuple(d if d > 0 else 1 for d in spec.dims)
        dtype = numpy_dtype(spec.datatype)
        out[spec.name] = (
            np.zeros(shape, dtype=dtype) if dtype != np.object_ else np.full(shape, b"", dtype=object)
        )
    return out


def batch_policy(config: ModelConfig, adaptive: bool = False) -> BatchPolicy:
    """The model's batching rules; ``adaptive``: engine.batching 'adaptive' (batch_cost.py)."""
    db = config.dynamic_batching
    if db is None or config.max_batch_size == 0:  # no dynamic batching: every request runs alone
        return BatchPolicy(max_rows=max(1, config.max_batch_size), alone=True)
    return BatchPolicy(
        max_rows=config.max_batch_size,
        max_queue_delay_ns=db.max_queue_delay_us * 1000,
        preferred_rows=frozenset(db.preferred_batch_size),
        adaptive=adaptive,
    )


def batch_buffers(config: ModelConfig) -> dict[str, Array]:
    """Pre-allocated batch buffers for inputs of fixed shape (variable ones are concatenated)."""
    if config.max_batch_size == 0:
        return {}
    return {
        spec.name: np.empty((config.max_batch_size, *spec.dims), dtype=numpy_dtype(spec.datatype))
        for spec in config.inputs
        if all(d > 0 for d in spec.dims) and spec.datatype != "BYTES"
    }


def has_variable_dims(config: ModelConfig) -> bool:
    """True if requests of this model may differ in a non-batch dimension (they then batch only
    with requests of the same shape)."""
    return any(any(d < 0 for d in spec.dims) for spec in config.inputs)


def batch_plan(config: ModelConfig) -> BatchPlan:
    """A worker's batch buffers and shape rule for ``config`` (execute.py)."""
    return BatchPlan(config, batch_buffers(config), has_variable_dims(config) and config.max_batch_size > 0)


class Supervisor(Protocol):
    """Who a thread worker reports its death and its failed reloads to (thread_pool.py)."""

    def died(self, worker: "ThreadWorker", error: BaseException) -> None:
        """``worker`` died of ``error`` (its requests already failed); called from its own thread,
        last thing."""
        ...

    def reload_failed(self, worker: "ThreadWorker", error: BaseException) -> float | None:
        """A replacement could not load: seconds to wait before it tries again, or None to give
        up (shutdown began)."""
        ...

    def pause(self, delay_s: float) -> bool:
        """Wait ``delay_s`` (a replacement's backoff); False at once if shutdown began."""
        ...


class HeldSource:
    """The worker's source, keeping every descriptor it hands out in ``held`` until the worker
    answered its request (invariant 2): what a dead worker held is found here, wherever it was
    (the batch being formed, the batcher's carry, the batch running, a GPU batch in flight).
    Answered entries are pruned only when the list outgrows ``limit`` (amortised O(1) per request;
    at most a worker's batches in flight and its carry are unanswered at once)."""

    __slots__ = ("_inner", "_limit", "_records", "held", "rows", "signal", "waiting")

    def __init__(
        self, inner: Source[Item], records: list[InferRequest], signal: list[int], limit: int
    ) -> None:
        self._inner, self._records, self._limit = inner, records, limit
        self.signal = signal
        self.held: list[Item] = []
        # the inner source's own (the batcher calls rows per request: no frame of ours between)
        self.rows: Callable[[Item], int] = inner.rows
        self.waiting: Callable[[], int] = inner.waiting

    def take(self, max_n: int, timeout_s: float | None) -> list[Item]:
        items = self._inner.take(max_n, timeout_s)
        held = self.held
        if len(held) > self._limit:
            held[:] = self.unanswered()
        held.extend(items)
        return items

    def unanswered(self) -> list[Item]:
        """The held descriptors whose request is unanswered, each once. A record still holds the
        request a descriptor names while its generation is the descriptor's (admission bumps it)
        and it is not released (``reset`` clears its times, enqueued_ns among them)."""
        records, seen, out = self._records, set(), []
        for item in self.held:
            req = records[item.request_id]
            times = req.times
            if (
                item.request_id not in seen
                and req.generation == request_generation(item)
                and times.enqueued_ns != 0
                and times.completed_ns == 0
            ):
                seen.add(item.request_id)
                out.append(item)
        return out


class ThreadWorker:
    def __init__(
        self,
        *,
        index: int,
        config: ModelConfig,
        backend: Backend,
        model_path: Any,
        placement: Placement,
        ring: Ring,
        table: RequestTable,
        pin: bool,
        board: IdleBoard | None = None,
        adaptive: bool = False,
        levels: list[Ring] | None = None,
        doorbell: Ring | None = None,
        requeue: Callable[[InferRequest], bool] | None = None,
        host_memory: Any = None,
        supervisor: Supervisor | None = None,
        replaces: "ThreadWorker | None" = None,
        delay_s: float = 0.0,
    ) -> None:
        """``levels`` and ``doorbell``: the priority rings (batcher.PrioritySource), when the model
        has more than one priority level; ``ring`` is then the first level's. ``requeue``: a level's
        timeout_action is DELAY (batcher.DelayingSource). ``host_memory``: the region holding the
        model's arena (a GPU instance with direct copies registers it with its device).
        ``adaptive``: engine.batching 'adaptive' (batch_cost.py; CPU instances: a GPU instance's
        batches overlap on its device, so its time per batch is not its cost).
        ``supervisor``: told of a death (invariant 2). ``replaces``: the dead worker this one
        replaces (joined first, its statistics carried on; a failed load is then retried through
        the supervisor instead of reported), after waiting ``delay_s``."""
        self.index = index
        self._board = board
        self.config = config
        self.placement = placement
        # a replacement writes on in its predecessor's statistics (that one has ended: one writer)
        self.stats: WorkerStats = replaces.stats if replaces is not None else WorkerStats()
        self.loaded = threading.Event()  # its load ended, well (ready) or not (load_error)
        self.ready = threading.Event()  # loaded and serving (cleared at a death)
        self.load_error: BaseException | None = None
        self.native_id = 0  # its thread's id (0: not started), for /proc/<pid>/task/<tid>
        self.serving: Serving | None = None  # once loaded (a GPU instance's reports its device)
        self.batches_at_load = 0  # stats.batches when it loaded: did it serve before it died?
        self._backend = backend
        self._model_path = model_path
        self._ring = ring
        self._levels = levels
        self._doorbell = doorbell
        self._requeue = requeue
        self._host_memory = host_memory
        self._table = table
        self._pin = pin
        self._supervisor = supervisor
        self._replaces = replaces  # until joined (then dropped: no chain of dead workers is kept)
        self._replacement = replaces is not None
        self._delay_s = delay_s
        self._policy = batch_policy(config, adaptive)
        self._signal: list[int] = []  # requests completed, latches set at the next take
        self._thread = threading.Thread(target=self._run, name=f"lumenrt-{config.name}-w{index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def served(self) -> bool:
        """It ran a batch since it loaded."""
        return self.stats.batches > self.batches_at_load

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        serving = self._start_serving()
        if serving is None:
            return
        source: RingSource | PrioritySource | DelayingSource[Item]
        if self._doorbell is not None and self._levels:
            source = PrioritySource(self._levels, self._doorbell, self._table.latches)
        else:
            source = RingSource(self._ring, self._table.latches)
        if self._requeue is not None:
            source = DelayingSource(source, self._table.records, self._requeue)
        self._signal = source.signal
        hold = HeldSource(source, self._table.records, self._signal, 4 * self._policy.max_rows + 16)
        batcher = Batcher(hold, self._policy, self._board, self.index)
        sink = ThreadSink(self.stats, self._table, self._signal)
        death: BaseException | None = None
        try:
            serving.serve(batcher, self._table.records, sink)
        except BaseException as e:  # not RingClosed (the serving loop's normal end): a death
            death = e
            self.ready.clear()
            self._fail_held(hold, sink, e)
        finally:
            for index in self._signal:  # completed, but the loop ended before the next take
                self._table.latches.set(index)
            self._signal.clear()
            try:
                serving.close()
            except Exception:
                log.exception("model %r: worker %d: closing its session failed", self.config.name, self.index)
        if death is not None:
            self.serving = None  # closed
            if self._supervisor is None:
                raise death
            self._supervisor.died(self, death)

    def _start_serving(self) -> "Serving | None":
        """Pin, load and warm up (after the backoff and the predecessor's end, for a replacement);
        None: the load failed (reported by the runtime at load) or shutdown began meanwhile."""
        supervisor, delay_s = self._supervisor, self._delay_s
        if self._replaces is not None:
            self._replaces.join()  # invariant 3
            self._replaces = None
        while True:
            if self._replacement and supervisor is not None and not supervisor.pause(delay_s):
                return None
            try:
                if self._pin:
                    bind_this_thread(self.placement)
                serving = self._load()
                break
            except BaseException as e:
                if not self._replacement or supervisor is None:  # reported by the runtime at load
                    self.load_error = e
                    self.loaded.set()
                    return None
                retry_in = supervisor.reload_failed(self, e)
                if retry_in is None:
                    return None
                delay_s = retry_in
        self.serving = serving
        self.batches_at_load = self.stats.batches
        self.ready.set()
        self.loaded.set()
        return serving

    def _fail_held(self, hold: HeldSource, sink: "ThreadSink", error: BaseException) -> None:
        """Invariant 2: what the dead worker still held, failed with WorkerDied."""
        message = (
            f"model {self.config.name!r}: worker {self.index} died: {type(error).__name__}: {error}; "
            "request failed"
        )
        records = self._table.records
        for item in hold.unanswered():
            try:
                sink.died(records[item.request_id], message, error)
            except BaseException:  # the caller's callback failed: the others still get theirs
                log.exception("model %r: failing a request of dead worker %d", self.config.name, self.index)

    def _load(self) -> "Serving":
        """The instance's session, loaded and warmed up on this (pinned) thread; a GPU instance's
        is its device pipeline (engine/gpu/serving.py, imported only for one)."""
        if self.placement.gpu >= 0:
            from lumenrt.engine.gpu.serving import load_gpu_serving

            return load_gpu_serving(
                self._backend, self._model_path, self.config, self.placement, self._host_memory
            )
        session = self._backend.load(self._model_path, self.config, self.placement)
        if self._pin:
            narrow_after_load(self.placement, session)
        for _ in range(self.config.warmup):
            session.run(zeros_for(self.config, 1))
        return CpuServing(session, batch_plan(self.config))


class Serving(Protocol):
    """What a worker thread runs once loaded: its loop over batches, until the ring is drained."""

    def serve(self, batcher: Batcher[Item], records: list[InferRequest], sink: "ThreadSink") -> None: ...

    def close(self) -> None: ...


class CpuServing:
    """A CPU instance: one batch at a time through its session (execute.py)."""

    def __init__(self, session: BackendSession, plan: BatchPlan) -> None:
        self._session, self._plan = session, plan

    def serve(self, batcher: Batcher[Item], records: list[InferRequest], sink: "ThreadSink") -> None:
        while True:
            try:
                items = batcher.next_batch()  # sets the latches of the last batch first
            except RingClosed:
                return
            start_ns = time.monotonic_ns()
            rows = execute_batch(self._plan, self._session, current_records(items, records), sink)
            batcher.ran(time.monotonic_ns() - start_ns, rows)

    def close(self) -> None:
        self._session.close()


class ThreadSink:
    """execute.py's sink for a worker thread: a request is its record; the model's output arrays
    are its answer (views of one batch's outputs), completed through the request table."""

    __slots__ = ("_batch_out_ns", "_batch_times", "_signal", "_table", "stats")

    def __init__(self, stats: WorkerStats, table: RequestTable, signal: list[int]) -> None:
        self.stats, self._table, self._signal = stats, table, signal
        # the running batch's stats.batch_ns entry, and the output time already added to it (its
        # answers add up to the last one's completed - compute end)
        self._batch_times: list[int] = [0, 0, 0]
        self._batch_out_ns = -1  # -1: no answer of the batch yet

    def inputs(self, request: InferRequest) -> dict[str, Array]:
        return request.inputs

    def rows(self, request: InferRequest) -> int:
        return request.rows

    def dequeue(self, request: InferRequest, now_ns: int) -> bool:
        times = request.times
        times.dequeued_ns = now_ns
        if request.deadline_ns and now_ns > request.deadline_ns:  # first: a request the event loop
            self.stats.expired += 1  # answered at its deadline is also cancelled (engine.py)
            self._complete(request, RequestTimeout(timed_out_message(now_ns - times.enqueued_ns)))
            return True
        if request.cancelled:
            self.stats.cancelled += 1
            self._complete(request, RequestCancelled(CANCELLED_MESSAGE))
            return True
        return False

    def ran(self, n_requests: int, rows: int, start_ns: int, end_ns: int) -> None:
        stats = self.stats
        stats.requests += n_requests
        stats.batches += 1
        stats.batch_rows[rows] = stats.batch_rows.get(rows, 0) + 1
        times = stats.batch_ns.get(rows)
        if times is None:
            times = stats.batch_ns[rows] = [0, 0, 0]
        times[1] += end_ns - start_ns
        self._batch_times, self._batch_out_ns = times, -1

    def answer(
        self,
        request: InferRequest,
        outputs: dict[str, Array],
        start_ns: int,
        end_ns: int,
        rows: int,
        now_ns: int,
    ) -> None:
        stats, times = self.stats, request.times
        times.batch_formed_ns = times.compute_start_ns = start_ns
        times.compute_end_ns = end_ns
        times.batch_size = rows
        request.outputs = outputs
        queue_ns = now_ns - times.enqueued_ns
        stats.queue_ns += queue_ns
        stats.queue_buckets[bisect_left(DURATION_BOUNDS_NS, queue_ns)] += 1
        stats.input_ns += start_ns - now_ns
        stats.infer_ns += end_ns - start_ns
        stats.compute_buckets[bisect_left(DURATION_BOUNDS_NS, end_ns - start_ns)] += 1
        times.completed_ns = time.monotonic_ns()
        out_ns = times.completed_ns - end_ns
        stats.output_ns += out_ns
        batch = self._batch_times  # its batch's entry (ran): input once, output up to the last
        if self._batch_out_ns < 0:  # the batch's first answer
            batch[0] += start_ns - now_ns
            self._batch_out_ns = 0
        batch[2] += out_ns - self._batch_out_ns
        self._batch_out_ns = out_ns
        self._table.complete(request, self._signal)

    def fail(self, request: InferRequest, message: str, cause: BaseException) -> None:
        self.stats.failures += 1
        error = EngineError(message)
        error.__cause__ = cause
        self._complete(request, error)

    def died(self, request: InferRequest, message: str, cause: BaseException) -> None:
        """Its worker died holding it (ThreadWorker invariant 2): WorkerDied (503)."""
        self.stats.failures += 1
        error = WorkerDied(message)
        error.__cause__ = cause
        self._complete(request, error)

    def answered(self, request: InferRequest) -> bool:
        return request.times.completed_ns != 0

    def _complete(self, request: InferRequest, error: EngineError) -> None:
        request.error = error
        request.times.completed_ns = time.monotonic_ns()
        self._table.complete(request, self._signal)
