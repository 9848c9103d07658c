"""Named shared-memory segments: naming, one owner, cleanup after crashes.

Names are ``lumenrt.<owner pid>.<n>.<tag>``. The creating process owns a segment and is the only
one that unlinks it (on ``Region.close()``, on garbage collection, or at interpreter exit); other
processes attach and only unmap. A segment whose owner died without unlinking is stale and is
removed by :func:`clean_stale`, which the server runs at start.
"""

import atexit
import contextlib
import itertools
import os
import weakref

from lumenrt.native._core import Region, clean_stale_shm, unlink_shm

SHM_PREFIX = "lumenrt."
_SHM_DIR = "/dev/shm"

_counter = itertools.count()
_owned: "weakref.WeakSet[Region]" = weakref.WeakSet()
_owned_names: dict[str, int] = {}  # name -> owner pid, for the exit hook


def create_shared(size_bytes: int, tag: str = "seg") -> Region:
    """Create and own a new named segment of ``size_bytes`` usable bytes."""
    if not tag or not all(c.isalnum() or c in "._-" for c in tag):
        raise ValueError(f"tag {tag!r}: letters, digits, '.', '_' or '-'")
    name = f"{SHM_PREFIX}{os.getpid()}.{next(_counter)}.{tag}"
    region = Region.create_shm(name, size_bytes)
    _owned.add(region)
    _owned_names[name] = os.getpid()
    return region


def clean_stale(prefix: str = SHM_PREFIX) -> list[str]:
    """Unlink segments named ``prefix*`` whose owner process is gone; returns their names."""
    return clean_stale_shm(prefix)


def leftover_segments(prefix: str = SHM_PREFIX) -> list[str]:
    """Names of segments under /dev/shm starting with ``prefix`` (live or stale)."""
    try:
        return sorted(n for n in os.listdir(_SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


@atexit.register
def _unlink_owned_at_exit() -> None:
    pid = os.getpid()
    for region in list(_owned):
        if region.closed:
            continue
        # views still alive at exit: the mapping goes with the process; unlinked below
        with contextlib.suppress(BufferError):
            region.close()
    for name, owner in _owned_names.items():
        if owner == pid:
            unlink_shm(name)
