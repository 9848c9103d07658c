"""Where the engine's workers run (engine.placements_for): compute threads never exceed the cores,
and a worker with several compute threads is pinned to as many cores of its own."""

import pytest

from lumenrt.engine.engine import placements_for


@pytest.mark.parametrize(
    ("workers", "cores", "expected"),
    [
        (1, (0, 1), [((0, 1), 2)]),  # one worker, two threads: both cores, not one
        (2, (0, 1), [((0,), 1), ((1,), 1)]),
        (3, (0, 1), [((0,), 1), ((1,), 1), ((0,), 1)]),  # more workers than cores: round-robin
        (2, (0, 1, 2, 3), [((0, 1), 2), ((2, 3), 2)]),  # disjoint runs
        (3, (0, 1, 2, 3), [((0,), 1), ((1,), 1), ((2,), 1)]),
        (2, (4, 6, 8, 10, 12), [((4, 6), 2), ((8, 10), 2)]),  # the cores given, in their order
    ],
)
def test_placements(
    workers: int, cores: tuple[int, ...], expected: list[tuple[tuple[int, ...], int]]
) -> None:
    got = placements_for(workers, cores)
    assert [(p.cores, p.intra_op_threads) for p in got] == expected
    assert sum(p.intra_op_threads for p in got) <= max(len(cores), workers)  # never more than the cores
    for p in got:
        assert len(p.cores) == p.intra_op_threads  # a core for each of its compute threads
