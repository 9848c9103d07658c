"""Thread-mode worker: one per core, pinned, owning one model session (a GPU instance's worker:
one host thread feeding its device, engine/gpu/serving.py).

Loop: the batcher blocks for the first request (GIL released while it waits), gathers a batch,
the worker drops requests that expired or were cancelled (answered, never run), concatenates the
rest into its pre-allocated batch buffers, runs the session (ONNX Runtime, XGBoost and PyTorch
release the GIL while they compute), hands each request exactly its own rows, and completes it.
Requests whose variable dimensions differ cannot share a batch: they run as separate groups.

Invariant: the worker never dies with requests unanswered. An error anywhere in a batch (the
model, gathering, splitting) fails exactly the batch's requests that are not yet answered, with
the error's text, and the worker goes on to the next batch.

Shutdown order
  1. the runtime closes the request ring (no new request gets in);
  2. each worker drains what is left (ring pops succeed until empty), then sees RingClosed;
  3. the worker closes its session and ends; the runtime joins it.
"""

import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lumenrt.backends.base import Backend, BackendSession, Placement
from lumenrt.engine.batcher import Batcher, BatchPolicy, DelayingSource, IdleBoard, PrioritySource, RingSource
from lumenrt.engine.config import ModelConfig
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
)
from lumenrt.engine.validate import numpy_dtype
from lumenrt.native import Item, Ring, RingClosed


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
    ) -> None:
        """``levels`` and ``doorbell``: the priority rings (batcher.PrioritySource), when the model
        has more than one priority level; ``ring`` is then the first level's. ``requeue``: a level's
        timeout_action is DELAY (batcher.DelayingSource). ``host_memory``: the region holding the
        model's arena (a GPU instance with direct copies registers it with its device).
        ``adaptive``: engine.batching 'adaptive' (batch_cost.py; CPU instances: a GPU instance's
        batches overlap on its device, so its time per batch is not its cost)."""
        self.index = index
        self._board = board
        self.config = config
        self.placement = placement
        self.stats = WorkerStats()
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.native_id = 0  # its thread's id (0: not started), for /proc/<pid>/task/<tid>
        self.serving: Serving | None = None  # once loaded (a GPU instance's reports its device)
        self._backend = backend
        self._model_path = model_path
        self._ring = ring
        self._levels = levels
        self._doorbell = doorbell
        self._requeue = requeue
        self._host_memory = host_memory
        self._table = table
        self._pin = pin
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

    def _run(self) -> None:
        try:
            self.native_id = threading.get_native_id()
            if self._pin:
                bind_this_thread(self.placement)
            serving = self._load()
        except BaseException as e:  # reported by the runtime at load
            self.load_error = e
            self.ready.set()
            return
        self.serving = serving
        self.ready.set()
        source: RingSource | PrioritySource | DelayingSource[Item]
        if self._doorbell is not None and self._levels:
            source = PrioritySource(self._levels, self._doorbell, self._table.latches)
        else:
            source = RingSource(self._ring, self._table.latches)
        if self._requeue is not None:
            source = DelayingSource(source, self._table.records, self._requeue)
        self._signal = source.signal
        batcher = Batcher(source, self._policy, self._board, self.index)
        sink = ThreadSink(self.stats, self._table, self._signal)
        try:
            serving.serve(batcher, self._table.records, sink)
        finally:
            for index in self._signal:  # completed, but the loop ended before the next take
                self._table.latches.set(index)
            self._signal.clear()
            serving.close()

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

    def answered(self, request: InferRequest) -> bool:
        return request.times.completed_ns != 0

    def _complete(self, request: InferRequest, error: EngineError) -> None:
        request.error = error
        request.times.completed_ns = time.monotonic_ns()
        self._table.complete(request, self._signal)
