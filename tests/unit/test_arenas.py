"""Slab pool and bump arena from Python: zero-copy views, exhaustion, double free, counters."""

import threading

import numpy as np
import pytest

from lumenrt.native import (
    BumpArena,
    Layout,
    PoolExhausted,
    Region,
    SlabPool,
    bump_required_bytes,
    slab_required_bytes,
)


def make_pool(slot_bytes: int, n_slots: int) -> SlabPool:
    return SlabPool.create(Region.anonymous(slab_required_bytes(slot_bytes, n_slots)), slot_bytes, n_slots)


def test_slots_are_aligned_zero_copy_views() -> None:
    region = Region.anonymous(slab_required_bytes(1000, 4))
    pool = SlabPool.create(region, 1000, 4)
    assert pool.slot_bytes == 1024 and pool.n_slots == 4
    slot = pool.alloc()
    view = pool.view(slot)
    assert len(view) == 1024 and not view.readonly
    arr = np.frombuffer(view, dtype=np.float32)
    arr[:] = 3.5
    whole = np.frombuffer(region, dtype=np.uint8)
    offset = pool.offset_of(slot)
    assert offset % 64 == 0
    assert np.frombuffer(whole[offset : offset + 1024].tobytes(), dtype=np.float32)[0] == 3.5
    del arr, view, whole


def test_exhaustion_is_immediate_and_clear() -> None:
    pool = make_pool(64, 3)
    held = [pool.alloc() for _ in range(3)]
    assert sorted(held) == [0, 1, 2]
    assert pool.try_alloc() is None
    with pytest.raises(PoolExhausted, match="all 3 slots of 64 bytes are in use"):
        pool.alloc()
    pool.free(held[0])
    assert pool.alloc() == held[0]


def test_double_free_and_bad_index_are_refused() -> None:
    pool = make_pool(64, 4)
    slot = pool.alloc()
    pool.free(slot)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(slot)
    with pytest.raises(IndexError, match="out of range"):
        pool.free(4)
    with pytest.raises(IndexError):
        pool.view(-1)


def test_threads_never_share_a_slot_and_counters_balance() -> None:
    pool = make_pool(64, 16)
    errors: list[str] = []

    def churn(tid: int) -> None:
        for r in range(3000):
            held = [s for s in (pool.try_alloc() for _ in range(6)) if s is not None]
            for s in held:
                pool.view(s)[:8] = (tid * 100_000 + r).to_bytes(8, "little")
            for s in held:
                if int.from_bytes(pool.view(s)[:8], "little") != tid * 100_000 + r:
                    errors.append(f"slot {s} overwritten while held by thread {tid}")
                pool.free(s)

    threads = [threading.Thread(target=churn, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = pool.stats()
    assert stats["allocated"] == stats["freed"] > 0
    assert stats["in_use"] == 0 and 0 < stats["high_water"] <= 16
    assert sorted(pool.alloc() for _ in range(16)) == list(range(16))


def test_attach_shares_state() -> None:
    region = Region.anonymous(slab_required_bytes(64, 2))
    a = SlabPool.create(region, 64, 2)
    b = SlabPool.attach(region)
    s = a.alloc()
    assert b.alloc() != s
    assert b.try_alloc() is None


def test_bump_arena_alloc_align_reset() -> None:
    region = Region.anonymous(bump_required_bytes(4096))
    arena = BumpArena.create(region, 4096)
    a = arena.alloc(10, align=1)
    b = arena.alloc(100)
    assert b % 64 == 0 and b > a
    with pytest.raises(PoolExhausted, match="5000 bytes asked"):
        arena.alloc(5000)
    with pytest.raises(ValueError, match="align"):
        arena.alloc(8, align=3)
    arena.reset()
    assert arena.alloc(10, align=1) == a
    stats = arena.stats()
    assert stats["resets"] == 1 and stats["allocations"] == 3 and stats["exhausted"] == 1
    assert stats["used_bytes"] == 10 and stats["high_water_bytes"] >= 110


def test_layout_places_structures_aligned() -> None:
    lay = Layout()
    a = lay.add(100, name="ring")
    b = lay.add(10, align=4096, name="pool")
    assert a == 0 and b == 4096 and lay.size_bytes == 4106
    assert lay.offsets == {"ring": 0, "pool": 4096}
    with pytest.raises(ValueError):
        lay.add(0)
    with pytest.raises(ValueError):
        lay.add(8, align=3)
