"""One inference request inside the engine, and its stage timestamps.

Requests live in a fixed table per model (``RequestTable``), allocated once at load: the ring
carries only the table index (``request_id``), so nothing about a request is allocated on the hot
path beyond the numpy arrays the caller hands in and the model hands back.

Completion, exactly once per submission, by whoever finishes the request:
  - an asyncio caller gave ``on_done``: a worker thread calls it (it posts to the loop's
    completion ring); a worker process pushes to its model's completion ring instead, which the
    loop drains itself (process_pool.py); shutdown paths call it from any thread;
  - a synchronous caller waits on its record's latch (``RequestTable.latches``, native): a worker
    thread appends the index to its ``signal`` list, and the latches are set by its next
    ``Ring.pop_many`` once the GIL is released, so the woken caller finds the GIL free; a worker
    process sets the latch in shared memory itself.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from lumenrt.native import Latches, Region, latches_required_bytes

Array = npt.NDArray[Any]


class EngineError(RuntimeError):
    """Base of the errors a request can be answered with."""

    status = 500


class QueueFull(EngineError):
    status = 503


class RequestTimeout(EngineError):
    status = 504


class RequestCancelled(EngineError):
    status = 499


class WorkerDied(EngineError):
    status = 503


class ModelNotReady(EngineError):
    status = 503


class InvalidInput(EngineError, ValueError):
    status = 400


@dataclass(slots=True)
class StageTimes:
    """CLOCK_MONOTONIC nanoseconds (time.monotonic_ns); 0 = not reached."""

    received_ns: int = 0
    enqueued_ns: int = 0
    dequeued_ns: int = 0
    batch_formed_ns: int = 0
    compute_start_ns: int = 0
    compute_end_ns: int = 0
    completed_ns: int = 0
    batch_size: int = 0  # rows in the batch this request ran in

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class InferRequest:
    index: int
    inputs: dict[str, Array] = field(default_factory=dict)
    rows: int = 1
    deadline_ns: int = 0  # 0 = none
    outputs: dict[str, Array] | None = None
    error: EngineError | None = None
    cancelled: bool = False
    times: StageTimes = field(default_factory=StageTimes)
    on_done: Any = None  # callable(request) run at completion (async callers); None: the latch
    future: Any = None  # asyncio.Future of an infer_async caller
    on_answer: Any = None  # callable(request), event loop thread: a submit_callback caller
    context: Any = None  # what the on_answer caller needs back (its own record; not read here)
    model_id: int = 0  # which runtime's table this record belongs to (for async completions)
    generation: int = 0  # process mode: bumped at each use, so a late notice cannot hit a new request
    finished: bool = False  # process mode: completed once (notices after that are ignored)
    slot: int = -1  # process mode: the arena slot holding its tensors
    level: int = 1  # its priority level (1 is served first)
    delay_ns: int = 0  # timeout_action DELAY: past this, it goes behind what waits (batcher.DelayingSource)
    delayed: bool = False  # put back once already
    # Answered at its deadline by the event loop (engine.py) before a worker answered it: the record
    # is released once both the caller has released it and the worker's answer has come back.
    answered_early: bool = False
    caller_released: bool = False
    worker_answered: bool = False

    def reset(self) -> None:
        self.inputs = {}
        self.outputs = None
        self.error = None
        self.cancelled = False
        self.deadline_ns = 0
        self.rows = 1
        self.times = StageTimes()
        self.on_done = None
        self.future = None
        self.on_answer = None
        self.context = None
        self.finished = False
        self.slot = -1
        self.level = 1
        self.delay_ns = 0
        self.delayed = False
        self.answered_early = self.caller_released = self.worker_answered = False


class RequestTable:
    """A fixed set of request records and a free list. ``acquire`` and ``release`` are O(1) and
    atomic under the GIL (deque.popleft/append); running out means the model is saturated."""

    def __init__(self, size: int, latches: Latches | None = None) -> None:
        """``latches``: one per record, made by the caller where workers in other processes can
        set them (process mode); by default in private memory of this process."""
        self.records = [InferRequest(i) for i in range(size)]
        self._free: deque[int] = deque(range(size))
        if latches is None:
            latches = Latches.create(Region.anonymous(latches_required_bytes(size)), size)
        if len(latches) < size:
            raise ValueError(f"{len(latches)} latches for {size} request records")
        self.latches = latches

    def complete(self, request: InferRequest, signal: list[int]) -> None:
        """Called by the completer (GIL held): an async caller's callback now, a synchronous
        caller's latch at the completer's next pop (``signal``)."""
        callback = request.on_done
        if callback is not None:
            callback(request)
        else:
            signal.append(request.index)

    def complete_now(self, request: InferRequest) -> None:
        """Complete outside a worker loop (shutdown paths): set the latch at once."""
        callback = request.on_done
        if callback is not None:
            callback(request)
        else:
            self.latches.set(request.index)

    def acquire(self) -> InferRequest | None:
        try:
            index = self._free.popleft()
        except IndexError:
            return None
        self.latches.reset(index)
        return self.records[index]

    def release(self, request: InferRequest) -> None:
        request.reset()
        self._free.append(request.index)

    @property
    def free(self) -> int:
        return len(self._free)


def batch_rows(inputs: dict[str, Array]) -> int:
    first = next(iter(inputs.values()))
    return int(first.shape[0]) if first.ndim else 1
