"""Where memory lives, read from procfs, and binding it to a NUMA node through the kernel (no libnuma).

What is read, below ``root`` (``/`` on a real machine; a fake tree in the tests):
  - ``proc/<pid>/numa_maps``: one line per mapping (VMA) of the process, its start address, its
    memory policy (``default``, ``bind:0``, ``prefer:1``, ``interleave:0-1``, ...) and the pages
    resident on each node (``N0=512``), counted in the mapping's ``kernelpagesize_kB`` (2048 for a
    hugetlbfs mapping; a transparent huge page counts as its base pages). A mapping with nothing
    resident has no counts and no page size; it reads as the base page size and no pages.

Syscalls, made through ``libc.syscall`` by number (x86_64 and aarch64 only; elsewhere binding
raises LocalityError):
  - ``mbind(2)``: ``bind_memory`` puts a range under MPOL_BIND to one node, moving the pages already
    there (MPOL_MF_MOVE);
  - ``set_mempolicy(2)`` / ``get_mempolicy(2)``: the calling thread's policy for new pages
    (``set_thread_memory_node``, ``thread_memory_node``).

On a machine with one node every page is local: a test on such a machine can show 100% local on
node 0 and nothing more; seeing remote pages needs a machine with two nodes.
"""

import ctypes
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

# <linux/mempolicy.h>
MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_MF_MOVE = 1 << 1
_MPOL_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)  # STATIC_NODES, RELATIVE_NODES, NUMA_BALANCING

# (mbind, set_mempolicy, get_mempolicy): arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h (which aarch64 uses).
_SYSCALLS = {"x86_64": (237, 238, 239), "aarch64": (235, 237, 236)}

# Nodemask words: 16 x 64 bits = 1024 nodes, the kernel's largest MAX_NUMNODES (NODES_SHIFT <= 10);
# get_mempolicy(2) fails with EINVAL when the mask holds fewer bits than the machine's possible nodes.
_MASK_WORDS = 16
_BITS = 8 * ctypes.sizeof(ctypes.c_ulong)

# Address, then the policy: a mode (two of them hold a space), an optional =flags, an optional
# :nodelist (see mpol_to_str in mm/mempolicy.c).
_HEAD = re.compile(
    r"([0-9a-fA-F]+) ((?:weighted interleave|prefer \(many\)|[a-z]+)(?:=[a-z]+)?(?::[0-9,-]*)?)(?: (.*))?"
)


class LocalityError(ValueError):
    """A numa_maps line that cannot be read, or binding asked for where it is not supported."""


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int  # the VMA's first address (numa_maps gives no end)
    policy: str  # as the kernel writes it: "default", "bind:0", "interleave:0-1", ...
    pages_by_node: dict[int, int]  # resident pages per node, in pages of page_bytes
    page_bytes: int  # kernelpagesize_kB x 1024 (the base page size when not given)
    file: str | None  # the file mapped, if any (octal escapes such as \040 decoded)
    anon: bool  # no file backs it (heap, stack, anonymous mmap)

    @property
    def resident_bytes(self) -> int:
        return sum(self.pages_by_node.values()) * self.page_bytes


@dataclass(frozen=True, slots=True)
class Locality:
    node: int
    local_bytes: int  # resident on ``node``
    total_bytes: int  # resident anywhere

    @property
    def share(self) -> float | None:
        """local / total; None when nothing is resident."""
        return self.local_bytes / self.total_bytes if self.total_bytes else None


def read_numa_maps(pid: int | str = "self", root: Path | str = "/") -> list[Mapping]:
    """The mappings of process ``pid`` in ``proc/<pid>/numa_maps`` below ``root``."""
    path = Path(root) / "proc" / str(pid) / "numa_maps"
    maps = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            maps.append(_parse_line(line, f"{path}:{number}"))
    return maps


def thread_policy(pid: int, tid: int, root: Path | str = "/") -> str | None:
    """The memory policy thread ``tid`` of ``pid`` runs under, as the kernel writes it: the first
    line of its ``numa_maps`` (a mapping without a policy of its own shows the thread's). Reads one
    line, so the kernel walks one mapping, not the process (None: no mapping, or the thread ended)."""
    path = Path(root) / "proc" / str(pid) / "task" / str(tid) / "numa_maps"
    try:
        with path.open() as f:
            line = f.readline()
    except OSError:
        return None
    return _parse_line(line, f"{path}:1").policy if line.strip() else None


def _parse_line(line: str, where: str) -> Mapping:
    head = _HEAD.fullmatch(line.rstrip())
    if head is None:
        raise LocalityError(f"{where}: {line!r} is not 'ADDRESS POLICY [key=value ...]'")
    pages: dict[int, int] = {}
    page_bytes = mmap.PAGESIZE
    file: str | None = None
    for token in (head.group(3) or "").split():
        key, eq, value = token.partition("=")
        if key == "file" and eq:
            file = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), value)
        elif re.fullmatch(r"N\d+", key) or key == "kernelpagesize_kB":
            if not value.isdigit():
                raise LocalityError(f"{where}: {key}={value!r} is not a number")
            if key == "kernelpagesize_kB":
                page_bytes = int(value) * 1024
            else:
                pages[int(key[1:])] = int(value)
        # other fields (anon=, dirty=, mapped=, heap, stack, huge, ...) are not needed here
    return Mapping(int(head.group(1), 16), head.group(2), pages, page_bytes, file, file is None)


def locality(maps: list[Mapping], node: int, ranges: list[tuple[int, int]] | None = None) -> Locality:
    """How much of the resident memory in ``maps`` is on ``node``; with ``ranges`` ([start, end)
    pairs), only the mappings whose start lies in one of them."""
    local = total = 0
    for m in maps:
        if ranges is not None and not any(start <= m.start < end for start, end in ranges):
            continue
        local += m.pages_by_node.get(node, 0) * m.page_bytes
        total += m.resident_bytes
    return Locality(node, local, total)


# ---- binding ---------------------------------------------------------------------------------------


def buffer_address(buf: "WriteableBuffer") -> int:
    """The address of the first byte of a writable buffer; valid while ``buf`` lives and keeps its
    size. The ctypes view is dropped at once, so the buffer can be closed or resized afterwards."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def bind_memory(address: int, length: int, node: int, *, move: bool = True) -> None:
    """mbind(2) [address, address + length) to ``node`` (MPOL_BIND); ``move`` moves the pages
    already resident elsewhere (MPOL_MF_MOVE). ``address`` must be page-aligned."""
    if address % mmap.PAGESIZE:
        raise ValueError(f"address {address:#x} is not page-aligned (page size {mmap.PAGESIZE})")
    if length < 0:
        raise ValueError(f"length {length} is negative")
    mask = _nodemask(node)
    _syscall(
        "mbind",
        node,
        ctypes.c_void_p(address),
        ctypes.c_ulong(length),
        ctypes.c_long(MPOL_BIND),
        mask,
        ctypes.c_ulong(len(mask) * _BITS + 1),  # the kernel reads maxnode - 1 bits
        ctypes.c_ulong(MPOL_MF_MOVE if move else 0),
    )


def set_thread_memory_node(node: int | None) -> None:
    """set_mempolicy(2) for the calling thread: new pages on ``node`` only (MPOL_BIND), or the
    default policy again (MPOL_DEFAULT) for None."""
    if node is None:
        _syscall("set_mempolicy", None, ctypes.c_long(MPOL_DEFAULT), None, ctypes.c_ulong(0))
        return
    mask = _nodemask(node)
    _syscall("set_mempolicy", node, ctypes.c_long(MPOL_BIND), mask, ctypes.c_ulong(len(mask) * _BITS + 1))


def thread_memory_node() -> int | None:
    """The node the calling thread's policy binds or prefers, if it names exactly one; else None."""
    mode = ctypes.c_int(0)
    mask = (ctypes.c_ulong * _MASK_WORDS)()
    _syscall(
        "get_mempolicy",
        None,
        ctypes.byref(mode),
        mask,
        ctypes.c_ulong(_MASK_WORDS * _BITS + 1),
        ctypes.c_void_p(None),
        ctypes.c_ulong(0),
    )
    nodes = [w * _BITS + b for w, word in enumerate(mask) for b in range(_BITS) if word >> b & 1]
    if mode.value & ~_MPOL_MODE_FLAGS in (MPOL_BIND, MPOL_PREFERRED) and len(nodes) == 1:
        return nodes[0]
    return None


def _nodemask(node: int) -> ctypes.Array[ctypes.c_ulong]:
    if node < 0:
        raise ValueError(f"node {node} is negative")
    mask = (ctypes.c_ulong * max(_MASK_WORDS, node // _BITS + 1))()
    mask[node // _BITS] = 1 << (node % _BITS)
    return mask


def _syscall(name: str, node: int | None, *args: object) -> None:
    machine = os.uname().machine
    numbers = _SYSCALLS.get(machine)
    if numbers is None:
        raise LocalityError(f"memory binding is not supported on {machine} (only {', '.join(_SYSCALLS)})")
    number = numbers[("mbind", "set_mempolicy", "get_mempolicy").index(name)]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(number), *args) == -1:
        errno = ctypes.get_errno()
        target = "" if node is None else f" to node {node}"
        raise OSError(errno, f"{name}{target}: {os.strerror(errno)}")
