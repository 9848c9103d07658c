"""Adaptive batching (engine/batch_cost.py): the cost table on its own, then a batcher with an
adaptive policy over a scripted queue that never runs dry, told a model's cost for each batch it
forms. The cost models are the two shapes measured on this VM: a fixed overhead plus a little per
row (digits_mlp: batching pays), and a cost per row that grows with the batch (SqueezeNet in the
server: batching costs)."""

from collections import Counter
from collections.abc import Callable

import pytest

from lumenrt.engine.batch_cost import MIN_ROW_NS, PROBE_EVERY, BatchCost
from lumenrt.engine.batcher import Batcher, BatchPolicy
from tests.unit import test_batcher
from tests.unit.test_batcher import Scripted

scripted = test_batcher.scripted  # the fixture: a scripted queue and clock (test_batcher.py)

US = 1000  # ns


def pays(rows: int) -> int:
    """A batch costs 4 ms plus 1 ms a row: the bigger the cheaper per row."""
    return 4000 * US + 1000 * US * rows


def costs(rows: int) -> int:
    """12 ms a row alone, 16 ms a row in any batch: batching costs a third more."""
    return 12_000 * US if rows == 1 else 16_000 * US * rows


def run(batcher: Batcher[int], cost: Callable[[int], int], batches: int) -> Counter[int]:
    """Form ``batches`` batches, tell the batcher each one's cost; how many of each size formed."""
    sizes: Counter[int] = Counter()
    for _ in range(batches):
        rows = sum(batcher.next_batch())
        batcher.ran(cost(rows), rows)
        sizes[rows] += 1
    return sizes


def adaptive(scripted: Scripted, max_rows: int = 8, queued: int = 10_000) -> Batcher[int]:
    return Batcher(scripted(queued=[1] * queued), BatchPolicy(max_rows=max_rows, adaptive=True))


def test_the_best_size_is_the_cheapest_per_row_seen() -> None:
    cost = BatchCost(8)
    assert cost.best == 1  # nothing measured: single requests (the second batch probes upwards)
    cost.observe(4, 4 * 16_000)
    assert cost.best == 4
    cost.observe(1, 12_000)
    assert cost.best == 1
    cost.observe(8, 8 * 1_000)
    assert cost.best == 8
    assert cost.costs() == {1: 12_000.0, 4: 16_000.0, 8: 1_000.0}


def test_observations_outside_the_batch_range_are_ignored() -> None:
    cost = BatchCost(4)
    for rows, ns in ((0, 1000), (5, 1000), (-1, 1000), (2, 0)):
        cost.observe(rows, ns)
    assert cost.costs() == {} and cost.best == 1


def test_probes_go_up_to_max_and_down_to_half_the_best() -> None:
    cost = BatchCost(16)
    cost.observe(8, 8 * MIN_ROW_NS)
    limits = [cost.limit() for _ in range(2 * PROBE_EVERY)]
    assert Counter(limits) == {8: 2 * PROBE_EVERY - 4, 16: 2, 4: 2}
    assert limits[1] == 16  # the second batch probes upwards, then one in PROBE_EVERY
    assert limits[1 + PROBE_EVERY // 2] == 4 and limits[1 + PROBE_EVERY] == 16


def test_where_batching_costs_it_settles_on_single_requests(scripted: Scripted) -> None:
    batcher = adaptive(scripted)
    start = run(batcher, costs, 4 * PROBE_EVERY)
    assert start[8] <= 4  # the upward probes only
    assert batcher.cost is not None and batcher.cost.best == 1
    sizes = run(batcher, costs, 20 * PROBE_EVERY)
    # settled: only the upward probes (one per PROBE_EVERY) form more than one row
    assert sum(n for rows, n in sizes.items() if rows > 1) <= 20
    assert sizes[1] >= 20 * PROBE_EVERY - 20


def test_where_batching_pays_it_climbs_back_from_a_slow_measurement(scripted: Scripted) -> None:
    batcher = adaptive(scripted, max_rows=8)
    assert batcher.cost is not None
    batcher.cost.observe(8, pays(8) * 100)  # a cold first batch of 8: looked 100x dearer
    batcher.cost.observe(1, pays(1))
    assert batcher.cost.best == 1
    sizes = run(batcher, pays, 20 * PROBE_EVERY)
    assert batcher.cost.best == 8
    # each upward probe halves the error (PROBE_WEIGHT): six probes, then full batches
    assert sizes[8] >= 13 * PROBE_EVERY


def test_it_follows_a_change_in_what_batching_costs(scripted: Scripted) -> None:
    batcher = adaptive(scripted)
    run(batcher, pays, 4 * PROBE_EVERY)
    assert batcher.cost is not None and batcher.cost.best == 8
    later = run(batcher, costs, 20 * PROBE_EVERY)
    assert later.most_common(1)[0][0] == 1
    assert batcher.cost.best == 1


def test_the_cap_never_splits_or_refuses_a_request(scripted: Scripted) -> None:
    batcher = Batcher(scripted(queued=[5, 1, 1]), BatchPolicy(max_rows=8, adaptive=True))
    assert batcher.cost is not None
    batcher.cost.observe(1, costs(1))
    batcher.cost.observe(8, costs(8))
    assert batcher.cost.best == 1
    batcher.cost.limit(), batcher.cost.limit()  # past the opening upward probe
    assert batcher.next_batch() == [5]  # first of its batch: runs whole, over the cap
    batcher.ran(costs(5), 5)
    assert batcher.next_batch() == [1]


def test_a_model_whose_rows_cost_less_than_the_measurement_can_tell_is_not_capped(
    scripted: Scripted,
) -> None:
    def small(rows: int) -> int:  # batching looks dearer a row, but every row is under MIN_ROW_NS
        return MIN_ROW_NS // 50 if rows == 1 else MIN_ROW_NS // 30 * rows

    batcher = adaptive(scripted)
    sizes = run(batcher, small, 100)
    assert sizes == {1: 1 + 3, 8: 96}  # the first batch, and the downward probes (half of 1)
    assert batcher.cost is not None and batcher.cost.small
    # the same model slowed down past the bound: capped again
    run(batcher, lambda rows: small(rows) * 100, 8 * PROBE_EVERY)  # seen at the downward probes
    assert not batcher.cost.small and batcher.cost.best == 1
    later = run(batcher, lambda rows: small(rows) * 100, 4 * PROBE_EVERY)
    assert later.most_common(1)[0][0] == 1


def test_an_uncapped_models_best_size_is_measured_again_and_a_slowdown_caps_it() -> None:
    cost = BatchCost(8)
    for rows, per_row in ((1, MIN_ROW_NS // 20), (4, MIN_ROW_NS // 40), (8, MIN_ROW_NS // 20)):
        cost.observe(rows, rows * per_row)
    assert cost.best == 4 and cost.small  # a middle size best, never formed while uncapped...
    for _ in range(3 * PROBE_EVERY):  # ...but for the downward probes; now 3 ms a row at any size
        rows = cost.limit()
        cost.observe(rows, rows * 3 * MIN_ROW_NS)
    assert not cost.small


def test_a_batch_that_did_not_run_whole_teaches_nothing(scripted: Scripted) -> None:
    batcher = adaptive(scripted)
    rows = sum(batcher.next_batch())
    batcher.ran(5, rows - 1)  # one of its requests expired: the batch was quick, and short
    batcher.ran(5, 0)  # none ran
    assert batcher.cost is not None and batcher.cost.costs() == {}
    batcher.ran(costs(rows), rows)
    assert batcher.cost.costs() == {rows: costs(rows) / rows}


@pytest.mark.parametrize("adaptive_policy", [False, True])
def test_only_an_adaptive_policy_listens_to_costs(scripted: Scripted, adaptive_policy: bool) -> None:
    batcher = Batcher(scripted(queued=[1] * 800), BatchPolicy(max_rows=8, adaptive=adaptive_policy))
    sizes = run(batcher, costs, 100)
    if adaptive_policy:  # single requests, but for the upward probes
        assert sizes[1] > sizes[8]
    else:
        assert sizes == {8: 100}


def test_a_model_without_batching_has_no_cost_table(scripted: Scripted) -> None:
    batcher = Batcher(scripted(queued=[1] * 3), BatchPolicy(max_rows=1, adaptive=True))
    assert batcher.cost is None
    assert run(batcher, costs, 3) == {1: 3}
