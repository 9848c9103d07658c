"""The native core, seen from Python.

Every structure lives in a caller-given, 64-byte-aligned buffer (usually a :class:`Region`), so the
same ring or pool serves threads of one process and processes sharing a shared-memory segment::

    region = Region.anonymous(ring_required_bytes(1024))     # shared with children forked later
    ring = Ring.create(region, "mpmc", 1024)
    ring.push(42, slot=3, nbytes=600)
    item = ring.pop(timeout_s=1.0)                            # Item(request_id=42, slot=3, ...)

In another process, ``Ring.attach(Region.attach_shm(name), offset)`` maps the same ring.

Every thread that uses a ring holds an entry of its agent table while it lives (an exited thread's
entry is reused once the table is full; a dead process's by ``recover``). The table's size is chosen
at create: ``Ring.create(..., max_agents=n)`` in ``ring_required_bytes(capacity, max_agents=n)``
bytes, 0 for ``DEFAULT_AGENTS``, at most ``MAX_AGENTS``; ``agent_table`` sizes one for a count of
threads.
"""

import numpy as np

from lumenrt.native._core import (
    CACHELINE,
    DEFAULT_AGENTS,
    HOLD_DONE,
    LATCH_STRIDE,
    MAX_AGENTS,
    NOTIFIER_BYTES,
    BumpArena,
    Item,
    Latches,
    LrtError,
    Notifier,
    PoolExhausted,
    Region,
    Ring,
    RingClosed,
    SlabPool,
    bump_required_bytes,
    hold_init,
    hold_required_bytes,
    now_ns,
    process_alive,
    ring_required_bytes,
    set_parent_death_signal,
    slab_required_bytes,
)
from lumenrt.native.layout import Layout
from lumenrt.native.shm import (
    SHM_PREFIX,
    PassedFd,
    clean_stale,
    create_shared,
    create_unnamed,
    leftover_segments,
    map_passed,
)


def latches_required_bytes(n: int) -> int:
    return n * LATCH_STRIDE


RING_KINDS: tuple[str, ...] = ("mpmc", "spsc", "naive", "batched")


def agent_table(threads: int) -> int:
    """The ``max_agents`` for a ring that ``threads`` threads may use at once: rounded up to whole
    64-entry words (entries up to the word's end cost 64 bytes each and nothing on the hot path).
    ValueError past ``MAX_AGENTS``: the caller names what needs that many."""
    if threads < 1 or threads > MAX_AGENTS:
        raise ValueError(f"threads {threads}: a ring's agent table holds 1 to {MAX_AGENTS}")
    return min(-(-threads // 64) * 64, MAX_AGENTS)


def make_ring(
    kind: str, capacity: int, *, shared: bool = True, spin_iters: int = -1, max_agents: int = 0
) -> Ring:
    """A ring in its own anonymous region (shared with processes forked afterwards)."""
    region = Region.anonymous(ring_required_bytes(capacity, max_agents))
    return Ring.create(region, kind, capacity, shared=shared, spin_iters=spin_iters, max_agents=max_agents)


# The lrt_desc layout (native/include/lrt/common.h) as a numpy dtype, for reading a hold.
DESC_DTYPE = np.dtype(
    [
        ("request_id", "<u8"),
        ("slot", "<u4"),
        ("nbytes", "<u4"),
        ("t_ns", "<u8"),
        ("aux0", "<u8"),
        ("aux1", "<u8"),
        ("aux2", "<u8"),
        ("kind", "<u4"),
        ("flags", "<u4"),
    ]
)
HOLD_HEADER_BYTES = 64

__all__ = [
    "CACHELINE",
    "DEFAULT_AGENTS",
    "DESC_DTYPE",
    "HOLD_DONE",
    "HOLD_HEADER_BYTES",
    "LATCH_STRIDE",
    "MAX_AGENTS",
    "NOTIFIER_BYTES",
    "RING_KINDS",
    "SHM_PREFIX",
    "BumpArena",
    "Item",
    "Latches",
    "Layout",
    "LrtError",
    "Notifier",
    "PassedFd",
    "PoolExhausted",
    "Region",
    "Ring",
    "RingClosed",
    "SlabPool",
    "agent_table",
    "bump_required_bytes",
    "clean_stale",
    "create_shared",
    "create_unnamed",
    "hold_init",
    "hold_required_bytes",
    "latches_required_bytes",
    "leftover_segments",
    "make_ring",
    "map_passed",
    "now_ns",
    "process_alive",
    "ring_required_bytes",
    "set_parent_death_signal",
    "slab_required_bytes",
]
