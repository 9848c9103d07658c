"""The thread pool: a model's workers as threads of the engine's process (worker.py), one per
placement, pinned. Workers take request records straight from the runtime's ring and answer them
themselves through the request table (no completion hop).

A GPU instance (``Placement.gpu`` >= 0) is a worker thread like the others, taking from the same
ring; once loaded it runs engine/gpu/serving.py's loop instead of execute.py's.

Invariants (beside runtime.py's)
  1. A worker thread never dies with requests unanswered (execute.py, gpu/serving.py); it is never
     replaced, so the pool is ready from start until close.
  2. Each worker writes only its own WorkerStats; ``statistics`` adds them up.

Shutdown order: the runtime closes the request ring; each worker drains what is left, sees
RingClosed and closes its session; ``close`` joins them.
"""

import os
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
        board = IdleBoard(len(placements))
        self.size = len(placements)
        self._workers = [
            ThreadWorker(
                index=i,
                config=runtime.config,
                backend=backend,
                model_path=model_path,
                placement=p,
                ring=runtime.ring,
                table=runtime.table,
                pin=runtime.options.pin,
                board=board,
                adaptive=runtime.options.batching == "adaptive" and p.gpu < 0,
                levels=runtime.level_rings if runtime.doorbell is not None else None,
                doorbell=runtime.doorbell,
                requeue=runtime.requeue if runtime.delays else None,
                host_memory=runtime.region if p.gpu >= 0 and runtime.arena is not None else None,
            )
            for i, p in enumerate(placements)
        ]

    def tasks(self) -> list[tuple[int, int]]:
        """(pid, thread id) of each worker; 0 where it is not running."""
        return [(os.getpid(), w.native_id) if w.alive else (0, 0) for w in self._workers]

    def start(self, timeout_s: float) -> None:
        for w in self._workers:
            w.start()
        for w in self._workers:
            if not w.ready.wait(timeout_s):
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
        """Shutdown began: nothing to stop (thread workers are never replaced)."""

    def close(self, timeout_s: float) -> None:
        """The ring is closed: the workers drain it and end."""
        for w in self._workers:
            w.join(timeout_s)

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
        for w in self._workers:
            total.add(w.stats)
        return {
            "workers_ready": sum(1 for w in self._workers if w.alive and w.ready.is_set()),
            "worker_deaths": 0,  # thread workers never die (execute.py) and are never replaced
            "replacement_failures": 0,
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
