"""Triton's system shared-memory extension: a client on the same host puts tensors in a POSIX
shared-memory object, registers a region of it by name, and then sends region names and offsets
instead of tensor bytes (HTTP ``/v2/systemsharedmemory/...``, gRPC ``SystemSharedMemory*``, the
``shared_memory_region``/``_offset``/``_byte_size`` tensor parameters).

The server never maps a client's object. It keeps one descriptor per region and moves bytes with
``preadv`` (inputs, into memory of its own) and ``pwrite`` (outputs). A mapping cannot be made
safe against its client: the object is the client's, which can shrink it with ``ftruncate`` (or
make it a hole the file system cannot fill) at any moment, and the server's next touch of a page
past the new end is a ``SIGBUS`` that kills the whole process. A check before the access (``fstat``)
does not close that: the client can truncate between the check and the copy, and POSIX objects
from ``shm_open`` cannot be sealed (only memfds take ``F_SEAL_SHRINK``). A read or write system
call on the descriptor has no such window: past the end, ``pread`` returns a short count and
``pwrite`` extends the object; the kernel reports, it never faults the caller.

Invariants
  1. Off unless ``lumenrt serve --allow-client-shm``: the service has no registry, and every
     endpoint and tensor parameter of the extension answers 400 saying how to turn it on.
  2. A key is a shared-memory object's name, never a path: an optional leading ``/``, then 1-255
     of ``[A-Za-z0-9._-]``, not ``.`` or ``..``. It is opened as ``/dev/shm/<name>`` with
     ``O_NOFOLLOW``, and must be a regular file.
  3. A key never names one of lumenrt's own segments: a name starting with ``SHM_PREFIX``
     (``lumenrt.``, how ``lumenrt.native.shm`` names every segment it creates) is refused before
     anything is opened, and an object that is one of those segments under another name (a hard
     link: same device and inode) is refused once opened. The engine's process-mode memory is an
     unnamed memfd, which no key can name. With ``--client-shm-prefix P``, a key's name must also
     start with ``P``.
  4. Sizes are checked before anything is read or allocated: at registration, ``offset +
     byte_size`` must fit in the object as it is (``fstat``); for each tensor, its offset and size
     must fit in the region, an input's size must be its shape's (so a fixed-size input is bounded
     by the element limit), and a BYTES input is at most ``max_bytes_tensor`` (as a body is).
  5. Nothing the client does to its object can fault the server (the reasoning above): inputs are
     copied out with ``preadv``, outputs in with ``pwrite``, never through a mapping. Before each
     copy ``fstat`` refuses an object that was unlinked or is smaller than the tensor's end (a 400
     naming the region); a read that comes back short (the object shrank during it) is refused the
     same way. A write racing a truncate re-extends the object, within the region's bounds; the
     client sees its own doing, the server nothing. Cost: an input is one copy more than a view
     (region -> the request's own buffer, then admission copies it into the batch); an output is
     one copy, as before. An array handed to the engine is the server's memory alone, so it never
     changes under a model either.
  6. One thread: the registry, its descriptors and every copy are used from the event loop's
     thread only (as the service's counters are), so it holds no lock. Unregistering closes the
     region's descriptor and sets its ``fd`` to -1 in the same step; an output target taken before
     then (at parse time; the write is at encode time) sees -1 and refuses (400 naming the region),
     so it never writes through a descriptor number the process reused for something else.
  7. Bounded: at most ``max_per_client`` regions per client (its API key's name, else its
     address) and ``max_regions`` in all; each keeps one descriptor.
  8. The sweeper (``sweep``, every ``SWEEP_INTERVAL_S`` from the app) unregisters a region whose
     object was unlinked (no links left) or shrank below the region, so a client that goes away
     leaves no descriptor open for long. Invariant 5 does not depend on it.
"""

import logging
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np

from lumenrt.native.shm import SHM_PREFIX
from lumenrt.protocols.errors import ServerError, bad_request
from lumenrt.protocols.parameters import SharedMemoryRef
from lumenrt.protocols.raw import LE_DTYPES, Array, check_size, from_raw, to_raw

logger = logging.getLogger(__name__)

SHM_ROOT = "/dev/shm"
OFF_MESSAGE = "system shared memory is off on this server (start it with lumenrt serve --allow-client-shm)"
SWEEP_INTERVAL_S = 1.0
MAX_NAME_CHARS = 256
MAX_BYTES_TENSOR = 64 << 20  # a BYTES input's bytes (the server's default body limit)
_KEY = re.compile(r"/?([A-Za-z0-9._-]{1,255})")
_PREFIX = re.compile(r"/?([A-Za-z0-9._-]{0,254})")


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
    fd: int  # -1 once unregistered (invariant 6)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """Where an output goes: ``ref``'s bytes in ``region`` (checked against it when the request was
    parsed; written by :func:`write_shm_output` when the answer is encoded)."""

    region: Region
    ref: SharedMemoryRef

    def __len__(self) -> int:
        return self.ref.byte_size


def object_name(key: str) -> str:
    """The object's file name under ``SHM_ROOT`` for ``key``, or a 400 naming the key."""
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None or match.group(1) in (".", ".."):
        raise bad_request(
            f"key {key!r}: must be a shared-memory object name (an optional leading '/', then 1-255 "
            "letters, digits, '.', '_' or '-'), not a path"
        )
    return match.group(1)


def key_prefix(prefix: str) -> str:
    """The object-name prefix every key must start with (``--client-shm-prefix``; '' = any), as an
    object name starts (no leading '/'); ValueError if it is not one, or names lumenrt's own."""
    match = _PREFIX.fullmatch(prefix) if isinstance(prefix, str) else None
    if match is None:
        raise ValueError(
            f"client shared-memory prefix {prefix!r}: must be the start of an object name (an optional "
            "leading '/', then at most 254 letters, digits, '.', '_' or '-')"
        )
    name = match.group(1)
    if name.startswith(SHM_PREFIX):
        raise ValueError(
            f"client shared-memory prefix {prefix!r}: {SHM_PREFIX}* names lumenrt's own segments"
        )
    return name


class SharedMemoryRegistry:
    """The registered regions, by name (one namespace for every client, as Triton has)."""

    def __init__(
        self,
        max_per_client: int = 64,
        max_regions: int = 1024,
        root: str = SHM_ROOT,
        prefix: str = "",
        max_bytes_tensor: int = MAX_BYTES_TENSOR,
    ) -> None:
        self.max_per_client = max_per_client
        self.max_regions = max_regions
        self.root = root
        self.prefix = key_prefix(prefix)
        self.max_bytes_tensor = max_bytes_tensor
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
        file_name = object_name(key)
        if file_name.startswith(SHM_PREFIX):  # invariant 3
            raise bad_request(
                f"region {name!r}: key {key!r} names one of lumenrt's own shared-memory segments "
                f"({SHM_PREFIX}*), which clients cannot register"
            )
        if not file_name.startswith(self.prefix):
            raise bad_request(
                f"region {name!r}: key {key!r}: this server takes only objects whose names start with "
                f"{self.prefix!r} (--client-shm-prefix)"
            )
        try:
            fd = os.open(os.path.join(self.root, file_name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise bad_request(f"region {name!r}: cannot open key {key!r}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise bad_request(f"region {name!r}: key {key!r} is not a shared-memory object")
            if self._is_lumenrt_segment(info):
                raise bad_request(
                    f"region {name!r}: key {key!r} is another name (a link) of one of lumenrt's own "
                    f"shared-memory segments ({SHM_PREFIX}*), which clients cannot register"
                )
            if offset + byte_size > info.st_size:
                raise bad_request(
                    f"region {name!r}: offset {offset} + byte_size {byte_size} is past the end of "
                    f"key {key!r} ({info.st_size} bytes)"
                )
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = Region(name, key, offset, byte_size, client, fd)
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

    def read(self, ref: SharedMemoryRef, datatype: str, shape: tuple[int, ...], where: str) -> Array:
        """An input's array, over a copy of its bytes in the region that only the server holds
        (``where``: its parameters' path). Sizes are checked before the copy is allocated."""
        region = self._checked(ref, where)
        if datatype in LE_DTYPES:
            check_size(datatype, shape, ref.byte_size, where, bad_request)
        elif ref.byte_size > self.max_bytes_tensor:
            raise bad_request(
                f"{where}: shared_memory_byte_size {ref.byte_size} is more than a tensor may have here "
                f"({self.max_bytes_tensor} bytes)"
            )
        copy = np.empty(ref.byte_size, np.uint8)
        _read_into(region, ref.offset, copy.data, where)
        return from_raw(copy.data, datatype, shape, where, bad_request)

    def target(self, ref: SharedMemoryRef, where: str) -> OutputTarget:
        """Where an output named ``ref`` goes, checked against its region."""
        return OutputTarget(self._checked(ref, where), ref)

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

    def _checked(self, ref: SharedMemoryRef, where: str) -> Region:
        """``ref``'s region, with ``ref`` inside it (invariant 4)."""
        region = self._region(ref.region, f"{where}.shared_memory_region")
        if ref.offset + ref.byte_size > region.byte_size:
            raise bad_request(
                f"{where}: shared_memory_offset {ref.offset} + shared_memory_byte_size {ref.byte_size} "
                f"is past the end of region {ref.region!r} ({region.byte_size} bytes)"
            )
        return region

    def _is_lumenrt_segment(self, info: os.stat_result) -> bool:
        """Whether the opened object is one of lumenrt's named segments under ``root`` (invariant
        3; registration only, so a scan of lumenrt's few names is cheap)."""
        try:
            names = [n for n in os.listdir(self.root) if n.startswith(SHM_PREFIX)]
        except OSError:
            return False
        for each in names:
            try:
                other = os.stat(os.path.join(self.root, each), follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
                return True
        return False

    def _drop(self, name: str) -> None:
        region = self._regions.pop(name)
        left = self._per_client[region.client] - 1
        if left:
            self._per_client[region.client] = left
        else:
            del self._per_client[region.client]
        fd, region.fd = region.fd, -1  # invariant 6: a target taken before now sees -1
        os.close(fd)


def _object_fits(region: Region, end: int, where: str) -> int:
    """The region's descriptor, once ``fstat`` shows its object still linked and at least ``end``
    bytes of the region long (``end``: from the region's start); else a 400 naming the region."""
    fd = region.fd
    if fd < 0:
        raise bad_request(f"{where}: region {region.name!r} was unregistered while the request ran")
    try:
        info = os.fstat(fd)
    except OSError as exc:
        raise bad_request(
            f"{where}: region {region.name!r}: cannot use key {region.key!r}: {exc.strerror}"
        ) from None
    if info.st_nlink == 0:
        raise bad_request(
            f"{where}: region {region.name!r}: its object (key {region.key!r}) was unlinked; "
            "create it and register the region again"
        )
    if info.st_size < region.offset + end:
        raise bad_request(
            f"{where}: region {region.name!r}: its object (key {region.key!r}) is now {info.st_size} "
            f"bytes, shorter than the region needs here ({region.offset + end})"
        )
    return fd


def _read_into(region: Region, at: int, into: memoryview, where: str) -> None:
    """Copy ``len(into)`` bytes from ``at`` in the region (invariant 5)."""
    fd = _object_fits(region, at + len(into), where)
    done, start = 0, region.offset + at
    while done < len(into):
        try:
            got = os.preadv(fd, [into[done:]], start + done)
        except OSError as exc:
            raise bad_request(
                f"{where}: region {region.name!r}: cannot read key {region.key!r}: {exc.strerror}"
            ) from None
        if got == 0:  # past the end: the object shrank since the check
            raise bad_request(
                f"{where}: region {region.name!r}: its object (key {region.key!r}) shrank while it was read"
            )
        done += got


def _write_from(region: Region, at: int, data: memoryview, where: str) -> None:
    """Copy ``data`` to ``at`` in the region (invariant 5)."""
    fd = _object_fits(region, at + len(data), where)
    done, start = 0, region.offset + at
    while done < len(data):
        try:
            wrote = os.pwrite(fd, data[done:], start + done)
        except OSError as exc:
            raise bad_request(
                f"{where}: region {region.name!r}: cannot write key {region.key!r}: {exc.strerror}"
            ) from None
        if wrote == 0:  # a regular file takes at least one byte or fails: never expected
            raise bad_request(f"{where}: region {region.name!r}: cannot write key {region.key!r}")
        done += wrote


def write_shm_output(name: str, array: Any, target: OutputTarget, ref: SharedMemoryRef) -> tuple[str, int]:
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
    _write_from(target.region, ref.offset, memoryview(data).cast("B"), f"output {name!r}")
    return datatype, size
