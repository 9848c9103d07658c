"""Shared memory between the engine and its worker processes.

Unnamed (preferred, process mode): ``create_unnamed`` makes a memfd and maps it; worker processes
receive the descriptor when they are spawned (``PassedFd``) and map it too. Nothing is in
/dev/shm, so nothing needs unlinking after any exit, SIGKILL included: the kernel frees the memory
with the last mapping and descriptor.

Named segments (``create_shared``; the demo and the queue benchmarks):

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
from typing import Any

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


class PassedFd:
    """A descriptor handed to a process started with multiprocessing's spawn: pickled while that
    process starts, it travels as an inherited descriptor (multiprocessing's DupFd), so the
    child gets its own descriptor of the same open file. The child owns (and closes) what it got."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        from multiprocessing import reduction

        return (_passed_fd, (reduction.DupFd(self.fd),))


def _passed_fd(dup: Any) -> PassedFd:
    return PassedFd(dup.detach())


def create_unnamed(size_bytes: int, tag: str = "seg") -> tuple[Region, int]:
    """A shared mapping of a new memfd of ``size_bytes`` (zeroed), and the descriptor: keep it to
    hand to processes started later (``PassedFd``), close it when none will be."""
    fd = os.memfd_create(f"lumenrt.{tag}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size_bytes)
        return Region.map_fd(fd, size_bytes), fd
    except BaseException:
        os.close(fd)
        raise


def map_passed(passed: PassedFd, size_bytes: int) -> Region:
    """In the child: map the memory behind a descriptor it received, then close the descriptor."""
    try:
        return Region.map_fd(passed.fd, size_bytes)
    finally:
        os.close(passed.fd)


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
