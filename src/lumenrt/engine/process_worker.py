"""Process-mode worker: one process per worker, attached to the model's shared-memory segment.

It reads each request's inputs in place from its arena slot, writes the outputs into the same
slot, and reports through the completion ring. Every request it pops is first recorded in its
hold (in shared memory, by the ring itself) and marked done only after its completion was pushed,
so the supervisor can fail exactly what a killed worker had taken.

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
from lumenrt.engine.slot_layout import header, read_tensors, write_error, write_outputs
from lumenrt.engine.worker import (
    batch_buffers,
    batch_policy,
    gather,
    has_variable_dims,
    shape_groups,
    zeros_for,
)
from lumenrt.native import (
    DESC_DTYPE,
    HOLD_DONE,
    HOLD_HEADER_BYTES,
    Item,
    Latches,
    PassedFd,
    Ring,
    RingClosed,
    SlabPool,
    map_passed,
    set_parent_death_signal,
)

# Completion statuses (descriptor aux0, and the slot header's status).
OK, TIMED_OUT, CANCELLED, FAILED, WORKER_DIED = 0, 1, 2, 3, 4
# Completion descriptor kinds.
FROM_WORKER, FROM_SUPERVISOR = 0, 1
# Request descriptor kinds: ASYNC is answered through the completion ring; SYNC by writing the
# status into the slot header and setting the caller's latch (the caller waits on it itself).
ASYNC, SYNC = 0, 1
# Worker states in the status table.
STARTING, READY, EXITED = 0, 1, 2
LOAD_FAILED = 3  # exit code of a worker whose model did not load
STATUS_COLS = 5  # pid, state, requests, batches, infer_ns (compute time of its batch, per request)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    memory: PassedFd  # the model's shared segment (a memfd), inherited at spawn
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
        return request[0].aux0

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
    pool = SlabPool.attach(region, off["pool"])
    latches = Latches.attach(region, spec.table_size, off["latches"])
    hold_offset = off["holds"] + spec.index * spec.hold_bytes
    hold_ids: Any = np.ndarray(
        spec.hold_capacity, DESC_DTYPE, buffer=memoryview(region), offset=hold_offset + HOLD_HEADER_BYTES
    )["request_id"]
    cancel = np.ndarray(spec.table_size, np.uint8, buffer=memoryview(region), offset=off["cancel"])
    status = np.ndarray(
        (spec.n_workers, STATUS_COLS), np.int64, buffer=memoryview(region), offset=off["status"]
    )
    if spec.pin and spec.placement.cores:
        os.sched_setaffinity(0, spec.placement.cores)
    config = spec.config
    try:
        session = get_backend(config.backend, config.source).load(spec.model_path, config, spec.placement)
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
    batcher = Batcher(HeldSource(requests, region, hold_offset), batch_policy(config))
    buffers = batch_buffers(config)

    def finish(item: Item, pos: int, code: int) -> None:
        if item.kind == SYNC:
            header(pool.view(item.slot))["status"] = code
            latches.set(item.request_id)
        else:
            completions.push(item.request_id, slot=item.slot, aux0=code, aux1=item.aux1, kind=FROM_WORKER)
        hold_ids[pos % spec.hold_capacity] = HOLD_DONE  # after: a death between = a duplicate notice

    variable = has_variable_dims(config) and config.max_batch_size > 0

    def run_group(live: list[tuple[Item, int, memoryview]]) -> None:
        parts = [read_tensors(slot, config, outputs=False) for _, _, slot in live]
        inputs = parts[0] if len(parts) == 1 else gather(config, buffers, parts)
        rows = sum(item.aux0 for item, _, _ in live)
        t_start = time.monotonic_ns()
        try:
            outputs = session.run(inputs)
        except Exception as e:
            for item, pos, slot in live:
                write_error(slot, f"model {config.name!r} failed: {type(e).__name__}: {e}")
                finish(item, pos, FAILED)
            return
        t_end = time.monotonic_ns()
        # counted before any answer goes out, so a caller that reads the statistics once answered
        # sees its request in them (as thread mode, whose latches are set at the next take)
        status[spec.index, 2] += len(live)
        status[spec.index, 3] += 1
        status[spec.index, 4] += (t_end - t_start) * len(live)
        offset = 0
        for item, pos, slot in live:
            n = item.aux0
            mine = {k: v[offset : offset + n] for k, v in outputs.items()} if len(live) > 1 else outputs
            offset += n
            h = header(slot)
            h["compute_start_ns"], h["compute_end_ns"], h["batch_rows"] = t_start, t_end, rows
            try:
                write_outputs(slot, mine)
            except ValueError as e:
                write_error(slot, str(e))
                finish(item, pos, FAILED)
                continue
            finish(item, pos, OK)

    try:
        while True:
            try:
                batch = batcher.next_batch()
            except RingClosed:
                break
            now_ns = time.monotonic_ns()
            live: list[tuple[Item, int, memoryview]] = []
            for item, pos in batch:
                slot = pool.view(item.slot)
                header(slot)["dequeued_ns"] = now_ns
                if cancel[item.request_id]:
                    finish(item, pos, CANCELLED)
                elif item.aux2 and now_ns > item.aux2:
                    finish(item, pos, TIMED_OUT)
                else:
                    live.append((item, pos, slot))
            if not live:
                continue
            groups = [live]
            if variable and len(live) > 1:
                parts = [read_tensors(slot, config, outputs=False) for _, _, slot in live]
                groups = [[live[i] for i in g] for g in shape_groups(parts)]
            for group in groups:
                try:
                    run_group(group)
                except Exception as e:  # never leave a request unanswered (see worker.py)
                    for item, pos, slot in group:
                        if hold_ids[pos % spec.hold_capacity] != HOLD_DONE:
                            write_error(slot, f"model {config.name!r}: could not run the batch: {e}")
                            finish(item, pos, FAILED)
    finally:
        status[spec.index, 1] = EXITED
        session.close()
