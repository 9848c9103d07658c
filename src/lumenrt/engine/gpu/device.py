"""The device seam: what a GPU instance needs of an accelerator, and nothing more.

A ``Device`` hands out host buffers (page-locked when asked), device buffers, streams and events,
and issues work on a stream: copies host -> device and device -> host, a launch (a callable that
enqueues the model's kernels on the stream, or a captured graph's replay), an event record, and a
wait of one stream for an event of another. Every issuing call returns at once: the work runs on
the device in stream order, after the events it waits for. The host waits for one event at a time
(``synchronize_event``), never for the whole device on the request path (``synchronize`` exists
for load and close only).

Two implementations, picked by ``open_device`` (devices.py): ``TorchCudaDevice`` (torch_device.py,
CUDA through torch) and the tests' ``FakeDevice`` (tests/fake_device.py: one thread per stream running the same operations on numpy
arrays, recording the schedule). Errors: a failure of work already issued is raised by the
``synchronize_event`` of the first event recorded after it on that stream (or on a stream that
waited for it), as ``DeviceError``; a failure the issuing call itself sees (a launch refused, an
allocation that does not fit) is raised by that call.

Buffers say who owns them: a device owns nothing it handed out; the caller that allocated a
buffer (staging.py) keeps it for the instance's life and drops it at close.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

Array = np.ndarray[Any, np.dtype[Any]]


class DeviceError(RuntimeError):
    """Work on a device failed; the message names the device and the library's error."""


@dataclass(slots=True)
class HostBuffer:
    """Host memory for staging: ``array`` is the numpy view the worker gathers into and reads
    from; ``handle`` is the device library's object for the same memory (a pinned torch tensor),
    owned by this buffer."""

    array: Array
    handle: Any
    pinned: bool


class Device(Protocol):
    index: int
    name: str  # "cuda:0"

    def host_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any], *, pinned: bool) -> HostBuffer: ...

    def device_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """Device memory (zeroed) of that shape, sliceable by rows (``buf[:rows]``)."""
        ...

    def new_stream(self) -> Any: ...

    def new_event(self, *, blocking: bool) -> Any:
        """A timing event; ``blocking``: the host sleeps in ``synchronize_event`` (else spins)."""
        ...

    def copy_to_device(self, dst: Any, src: HostBuffer, rows: int, stream: Any) -> None:
        """Rows ``[:rows]`` of ``src`` into ``dst[:rows]``, on ``stream``."""
        ...

    def copy_to_host(self, dst: HostBuffer, src: Any, rows: int, stream: Any) -> None: ...

    def copy_rows_to_device(self, dst: Any, row: int, src: Array, stream: Any) -> None:
        """``src`` (host rows, batch first) into ``dst[row:row + len(src)]``, on ``stream``:
        asynchronous when ``src`` lies in registered (page-locked) memory. The caller keeps
        ``src`` unchanged until an event recorded after this copy has completed."""
        ...

    def register_host(self, memory: Any) -> Any:
        """Page-lock existing host memory (a buffer, e.g. a model's arena region) so copies from
        it are asynchronous; returns the handle for ``unregister_host``. Registering memory that
        is registered already counts one more user. DeviceError if the device refuses."""
        ...

    def unregister_host(self, handle: Any) -> None:
        """One user fewer of a registration; the last one unregisters (before the memory goes)."""
        ...

    def launch(self, stream: Any, work: Callable[[], None]) -> None:
        """Run ``work`` with ``stream`` current: what it enqueues runs in that stream's order."""
        ...

    def capture(self, stream: Any, work: Callable[[], None]) -> Callable[[], None]:
        """``work`` captured as a graph (after warm-up runs on ``stream``); the result replays it
        and is given to ``launch``. Load time only."""
        ...

    def record(self, event: Any, stream: Any) -> None: ...

    def wait_event(self, stream: Any, event: Any) -> None:
        """``stream`` waits for ``event``'s work; the host does not."""
        ...

    def synchronize_event(self, event: Any) -> None:
        """The host waits for this event only; DeviceError if the work before it failed."""
        ...

    def synchronize_stream(self, stream: Any) -> None:
        """The host waits for one stream (load and close only)."""
        ...

    def elapsed_ns(self, start: Any, end: Any) -> int:
        """Device time between two completed events."""
        ...

    def memory_used_bytes(self) -> int:
        """Device memory this process holds on the device (every model's)."""
        ...

    def utilization(self) -> dict[str, float] | None:
        """NVML's figures for the whole device (``utilization``: 0..1 of the last sample period,
        ``memory_used_bytes``, ``memory_total_bytes``), or None without NVML (nvidia-ml-py)."""
        ...


class DeviceProgram(Protocol):
    """A model loaded onto a device by its backend (``GpuBackend.load_gpu``); owns its weights."""

    weight_bytes: int  # device memory its weights and buffers hold

    def run(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        """Enqueue the model on the current stream (``Device.launch`` makes it current): read
        the device ``inputs`` (views of the staging buffers, batch first), write the device
        ``outputs`` views. Returns once enqueued; must not wait for the device."""
        ...

    def close(self) -> None: ...
