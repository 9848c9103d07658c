"""Named shared memory: one owner unlinks; attachers and dead processes leave nothing behind;
stale segments of crashed owners are found and removed. Unnamed shared memory (a memfd handed to
spawned children): shared both ways, never in /dev/shm."""

import multiprocessing
import os
import signal

import pytest

from lumenrt.native import (
    SHM_PREFIX,
    PassedFd,
    Region,
    Ring,
    clean_stale,
    create_shared,
    create_unnamed,
    leftover_segments,
    map_passed,
    ring_required_bytes,
)

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")


def attach_and_push(name: str, value: int) -> None:
    region = Region.attach_shm(name)
    assert not region.owner
    ring = Ring.attach(region)
    ring.push(value)


def attach_and_die(name: str) -> None:
    region = Region.attach_shm(name)
    Ring.attach(region).push(7)
    os.kill(os.getpid(), signal.SIGKILL)


def map_and_push(passed: PassedFd, size: int, value: int) -> None:
    region = map_passed(passed, size)
    Ring.attach(region).push(value)
    os.kill(os.getpid(), signal.SIGKILL)  # no clean exit: nothing is left behind either way


def test_unnamed_memory_is_shared_with_a_spawned_child_and_never_named() -> None:
    before = set(leftover_segments())
    size = ring_required_bytes(16)
    region, fd = create_unnamed(size, tag="t0")
    try:
        assert region.name is None and set(leftover_segments()) == before
        ring = Ring.create(region, "mpmc", 16)
        child = SPAWN.Process(target=map_and_push, args=(PassedFd(fd), size, 41))
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL
        assert ring.pop(timeout_s=5).request_id == 41  # type: ignore[union-attr]
        del ring
    finally:
        region.close()
        os.close(fd)
    assert set(leftover_segments()) == before


def test_map_fd_refuses_bad_sizes_and_descriptors() -> None:
    with pytest.raises(ValueError, match="size"):
        Region.map_fd(0, 0)
    with pytest.raises(OSError):
        Region.map_fd(-1, 4096)


def test_spawned_process_attaches_by_name_and_owner_unlinks() -> None:
    region = create_shared(ring_required_bytes(16), tag="t1")
    assert region.owner and region.name is not None and region.name.startswith(SHM_PREFIX)
    ring = Ring.create(region, "mpmc", 16)
    child = SPAWN.Process(target=attach_and_push, args=(region.name, 99))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    item = ring.pop(timeout_s=10)
    assert item is not None and item.request_id == 99
    name = region.name
    assert name in leftover_segments()
    del ring
    region.close()
    assert name not in leftover_segments()
    with pytest.raises(FileNotFoundError):
        Region.attach_shm(name)


def test_killed_attacher_leaves_nothing_after_owner_closes() -> None:
    region = create_shared(ring_required_bytes(16), tag="t2")
    ring = Ring.create(region, "mpmc", 16)
    child = FORK.Process(target=attach_and_die, args=(region.name,))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    item = ring.pop(timeout_s=10)
    assert item is not None and item.request_id == 7
    name = region.name
    del ring
    region.close()
    assert name not in leftover_segments()


def create_and_crash(conn: "multiprocessing.connection.Connection") -> None:
    region = create_shared(4096, tag="crash")
    conn.send(region.name)
    os.kill(os.getpid(), signal.SIGKILL)


def test_stale_segment_of_crashed_owner_is_cleaned_at_next_start() -> None:
    live = create_shared(4096, tag="live")
    parent_end, child_end = FORK.Pipe()
    child = FORK.Process(target=create_and_crash, args=(child_end,))
    child.start()
    stale_name = parent_end.recv()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert stale_name in leftover_segments()
    removed = clean_stale()
    assert stale_name in removed
    assert stale_name not in leftover_segments()
    assert live.name in leftover_segments()  # a live owner's segment stays
    live.close()


def test_forked_child_exit_does_not_unlink_the_parents_segment() -> None:
    region = create_shared(4096, tag="fork")
    child = FORK.Process(target=lambda: None)
    child.start()
    child.join(30)
    assert region.name in leftover_segments()
    region.close()


def test_bad_names_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="tag"):
        create_shared(4096, tag="a/b")
    with pytest.raises(ValueError, match="size"):
        Region.create_shm("lumenrt.test.zero", 0)
    with pytest.raises(ValueError, match="shm name"):
        Region.attach_shm("has space")
