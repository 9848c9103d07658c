"""The response cache: answers a request that repeats one already answered, without the queue.

Triton's response cache, for models whose config says ``response_cache: {enable: true}``, within
one server-wide byte budget (``lumenrt serve --cache-size-bytes``; 0, the default, is no cache).

Key: a BLAKE2b digest (16 bytes) over the model name, its version, the load id of the model
runtime (a reloaded model never answers from its old weights), the requested output names in the
order asked, and for every input (sorted by name) its name, V2 datatype, numpy dtype and shape: all
these small fields as the ``repr`` of one list (strings quoted and escaped, so no field can run
into the next); then every input's raw bytes, fed to the hash from the array's own buffer (no
concatenated copy; their lengths are fixed by dtype and shape; a BYTES element goes with its
length). The model and version are in the key, so an entry is never served across models or
versions; the statistics are kept per (model, version) too.

Value: the requested outputs, copied and made read-only (hits share them; nothing may write into
them), and their size in bytes (data bytes; a BYTES tensor counts the length of each element).
The entries are kept in least-recently-used order; storing past the budget evicts from the least
recently used end; an entry larger than the whole budget is not stored.

Invariants:
  1. Every method runs on the server's event loop thread (the front ends and ``InferenceService``
     call it there); it holds no lock and needs none.
  2. ``used_bytes`` is the sum of the sizes of the entries held, and never exceeds ``budget_bytes``
     after a call returns.
  3. An array handed out by ``lookup`` is never written: it is a read-only copy owned by the cache
     (and by the answers still encoding it, after its entry is evicted).
"""

import hashlib
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
_UTF8, _PASS = "utf-8", "surrogatepass"  # a str with lone surrogates still has bytes to hash
DIGEST_BYTES = 16  # 128 bits: a collision between two live entries is not a practical concern


@dataclass(frozen=True, slots=True)
class CacheInput:
    """One input tensor as it goes into the key."""

    name: str
    datatype: str  # KServe V2 name (FP32, BYTES ...)
    array: Array


@dataclass(frozen=True, slots=True)
class CacheKey:
    model: str
    version: int
    digest: bytes


@dataclass(slots=True)
class CacheStats:
    """Triton's ``cache_hit`` / ``cache_miss`` for one model version: counts and cumulative ns
    (a hit: key and lookup; a miss: key, lookup and the store of the answer)."""

    hits: int = 0
    hit_ns: int = 0
    misses: int = 0
    miss_ns: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    outputs: tuple[tuple[str, Array], ...]
    size_bytes: int


class ResponseCache:
    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self._stats: dict[tuple[str, int], CacheStats] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def key(
        self, model: str, version: int, load_id: int, inputs: Sequence[CacheInput], outputs: Sequence[str]
    ) -> CacheKey:
        """The key of a request (see the module's docstring for what goes in, in which order)."""
        ordered = sorted(inputs, key=_by_name) if len(inputs) > 1 else inputs
        # every small field in one repr of a tuple (strings quoted and escaped by repr: no field
        # can run into the next); the data follow, their lengths fixed by dtype and shape
        fields: list[Any] = [model, version, load_id, tuple(outputs)]
        for item in ordered:
            array = item.array
            fields.append((item.name, item.datatype, array.dtype.str, array.shape))
        h = hashlib.blake2b(repr(fields).encode(_UTF8, _PASS), digest_size=DIGEST_BYTES)
        for item in ordered:
            array = item.array
            if array.dtype.kind == "O":  # BYTES: each element with its length
                _objects(h, array)
            else:  # the array's own buffer (a contiguous copy only when it is strided)
                h.update((array if array.flags.c_contiguous else np.ascontiguousarray(array)).data)
        return CacheKey(model, version, h.digest())

    def lookup(self, key: CacheKey, started_ns: int) -> tuple[tuple[str, Array], ...] | None:
        """The cached outputs (read-only) of ``key``, counted as a hit; None, counted as a miss.
        ``started_ns`` (time.monotonic_ns) is when the key began to be computed: the time from it
        is added to the hit or miss time."""
        entry = self._entries.get(key.digest)
        stats = self.stats(key.model, key.version)
        if entry is None:
            stats.misses += 1
            stats.miss_ns += time.monotonic_ns() - started_ns
            return None
        self._entries.move_to_end(key.digest)
        stats.hits += 1
        stats.hit_ns += time.monotonic_ns() - started_ns
        return entry.outputs

    def store(self, key: CacheKey, outputs: Iterable[tuple[str, Array]]) -> bool:
        """Keep a copy of ``outputs`` under ``key`` (after a miss); False when it is larger than the
        whole budget (not stored). The time it takes is added to the miss time."""
        started = time.monotonic_ns()
        try:
            kept = tuple((name, _frozen_copy(a)) for name, a in outputs)
            size = sum(_size_bytes(a) for _, a in kept)
            if size > self.budget_bytes:
                return False
            old = self._entries.pop(key.digest, None)
            if old is not None:
                self.used_bytes -= old.size_bytes
            while self._entries and self.used_bytes + size > self.budget_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.used_bytes -= evicted.size_bytes
                self.evictions += 1
            self._entries[key.digest] = _Entry(kept, size)
            self.used_bytes += size
            return True
        finally:
            self.stats(key.model, key.version).miss_ns += time.monotonic_ns() - started

    def stats(self, model: str, version: int) -> CacheStats:
        """The counters of one model version (created at zero on first use)."""
        found = self._stats.get((model, version))
        if found is None:
            found = self._stats[(model, version)] = CacheStats()
        return found

    def peek_stats(self, model: str, version: int) -> CacheStats:
        """The counters of one model version, without creating them (zeros if never used)."""
        return self._stats.get((model, version)) or CacheStats()


def _by_name(item: CacheInput) -> str:
    return item.name


def _objects(h: Any, array: Array) -> None:
    h.update(b"O%d:" % array.size)
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode(_UTF8, _PASS)
        h.update(b"%d:" % len(data))
        h.update(data)


def _frozen_copy(array: Array) -> Array:
    out = array.copy(order="C")
    out.setflags(write=False)
    return out


def _size_bytes(array: Array) -> int:
    if array.dtype.kind == "O":
        return sum(len(x) if isinstance(x, (bytes, str)) else 8 for x in array.reshape(-1))
    return int(array.nbytes)
