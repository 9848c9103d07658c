"""Process-mode worker: one process per worker, attached to the model's shared-memory segment.

It reads each request's inputs in place from its arena slot, writes the outputs into the same
slot, and reports: a synchronous request by its latch, an asynchronous one through the completion
ring and its notifier (which wakes the engine's event loop only while it sleeps). Every request it
pops is first recorded in its hold (in shared memory, by the ring itself) and marked done only
after its completion was pushed, so the supervisor can fail exactly what a killed worker had taken.

It dies with its engine: the parent-death signal (SIGKILL, armed first thing) ends it when the
supervisor thread that spawned it ends, and a check right after arming covers a parent that died
before. SIGINT and SIGTERM are ignored: a Ctrl-C or a signal to the whole process group reaches
the server, which drains and then stops its workers itself.
"""

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.backends.base import Placement, get_backend
from lumenrt.engine.batcher import Batcher
from lumenrt.engine.config import ModelConfig
from lumenrt.engine.descriptors import (
    CANCELLED,
    FAILED,
    FROM_WORKER,
    OK,
    SYNC,
    TIMED_OUT,
    push_completion,
    request_deadline_ns,
    request_generation,
    request_kind,
    request_rows,
)
from lumenrt.engine.execute import execute_batch
from lumenrt.engine.placing import bind_this_thread, narrow_after_load
from lumenrt.engine.request import Array
from lumenrt.engine.slot_layout import (
    read_tensors,
    set_compute,
    set_dequeued,
    set_status,
    write_error,
    write_outputs,
)
from lumenrt.engine.worker import batch_plan, batch_policy, zeros_for
from lumenrt.native import (
    DESC_DTYPE,
    HOLD_DONE,
    HOLD_HEADER_BYTES,
    Item,
    Latches,
    Notifier,
    PassedFd,
    Ring,
    RingClosed,
    SlabPool,
    map_passed,
    set_parent_death_signal,
)

# Worker states in the status table.
STARTING, READY, EXITED = 0, 1, 2
LOAD_FAILED = 3  # exit code of a worker whose model did not load
STATUS_COLS = 5  # pid, state, requests, batches, infer_ns (compute time of its batch, per request)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    memory: PassedFd  # the model's shared segment (a memfd), inherited at spawn
    notifier: PassedFd  # the completion ring's eventfd (process_pool.py), inherited at spawn
    memory_bytes: int
    parent_pid: int
    offsets: dict[str, int]
    config: ModelConfig
    model_path: Path
    placement: Placement
    index: int
    n_workers: int
    pin: bool
    hold_capacity: int
    hold_bytes: int
    table_size: int
    spin_ns: int = 0  # an idle worker polls the request ring this long before sleeping
    adaptive: bool = False  # engine.batching 'adaptive' (batch_cost.py)


class HeldSource:
    """Pops through the worker's hold; a request is (item, hold position)."""

    def __init__(self, ring: Ring, region: Any, hold_offset: int) -> None:
        self._ring, self._region, self._hold_offset = ring, region, hold_offset

    def take(self, max_n: int, timeout_s: float | None) -> list[tuple[Item, int]]:
        items, first = self._ring.pop_many_hold(
            min(max_n, 64), self._region, self._hold_offset, timeout_s=timeout_s
        )
        return [(item, first + k) for k, item in enumerate(items)]

    def rows(self, request: tuple[Item, int]) -> int:
        return request_rows(request[0])

    def waiting(self) -> int:
        return len(self._ring)


def worker_main(spec: WorkerSpec) -> None:
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != spec.parent_pid:  # the engine died before the signal was armed
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    region = map_passed(spec.memory, spec.memory_bytes)
    off = spec.offsets
    requests = Ring.attach(region, off["requests"])
    requests.spin_ns = spec.spin_ns
    completions = Ring.attach(region, off["completions"])
    try:
        notifier = Notifier.attach(region, spec.notifier.fd, offset=off["notifier"])  # dups it
    finally:
        os.close(spec.notifier.fd)
    pool = SlabPool.attach(region, off["arena"])
    latches = Latches.attach(region, spec.table_size, off["latches"])
    hold_offset = off["holds"] + spec.index * spec.hold_bytes
    hold_ids: Any = np.ndarray(
        spec.hold_capacity, DESC_DTYPE, buffer=memoryview(region), offset=hold_offset + HOLD_HEADER_BYTES
    )["request_id"]
    cancel = np.ndarray(spec.table_size, np.uint8, buffer=memoryview(region), offset=off["cancel"])
    status = np.ndarray(
        (spec.n_workers, STATUS_COLS), np.int64, buffer=memoryview(region), offset=off["status"]
    )
    if spec.pin:
        bind_this_thread(spec.placement)  # the process's main thread: its later threads inherit it
    config = spec.config
    try:
        session = get_backend(config.backend, config.source).load(spec.model_path, config, spec.placement)
        if spec.pin:
            narrow_after_load(spec.placement, session)
        for _ in range(config.warmup):
            session.run(zeros_for(config, 1))
    except Exception as e:  # one line for the operator; the supervisor sees the exit code
        print(
            f"lumenrt: model {config.name!r} worker {spec.index}: could not load: {type(e).__name__}: {e}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(LOAD_FAILED) from None
    status[spec.index, :2] = (os.getpid(), READY)
    batcher = Batcher(HeldSource(requests, region, hold_offset), batch_policy(config, spec.adaptive))
    plan = batch_plan(config)
    sink = SlotSink(config, completions, notifier, latches, hold_ids, cancel, status[spec.index])
    try:
        while True:
            try:
                batch = batcher.next_batch()
            except RingClosed:
                break
            start_ns = time.monotonic_ns()
            rows = execute_batch(
                plan, session, [HeldRequest(item, pos, pool.view(item.slot)) for item, pos in batch], sink
            )
            batcher.ran(time.monotonic_ns() - start_ns, rows)
    finally:
        status[spec.index, 1] = EXITED
        session.close()


@dataclass(slots=True)
class HeldRequest:
    """A request a worker process has taken: its descriptor, its place in the worker's hold, and
    its arena slot (a view of shared memory owned by the engine's arena; the worker only reads
    the inputs and writes the answer there)."""

    item: Item
    hold_pos: int
    slot: memoryview


class SlotSink:
    """execute.py's sink for a worker process: a request's inputs are read in place from its slot;
    its answer (outputs or error text, stage times, status) is written into the slot and reported
    (SYNC: status in the slot header and the caller's latch; ASYNC: a completion descriptor and a
    notify), then its hold entry is marked done. Requests and batches are counted in the status table; the rest
    of the statistics where the answer is read (process_pool.py)."""

    __slots__ = ("_cancel", "_completions", "_config", "_hold_ids", "_latches", "_notifier", "_status")

    def __init__(
        self,
        config: ModelConfig,
        completions: Ring,
        notifier: Notifier,
        latches: Latches,
        hold_ids: Any,
        cancel: Any,
        status: Any,
    ) -> None:
        self._config, self._completions, self._latches = config, completions, latches
        self._notifier = notifier
        self._hold_ids, self._cancel, self._status = hold_ids, cancel, status

    def inputs(self, request: HeldRequest) -> dict[str, Array]:
        return read_tensors(request.slot, self._config, outputs=False)

    def rows(self, request: HeldRequest) -> int:
        return request_rows(request.item)

    def dequeue(self, request: HeldRequest, now_ns: int) -> bool:
        set_dequeued(request.slot, now_ns)
        item = request.item
        deadline_ns = request_deadline_ns(item)
        if deadline_ns and now_ns > deadline_ns:  # first: one answered at its deadline is cancelled too
            self._finish(request, TIMED_OUT)
            return True
        if self._cancel[item.request_id]:
            self._finish(request, CANCELLED)
            return True
        return False

    def ran(self, n_requests: int, rows: int, start_ns: int, end_ns: int) -> None:
        status = self._status
        status[2] += n_requests
        status[3] += 1
        status[4] += (end_ns - start_ns) * n_requests

    def answer(
        self,
        request: HeldRequest,
        outputs: dict[str, Array],
        start_ns: int,
        end_ns: int,
        rows: int,
        now_ns: int,
    ) -> None:
        set_compute(request.slot, start_ns, end_ns, rows)
        try:
            write_outputs(request.slot, outputs)
        except ValueError as e:  # outputs larger than the slot
            write_error(request.slot, str(e))
            self._finish(request, FAILED)
            return
        self._finish(request, OK)

    def fail(self, request: HeldRequest, message: str, cause: BaseException) -> None:
        write_error(request.slot, message)
        self._finish(request, FAILED)

    def answered(self, request: HeldRequest) -> bool:
        return bool(self._hold_ids[request.hold_pos % len(self._hold_ids)] == HOLD_DONE)

    def _finish(self, request: HeldRequest, code: int) -> None:
        item = request.item
        if request_kind(item) == SYNC:
            set_status(request.slot, code)
            self._latches.set(item.request_id)
        else:
            push_completion(
                self._completions, item.request_id, item.slot, code, request_generation(item), FROM_WORKER
            )
            self._notifier.notify()  # a system call only while the loop sleeps
        self._hold_ids[request.hold_pos % len(self._hold_ids)] = (
            HOLD_DONE  # after: a death between = a duplicate notice
        )
