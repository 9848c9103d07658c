"""The process pool: a model's workers as processes over the model's shared region.

The runtime's region is an unnamed memfd here (runtime.py), handed to each worker at spawn. The
pool adds to it the completion ring and its notifier, one hold per worker, a cancel flag per
request record and a status table. How answers come back:
  - synchronous requests: the worker writes the answer and its status into the slot and sets the
    caller's latch; the caller reads the answer in its own thread (``collect``);
  - asynchronous requests: the worker writes the answer into the slot, pushes a completion
    descriptor and notifies (an eventfd write only while the consumer sleeps). The consumer is
    the engine's event loop (``attach``): its reader drains the ring (``drain``), reads each
    answer out of its slot and resolves its caller on the spot, ignoring duplicate notices
    (generation + finished flag). No thread of the pool's own sits between worker and loop.
The supervisor thread spawns every worker, so their parent-death signal (SIGKILL) is tied to a
thread that outlives them; when a worker dies it fails what the worker held (its hold, and any
claim the ring recovers): a synchronous request directly (error, then its latch), an
asynchronous one by a WORKER_DIED notice to the completion ring; unless shutdown began it starts
a replacement, retrying with backoff while replacements fail.

Invariants (beside runtime.py's)
  1. Every request a worker took is answered exactly once: by the worker (a result or a clear
     error), by the supervisor when the worker dies (WorkerDied), or by ``close`` when the runtime
     ends before it ran (ModelNotReady).
  2. The pool is ready only while every worker is alive and has loaded.
  3. The supervisor never dies: an error while replacing is reported and retried with backoff.
  4. No replacement starts once ``stopping`` is set (shutdown began); dead workers' requests are
     still failed.
  5. Only the supervisor reaps worker processes; ``close`` waits on their sentinels and kills.
  6. The completion ring has one consumer at a time: the attached event loop (its reader, its
     inline poll, its deadline timer: all in the loop's thread), and after ``close`` detached it,
     the thread closing the pool. Answers drained on the loop are resolved through ``answer``;
     anywhere else through the request's ``on_done`` (safe from any thread).

Shutdown order (the runtime has set closed and stopping, and closed the request ring)
  1. kill workers still loading (they hold nothing); the others drain the ring and exit; wait for
     them (kill after the grace period);
  2. stop the supervisor (it reaps the workers and fails what any killed one held);
  3. detach the loop: in its own thread it drains the completion ring a last time and removes its
     reader (``_detach``); what is left is drained by the closing thread;
  4. fail whatever is still unanswered; then (``release_memory``) unmap the region and close its
     descriptor.
"""

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lumenrt.backends.base import Backend, Placement
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.descriptors import (
    CANCELLED,
    FAILED,
    FROM_SUPERVISOR,
    OK,
    TIMED_OUT,
    WORKER_DIED,
    completion_code,
    completion_generation,
    completion_source,
    push_completion,
    ring_capacity,
)
from lumenrt.engine.execute import CANCELLED_MESSAGE, timed_out_message
from lumenrt.engine.histograms import DURATION_BOUNDS_NS
from lumenrt.engine.process_worker import READY, STARTING, STATUS_COLS, WorkerSpec, worker_main
from lumenrt.engine.request import (
    EngineError,
    InferRequest,
    ModelNotReady,
    RequestCancelled,
    RequestTimeout,
    WorkerDied,
)
from lumenrt.engine.slot_layout import read_answer, read_error, read_tensors
from lumenrt.engine.worker import WorkerStats
from lumenrt.native import (
    DESC_DTYPE,
    HOLD_DONE,
    HOLD_HEADER_BYTES,
    NOTIFIER_BYTES,
    Latches,
    Layout,
    Notifier,
    PassedFd,
    Region,
    Ring,
    agent_table,
    create_unnamed,
    hold_init,
    hold_required_bytes,
    latches_required_bytes,
    ring_required_bytes,
)

if TYPE_CHECKING:
    from lumenrt.engine.runtime import ModelRuntime

SPAWN = multiprocessing.get_context("spawn")  # workers start clean: no inherited threads or locks
# Replacement backoff after a worker that died while loading: 0.1 s doubling to 5 s (guessed: a
# model that fails to load keeps failing; a transient failure, e.g. memory, clears in seconds).
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 5.0
# release_memory: how long the region may still be in use by a read that was under way when its
# slots were revoked (one socket read; guessed ample)
UNMAP_WAIT_S = 2.0
START_TIMEOUT_S = 120.0  # a worker that has not loaded by then is killed and retried
# close: how long the attached event loop may take to drain the completion ring a last time and
# let go of it (guessed: one loop turn is well under a second; the loop awaits close meanwhile)
DETACH_WAIT_S = 10.0

log = logging.getLogger("lumenrt.engine")


# The completion ring's agent table (native/include/lrt/ring.h): its threads are the worker
# processes (one thread each pushes), the supervisor (notices) and the consumer (the event loop,
# then the closing thread), plus replacements started before a dead worker's entry is freed (a
# registration that finds the table full frees the entries of dead processes first). The runtime
# refuses a model whose workers outgrow any table (runtime.ring_agents) before this is sized.
COMPLETION_OTHER_AGENTS = 8


def _completion_agents(n_workers: int) -> int:
    return agent_table(n_workers + COMPLETION_OTHER_AGENTS)


def _hold_capacity(config: ModelConfig) -> int:
    return 4 * max(config.max_batch_size, 1) + 16  # unfinished at once <= a batch + its carry-over


def _hold_bytes(config: ModelConfig) -> int:
    return (hold_required_bytes(_hold_capacity(config)) + 63) & ~63


class ProcessPool:
    @staticmethod
    def add_sections(lay: Layout, config: ModelConfig, table_size: int, n_workers: int) -> None:
        """The completion ring and its notifier, the holds, the cancel flags and the status table."""
        lay.add(
            ring_required_bytes(ring_capacity(2 * table_size), _completion_agents(n_workers)),
            name="completions",
        )
        lay.add(NOTIFIER_BYTES, name="notifier")
        lay.add(_hold_bytes(config) * n_workers, name="holds")
        lay.add(table_size, name="cancel")
        lay.add(n_workers * STATUS_COLS * 8, name="status")

    @staticmethod
    def create_region(size_bytes: int, model_name: str) -> tuple[Region, int]:
        """A memfd the workers receive at spawn (nothing in /dev/shm to unlink)."""
        return create_unnamed(size_bytes, tag=f"model-{model_name}"[:60])

    def __init__(
        self, runtime: "ModelRuntime", *, backend: Backend, model_path: Path, placements: list[Placement]
    ) -> None:
        self._rt = runtime
        config = runtime.config
        self.config = config
        region, offsets = runtime.region, runtime._offsets
        n = self.size = len(placements)
        table_size = len(runtime.table.records)
        hold_capacity, hold_bytes = _hold_capacity(config), _hold_bytes(config)
        self._completions = Ring.create(
            region,
            "mpmc",
            ring_capacity(2 * table_size),
            offset=offsets["completions"],
            max_agents=_completion_agents(n),
        )
        # this process's handle: the event loop pops (the closing thread once it let go, invariant
        # 6), and only its inline poll waits (spinning through the whole window, never sleeping)
        self._completions.spin_ns = runtime.options.spin_us * 1000
        # wakes the consumer's loop when a worker or the supervisor pushes while it sleeps; the
        # workers get its eventfd at spawn
        self.notifier: Notifier | None = Notifier.create(region, offset=offsets["notifier"])
        # the consumer (invariant 6): the loop whose reader drains the ring, and how it resolves
        self._loop: asyncio.AbstractEventLoop | None = None
        self._answer: Callable[[int, int], None] | None = None  # (model id, request index)
        self._closing = False  # close began: no loop attaches any more
        self._detach_lock = threading.Lock()  # close's hand-over only, never per request
        self._kept = False  # a loop that never let go keeps the region (release_memory)
        for i in range(n):
            hold_init(region, offsets["holds"] + i * hold_bytes, hold_capacity)
        self._cancel = np.ndarray(table_size, np.uint8, buffer=memoryview(region), offset=offsets["cancel"])
        self._status = np.ndarray(
            (n, STATUS_COLS), np.int64, buffer=memoryview(region), offset=offsets["status"]
        )
        self._status[:] = 0
        self._holds = [
            np.ndarray(
                hold_capacity,
                DESC_DTYPE,
                buffer=memoryview(region),
                offset=offsets["holds"] + i * hold_bytes + HOLD_HEADER_BYTES,
            )
            for i in range(n)
        ]
        self._specs = [
            WorkerSpec(
                memory=PassedFd(runtime._fd),
                notifier=PassedFd(self.notifier.fileno()),
                memory_bytes=len(memoryview(region)),
                parent_pid=os.getpid(),
                offsets=offsets,
                config=config,
                model_path=model_path,
                placement=p,
                index=i,
                n_workers=n,
                pin=runtime.options.pin,
                hold_capacity=hold_capacity,
                hold_bytes=hold_bytes,
                table_size=table_size,
                spin_ns=runtime.options.spin_us * 1000,
                adaptive=runtime.options.batching == "adaptive",
            )
            for i, p in enumerate(placements)
        ]
        self._procs: list[Any] = [None] * n
        self._stop_r, self._stop_w = multiprocessing.Pipe(duplex=False)
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"lumenrt-{config.name}-supervisor", daemon=True
        )
        self._spawned = threading.Event()  # the supervisor started every worker (or failed to)
        self._spawn_error: BaseException | None = None
        self._started = False  # start() returned: deaths from now on are replaced
        self.stopping = False  # shutdown began: no worker is replaced any more
        # per-request statistics as the thread pool keeps them, added up where answers are read:
        # one WorkerStats per reading thread (the event loop, synchronous callers), so each
        # has one writer; with it, request rows by the size of the batch they ran in
        self._reader_stats: dict[int, tuple[WorkerStats, dict[int, int]]] = {}
        self.worker_deaths = 0
        self.replacement_failures = 0

    # ---- lifecycle --------------------------------------------------------------------------

    def _spawn(self, i: int) -> None:
        """Supervisor thread only (the workers' parent-death signal follows the spawning thread).
        A pinned worker is born on its CPUs: this thread takes the worker's affinity around the
        start, so that the threads the child starts before it pins itself (numpy's OpenBLAS pool,
        at import) are placed too, then gets its own back."""
        self._status[i, :2] = (0, STARTING)
        spec = self._specs[i]
        proc = SPAWN.Process(
            target=worker_main, args=(spec,), name=f"lumenrt-{self.config.name}-w{i}", daemon=True
        )
        own = os.sched_getaffinity(0) if spec.pin and spec.placement.cores else None
        try:
            if own is not None:
                os.sched_setaffinity(0, spec.placement.cores)  # this thread only (Linux)
            proc.start()
        finally:
            if own is not None:
                os.sched_setaffinity(0, own)
        self._procs[i] = proc

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the workers and wait until every one has loaded its model."""
        self._supervisor.start()
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
                raise TimeoutError(f"model {self.config.name!r}: workers did not load within {timeout_s} s")
            time.sleep(0.005)
        self._started = True

    @property
    def ready(self) -> bool:
        status = self._status
        return (
            status is not None
            and all(p is not None and p.is_alive() for p in self._procs)
            and bool(np.all(status[:, 1] == READY))
        )

    def stop(self) -> None:
        """Shutdown began: workers that die from now on are not replaced (what they held still
        fails at once)."""
        self.stopping = True

    def close(self, timeout_s: float) -> None:
        """Steps 1-4 of the shutdown order (see the top); the request ring is closed."""
        self._closing = True
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
        self._detach()
        self._drain(self._complete_anywhere)  # left after the loop let go, or with no loop
        self._fail_unfinished()

    def release_memory(self) -> None:
        """Unmap the region and close its descriptor. Latches move to private memory, all set, so
        a late waiter returns at once; the arena goes (a later release frees no slot)."""
        rt = self._rt
        if self._kept:
            log.error(
                "model %r: its event loop never let go of the completion ring: the region stays mapped",
                self.config.name,
            )
            return
        self.notifier = None  # closes its eventfd and lets go of the region
        for req in rt.table.records:  # views of arena slots, in records a caller still holds
            req.inputs = {}
        self._cancel = self._status = None  # type: ignore[assignment]
        self._holds = []
        rt.arena = None
        records = len(rt.table.records)
        latches = Latches.create(Region.anonymous(latches_required_bytes(records)), records)
        for index in range(records):  # every request is answered by now (close)
            latches.set(index)
        rt.table.latches = latches
        del self._completions
        del rt.ring
        rt.level_rings, rt.doorbell = [], None  # the rings live in the region too
        deadline = time.monotonic() + UNMAP_WAIT_S
        while True:
            try:
                rt.region.close()
                break
            except BufferError:  # a read into a revoked slot may still be under way (a front end's
                if time.monotonic() > deadline:  # transport holds its view for the one read):
                    raise  # ... or a view was kept for good, which is a bug to report
                time.sleep(0.001)
        os.close(rt._fd)
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
        """Answer what is still unanswered (the workers have ended): a synchronous request a worker
        answered is read out of its slot now, while the slot is still there (its caller may wait
        for it later, ``ModelRuntime.wait``); any other gets ModelNotReady."""
        table = self._rt.table
        for req in table.records:
            if not req.generation or req.finished or not req.times.enqueued_ns:
                continue
            if req.on_done is None and table.latches.is_set(req.index):
                self.collect(req)
            else:
                req.finished = True
                req.error = ModelNotReady(f"model {self.config.name!r} unloaded before the request ran")
                table.complete_now(req)

    # ---- requests ---------------------------------------------------------------------------

    def admitted(self, req: InferRequest) -> None:
        self._cancel[req.index] = 0

    def collect(self, req: InferRequest) -> None:
        """A synchronous request whose latch is set: if the worker answered it itself (not the
        supervisor, which fails what a dead worker held), read the answer from its slot."""
        if req.finished:
            return
        req.finished = True
        self._read_result(req, -1, from_supervisor=False)

    def cancel(self, req: InferRequest) -> None:
        cancel = self._cancel
        if cancel is not None:
            cancel[req.index] = 1

    # ---- asynchronous answers: the consumer (invariant 6) ----------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop, answer: Callable[[int, int], None]) -> None:
        """Event loop thread: from now on that loop drains the completion ring (its reader on the
        notifier) and resolves each answer with ``answer(model id, request index)``. Attaching
        to another loop moves the reader; a pool that is closing stays as it is."""
        notifier = self.notifier
        if self._closing or notifier is None or self._loop is loop:
            return
        old = self._loop
        if old is not None and not old.is_closed():
            old.remove_reader(notifier.fileno())
        self._loop, self._answer = loop, answer
        loop.add_reader(notifier.fileno(), self.drain)
        self.drain()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop that drains the completion ring now (None: none, or close took over)."""
        return self._loop

    def drain(self) -> None:
        """The loop's reader: answer everything in the completion ring, then arm the notifier
        (re-checking the ring after arming: see notifier.h)."""
        if self._loop is None:  # detached (close drains what is left), or released: touch nothing
            return
        notifier, ring = self.notifier, self._completions
        assert notifier is not None
        notifier.drain()
        self._drain(self._resolve_here)
        self._arm(notifier, ring)

    def _arm(self, notifier: Notifier, ring: Ring) -> None:
        """Arm the notifier, re-checking the ring after arming (see notifier.h)."""
        while True:
            notifier.arm()
            # a cell a worker claimed but has not published yet counts in len() and pops nothing:
            # that worker notifies once it has published (armed now), or dies there and the
            # supervisor recovers the cell and notifies; either wakes this reader again
            if len(ring) == 0 or not self._drain(self._resolve_here):
                return

    def poll(self, timeout_s: float) -> None:
        """The loop's inline completion (engine.py): wait up to ``timeout_s`` for an answer,
        spinning with the GIL released, and resolve what arrived. The notifier is disarmed
        meanwhile, as in engine.py's poll: the worker that answers makes no system call."""
        notifier, ring = self.notifier, self._completions
        if self._loop is None or notifier is None:
            return
        rearm = notifier.disarm()  # False: a wake-up is pending, and the reader re-arms
        try:
            for item in ring.pop_many(256, timeout_s=timeout_s):
                self._take(item, self._resolve_here)
        finally:
            if rearm and self._loop is not None:  # detached meanwhile: close drains the rest
                self._arm(notifier, ring)

    def _drain(self, resolve: Callable[[InferRequest], None]) -> int:
        """Answer what the ring holds now; how many notices were taken."""
        ring, taken = self._completions, 0
        while True:
            items = ring.pop_many(256, timeout_s=0)
            if not items:
                return taken
            taken += len(items)
            for item in items:
                self._take(item, resolve)

    def _take(self, item: Any, resolve: Callable[[InferRequest], None]) -> None:
        """One notice: its answer read and resolved. An answer that fails (its caller's callback
        raised) is logged, so the notices taken with it still reach their callers."""
        req = self._rt.table.records[item.request_id]
        if req.generation != completion_generation(item) or req.finished:
            return  # a duplicate (the worker pushed, then died before marking its hold)
        req.finished = True
        try:
            self._read_result(req, completion_code(item), completion_source(item) == FROM_SUPERVISOR)
            resolve(req)
        except Exception:
            log.exception("model %r: answering a request failed", self.config.name)

    def _resolve_here(self, req: InferRequest) -> None:  # the attached loop's thread
        answer = self._answer
        assert answer is not None
        answer(req.model_id, req.index)

    def _complete_anywhere(self, req: InferRequest) -> None:  # any thread: through on_done
        self._rt.table.complete_now(req)

    def _detach(self) -> None:
        """Step 3 of the shutdown order: the attached loop drains the ring a last time in its
        own thread and removes its reader; after that nothing else reads the ring but the
        closing thread. A loop that does not answer within DETACH_WAIT_S keeps the region."""
        loop, notifier = self._loop, self.notifier
        if loop is None or notifier is None:
            return
        if loop.is_closed():  # its callers are gone: the closing thread drains (through on_done)
            self._loop = None
            return
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here or not loop.is_running():
            self._let_go(loop, notifier)
            return
        done = threading.Event()

        def last() -> None:  # the loop's thread
            with self._detach_lock:
                if self._loop is loop:  # not given up on by a close that stopped waiting
                    self._let_go(loop, notifier)
                elif not loop.is_closed():  # given up on: the reader goes all the same (the
                    loop.remove_reader(notifier.fileno())  # region and eventfd stay: _kept)
            done.set()

        try:
            loop.call_soon_threadsafe(last)
        except RuntimeError:  # closed meanwhile: nothing runs on it any more
            self._loop = None
            return
        if not done.wait(DETACH_WAIT_S):
            with self._detach_lock:
                if self._loop is loop:
                    self._loop, self._kept = None, True

    def _let_go(self, loop: asyncio.AbstractEventLoop, notifier: Notifier) -> None:
        try:
            self.drain()
        finally:
            if not loop.is_closed():
                loop.remove_reader(notifier.fileno())
            self._loop = None

    # ---- reading answers ---------------------------------------------------------------------

    def _read_result(self, req: InferRequest, code: int, from_supervisor: bool) -> None:
        """Outputs or error out of the slot into the request (the slot is freed at release).
        ``code`` -1: the one the worker wrote in the slot (a synchronous request's)."""
        arena = self._rt.arena
        assert arena is not None
        slot_view = arena.view(req.slot)
        t = req.times
        if not from_supervisor:
            status, t.dequeued_ns, t.compute_start_ns, t.compute_end_ns, t.batch_size = read_answer(slot_view)
            t.batch_formed_ns = t.compute_start_ns
            if code < 0:
                code = status
            self._count(req, code)
        elif code == WORKER_DIED:  # failed for its worker's death: a failure, as in the thread pool
            self._count(req, code)
        if code == OK:
            req.outputs = {k: v.copy() for k, v in read_tensors(slot_view, self.config, outputs=True).items()}
        elif code == TIMED_OUT:
            req.error = RequestTimeout(timed_out_message(t.dequeued_ns - t.enqueued_ns))
        elif code == CANCELLED:
            req.error = RequestCancelled(CANCELLED_MESSAGE)
        elif code == FAILED:
            req.error = EngineError(read_error(slot_view))
        else:
            req.error = WorkerDied(
                f"model {self.config.name!r}: the worker running this request died; it was not answered"
            )
        del slot_view
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
        elif code in (FAILED, WORKER_DIED):
            stats.failures += 1
        elif code == OK:
            queue_ns = t.dequeued_ns - t.enqueued_ns
            input_ns = t.compute_start_ns - t.dequeued_ns
            infer_ns = t.compute_end_ns - t.compute_start_ns
            output_ns = time.monotonic_ns() - t.compute_end_ns
            stats.queue_ns += queue_ns
            stats.input_ns += input_ns
            stats.infer_ns += infer_ns
            stats.output_ns += output_ns
            stats.queue_buckets[bisect_left(DURATION_BOUNDS_NS, queue_ns)] += 1
            stats.compute_buckets[bisect_left(DURATION_BOUNDS_NS, infer_ns)] += 1
            rows_seen[t.batch_size] = rows_seen.get(t.batch_size, 0) + req.rows
            # per batch size, weighted by the request's share of its batch (statistics divides)
            batch = stats.batch_ns.get(t.batch_size)
            if batch is None:
                batch = stats.batch_ns[t.batch_size] = [0, 0, 0]
            batch[0] += input_ns * req.rows
            batch[1] += infer_ns * req.rows
            batch[2] += output_ns * req.rows

    # ---- supervision (a thread) -------------------------------------------------------------

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
        """Worker i is gone: fail what it held. A synchronous request here and now (its error,
        then its latch, unless the worker had set it); an asynchronous one by a WORKER_DIED
        notice to the consumer of the completion ring."""
        if not self._rt.closed:  # a death while shutting down is the shutdown's
            self.worker_deaths += 1
        notices = {(int(item.request_id), int(item.slot), int(item.aux1)) for item in self._rt.ring.recover()}
        hold = self._holds[i]
        for entry in hold[hold["request_id"] != HOLD_DONE]:
            notices.add((int(entry["request_id"]), int(entry["slot"]), int(entry["aux1"])))
        table = self._rt.table
        for index, slot, generation in notices:
            req = table.records[index]
            if req.generation != generation or req.finished:
                continue
            if req.on_done is None:  # synchronous: its caller waits on the latch, nobody else reads
                if not table.latches.is_set(index):  # (set: the worker answered, then died)
                    req.finished = True
                    self._read_result(req, WORKER_DIED, from_supervisor=True)
                    table.latches.set(index)
            else:
                push_completion(self._completions, index, slot, WORKER_DIED, generation, FROM_SUPERVISOR)
        self._completions.recover()
        hold["request_id"] = HOLD_DONE
        notifier = self.notifier
        if notifier is not None:
            notifier.notify()

    # ---- statistics -------------------------------------------------------------------------

    def tasks(self) -> list[tuple[int, int]]:
        """(pid, thread id) of each worker process's main thread (the one that runs the model);
        0 where none runs."""
        pids = [int(p.pid) if p is not None and p.pid and p.is_alive() else 0 for p in self._procs]
        return [(pid, pid) for pid in pids]

    def statistics(self, total: WorkerStats) -> dict[str, Any]:
        """Per-request figures from the reading threads; requests and batches from the workers'
        status rows; plus deaths, replacement failures and pids."""
        rows_seen: dict[int, int] = {}
        for stats, seen in list(self._reader_stats.values()):
            total.add(stats)
            for size, rows in list(seen.items()):
                rows_seen[size] = rows_seen.get(size, 0) + rows
        status = self._status
        total.requests = int(status[:, 2].sum()) if status is not None else 0
        total.batches = int(status[:, 3].sum()) if status is not None else 0
        total.batch_rows = {size: rows // size for size, rows in rows_seen.items() if size > 0}
        # the readers' batch_ns are summed per request times its rows (``_count``): per batch,
        # a batch's requests together weigh its size
        total.batch_ns = {
            size: [ns // size for ns in times] for size, times in total.batch_ns.items() if size > 0
        }
        ready = 0
        if status is not None:
            ready = sum(
                1
                for i, p in enumerate(self._procs)
                if p is not None and p.is_alive() and status[i, 1] == READY
            )
        return {
            "workers_ready": ready,
            "worker_deaths": self.worker_deaths,
            "replacement_failures": self.replacement_failures,
            "pids": [int(p.pid) if p is not None and p.pid else 0 for p in self._procs],
            "gpu": None,  # GPU instances run in the thread pool only (runtime.py)
        }
