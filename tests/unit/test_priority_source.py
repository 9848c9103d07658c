"""The priority source (engine/batcher.py): one ring per level and a doorbell of tokens, over real
native rings of every kind a model may be configured with."""

import pytest

from lumenrt.engine.batcher import PrioritySource
from lumenrt.native import Ring, RingClosed, make_ring


def rings(kind: str, levels: int) -> tuple[list[Ring], Ring]:
    return [make_ring(kind, 16) for _ in range(levels)], make_ring(kind, 64)


def queue(levels: list[Ring], doorbell: Ring, level: int, request_id: int) -> None:
    """As admission does: the request to its level first, then its token."""
    assert levels[level - 1].try_push(request_id, aux0=1)
    assert doorbell.try_push(request_id)


@pytest.mark.parametrize("kind", ["mpmc", "naive", "batched"])
def test_the_highest_level_is_taken_first_and_each_level_in_order(kind: str) -> None:
    levels, doorbell = rings(kind, 3)
    source = PrioritySource(levels, doorbell)
    for level, rid in [(3, 1), (2, 2), (3, 3), (1, 4), (2, 5), (1, 6)]:
        queue(levels, doorbell, level, rid)
    assert source.waiting() == 6
    assert [item.request_id for item in source.take(3, None)] == [4, 6, 2]
    assert [item.request_id for item in source.take(8, None)] == [5, 1, 3]
    assert source.waiting() == 0 and source.take(4, 0) == []


@pytest.mark.parametrize("kind", ["mpmc", "naive", "batched"])
def test_a_closed_drained_doorbell_ends_the_worker_after_what_was_queued(kind: str) -> None:
    levels, doorbell = rings(kind, 2)
    source = PrioritySource(levels, doorbell)
    queue(levels, doorbell, 2, 7)
    for ring in [*levels, doorbell]:
        ring.close()
    assert [item.request_id for item in source.take(4, None)] == [7]  # level 1 closed and empty: skipped
    with pytest.raises(RingClosed):
        source.take(4, None)


def test_rows_come_from_the_descriptor() -> None:
    levels, doorbell = rings("mpmc", 2)
    assert levels[1].try_push(9, aux0=3) and doorbell.try_push(9)
    source = PrioritySource(levels, doorbell)
    (item,) = source.take(1, None)
    assert source.rows(item) == 3


def test_tokens_left_after_the_levels_were_emptied_at_unload_end_the_worker() -> None:
    """The runtime answered what was left in the closed level rings (a worker outlived the join):
    the worker's next take finds tokens but no request, and ends instead of spinning."""
    levels, doorbell = rings("mpmc", 2)
    queue(levels, doorbell, 1, 3)
    for ring in [*levels, doorbell]:
        ring.close()
    assert [item.request_id for item in levels[0].pop_many(4, timeout_s=0)] == [3]  # taken by close
    with pytest.raises(RingClosed):
        PrioritySource(levels, doorbell).take(4, None)
