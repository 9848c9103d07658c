"""Memory locality (placement/memory.py): numa_maps parsed from a fake procfs tree, locality counted
over a fake two-node process, and binding through mbind(2)/set_mempolicy(2) on this machine.

This machine has one NUMA node, so the real-memory tests can only show every page local on node 0;
remote pages need a machine with two nodes."""

import errno
import mmap
import threading
from pathlib import Path

import pytest

from lumenrt.placement.memory import (
    Locality,
    LocalityError,
    Mapping,
    bind_memory,
    buffer_address,
    locality,
    read_numa_maps,
    set_thread_memory_node,
    thread_memory_node,
)

NUMA = Path("/proc/self/numa_maps").exists()
needs_numa = pytest.mark.skipif(not NUMA, reason="no /proc/self/numa_maps (kernel without NUMA)")

FAKE_MAPS = """\
55d0a1c00000 default file=/usr/bin/cat mapped=2 N0=2 kernelpagesize_kB=4
55d0a2e00000 default heap anon=33 dirty=33 active=0 N0=33 kernelpagesize_kB=4
7f12a0000000 bind:0 anon=512 dirty=512 active=0 N0=512 kernelpagesize_kB=4
7f12b0000000 prefer:1 anon=256 dirty=256 N1=256 kernelpagesize_kB=4
7f12c0000000 interleave:0-1 anon=100 dirty=100 N0=50 N1=50 kernelpagesize_kB=4
7f1300000000 bind=static:1 file=/dev/hugepages/buf\\040one huge dirty=4 N0=1 N1=3 kernelpagesize_kB=2048
7f1400000000 prefer (many):0-1 anon=8 dirty=8 N0=8 kernelpagesize_kB=4
7f1500000000 default
7ffd00000000 default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=4
"""


def _write_maps(root: Path, text: str, pid: int = 123) -> Path:
    folder = root / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "numa_maps").write_text(text)
    return root


def test_numa_maps_parse_every_policy_form_and_huge_pages(tmp_path: Path) -> None:
    maps = read_numa_maps(123, _write_maps(tmp_path, FAKE_MAPS))
    assert [m.policy for m in maps] == [
        "default",
        "default",
        "bind:0",
        "prefer:1",
        "interleave:0-1",
        "bind=static:1",
        "prefer (many):0-1",
        "default",
        "default",
    ]
    assert maps[0] == Mapping(0x55D0A1C00000, "default", {0: 2}, 4096, "/usr/bin/cat", False)
    assert maps[2] == Mapping(0x7F12A0000000, "bind:0", {0: 512}, 4096, None, True)
    assert maps[4].pages_by_node == {0: 50, 1: 50}
    huge = maps[5]
    assert (huge.file, huge.anon, huge.page_bytes) == ("/dev/hugepages/buf one", False, 2 << 20)
    assert (huge.pages_by_node, huge.resident_bytes) == ({0: 1, 1: 3}, 4 * (2 << 20))
    empty = maps[7]  # nothing resident: no counts, no page size
    assert (empty.start, empty.pages_by_node, empty.page_bytes, empty.anon) == (
        0x7F1500000000,
        {},
        mmap.PAGESIZE,
        True,
    )


@pytest.mark.parametrize(
    "line",
    [
        "nothex default N0=1",
        "7f0000000000",
        "7f0000000000 default N0=x kernelpagesize_kB=4",
        "7f0000000000 bind:0 N0=1 kernelpagesize_kB=four",
    ],
)
def test_malformed_line_raises_naming_file_and_line(tmp_path: Path, line: str) -> None:
    root = _write_maps(tmp_path, "7f0000000000 default N0=1 kernelpagesize_kB=4\n\n" + line + "\n")
    with pytest.raises(LocalityError, match=r"proc/123/numa_maps:3: "):
        read_numa_maps(123, root)


TWO_NODES = """\
10000000 bind:0 anon=512 dirty=512 N0=512 kernelpagesize_kB=4
20000000 interleave:0-1 anon=512 dirty=512 N0=256 N1=256 kernelpagesize_kB=4
30000000 default file=/dev/hugepages/weights huge dirty=4 N0=3 N1=1 kernelpagesize_kB=2048
40000000 default
"""


def test_locality_on_two_nodes_counts_bytes_and_restricts_by_range(tmp_path: Path) -> None:
    maps = read_numa_maps(123, _write_maps(tmp_path, TWO_NODES))
    mib = 1 << 20
    # 2 + 1 MiB of 4 KiB pages and 6 MiB of 2 MiB pages on node 0; 1 + 2 MiB on node 1
    assert locality(maps, 0) == Locality(0, 9 * mib, 12 * mib)
    assert (locality(maps, 0).share, locality(maps, 1).share) == (0.75, 0.25)
    assert locality(maps, 0, [(0x1000_0000, 0x1000_1000)]).share == 1.0  # the bound mapping only
    assert locality(maps, 1, [(0x2000_0000, 0x2000_0001)]) == Locality(1, 1 * mib, 2 * mib)
    both = locality(maps, 1, [(0x1000_0000, 0x1000_0001), (0x3000_0000, 0x4000_0000)])
    assert (both.local_bytes, both.total_bytes) == (2 * mib, 10 * mib)
    assert locality(maps, 0, [(0x1000_0001, 0x2000_0000)]).total_bytes == 0  # by start; end excluded
    assert locality(maps, 0, [(0x4000_0000, 0x5000_0000)]).share is None  # nothing resident
    assert locality([], 0).share is None


@needs_numa
def test_bound_and_touched_region_is_all_local_on_node_0() -> None:
    size = 4 << 20
    region = mmap.mmap(-1, size)
    try:
        address = buffer_address(region)
        bind_memory(address, size, 0)
        for offset in range(0, size, 4096):
            region[offset] = 1
        maps = read_numa_maps()
        loc = locality(maps, 0, [(address, address + size)])
        assert loc.share == 1.0 and loc.local_bytes >= size
        mine = [m for m in maps if address <= m.start < address + size]
        assert [m.policy for m in mine] == ["bind:0"]
    finally:
        region.close()  # buffer_address kept no export, so closing cannot raise BufferError


@needs_numa
def test_thread_memory_node_follows_set_thread_memory_node() -> None:
    seen: list[int | None] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            seen.append(thread_memory_node())
            set_thread_memory_node(0)
            seen.append(thread_memory_node())
            set_thread_memory_node(None)
            seen.append(thread_memory_node())
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert errors == []
    assert seen == [None, 0, None]
    assert thread_memory_node() is None  # the test's own thread was never changed


@needs_numa
def test_binding_to_absent_node_raises_einval_naming_node() -> None:
    region = mmap.mmap(-1, 1 << 16)
    try:
        with pytest.raises(OSError, match="mbind to node 63") as info:
            bind_memory(buffer_address(region), len(region), 63)
        assert info.value.errno == errno.EINVAL
        with pytest.raises(OSError, match="set_mempolicy to node 63") as info:
            set_thread_memory_node(63)
        assert info.value.errno == errno.EINVAL
        assert thread_memory_node() is None
    finally:
        region.close()


def test_unaligned_address_raises_naming_address() -> None:
    with pytest.raises(ValueError, match="address 0x1001 is not page-aligned"):
        bind_memory(0x1001, 4096, 0)
    with pytest.raises(ValueError, match="node -1"):
        bind_memory(0x1000, 4096, -1)
