"""Process mode: one loaded model version served by worker processes over shared memory.

One unnamed shared segment per model (a memfd the workers receive when they are spawned; nothing
in /dev/shm, so nothing to unlink after any exit, SIGKILL of the engine included) holds the request
ring, the completion ring, the arena (one slot per request: inputs in, outputs out), one hold per
worker, a cancel flag per request record and a status table. Threads in the engine process:
  - callers (ingress): validate, copy inputs into a slot (the one copy), push the descriptor;
  - the completion thread: the only one that completes requests; it copies outputs out of the
    slot, frees it, and ignores duplicate notices (generation + finished flag);
  - the supervisor: it spawns every worker, so their parent-death signal (SIGKILL) is tied to a
    thread that outlives them; when a worker dies it reports what the worker held (its hold, and
    any claim the ring recovers) to the completion ring as WORKER_DIED notices and, unless the
    runtime is stopping, starts a replacement, retrying with backoff while replacements fail.

Invariants
  1. Every request that admission accepts is answered exactly once: by its worker (a result or a
     clear error), by the supervisor when its worker dies (WorkerDied), or by ``close`` when the
     runtime ends before it ran (ModelNotReady). Admission refuses at once (QueueFull names the
     limit: max_queue_size, request records, or arena slots), never waits.
  2. The model is ready only while every worker is alive and has loaded.
  3. The supervisor never dies: an error while replacing is reported and retried with backoff.
  4. No replacement starts once ``stopping`` is set (shutdown began); dead workers' requests are
     still failed.
  5. Only the supervisor reaps worker processes; ``close`` waits on their sentinels and kills.

Shutdown order
  1. stopping = closed = True (ingress refuses, no replacement), close the request ring;
  2. kill workers still loading (they hold nothing); the others drain the ring and exit; wait for
     them (kill after the grace period);
  3. stop the supervisor (it reaps the workers and fails what any killed one held); close the
     completion ring; the completion thread drains and ends;
  4. fail whatever is still unanswered; close the descriptor and unmap.
"""

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.backends.base import Placement
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.lane import InlineLane
from lumenrt.engine.process_worker import (
    CANCELLED,
    FAILED,
    FROM_SUPERVISOR,
    OK,
    READY,
    STARTING,
    STATUS_COLS,
    SYNC,
    TIMED_OUT,
    WORKER_DIED,
    WorkerSpec,
    worker_main,
)
from lumenrt.engine.request import (
    Array,
    EngineError,
    InferRequest,
    InvalidInput,
    ModelNotReady,
    QueueFull,
    RequestCancelled,
    RequestTable,
    RequestTimeout,
    StageTimes,
    WorkerDied,
)
from lumenrt.engine.runtime import RuntimeOptions, _ring_capacity, admit, push_and_wait, refusal, try_push
from lumenrt.engine.slot_layout import (
    SlotTooSmall,
    header,
    read_error,
    read_tensors,
    slot_bytes_needed,
    write_inputs,
)
from lumenrt.engine.worker import WorkerStats
from lumenrt.native import (
    DESC_DTYPE,
    HOLD_DONE,
    HOLD_HEADER_BYTES,
    LATCH_STRIDE,
    Latches,
    Layout,
    PassedFd,
    Region,
    Ring,
    RingClosed,
    SlabPool,
    create_unnamed,
    hold_init,
    hold_required_bytes,
    latches_required_bytes,
    ring_required_bytes,
    slab_required_bytes,
)

ARENA_BUDGET_BYTES = 256 << 20  # per model; guessed: bounds shared memory for big-input models
SPAWN = multiprocessing.get_context("spawn")  # workers start clean: no inherited threads or locks
# Replacement backoff after a worker that died while loading: 0.1 s doubling to 5 s (guessed: a
# model that fails to load keeps failing; a transient failure, e.g. memory, clears in seconds).
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 5.0
START_TIMEOUT_S = 120.0  # a worker that has not loaded by then is killed and retried

log = logging.getLogger("lumenrt.engine")


class ProcessModelRuntime:
    def __init__(
        self,
        *,
        config: ModelConfig,
        version: int,
        model_path: Path,
        backend: Any,
        placements: list[Placement],
        options: RuntimeOptions,
    ) -> None:
        self.config, self.version, self.options = config, version, options
        self.model_id = 0
        self._model_path, self._placements = model_path, placements
        db = config.dynamic_batching
        self._max_queue = db.max_queue_size if db is not None else 1024
        max_rows = max(config.max_batch_size, 1)
        table_size = self._max_queue + 2 * max_rows * len(placements)
        slot_bytes = max(slot_bytes_needed(config, max_rows) or options.arena_slot_bytes, 4096)
        n_slots = max(1, min(table_size, options.arena_slots, ARENA_BUDGET_BYTES // slot_bytes))
        if ARENA_BUDGET_BYTES // slot_bytes < min(self._max_queue, options.arena_slots):
            log.warning(  # the size cap binds before the configured limits: said once at load
                "model %r (process mode): %d MiB of arena hold only %d requests of %d bytes "
                "(max_batch_size rows of every tensor); requests beyond get 503 'arena full'",
                config.name,
                ARENA_BUDGET_BYTES >> 20,
                n_slots,
                slot_bytes,
            )
        self._hold_capacity = 4 * max_rows + 16  # unfinished at once <= a batch + its carry-over
        hold_bytes = (hold_required_bytes(self._hold_capacity) + 63) & ~63
        n = len(placements)
        lay = Layout()
        ring_cap = _ring_capacity(self._max_queue)
        comp_cap = _ring_capacity(2 * table_size)
        offsets = {
            "requests": lay.add(ring_required_bytes(ring_cap)),
            "completions": lay.add(ring_required_bytes(comp_cap)),
            "holds": lay.add(hold_bytes * n),
            "cancel": lay.add(table_size),
            "status": lay.add(n * STATUS_COLS * 8),
            "latches": lay.add(latches_required_bytes(table_size)),
            "pool": lay.add(slab_required_bytes(slot_bytes, n_slots), align=4096),
        }
        self._region_bytes = lay.size_bytes
        self.region, self._fd = create_unnamed(lay.size_bytes, tag=f"model-{config.name}"[:60])
        self.ring = Ring.create(self.region, options.queue_type, ring_cap, offset=offsets["requests"])
        self._completions = Ring.create(self.region, "mpmc", comp_cap, offset=offsets["completions"])
        self._spin_ns = options.spin_us * 1000
        self._completions.spin_ns = 0  # this process's handle: the completion thread polls
        self._signal: list[int] = []  # completed by the completion thread, latches set at its next pop
        self.pool = SlabPool.create(self.region, slot_bytes, n_slots, offset=offsets["pool"])
        # sync callers' latches, set by the worker process itself (no completion-thread hop)
        self.table = RequestTable(
            table_size, Latches.create(self.region, table_size, offset=offsets["latches"], shared=True)
        )
        for i in range(n):
            hold_init(self.region, offsets["holds"] + i * hold_bytes, self._hold_capacity)
        self._cancel = np.ndarray(
            table_size, np.uint8, buffer=memoryview(self.region), offset=offsets["cancel"]
        )
        self._status = np.ndarray(
            (n, STATUS_COLS), np.int64, buffer=memoryview(self.region), offset=offsets["status"]
        )
        self._status[:] = 0
        self._holds = [
            np.ndarray(
                self._hold_capacity,
                DESC_DTYPE,
                buffer=memoryview(self.region),
                offset=offsets["holds"] + i * hold_bytes + HOLD_HEADER_BYTES,
            )
            for i in range(n)
        ]
        self._specs = [
            WorkerSpec(
                memory=PassedFd(self._fd),
                memory_bytes=self._region_bytes,
                parent_pid=os.getpid(),
                offsets=offsets,
                config=config,
                model_path=model_path,
                placement=p,
                index=i,
                n_workers=n,
                pin=options.pin,
                hold_capacity=self._hold_capacity,
                hold_bytes=hold_bytes,
                table_size=table_size,
                spin_ns=self._spin_ns,
            )
            for i, p in enumerate(placements)
        ]
        self._procs: list[Any] = [None] * n
        self._stop_r, self._stop_w = multiprocessing.Pipe(duplex=False)
        self._completer = threading.Thread(
            target=self._complete_loop, name=f"lumenrt-{config.name}-done", daemon=True
        )
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"lumenrt-{config.name}-supervisor", daemon=True
        )
        self._spawned = threading.Event()  # the supervisor started every worker (or failed to)
        self._spawn_error: BaseException | None = None
        self._started = False  # start() returned: deaths from now on are replaced
        self.lane = InlineLane(config, backend, model_path, options, placements, process_mode=True)
        self.closed = False
        self.stopping = False  # shutdown began: no worker is replaced any more
        self.rejected = 0
        # per-request statistics as thread mode keeps them, added up where answers are read: one
        # WorkerStats per reading thread (the completion thread, synchronous callers), so each has
        # one writer; ``_rows_seen``: request rows by the size of the batch they ran in
        self._reader_stats: dict[int, tuple[WorkerStats, dict[int, int]]] = {}
        self.worker_deaths = 0
        self.replacement_failures = 0

    # ---- lifecycle --------------------------------------------------------------------------

    def _spawn(self, i: int) -> None:
        """Supervisor thread only (the workers' parent-death signal follows the spawning thread)."""
        self._status[i, :2] = (0, STARTING)
        proc = SPAWN.Process(
            target=worker_main, args=(self._specs[i],), name=f"lumenrt-{self.config.name}-w{i}", daemon=True
        )
        proc.start()
        self._procs[i] = proc

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the workers and wait until every one has loaded its model."""
        self._completer.start()
        self._supervisor.start()
        try:
            self._spawned.wait()
            if self._spawn_error is not None:
                raise EngineError(
                    f"model {self.config.name!r}: could not start its workers: {self._spawn_error}"
                ) from self._spawn_error
            deadline = time.monotonic() + timeout_s
            while not all(self._status[i, 1] == READY for i in range(len(self._specs))):
                for i, p in enumerate(self._procs):
                    if p.exitcode is not None or not p.is_alive():
                        raise EngineError(
                            f"model {self.config.name!r}: worker {i} exited while loading "
                            f"(exit code {p.exitcode}); see its error above"
                        )
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"model {self.config.name!r}: workers did not load within {timeout_s} s"
                    )
                time.sleep(0.005)
            self.lane.open()  # in this process: small models answer without a worker (lane.py)
        except BaseException:
            self.close()
            raise
        self._started = True

    @property
    def ready(self) -> bool:
        status = self._status
        return (
            not self.closed
            and status is not None
            and all(p is not None and p.is_alive() for p in self._procs)
            and bool(np.all(status[:, 1] == READY))
        )

    def begin_shutdown(self) -> None:
        """Shutdown began: workers that die from now on are not replaced (what they held still
        fails at once)."""
        self.stopping = True

    def close(self, timeout_s: float = 30) -> None:
        if self.closed:
            return
        self.stopping = self.closed = True
        self.ring.close()
        for i, p in enumerate(self._procs):  # still loading: it holds no request, and would only
            if p is not None and p.pid is not None and self._status[i, 1] == STARTING:  # see the
                p.kill()  # closed ring once its model has loaded
        self._wait_workers(timeout_s)
        for p in self._procs:
            if p is not None and p.pid is not None and not multiprocessing.connection.wait([p.sentinel], 0):
                p.kill()  # a signal only: the supervisor reaps it and fails what it held
        self._wait_workers(5)
        self._stop_w.send(b"x")
        if self._supervisor.is_alive():
            self._supervisor.join(15)
        self._completions.close()
        if self._completer.is_alive():
            self._completer.join(10)
        self._fail_unfinished()
        self.lane.close()
        self._cancel = self._status = None  # type: ignore[assignment]
        self._holds = []
        del self.ring, self._completions, self.pool
        self.table.latches = Latches.create(
            Region.anonymous(len(self.table.latches) * LATCH_STRIDE), len(self.table.latches)
        )
        self.region.close()
        os.close(self._fd)
        self._stop_r.close()
        self._stop_w.close()

    def _wait_workers(self, timeout_s: float) -> None:
        """Until every started worker has exited or ``timeout_s`` passed (sentinels only: the
        supervisor reaps)."""
        deadline = time.monotonic() + timeout_s
        pending = {p.sentinel for p in self._procs if p is not None and p.pid is not None}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for s in multiprocessing.connection.wait(list(pending), left):
                pending.discard(s)

    def _fail_unfinished(self) -> None:
        for req in self.table.records:
            answered = req.on_done is None and self.table.latches.is_set(req.index)
            if req.generation and not req.finished and req.times.enqueued_ns and not answered:
                req.finished = True
                req.error = ModelNotReady(f"model {self.config.name!r} unloaded before the request ran")
                self.table.complete_now(req)

    # ---- requests -------------------------------------------------------------------------

    def submit(
        self,
        inputs: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        on_done: Callable[[InferRequest], None] | None = None,
    ) -> InferRequest:
        """Queue the request without waiting: ``on_done`` runs in the completion thread (None: the
        record's latch is set)."""
        req = self._prepare(inputs, timeout_s, on_done)
        try_push(self, req, slot=req.slot, aux0=req.rows, aux1=req.generation, aux2=req.deadline_ns)
        return req

    def run(self, inputs: Mapping[str, Any], *, timeout_s: float | None = None) -> InferRequest:
        """Synchronous: queue and wait in this thread with the GIL released (see ModelRuntime.run)."""
        req = self._prepare(inputs, timeout_s, None)
        push_and_wait(
            self, req, slot=req.slot, aux0=req.rows, aux1=req.generation, aux2=req.deadline_ns, kind=SYNC
        )
        if not req.finished:  # the worker set the latch itself: read the answer from the slot
            req.finished = True
            slot_view = self.pool.view(req.slot)
            code = int(header(slot_view)["status"])
            del slot_view
            self._read_result(req, code, from_supervisor=False)
        return req

    def run_inline(
        self, inputs: Mapping[str, Any], times: StageTimes | None = None, timeout_s: float | None = None
    ) -> dict[str, Array] | None:
        """The outputs, computed in this thread now, or None: submit it (engine/lane.py)."""
        ring = None if self.closed else getattr(self, "ring", None)  # gone once closed
        if ring is None:
            return None
        return self.lane.run(inputs, len(ring), times, timeout_s)

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
        slot = self.pool.try_alloc()
        if slot is None:
            self.table.release(req)
            self.rejected += 1
            raise QueueFull(
                f"model {self.config.name!r}: arena full: all {self.pool.n_slots} slots in use (one per "
                f"request in flight, {self.pool.slot_bytes} bytes each: max_batch_size rows of every "
                f"tensor; the arena is capped at {ARENA_BUDGET_BYTES >> 20} MiB per model)"
            )
        try:
            write_inputs(self.pool.view(slot), arrays)  # the one copy
        except SlotTooSmall as e:
            self.pool.free(slot)
            self.table.release(req)
            raise InvalidInput(f"model {self.config.name!r}: {e}") from None
        req.generation += 1
        req.slot = slot
        req.on_done = on_done
        self._cancel[req.index] = 0
        req.times.enqueued_ns = time.monotonic_ns()
        return req

    def _refuse(self, req: InferRequest, refused: str | None = None) -> None:
        self.pool.free(req.slot)
        req.slot = -1
        self.release(req)
        self.rejected += 1
        raise refusal(self.config, self.closed, self._max_queue, refused)

    def cancel(self, req: InferRequest) -> None:
        req.cancelled = True
        self._cancel[req.index] = 1

    def release(self, req: InferRequest) -> None:
        req.generation += 1  # a late notice for the old use can no longer match the record
        self.table.release(req)

    # ---- completion and supervision (threads) ----------------------------------------------

    def _complete_loop(self) -> None:
        records, latches, signal = self.table.records, self.table.latches, self._signal
        try:
            while True:
                try:  # sets the latches of what the last round completed, GIL released
                    items = self._completions.pop_many(64, latches=latches, signal=signal)
                except RingClosed:
                    return
                for item in items:
                    req = records[item.request_id]
                    if req.generation != item.aux1 or req.finished:
                        continue  # a duplicate (worker pushed, then died before marking its hold)
                    if req.on_done is None and latches.is_set(req.index):
                        continue  # a sync request the worker answered itself before it died
                    req.finished = True
                    self._read_result(req, item.aux0, item.kind == FROM_SUPERVISOR)
                    self.table.complete(req, signal)
        finally:
            for index in signal:
                latches.set(index)
            signal.clear()

    def _read_result(self, req: InferRequest, code: int, from_supervisor: bool) -> None:
        """Outputs or error out of the slot into the request; frees the slot."""
        slot_view = self.pool.view(req.slot)
        t = req.times
        if not from_supervisor:
            h = header(slot_view)
            t.dequeued_ns = int(h["dequeued_ns"])
            t.batch_formed_ns = t.compute_start_ns = int(h["compute_start_ns"])
            t.compute_end_ns = int(h["compute_end_ns"])
            t.batch_size = int(h["batch_rows"])
            self._count(req, code)
        if code == OK:
            req.outputs = {k: v.copy() for k, v in read_tensors(slot_view, self.config, outputs=True).items()}
        elif code == TIMED_OUT:
            waited_us = (t.dequeued_ns - t.enqueued_ns) // 1000
            req.error = RequestTimeout(f"request timed out after {waited_us} us in the queue; not run")
        elif code == CANCELLED:
            req.error = RequestCancelled("request cancelled before it ran")
        elif code == FAILED:
            req.error = EngineError(read_error(slot_view))
        else:
            req.error = WorkerDied(
                f"model {self.config.name!r}: the worker running this request died; it was not answered"
            )
        del slot_view
        self.pool.free(req.slot)
        req.slot = -1
        t.completed_ns = time.monotonic_ns()

    def _count(self, req: InferRequest, code: int) -> None:
        """This reading thread's statistics for one answer from a worker (see ``__init__``)."""
        mine = self._reader_stats.get(threading.get_ident())
        if mine is None:
            mine = self._reader_stats.setdefault(threading.get_ident(), (WorkerStats(), {}))
        stats, rows_seen = mine
        t = req.times
        if code == TIMED_OUT:
            stats.expired += 1
        elif code == CANCELLED:
            stats.cancelled += 1
        elif code == FAILED:
            stats.failures += 1
        elif code == OK:
            stats.queue_ns += t.dequeued_ns - t.enqueued_ns
            stats.input_ns += t.compute_start_ns - t.dequeued_ns
            stats.infer_ns += t.compute_end_ns - t.compute_start_ns
            stats.output_ns += time.monotonic_ns() - t.compute_end_ns
            rows_seen[t.batch_size] = rows_seen.get(t.batch_size, 0) + req.rows

    def _supervise(self) -> None:
        """The supervisor thread (see the top): spawns, watches, fails, replaces, reaps."""
        try:
            for i in range(len(self._specs)):
                self._spawn(i)
        except BaseException as e:
            self._spawn_error = e
        finally:
            self._spawned.set()
        failures = [0] * len(self._specs)  # deaths while loading in a row, per worker
        retry_at: dict[int, float] = {}  # worker -> when to start its replacement
        dead: set[int] = set()  # reported dead, not (yet) replaced
        while True:
            try:
                sentinels = {
                    p.sentinel: i
                    for i, p in enumerate(self._procs)
                    if p is not None and p.pid is not None and i not in dead
                }
                timeout = max(0.0, min(retry_at.values()) - time.monotonic()) if retry_at else None
                ready = multiprocessing.connection.wait([*sentinels, self._stop_r], timeout)
                if self._stop_r in ready:
                    break
                for s in ready:
                    i = sentinels[s]
                    loaded = self._status[i, 1] == READY
                    self._procs[i].join(1)
                    dead.add(i)
                    self._report_death(i)
                    # during start() only a worker that had loaded is replaced: one that died
                    # loading is start()'s to report
                    if not self.stopping and (self._started or loaded):
                        failures[i] = 0 if loaded else failures[i] + 1
                        delay = 0.0 if loaded else min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (failures[i] - 1))
                        if not loaded:
                            self.replacement_failures += 1
                            log.warning(
                                "model %r: replacement worker %d exited while loading (exit code %s); "
                                "retrying in %.1f s",
                                self.config.name,
                                i,
                                self._procs[i].exitcode,
                                delay,
                            )
                        retry_at[i] = time.monotonic() + delay
                now = time.monotonic()
                for i in [i for i, at in retry_at.items() if at <= now]:
                    del retry_at[i]
                    if self.stopping:
                        continue
                    try:
                        self._spawn(i)
                        dead.discard(i)
                    except Exception as e:  # e.g. out of memory or processes: try again later
                        failures[i] += 1
                        self.replacement_failures += 1
                        retry_at[i] = time.monotonic() + min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** failures[i])
                        log.warning(
                            "model %r: could not start worker %d: %s; retrying", self.config.name, i, e
                        )
                if self.stopping:
                    retry_at.clear()
            except Exception:  # never dies (invariant 3): report and go on
                log.exception("model %r: supervisor error (continuing)", self.config.name)
                time.sleep(0.1)
        for i, p in enumerate(self._procs):  # close() has ended them: reap, fail what they held
            if p is not None and p.pid is not None and i not in dead:
                p.join(5)
                if p.exitcode is not None and self._holds:
                    self._report_death(i)

    def _report_death(self, i: int) -> None:
        """Worker i is gone: fail what it held (WORKER_DIED notices to the completion thread)."""
        if not self.closed:
            self.worker_deaths += 1
        notices = {(int(item.request_id), int(item.aux1)) for item in self.ring.recover()}
        hold = self._holds[i]
        for entry in hold[hold["request_id"] != HOLD_DONE]:
            notices.add((int(entry["request_id"]), int(entry["aux1"])))
        for index, generation in notices:
            self._completions.push(index, aux0=WORKER_DIED, aux1=generation, kind=FROM_SUPERVISOR)
        self._completions.recover()
        hold["request_id"] = HOLD_DONE

    # ---- statistics -----------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        """The keys and meanings of thread mode's ``ModelRuntime.statistics``, plus the workers'
        deaths, replacement failures and pids."""
        total = WorkerStats()
        rows_seen: dict[int, int] = {}
        for stats, seen in list(self._reader_stats.values()):
            total.add(stats)  # requests and batches: none, the workers count those (status)
            for size, rows in list(seen.items()):
                rows_seen[size] = rows_seen.get(size, 0) + rows
        status = self._status
        total.requests = int(status[:, 2].sum()) if status is not None else 0
        total.batches = int(status[:, 3].sum()) if status is not None else 0
        total.batch_rows = {size: rows // size for size, rows in rows_seen.items() if size > 0}
        total.add(self.lane.stats)  # requests answered inline count like any other (lane.py)
        return {
            "name": self.config.name,
            "version": self.version,
            "ready": self.ready,
            "workers": len(self._specs),
            "worker_mode": "process",
            "queue_type": self.options.queue_type,
            "allocator_type": "lumen_arena",
            "requests": total.requests,
            "batches": total.batches,
            "failures": total.failures,
            "expired": total.expired,
            "cancelled": total.cancelled,
            "arena_fallbacks": 0,  # process mode has no fallback: every request lives in a slot
            "queue_ns": total.queue_ns,
            "input_ns": total.input_ns,
            "infer_ns": total.infer_ns,
            "output_ns": total.output_ns,
            "batch_rows": dict(sorted(total.batch_rows.items())),
            "lane": self.lane.describe(),
            "rejected": self.rejected,
            "worker_deaths": self.worker_deaths,
            "replacement_failures": self.replacement_failures,
            "arena": self.pool.stats() if not self.closed else None,
            "ring": self.ring.stats() if not self.closed else None,
            "pids": [int(p.pid) if p is not None and p.pid else 0 for p in self._procs],
        }
