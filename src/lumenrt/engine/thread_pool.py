"""The thread pool: a model's workers as threads of the engine's process (worker.py), one per
placement, pinned. Workers take request records straight from the runtime's ring and answer them
themselves through the request table (no completion hop).

A GPU instance (``Placement.gpu`` >= 0) is a worker thread like the others, taking from the same
ring; once loaded it runs engine/gpu/serving.py's loop instead of execute.py's.

Supervision, as the process pool's (process_pool.py) but with no thread of its own: a worker whose
loop ends by anything but RingClosed (a BaseException from the model, a bug in the batcher or in
execute.py) has died. In its own thread it fails what it held and reports to the pool (``died``),
which starts a replacement thread at its index: that one joins the dead one, waits its backoff,
loads a fresh session (pinned like the first) and serves. A replacement that cannot load retries
with backoff (``reload_failed``, ``pause``) in its own thread; one whose thread cannot be started
is retried with backoff by the dead worker's thread. Both count in ``replacement_failures``.

Invariants (beside runtime.py's)
  1. Every request admitted is answered exactly once: by the worker that took it (a result or a
     clear error), by that worker as it dies (WorkerDied naming the model, the worker and the
     cause: worker.py invariant 2), or, still in a ring once the workers have ended (one died
     while shutting down and has no replacement to take it), by the runtime's close (ModelNotReady, runtime.py ``_fail_left``).
  2. The pool is ready only while every worker is alive and loaded: a dying worker clears its
     readiness before failing what it held, and its replacement is ready once loaded.
  3. Deaths are replaced, one thread per index at a time, unless shutdown began (``stop``): the
     check and the new worker's start happen under ``_lock``, which ``stop`` takes to set
     ``stopping``, so after ``stop`` returns no replacement starts and ``_workers`` is final.
  4. No tight loop: after a worker that died before running a batch since it loaded, a
     replacement that failed to load or a thread that could not start, the next try waits a
     backoff (RETRY_FIRST_S doubling to RETRY_MAX_S), cut short by shutdown; a worker that had
     served is replaced at once.
  5. Each worker writes only its own WorkerStats (a replacement goes on with its predecessor's,
     which has ended); ``statistics`` adds them up. ``worker_deaths`` and
     ``replacement_failures`` are written under ``_lock``.

Shutdown order: the runtime stops the pool (no replacement from now on) and closes the request
ring; each worker drains what is left, sees RingClosed and closes its session; ``close`` joins
them; the runtime then fails what is still in the rings (left by a worker that died while shutting
down, or whose replacement gave up).
"""

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lumenrt.backends.base import Backend, Placement
from lumenrt.engine.batcher import IdleBoard
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.request import InferRequest
from lumenrt.engine.worker import ThreadWorker, WorkerStats
from lumenrt.native import Layout, Region

if TYPE_CHECKING:
    from lumenrt.engine.runtime import ModelRuntime

# Replacement backoff (invariant 4): 0.1 s doubling to 5 s, as the process pool's (guessed: a
# model that fails to load, or kills its worker at once, keeps doing it; a transient cause clears
# in seconds)
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 5.0

log = logging.getLogger("lumenrt.engine")


class ThreadPool:
    @staticmethod
    def add_sections(lay: Layout, config: ModelConfig, table_size: int, n_workers: int) -> None:
        """The pool's own shared structures: none (its workers share the engine's memory)."""

    @staticmethod
    def create_region(size_bytes: int, model_name: str) -> tuple[Region, int]:
        """Private anonymous memory (no descriptor: -1); unmapped with its last reference."""
        return Region.anonymous(size_bytes), -1

    def __init__(
        self, runtime: "ModelRuntime", *, backend: Backend, model_path: Path, placements: list[Placement]
    ) -> None:
        self._rt = runtime
        self._backend, self._model_path, self._placements = backend, model_path, placements
        self._board = IdleBoard(len(placements))
        self.size = len(placements)
        self._lock = threading.Lock()  # replacements and the counters (invariants 3, 5)
        self.stopping = False  # shutdown began: no worker is replaced any more
        self._stopped = threading.Event()  # the same, for a backoff to wait on
        self._strikes = [0] * len(placements)  # per index: deaths before serving, failed loads in a row
        self.worker_deaths = 0
        self.replacement_failures = 0
        self._workers = [self._worker(i) for i in range(len(placements))]

    def _worker(self, i: int, replaces: ThreadWorker | None = None, delay_s: float = 0.0) -> ThreadWorker:
        rt, p = self._rt, self._placements[i]
        return ThreadWorker(
            index=i,
            config=rt.config,
            backend=self._backend,
            model_path=self._model_path,
            placement=p,
            ring=rt.ring,
            table=rt.table,
            pin=rt.options.pin,
            board=self._board,
            adaptive=rt.options.batching == "adaptive" and p.gpu < 0,
            levels=rt.level_rings if rt.doorbell is not None else None,
            doorbell=rt.doorbell,
            requeue=rt.requeue if rt.delays else None,
            host_memory=rt.region if p.gpu >= 0 and rt.arena is not None else None,
            supervisor=self,
            replaces=replaces,
            delay_s=delay_s,
        )

    def tasks(self) -> list[tuple[int, int]]:
        """(pid, thread id) of each worker; 0 where it is not running."""
        return [(os.getpid(), w.native_id) if w.alive else (0, 0) for w in self._workers]

    def start(self, timeout_s: float) -> None:
        for w in self._workers:
            w.start()
        for w in self._workers:
            if not w.loaded.wait(timeout_s):  # (not ready: one may die once loaded)
                raise TimeoutError(
                    f"model {w.config.name!r}: worker {w.index} did not load within {timeout_s} s"
                )
        errors = [w.load_error for w in self._workers if w.load_error is not None]
        if errors:
            raise errors[0]

    @property
    def ready(self) -> bool:
        return all(w.alive and w.ready.is_set() for w in self._workers)

    def stop(self) -> None:
        """Shutdown began: workers that die from now on are not replaced (what they held still
        fails at once), and a replacement waiting or retrying gives up (invariant 3)."""
        with self._lock:
            self.stopping = True
            self._stopped.set()

    def close(self, timeout_s: float) -> None:
        """The ring is closed: the workers drain it and end; what no worker is left to take is
        failed (see the top)."""
        self.stop()
        for w in self._workers:  # final (invariant 3)
            w.join(timeout_s)

    # ---- supervision (worker.Supervisor: called from the workers' threads) -------------------

    def died(self, worker: ThreadWorker, error: BaseException) -> None:
        """``worker`` died (what it held is failed): replace it unless shutdown began. A thread
        that cannot be started (the process is out of threads or memory) is retried after a
        backoff from here, the dead worker's thread, which ends once one has started."""
        i = worker.index
        with self._lock:
            self.worker_deaths += 1
            replacing = not self.stopping
            if replacing:
                self._strikes[i] = 0 if worker.served else self._strikes[i] + 1
        log.error(
            "model %r: worker %d died: %s: %s; %s",
            self._rt.config.name,
            i,
            type(error).__name__,
            error,
            "replacing it" if replacing else "not replaced (shutting down)",
            exc_info=(type(error), error, error.__traceback__),
        )
        while True:
            with self._lock:
                if self.stopping or self._workers[i] is not worker:
                    return
                replacement = self._workers[i] = self._worker(i, replaces=worker, delay_s=self._backoff(i))
                try:
                    replacement.start()  # it joins this thread first (worker.py invariant 3)
                    return
                except Exception as e:
                    start_error = e
                    self._workers[i] = worker
                    self.replacement_failures += 1
                    self._strikes[i] += 1
                    delay_s = self._backoff(i)
            log.warning(
                "model %r: could not start a replacement for worker %d: %s; retrying in %.1f s",
                self._rt.config.name,
                i,
                start_error,
                delay_s,
            )
            if self._stopped.wait(delay_s):
                return

    def reload_failed(self, worker: ThreadWorker, error: BaseException) -> float | None:
        with self._lock:
            self.replacement_failures += 1
            if self.stopping:
                return None
            self._strikes[worker.index] += 1
            delay_s = self._backoff(worker.index)
        log.warning(
            "model %r: replacement worker %d could not load: %s: %s; retrying in %.1f s",
            self._rt.config.name,
            worker.index,
            type(error).__name__,
            error,
            delay_s,
        )
        return delay_s

    def pause(self, delay_s: float) -> bool:
        return not self._stopped.wait(delay_s) if delay_s > 0 else not self.stopping

    def _backoff(self, i: int) -> float:
        strikes = self._strikes[i]
        return 0.0 if strikes == 0 else min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (strikes - 1))

    def release_memory(self) -> None:
        """Nothing: the region is private memory, unmapped once unreferenced (a caller still
        releasing a record after close frees its slot into it)."""

    # ---- requests ---------------------------------------------------------------------------

    def admitted(self, req: InferRequest) -> None:
        """Nothing to prepare: the worker reads the record itself."""

    def collect(self, req: InferRequest) -> None:
        """Nothing to read: the worker put the answer in the record."""

    def cancel(self, req: InferRequest) -> None:
        """Nothing beyond ``req.cancelled``, which the worker reads."""

    # ---- statistics -------------------------------------------------------------------------

    def statistics(self, total: WorkerStats) -> dict[str, Any]:
        for w in self._workers:  # a replacement's stats go on from its predecessor's
            total.add(w.stats)
        return {
            "workers_ready": sum(1 for w in self._workers if w.alive and w.ready.is_set()),
            "worker_deaths": self.worker_deaths,
            "replacement_failures": self.replacement_failures,
            "pids": [os.getpid()] * self.size,
            "gpu": self._gpu_statistics(),
        }

    def _gpu_statistics(self) -> dict[str, Any] | None:
        """The GPU instances' figures (engine/gpu/stats.py), None for a model without any."""
        if all(w.placement.gpu < 0 for w in self._workers):
            return None
        from lumenrt.engine.gpu.serving import describe
        from lumenrt.engine.gpu.stats import gpu_statistics

        reports = [describe(w.serving) for w in self._workers if w.placement.gpu >= 0]
        return gpu_statistics(r for r in reports if r is not None)
