"""``TorchCudaDevice``: the Device protocol (device.py) over ``torch.cuda``.

Imported only by ``device.open_device``, when a GPU instance loads: a CPU-only server never
imports this module (nor pynvml). One object per device index, shared by the instances on it;
each instance makes its own streams and events.

- host buffers: ``torch.empty(..., pin_memory=True)`` (page-locked: the copies are DMA'd and
  asynchronous) or pageable when the config turns pinning off; the numpy array is a view of the
  tensor's memory (no copy), the tensor is the HostBuffer's handle and keeps the memory alive.
- copies: ``Tensor.copy_(non_blocking=True)`` on the operation's stream; into or out of pageable
  memory CUDA makes them synchronous (what the pinned-vs-pageable benchmark measures).
- streams: each copy and launch makes its stream the issuing thread's current stream with
  ``torch.cuda.set_stream`` and leaves it so (the stream context manager costs three calls and a
  Stream object each time: a batch switches streams 3 times, and once per request with direct
  copies). Only an instance's own worker thread issues its work, and every issuing call sets the
  stream it needs, so what was current before never matters.
- registered host memory (``optimization.cuda.direct_copies``): a model's arena region is
  page-locked in place with ``cudaHostRegister`` (counted per address: the instances of one model
  share it) and unregistered by its last user, before the region can be unmapped.
- events: timing events; ``blocking`` events make the host sleep in ``synchronize`` (CUDA's
  blocking sync) instead of spinning (``optimization.cuda.busy_wait_events``).
- graphs: ``torch.cuda.graph`` on the instance's compute stream, the capture's errors limited to
  this thread (``capture_error_mode="thread_local"``: other instances keep serving meanwhile),
  the graphs of one stream sharing one memory pool (they never run at once).
- utilization: NVML through ``torch.cuda.utilization`` (which maps the index through
  CUDA_VISIBLE_DEVICES), only when nvidia-ml-py is installed (``lumenrt[gpu]``).
"""

import importlib.util
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from lumenrt.engine.gpu.device import DeviceError, HostBuffer

try:
    import torch
    from torch.utils.dlpack import from_dlpack
except ImportError as exc:  # pragma: no cover - the torch extra is missing
    raise DeviceError(
        "KIND_GPU instances run on CUDA through PyTorch: pip install 'lumenrt[torch]' with a CUDA build of torch"
    ) from exc

HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: the registration holds for every CUDA context
CAPTURE_WARMUP_RUNS = 3  # eager runs before a capture (PyTorch's docs use 3: lazy init, autotuning)

logger = logging.getLogger(__name__)

_opened: dict[int, "TorchCudaDevice"] = {}
_open_lock = threading.Lock()
_capture_lock = threading.Lock()  # one capture at a time in this process (load time only)
_set_stream = torch.cuda.set_stream  # the issuing thread's current stream (see the top)

# host memory registered with CUDA (register_host): address -> [users, the view holding it]
_registered: dict[int, list[Any]] = {}
_register_lock = threading.Lock()


def pci_address(index: int) -> str | None:
    """CUDA device ``index``'s PCI address (``0000:3b:00.0``), as CUDA reports it (so in this
    process's numbering, after CUDA_VISIBLE_DEVICES); None when there is no such device."""
    if not torch.cuda.is_available() or not 0 <= index < torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(index)
    ids = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    if not all(isinstance(i, int) for i in ids):  # a torch that does not report them
        return None
    domain, bus, device = ids
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class _AsDeviceError:
    """A reusable ``with`` block: torch's RuntimeError (torch.OutOfMemoryError and
    torch.AcceleratorError among them) leaves it as DeviceError naming the device and the error's
    type."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, RuntimeError) and not isinstance(exc, DeviceError):
            raise DeviceError(f"{self.name}: {type(exc).__name__}: {exc}") from exc


class TorchCudaDevice:
    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"cuda:{index}"
        self.torch_device = torch.device(self.name)
        self._pools: dict[int, Any] = {}  # id(stream) -> graph memory pool
        self._issuing = _AsDeviceError(self.name)

    @classmethod
    def open(cls, index: int) -> "TorchCudaDevice":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"cuda:{index}: no CUDA device: torch {torch.__version__} reports torch.cuda.is_available() "
                "False (a CPU build of torch, no NVIDIA driver, or CUDA_VISIBLE_DEVICES empty)"
            )
        count = torch.cuda.device_count()
        if index >= count:
            raise DeviceError(
                f"cuda:{index}: this process sees {count} CUDA device(s) (0..{count - 1}; "
                "CUDA_VISIBLE_DEVICES narrows them)"
            )
        with _open_lock:
            device = _opened.get(index)
            if device is None:
                device = _opened[index] = cls(index)
            return device

    def host_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any], *, pinned: bool) -> HostBuffer:
        tensor = torch.zeros(shape, dtype=torch_dtype(dtype), pin_memory=pinned)
        return HostBuffer(tensor.numpy(), tensor, pinned)

    def device_buffer(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return torch.zeros(shape, dtype=torch_dtype(dtype), device=self.torch_device)

    def new_stream(self) -> Any:
        return torch.cuda.Stream(self.torch_device)  # type: ignore[no-untyped-call]

    def new_event(self, *, blocking: bool) -> Any:
        return torch.cuda.Event(enable_timing=True, blocking=blocking)  # type: ignore[no-untyped-call]

    # Every issuing call runs under ``self._issuing``, which turns torch's errors into DeviceError
    # (device.py): after a fault that poisons the context CUDA fails every later call, records and
    # waits included, and the worker must still answer the batch (serving.py invariant 1).

    def copy_to_device(self, dst: Any, src: HostBuffer, rows: int, stream: Any) -> None:
        with self._issuing:
            _set_stream(stream)
            dst[:rows].copy_(src.handle[:rows], non_blocking=True)

    def copy_to_host(self, dst: HostBuffer, src: Any, rows: int, stream: Any) -> None:
        with self._issuing:
            _set_stream(stream)
            dst.handle[:rows].copy_(src[:rows], non_blocking=True)

    def copy_rows_to_device(self, dst: Any, row: int, src: np.ndarray[Any, Any], stream: Any) -> None:
        # no copy either way; DLPack shares a read-only array (one received in place) without
        # torch.from_numpy's warning (numpy >= 2.1 exports read-only arrays)
        source = torch.from_numpy(src) if src.flags.writeable else from_dlpack(src)
        with self._issuing:
            _set_stream(stream)
            dst[row : row + source.shape[0]].copy_(source, non_blocking=True)

    def register_host(self, memory: Any) -> Any:
        view = np.frombuffer(memory, dtype=np.uint8)  # holds the buffer (it stays mapped) while registered
        address, size = int(view.ctypes.data), int(view.nbytes)
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        with _register_lock:
            users = _registered.get(address)
            if users is None:
                with torch.cuda.device(self.torch_device):  # no context made on another device
                    err = cudart.cudaHostRegister(address, size, HOST_REGISTER_PORTABLE)
                if err != cudart.cudaError.success:
                    raise DeviceError(
                        f"{self.name}: cudaHostRegister of {size} bytes of host memory failed ({err}); "
                        "set optimization.cuda.direct_copies false"
                    )
                users = _registered[address] = [0, view]
            users[0] += 1
        return address

    def unregister_host(self, handle: Any) -> None:
        with _register_lock:
            users = _registered.get(handle)
            if users is None:
                return
            users[0] -= 1
            if users[0] == 0:
                cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
                with torch.cuda.device(self.torch_device):
                    err = cudart.cudaHostUnregister(handle)
                del _registered[handle]  # only now: the view keeps the memory mapped until here
                if err != cudart.cudaError.success:
                    logger.warning("%s: cudaHostUnregister failed (%s)", self.name, err)

    def launch(self, stream: Any, work: Callable[[], None]) -> None:
        with self._issuing:
            _set_stream(stream)
            work()

    def capture(self, stream: Any, work: Callable[[], None]) -> Callable[[], None]:
        with _capture_lock:
            with torch.cuda.stream(stream):
                for _ in range(CAPTURE_WARMUP_RUNS):
                    work()
            stream.synchronize()  # load time
            pool = self._pools.get(id(stream))
            if pool is None:
                pool = self._pools[id(stream)] = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                    work()
            except RuntimeError as exc:
                raise DeviceError(
                    f"{self.name}: CUDA graph capture failed ({exc}); set optimization.cuda.graphs false"
                ) from exc
        replay: Callable[[], None] = graph.replay
        return replay

    def record(self, event: Any, stream: Any) -> None:
        with self._issuing:
            event.record(stream)

    def wait_event(self, stream: Any, event: Any) -> None:
        with self._issuing:
            stream.wait_event(event)

    def synchronize_event(self, event: Any) -> None:
        try:
            event.synchronize()
        except RuntimeError as exc:  # torch.AcceleratorError and older torch's CUDA RuntimeError
            raise DeviceError(f"{self.name}: {exc}") from exc

    def synchronize_stream(self, stream: Any) -> None:
        try:
            stream.synchronize()
        except RuntimeError as exc:
            raise DeviceError(f"{self.name}: {exc}") from exc

    def elapsed_ns(self, start: Any, end: Any) -> int:
        return int(start.elapsed_time(end) * 1e6)  # elapsed_time: milliseconds, ~0.5 us resolution

    def memory_used_bytes(self) -> int:
        return int(torch.cuda.memory_reserved(self.torch_device))

    def utilization(self) -> dict[str, float] | None:
        if importlib.util.find_spec("pynvml") is None:  # nvidia-ml-py: the 'gpu' extra
            return None
        try:
            return {
                "utilization": torch.cuda.utilization(self.torch_device) / 100,
                "memory_used_bytes": float(torch.cuda.device_memory_used(self.torch_device)),
                "memory_total_bytes": float(torch.cuda.get_device_properties(self.index).total_memory),
            }
        except Exception:  # NVML missing from the driver, or refusing: not reported
            return None
