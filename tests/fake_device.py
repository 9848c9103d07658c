"""A fake accelerator for the GPU tests without a GPU (tests/unit/test_gpu_*.py,
tests/integration/test_engine_gpu.py): the Device protocol of lumenrt/engine/gpu/device.py on
numpy arrays, with one thread per stream running its operations in order, as a device would.

What it is for: the CPU-side logic of GPU instances (staging, the stream schedule, the worker
loop, errors) run for real, asynchronously, and checked against what it records:
  - ``issued``: every operation in the order the host issued it (stream, kind, tag, event), where
    ``tag`` is whatever the test set ``device.tag`` to before issuing (the batch number);
  - ``ran``: each operation's start and end on one global sequence (which ran beside which);
  - ``counts``: allocations (host and device buffers, streams, events, graph captures) and
    synchronizations (``synchronize_event``, ``synchronize_stream``, ``synchronize``).

Errors, as CUDA reports them: work that raises on its stream's thread (a kernel that fails)
taints the stream: its later copies and launches are skipped and every event it records carries
the error, until the stream next waits for an event that carries none (the next batch's
dependency: it starts clean); a stream that waits for a tainted event is tainted too.
``synchronize_event`` raises an event's error as DeviceError. (Real CUDA cannot recover a context
from a kernel fault at all; see engine/gpu/serving.py: ``sticky_errors`` makes the fake do the
same, every later host call raising.) ``refuse_next_launch(exc)`` makes the next ``launch`` raise on the host, as a
launch CUDA refuses (out of memory) does.

Memory: a buffer is a numpy array owned by whoever asked for it; ``close`` ends the stream threads.
"""

import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lumenrt.engine.gpu.device import DeviceError, HostBuffer

WAIT_GUARD_S = 60.0  # a stream waiting this long for an event has deadlocked: fail, never hang


@dataclass(eq=False)
class FakeEvent:
    name: str
    issued: int = 0  # records issued
    done: int = 0  # records run
    error: BaseException | None = None  # carried by the record that ran last
    at: int = 0  # the global sequence number when the last record ran
    cond: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, generation: int) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.done >= generation, WAIT_GUARD_S):
                raise AssertionError(f"fake device: event {self.name} never reached record {generation}")


@dataclass(frozen=True)
class Issued:
    seq: int
    stream: str
    kind: str  # record, wait, copy_to_device, copy_rows_to_device, copy_to_host, launch
    tag: Any
    event: FakeEvent | None = None
    generation: int = 0  # a record's or a wait's event generation


@dataclass(frozen=True)
class Ran:
    stream: str
    kind: str
    tag: Any
    start: int
    end: int


class FakeStream:
    def __init__(self, device: "FakeDevice", name: str) -> None:
        self.device = device
        self.name = name
        self.ops: deque[tuple[str, Any, Callable[[], None]]] = deque()
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.idle = True
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name=f"fake-{name}", daemon=True)
        self.thread.start()

    def put(self, kind: str, tag: Any, op: Callable[[], None]) -> None:
        with self.cond:
            self.ops.append((kind, tag, op))
            self.idle = False
            self.cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.ops and not self.closed:
                    self.idle = True
                    self.cond.notify_all()
                    self.cond.wait()
                if not self.ops:
                    return
                kind, tag, op = self.ops.popleft()
            start = self.device.next_seq()
            self.device.started(kind, tag)
            op()
            self.device.log_ran(Ran(self.name, kind, tag, start, self.device.next_seq()))

    def drain(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.idle and not self.ops, WAIT_GUARD_S)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join(WAIT_GUARD_S)


class FakeDevice:
    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.name = f"fake:{index}"
        self.tag: Any = None
        self.counts: Counter[str] = Counter()
        self.issued: list[Issued] = []
        self.ran: list[Ran] = []
        self.host_waits: list[tuple[int, Any]] = []  # (seq, tag of the awaited record) per synchronize_event
        self.host_waiting = threading.Event()  # set by every synchronize_event
        self.device_bytes = 0
        self.nvml: dict[str, float] | None = None  # what utilization() reports (None: no NVML)
        self.registered: dict[int, int] = {}  # host memory registered: address -> users
        # sticky errors, as CUDA's after a kernel fault: once a kernel failed, every later call
        # from the host (issuing, recording, waiting) raises RuntimeError
        self.sticky_errors = False
        self.poisoned: BaseException | None = None
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._streams: list[FakeStream] = []
        self._refusals: deque[BaseException] = deque()
        self._started: dict[tuple[str, Any], threading.Event] = {}
        self._record_tags: dict[tuple[int, int], Any] = {}  # (id(event), generation) -> tag

    # ---- the test's view -------------------------------------------------------------------

    def next_seq(self) -> int:
        return next(self._seq)

    def when_started(self, kind: str, tag: Any) -> threading.Event:
        """Set once an operation of this kind and tag starts running on its stream."""
        with self._lock:
            return self._started.setdefault((kind, tag), threading.Event())

    def started(self, kind: str, tag: Any) -> None:
        self.when_started(kind, tag).set()

    def log_ran(self, ran: Ran) -> None:
        with self._lock:
            self.ran.append(ran)

    def refuse_next_launch(self, error: BaseException) -> None:
        self._refusals.append(error)

    def close(self) -> None:
        for stream in self._streams:
            stream.close()

    def _issue(
        self, stream: FakeStream, kind: str, op: Callable[[], None], event: Any = None, gen: int = 0
    ) -> None:
        if self.poisoned is not None:
            raise RuntimeError(f"CUDA error (sticky): {self.poisoned}")
        with self._lock:
            self.issued.append(Issued(self.next_seq(), stream.name, kind, self.tag, event, gen))
        stream.put(kind, self.tag, op)

    # ---- the Device protocol ------------------------------------------------------------------

    def host_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any], *, pinned: bool) -> HostBuffer:
        self.counts["host_buffer"] += 1
        return HostBuffer(np.zeros(shape, dtype), None, pinned)

    def device_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        self.counts["device_buffer"] += 1
        buf = np.zeros(shape, dtype)
        self.device_bytes += buf.nbytes
        return buf

    def new_stream(self) -> FakeStream:
        self.counts["stream"] += 1
        stream = FakeStream(self, f"s{len(self._streams)}")
        self._streams.append(stream)
        return stream

    def new_event(self, *, blocking: bool) -> FakeEvent:
        self.counts["event"] += 1
        return FakeEvent(f"e{self.counts['event']}")

    def _copy(
        self, stream: FakeStream, kind: str, dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]
    ) -> None:
        """``src`` into ``dst`` (views of the buffers) when the stream gets to it."""

        def op() -> None:
            if stream.error is None:
                dst[...] = src

        self._issue(stream, kind, op)

    def copy_to_device(self, dst: Any, src: HostBuffer, rows: int, stream: FakeStream) -> None:
        self._copy(stream, "copy_to_device", dst[:rows], src.array[:rows])

    def copy_to_host(self, dst: HostBuffer, src: Any, rows: int, stream: FakeStream) -> None:
        self._copy(stream, "copy_to_host", dst.array[:rows], src[:rows])

    def copy_rows_to_device(self, dst: Any, row: int, src: np.ndarray[Any, Any], stream: FakeStream) -> None:
        self.counts["copy_rows_to_device"] += 1
        self._copy(stream, "copy_rows_to_device", dst[row : row + src.shape[0]], src)

    def register_host(self, memory: Any) -> Any:
        self.counts["register_host"] += 1
        view = np.frombuffer(memory, dtype=np.uint8)
        address = int(view.ctypes.data)
        self.registered[address] = self.registered.get(address, 0) + 1
        return address

    def unregister_host(self, handle: Any) -> None:
        self.counts["unregister_host"] += 1
        self.registered[handle] -= 1
        if self.registered[handle] == 0:
            del self.registered[handle]

    def launch(self, stream: FakeStream, work: Callable[[], None]) -> None:
        if self._refusals:
            raise self._refusals.popleft()

        def op() -> None:
            if stream.error is None:
                try:
                    work()
                except Exception as e:  # a kernel that fails: reported at the next event
                    stream.error = e
                    if self.sticky_errors:
                        self.poisoned = e

        self._issue(stream, "launch", op)

    def capture(self, stream: FakeStream, work: Callable[[], None]) -> Callable[[], None]:
        self.counts["capture"] += 1

        def replay() -> None:
            self.counts["replay"] += 1
            work()

        return replay

    def record(self, event: FakeEvent, stream: FakeStream) -> None:
        event.issued += 1
        generation = event.issued
        self._record_tags[(id(event), generation)] = self.tag

        def op() -> None:
            with event.cond:
                event.error = stream.error
                event.done, event.at = generation, self.next_seq()
                event.cond.notify_all()

        self._issue(stream, "record", op, event, generation)

    def wait_event(self, stream: FakeStream, event: FakeEvent) -> None:
        generation = event.issued

        def op() -> None:
            event.wait_for(generation)
            stream.error = event.error if event.done == generation else None

        self._issue(stream, "wait", op, event, generation)

    def synchronize_event(self, event: FakeEvent) -> None:
        if self.poisoned is not None and event.issued == event.done and event.error is None:
            raise DeviceError(f"{self.name}: sticky: {self.poisoned}")
        self.counts["synchronize_event"] += 1
        generation = event.issued
        with self._lock:
            self.host_waits.append((self.next_seq(), self._record_tags.get((id(event), generation))))
        self.host_waiting.set()
        event.wait_for(generation)
        if event.done == generation and event.error is not None:
            raise DeviceError(f"{self.name}: {type(event.error).__name__}: {event.error}")

    def synchronize_stream(self, stream: FakeStream) -> None:
        self.counts["synchronize_stream"] += 1
        stream.drain()

    def synchronize(self) -> None:
        """Device-wide (the protocol has none: counted so a test can say it never happens)."""
        self.counts["synchronize"] += 1
        for stream in self._streams:
            stream.drain()

    def elapsed_ns(self, start: FakeEvent, end: FakeEvent) -> int:
        return max(end.at - start.at, 0) * 1000  # sequence steps as microseconds

    def memory_used_bytes(self) -> int:
        return self.device_bytes

    def utilization(self) -> dict[str, float] | None:
        return self.nvml


def fake_program(fn: Callable[[np.ndarray], np.ndarray], name_in: str = "x", name_out: str = "y") -> Any:
    """A DeviceProgram computing ``y = fn(x)`` on the fake device's arrays."""

    class Program:
        weight_bytes = 64

        def __init__(self) -> None:
            self.runs = 0

        def run(self, inputs: Any, outputs: Any) -> None:
            self.runs += 1
            outputs[name_out][...] = fn(inputs[name_in])

        def close(self) -> None:
            pass

    return Program()
