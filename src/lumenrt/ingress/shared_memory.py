"""Triton's system shared-memory extension: a client on the same host puts tensors in a POSIX
shared-memory object, registers a region of it by name, and then sends region names and offsets
instead of tensor bytes (HTTP ``/v2/systemsharedmemory/...``, gRPC ``SystemSharedMemory*``, the
``shared_memory_region``/``_offset``/``_byte_size`` tensor parameters).

Inputs are read where they lie: the array handed to the engine is a view of the client's memory,
and admission copies it into the batch (the one copy). Outputs are written straight into the
client's region when the answer is encoded; the answer then carries no tensor bytes.

Invariants
  1. Off unless ``lumenrt serve --allow-client-shm``: the service has no registry, and every
     endpoint and tensor parameter of the extension answers 400 saying how to turn it on.
  2. A key is a shared-memory object's name, never a path: an optional leading ``/``, then 1-255
     of ``[A-Za-z0-9._-]``, not ``.`` or ``..``. It is opened as ``/dev/shm/<name>`` with
     ``O_NOFOLLOW``, and must be a regular file.
  3. Sizes are checked before anything is mapped or touched: at registration, ``offset +
     byte_size`` must fit in the object as it is (``fstat``); for each tensor, its offset and size
     must fit in the region, and an input's size must be its shape's.
  4. One thread: the registry is used from the event loop's thread only (as the service's
     counters are), so it holds no lock.
  5. A mapping outlives its registration while a request still holds a view of it: unregistering
     drops the registry's references and closes the descriptor; the mapping is closed at once if
     nothing views it, else CPython unmaps it when the last view is released. A request that
     started before the unregister therefore never reads unmapped memory.
  6. Bounded: at most ``max_per_client`` regions per client (its API key's name, else its
     address) and ``max_regions`` in all; each keeps one descriptor and one mapping.
  7. The sweeper (``sweep``, every ``SWEEP_INTERVAL_S`` from the app) unregisters a region whose
     object was unlinked (no links left) or shrank below the region, so a client that goes away
     leaves nothing mapped for long. A client that shrinks its object while the server is reading
     it can still fault the server (``SIGBUS``): the extension is for trusted co-located clients,
     which is why it is off by default.
"""

import contextlib
import logging
import mmap
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from lumenrt.protocols.errors import ServerError, bad_request
from lumenrt.protocols.parameters import SharedMemoryRef
from lumenrt.protocols.raw import from_raw, to_raw

logger = logging.getLogger(__name__)

SHM_ROOT = "/dev/shm"
OFF_MESSAGE = "system shared memory is off on this server (start it with lumenrt serve --allow-client-shm)"
SWEEP_INTERVAL_S = 1.0
MAX_NAME_CHARS = 256
_KEY = re.compile(r"/?([A-Za-z0-9._-]{1,255})")


def enabled(shm: "SharedMemoryRegistry | None", where: str = "") -> "SharedMemoryRegistry":
    """The registry, or the 400 that says the extension is off (invariant 1); ``where``: the tensor
    parameters that named a region (none: an endpoint)."""
    if shm is None:
        raise bad_request(f"{where}.shared_memory_region: {OFF_MESSAGE}" if where else OFF_MESSAGE)
    return shm


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int  # within the object
    byte_size: int
    client: str
    fd: int
    map: mmap.mmap
    view: memoryview  # the region: map[offset : offset + byte_size]

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def object_name(key: str) -> str:
    """The object's file name under ``SHM_ROOT`` for ``key``, or a 400 naming the key."""
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None or match.group(1) in (".", ".."):
        raise bad_request(
            f"key {key!r}: must be a shared-memory object name (an optional leading '/', then 1-255 "
            "letters, digits, '.', '_' or '-'), not a path"
        )
    return match.group(1)


class SharedMemoryRegistry:
    """The registered regions, by name (one namespace for every client, as Triton has)."""

    def __init__(self, max_per_client: int = 64, max_regions: int = 1024, root: str = SHM_ROOT) -> None:
        self.max_per_client = max_per_client
        self.max_regions = max_regions
        self.root = root
        self._regions: dict[str, Region] = {}
        self._per_client: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._regions)

    # ---- the endpoints --------------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int, client: str) -> None:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise bad_request(f"region name {name!r}: must be 1-{MAX_NAME_CHARS} printable characters")
        if name in self._regions:
            raise bad_request(f"region {name!r} is already registered (unregister it first)")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad_request(f"region {name!r}: {field} must be a non-negative integer, got {value!r}")
        if byte_size == 0:
            raise bad_request(f"region {name!r}: byte_size must be more than 0")
        if len(self._regions) >= self.max_regions:
            raise ServerError(429, f"region {name!r}: the server holds {self.max_regions} regions already")
        if self._per_client.get(client, 0) >= self.max_per_client:
            raise ServerError(
                429, f"region {name!r}: this client has {self.max_per_client} regions registered already"
            )
        path = os.path.join(self.root, object_name(key))
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise bad_request(f"region {name!r}: cannot open key {key!r}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise bad_request(f"region {name!r}: key {key!r} is not a shared-memory object")
            if offset + byte_size > info.st_size:
                raise bad_request(
                    f"region {name!r}: offset {offset} + byte_size {byte_size} is past the end of "
                    f"key {key!r} ({info.st_size} bytes)"
                )
            mapped = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        view = memoryview(mapped)[offset : offset + byte_size]
        self._regions[name] = Region(name, key, offset, byte_size, client, fd, mapped, view)
        self._per_client[client] = self._per_client.get(client, 0) + 1
        logger.info("shared memory: region %r registered (key %r, %d bytes)", name, key, byte_size)

    def unregister(self, name: str | None) -> None:
        """One region (unknown: 400), or every region (``name`` empty or None)."""
        if not name:
            for each in list(self._regions):
                self._drop(each)
            return
        if name not in self._regions:
            raise bad_request(f"region {name!r} is not registered")
        self._drop(name)

    def status(self, name: str | None) -> list[dict[str, Any]]:
        """Every region (``name`` empty or None), or the one named (unknown: 400)."""
        if not name:
            return [region.status() for region in self._regions.values()]
        return [self._region(name, "region").status()]

    # ---- tensors --------------------------------------------------------------------------------

    def read(self, ref: SharedMemoryRef, datatype: str, shape: tuple[int, ...], where: str) -> Any:
        """An input's array: a view of its bytes in the region (``where``: its parameters' path)."""
        return from_raw(self.target(ref, where), datatype, shape, where, bad_request)

    def target(self, ref: SharedMemoryRef, where: str) -> memoryview:
        """The bytes ``ref`` names, checked against its region."""
        region = self._region(ref.region, f"{where}.shared_memory_region")
        if ref.offset + ref.byte_size > region.byte_size:
            raise bad_request(
                f"{where}: shared_memory_offset {ref.offset} + shared_memory_byte_size {ref.byte_size} "
                f"is past the end of region {ref.region!r} ({region.byte_size} bytes)"
            )
        return region.view[ref.offset : ref.offset + ref.byte_size]

    # ---- upkeep ---------------------------------------------------------------------------------

    def sweep(self) -> list[str]:
        """Unregister the regions whose object was unlinked or shrank; their names."""
        gone: list[str] = []
        for name, region in list(self._regions.items()):
            try:
                info = os.fstat(region.fd)
            except OSError:
                gone.append(name)
                continue
            if info.st_nlink == 0 or info.st_size < region.offset + region.byte_size:
                gone.append(name)
        for name in gone:
            logger.info("shared memory: region %r unregistered (its object was unlinked or shrank)", name)
            self._drop(name)
        return gone

    def close(self) -> None:
        self.unregister(None)

    def _region(self, name: str, where: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise bad_request(f"{where}: no registered region {name!r}")
        return region

    def _drop(self, name: str) -> None:
        region = self._regions.pop(name)
        left = self._per_client[region.client] - 1
        if left:
            self._per_client[region.client] = left
        else:
            del self._per_client[region.client]
        os.close(region.fd)
        region.view.release()
        with contextlib.suppress(BufferError):  # else a request views it: unmapped with its last view
            region.map.close()


def write_shm_output(name: str, array: Any, target: memoryview, ref: SharedMemoryRef) -> tuple[str, int]:
    """Write an output into the shared memory its request named; its datatype and the bytes
    written. Its answer entry then has a name, datatype and shape, and neither data nor
    parameters (HTTP), or an empty ``raw_output_contents`` entry (gRPC), as Triton answers: its
    C++ client, perf_analyzer's, reads ``binary_data_size`` from any output that has parameters."""
    datatype, data = to_raw(array)
    size = len(data) if isinstance(data, bytes) else data.nbytes
    if size > len(target):
        raise bad_request(
            f"output {name!r}: needs {size} bytes but its shared_memory_byte_size is {len(target)} "
            f"(region {ref.region!r})"
        )
    target[:size] = data
    return datatype, size
