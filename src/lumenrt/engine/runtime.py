"""One loaded model version: its request ring, request table, input arena and workers.

Ingress path of a request (``submit``), all in the caller's thread:
  validate -> check the queue bound (max_queue_size) -> take a request record -> copy the inputs
  once (into an arena slot with allocator_type "lumen_arena", into fresh numpy arrays with
  "standard") -> push the record's index to the request ring -> a worker completes it.

Invariants (both worker modes; process_runtime.py adds its own)
  1. Every request admission accepts gets exactly one answer: its outputs, or an EngineError saying
     why (the model failed, its worker died, it expired or was cancelled before running, or the
     model was unloaded first). Nothing that takes a request may end without answering it: a
     worker that cannot run a batch fails that batch's requests and keeps serving.
  2. Admission never waits: a request over a limit is refused at once with QueueFull naming the
     limit (max_queue_size; request records; arena slots in process mode), and a push the ring
     refuses (full, closed, or a producer the ring cannot take) is answered at once, its record and
     slot returned, never treated as in flight.
  3. At most max_queue_size requests wait in the ring (exact with one producer thread, as behind
     the server's event loop; concurrent producer threads may overshoot by one each, bounded by
     the ring's capacity).
"""

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.backends.base import Backend, Placement
from lumenrt.engine.batcher import IdleBoard
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.lane import InlineLane
from lumenrt.engine.request import (
    Array,
    EngineError,
    InferRequest,
    ModelNotReady,
    QueueFull,
    RequestTable,
    StageTimes,
)
from lumenrt.engine.validate import validate_inputs
from lumenrt.engine.worker import ThreadWorker, WorkerStats
from lumenrt.native import (
    LrtError,
    Region,
    Ring,
    RingClosed,
    SlabPool,
    ring_required_bytes,
    slab_required_bytes,
)


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    queue_type: str = "mpmc"
    allocator_type: str = "lumen_arena"  # or "standard"
    pin: bool = True
    arena_slot_bytes: int = 1 << 20
    arena_slots: int = 256
    spin_us: int = 0  # poll before sleeping: idle workers on the ring, synchronous callers on their latch
    lane: str = "queue"  # the inline lane (engine/lane.py): queue, inline or auto
    lane_max_us: int = 30  # auto: the largest batch-1 compute that runs inline


def admit(
    config: ModelConfig,
    table: RequestTable,
    inputs: Mapping[str, Any],
    closed: bool,
    max_queue: int,
    timeout_s: float | None,
    queued: int,
) -> tuple[InferRequest, dict[str, Array]]:
    """The admission steps both worker modes share: refuse when unloading, validate, check the
    queue bound (``queued``: requests now in the ring), take a request record (QueueFull at once
    when none is free), stamp arrival and set the deadline."""
    received_ns = time.monotonic_ns()
    if closed:
        raise ModelNotReady(f"model {config.name!r} is unloading")
    arrays, rows = validate_inputs(config, inputs)
    if queued >= max_queue:
        raise QueueFull(f"model {config.name!r}: queue full (max_queue_size: {max_queue} requests waiting)")
    req = table.acquire()
    if req is None:
        raise QueueFull(
            f"model {config.name!r}: all {len(table.records)} request records in use "
            "(requests queued, running, or answered but not yet collected)"
        )
    req.times.received_ns = received_ns
    req.rows = rows
    db = config.dynamic_batching
    if timeout_s is None and db is not None and db.default_timeout_us:
        timeout_s = db.default_timeout_us / 1e6
    if timeout_s is not None:
        req.deadline_ns = received_ns + int(timeout_s * 1e9)
    return req, arrays


ABANDON_WAIT_S = 30.0  # guessed: far longer than any request runs here; past it the record is lost


def abandon(runtime: "ModelRuntime | Any", req: InferRequest) -> None:
    """A synchronous caller stopped waiting (a signal handler raised): cancel the request and wait,
    uninterruptibly and bounded, for its completion so that its record can be released."""
    runtime.cancel(req)
    try:
        done = runtime.table.latches.wait(req.index, timeout_s=ABANDON_WAIT_S)
    except BaseException:
        done = False
    if done:
        runtime.release(req)


def push_and_wait(runtime: Any, req: InferRequest, **desc: int) -> None:
    """The synchronous hand-off both worker modes share: push ``req`` (descriptor fields ``desc``)
    and wait for its latch in this thread; a push the ring refuses is answered at once
    (``_refuse``), only an interruption after the push leaves the request in flight."""
    refused: str | None = None
    try:
        pushed = runtime.ring.push_wait(
            req.index, latches=runtime.table.latches, latch=req.index, spin_ns=runtime._spin_ns, **desc
        )
    except RingClosed:
        pushed = False
    except LrtError as e:  # raised before the push took effect (e.g. too many producer threads)
        pushed, refused = False, str(e)
    except BaseException:  # e.g. KeyboardInterrupt while waiting: the request is in flight
        abandon(runtime, req)
        raise
    if not pushed:
        runtime._refuse(req, refused)


def try_push(runtime: Any, req: InferRequest, **desc: int) -> None:
    """The asynchronous hand-off both worker modes share: push without waiting; a refused push is
    answered at once (``_refuse``)."""
    refused: str | None = None
    try:
        pushed = runtime.ring.try_push(req.index, **desc)
    except RingClosed:
        pushed = False
    except LrtError as e:
        pushed, refused = False, str(e)
    if not pushed:
        runtime._refuse(req, refused)


def refusal(config: ModelConfig, closed: bool, max_queue: int, refused: str | None) -> EngineError:
    """The error for a push the ring refused: unloading, the ring's own refusal, or full."""
    if closed:
        return ModelNotReady(f"model {config.name!r} is unloading")
    if refused is not None:
        return EngineError(f"model {config.name!r}: the request ring refused the request: {refused}")
    return QueueFull(f"model {config.name!r}: queue full (max_queue_size: {max_queue} requests waiting)")


def _ring_capacity(n: int) -> int:
    cap = 2
    while cap < n:
        cap *= 2
    return cap


class ModelRuntime:
    def __init__(
        self,
        *,
        config: ModelConfig,
        version: int,
        model_path: Path,
        backend: Backend,
        placements: list[Placement],
        options: RuntimeOptions,
    ) -> None:
        self.config = config
        self.version = version
        self.model_id = 0  # set by the engine: index used by async completions
        self.options = options
        db = config.dynamic_batching
        max_queue = db.max_queue_size if db is not None else 1024
        per_batch = max(config.max_batch_size, 1)
        # records: every queued request plus what the workers may hold (a batch each, and a carry)
        self.table = RequestTable(max_queue + 2 * per_batch * len(placements))
        self.ring = Ring.create(
            Region.anonymous(ring_required_bytes(_ring_capacity(max_queue))),
            options.queue_type,
            _ring_capacity(max_queue),
        )
        self._max_queue = max_queue
        self._spin_ns = options.spin_us * 1000
        self.ring.spin_ns = self._spin_ns  # the workers' handle: idle workers poll before sleeping
        self.pool: SlabPool | None = None
        if options.allocator_type == "lumen_arena":
            n = min(options.arena_slots, len(self.table.records))
            self.pool = SlabPool.create(
                Region.anonymous(slab_required_bytes(options.arena_slot_bytes, n)),
                options.arena_slot_bytes,
                n,
            )
        self._slots: dict[int, int] = {}  # request index -> arena slot
        self.arena_fallbacks = 0  # requests too big for a slot (or arena full): copied to fresh arrays
        self.rejected = 0
        board = IdleBoard(len(placements))
        self.workers = [
            ThreadWorker(
                index=i,
                config=config,
                backend=backend,
                model_path=model_path,
                placement=p,
                ring=self.ring,
                table=self.table,
                pin=options.pin,
                board=board,
            )
            for i, p in enumerate(placements)
        ]
        self.lane = InlineLane(config, backend, model_path, options, placements, process_mode=False)
        self.closed = False

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, timeout_s: float = 120) -> None:
        for w in self.workers:
            w.start()
        for w in self.workers:
            if not w.ready.wait(timeout_s):
                raise TimeoutError(
                    f"model {self.config.name!r}: worker {w.index} did not load within {timeout_s} s"
                )
        errors = [w.load_error for w in self.workers if w.load_error is not None]
        if errors:
            self.close()
            raise errors[0]
        try:
            self.lane.open()
        except BaseException:
            self.close()
            raise

    @property
    def ready(self) -> bool:
        return not self.closed and all(w.alive and w.ready.is_set() for w in self.workers)

    def begin_shutdown(self) -> None:
        """Shutdown began: nothing to stop here (thread workers are never replaced)."""

    def close(self, timeout_s: float = 30) -> None:
        """Stop taking requests, let the workers finish what is queued, join them."""
        self.closed = True
        self.ring.close()
        for w in self.workers:
            w.join(timeout_s)
        self.lane.close()

    # ---- requests -------------------------------------------------------------------------

    def submit(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        on_done: Callable[[InferRequest], None] | None = None,
    ) -> InferRequest:
        """Queue the request without waiting: ``on_done`` runs in the worker when it completes
        (None: its latch is set, see ``table.latches.wait``)."""
        req = self._prepare(inputs, timeout_s, on_done)
        try_push(self, req, aux0=req.rows)
        return req

    def run(self, inputs: Mapping[str, Any], *, timeout_s: float | None = None) -> InferRequest:
        """Synchronous: queue the request and wait for it in this thread (polling ``spin_us``,
        then sleeping, with the GIL released from the push on). Returns it completed; the caller
        reads it, then releases it."""
        req = self._prepare(inputs, timeout_s, None)
        push_and_wait(self, req, aux0=req.rows)
        return req

    def run_inline(
        self, inputs: Mapping[str, Any], times: StageTimes | None = None, timeout_s: float | None = None
    ) -> dict[str, Array] | None:
        """The outputs, computed in this thread now, or None: submit it (engine/lane.py)."""
        if self.closed:
            return None
        return self.lane.run(inputs, len(self.ring), times, timeout_s)

    def _prepare(
        self,
        inputs: Mapping[str, Any],
        timeout_s: float | None,
        on_done: Callable[[InferRequest], None] | None,
    ) -> InferRequest:
        try:
            req, arrays = admit(
                self.config, self.table, inputs, self.closed, self._max_queue, timeout_s, len(self.ring)
            )
        except QueueFull:
            self.rejected += 1
            raise
        req.on_done = on_done
        req.inputs = self._copy_in(req, arrays)
        req.times.enqueued_ns = time.monotonic_ns()
        return req

    def _refuse(self, req: InferRequest, refused: str | None = None) -> None:
        """The ring refused the request (full, closed by an unload, or refused by the ring):
        return its record and arena slot, answer at once."""
        self.release(req)
        self.rejected += 1
        raise refusal(self.config, self.closed, self._max_queue, refused)

    def _copy_in(self, req: InferRequest, arrays: dict[str, Array]) -> dict[str, Array]:
        """The one copy of the request's tensors."""
        pool = self.pool
        if pool is not None:
            total = sum(a.nbytes for a in arrays.values() if a.dtype != np.object_)
            if total <= pool.slot_bytes and all(a.dtype != np.object_ for a in arrays.values()):
                slot = pool.try_alloc()
                if slot is not None:
                    self._slots[req.index] = slot
                    view = pool.view(slot)
                    copied: dict[str, Array] = {}
                    offset = 0
                    for name, a in arrays.items():
                        dst = np.frombuffer(view, dtype=a.dtype, count=a.size, offset=offset).reshape(a.shape)
                        np.copyto(dst, a)
                        copied[name] = dst
                        offset += (a.nbytes + 63) & ~63
                    return copied
            self.arena_fallbacks += 1
        return {name: np.array(a, copy=True) for name, a in arrays.items()}

    def cancel(self, req: InferRequest) -> None:
        req.cancelled = True

    def release(self, req: InferRequest) -> None:
        slot = self._slots.pop(req.index, None)
        if slot is not None and self.pool is not None:
            self.pool.free(slot)
        self.table.release(req)

    # ---- statistics -----------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        total = WorkerStats()
        for w in self.workers:
            total.add(w.stats)
        total.add(self.lane.stats)  # requests answered inline count like any other (lane.py)
        return {
            "name": self.config.name,
            "version": self.version,
            "ready": self.ready,
            "workers": len(self.workers),
            "worker_mode": "thread",
            "queue_type": self.options.queue_type,
            "allocator_type": self.options.allocator_type,
            "requests": total.requests,
            "batches": total.batches,
            "failures": total.failures,
            "expired": total.expired,
            "cancelled": total.cancelled,
            "rejected": self.rejected,
            "arena_fallbacks": self.arena_fallbacks,
            "queue_ns": total.queue_ns,
            "input_ns": total.input_ns,
            "infer_ns": total.infer_ns,
            "output_ns": total.output_ns,
            "batch_rows": dict(sorted(total.batch_rows.items())),
            "arena": self.pool.stats() if self.pool is not None else None,
            "ring": self.ring.stats(),
            "lane": self.lane.describe(),
            "worker_deaths": 0,  # thread workers never die (worker.py) and are never replaced
            "replacement_failures": 0,
            "pids": [os.getpid()] * len(self.workers),
        }
