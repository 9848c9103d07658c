"""The dynamic batcher over a scripted source whose clock the test owns: the max queue delay,
preferred sizes, max rows and carry-over, work conservation when peer workers sit idle, and the
end of the ring (a real ``Ring``). Waits are checked by the timeouts the batcher asked the source
for and by the scripted clock, never by wall-clock time."""

import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import pytest

from lumenrt.engine import batcher as batcher_module
from lumenrt.engine.batcher import Batcher, BatchPolicy, IdleBoard, RingSource
from lumenrt.native import Item, RingClosed, make_ring

R = TypeVar("R")
MS = 1_000_000  # ns


class ScriptedSource(Generic[R]):
    """Requests arrive at scripted times on a fake clock, which is also the batcher's clock (see
    the ``scripted`` fixture). ``take`` waits by moving the clock to the next arrival or to the end
    of its timeout, whichever comes first, and records every timeout it was called with. The ring
    stays open: a blocking take with nothing left to arrive is a test error (not RingClosed), and
    so is a batcher that keeps taking without ever returning."""

    def __init__(self, arrivals: Iterable[tuple[int, R]], rows: Callable[[R], int]) -> None:
        self.now_ns = 0
        self.future: deque[tuple[int, R]] = deque(sorted(arrivals, key=lambda a: a[0]))
        self.queue: deque[R] = deque()
        self.timeouts: list[float | None] = []
        self._rows = rows
        self._arrive()

    def monotonic_ns(self) -> int:
        return self.now_ns

    def _arrive(self) -> None:
        while self.future and self.future[0][0] <= self.now_ns:
            self.queue.append(self.future.popleft()[1])

    def take(self, max_n: int, timeout_s: float | None) -> list[R]:
        self.timeouts.append(timeout_s)
        assert len(self.timeouts) < 10_000, "the batcher spins on the source"
        if not self.queue:
            if timeout_s is None:
                assert self.future, "the batcher would block forever: nothing left to arrive"
                self.now_ns = self.future[0][0]
            elif timeout_s > 0:
                until_ns = self.now_ns + round(timeout_s * 1e9)
                self.now_ns = min(until_ns, self.future[0][0]) if self.future else until_ns
            self._arrive()
        return [self.queue.popleft() for _ in range(min(max_n, len(self.queue)))]

    def rows(self, request: R) -> int:
        return self._rows(request)

    def waiting(self) -> int:
        return len(self.queue)


Scripted = Callable[..., ScriptedSource[int]]


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Scripted:
    """``scripted(queued=[rows, ...], later=[(t_ns, rows), ...])``: requests are their row counts;
    the batcher's clock becomes the source's."""

    def make(queued: Iterable[int] = (), later: Iterable[tuple[int, int]] = ()) -> ScriptedSource[int]:
        source = ScriptedSource([*((0, r) for r in queued), *later], rows=lambda r: r)
        monkeypatch.setattr(batcher_module, "time", source)
        return source

    return make


# ---- the max queue delay --------------------------------------------------------------------


def test_it_waits_out_the_queue_delay_from_the_first_request_then_dispatches_what_it_has(
    scripted: Scripted,
) -> None:
    source = scripted(later=[(1 * MS, 1), (1 * MS + MS // 2, 1), (9 * MS, 1)])
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=2 * MS))
    assert batcher.next_batch() == [1, 1]
    # blocked for the first (t = 1 ms), then waited what was left of the 2 ms each time
    assert source.timeouts == [None, pytest.approx(0.002), pytest.approx(0.0015), 0]
    assert source.now_ns == 3 * MS  # dispatched at the deadline, not before, not after
    assert source.waiting() == 0 and len(source.future) == 1  # the 9 ms request is not waited for
    assert batcher.next_batch() == [1]
    assert source.now_ns == 11 * MS  # a new batch, a new deadline: 9 ms + 2 ms


def test_a_model_without_dynamic_batching_gets_one_request_per_batch(scripted: Scripted) -> None:
    source = scripted(queued=[1, 3, 1, 2])
    board = IdleBoard(2)
    batcher = Batcher(source, BatchPolicy(max_rows=8, alone=True), board, 0)
    assert [batcher.next_batch() for _ in range(3)] == [[1], [3], [1]]
    assert batcher.try_next_batch() == [2]
    assert batcher.try_next_batch() == []
    assert source.timeouts == [None, None, None, 0, 0]  # one request asked for each time


def test_without_a_delay_it_takes_only_what_is_already_queued(scripted: Scripted) -> None:
    source = scripted(queued=[1, 1], later=[(1 * MS, 1)])
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=0))
    assert batcher.next_batch() == [1, 1]
    assert source.now_ns == 0
    assert all(t is None or t == 0 for t in source.timeouts)


# ---- preferred batch sizes ------------------------------------------------------------------


def test_it_dispatches_early_at_a_preferred_size_when_nothing_more_waits(scripted: Scripted) -> None:
    source = scripted(queued=[1, 1], later=[(500 * MS, 1)])
    batcher = Batcher(
        source, BatchPolicy(max_rows=8, max_queue_delay_ns=1000 * MS, preferred_rows=frozenset({2}))
    )
    assert batcher.next_batch() == [1, 1]
    assert source.now_ns == 0  # it did not wait for the request due at 500 ms
    assert batcher.next_batch() == [1]


def test_between_preferred_sizes_it_keeps_waiting(scripted: Scripted) -> None:
    source = scripted(queued=[1, 1], later=[(MS // 2, 1), (MS // 2 + MS // 10, 1), (5 * MS, 1)])
    batcher = Batcher(
        source, BatchPolicy(max_rows=8, max_queue_delay_ns=1 * MS, preferred_rows=frozenset({4}))
    )
    assert batcher.next_batch() == [1, 1, 1, 1]
    assert source.now_ns == MS // 2 + MS // 10  # 2 and 3 rows waited on; 4 went at once


def test_a_preferred_size_does_not_stop_it_while_more_are_waiting(scripted: Scripted) -> None:
    source = scripted(queued=[2, 1])
    batcher = Batcher(
        source, BatchPolicy(max_rows=8, max_queue_delay_ns=1 * MS, preferred_rows=frozenset({2}))
    )
    assert batcher.next_batch() == [2, 1]


# ---- max rows, carry-over, whole requests ---------------------------------------------------


def test_alone_it_gathers_up_to_max_rows_without_waiting(scripted: Scripted) -> None:
    source = scripted(queued=[1] * 10)
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=1000 * MS))
    assert batcher.next_batch() == [1] * 8
    assert source.now_ns == 0  # full: no reason to wait
    assert batcher.next_batch() == [1, 1]


def test_overflowing_requests_are_carried_over_in_order_and_start_the_next_batches(
    scripted: Scripted,
) -> None:
    source = scripted(queued=[1, 2, 3, 4], later=[(1 * MS, 1)])
    batcher = Batcher(source, BatchPolicy(max_rows=4, max_queue_delay_ns=2 * MS))
    assert batcher.next_batch() == [1, 2]  # 3 and 4 were taken too, and did not fit
    assert batcher.next_batch() == [3]  # the carried 4 does not fit beside it either
    assert batcher.next_batch() == [4]
    assert source.now_ns == 0  # a batch with a request carried over behind it goes at once
    assert batcher.next_batch() == [1]  # nothing carried: it gathers as usual, until the deadline
    assert source.now_ns == 3 * MS


def test_carried_requests_that_fit_together_share_the_next_batch(scripted: Scripted) -> None:
    source = scripted(queued=[3, 3, 3, 3])
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=1 * MS))
    assert batcher.next_batch() == [3, 3]
    assert batcher.next_batch() == [3, 3]  # both carried ones
    assert source.waiting() == 0


def test_a_request_of_max_rows_runs_alone_at_once(scripted: Scripted) -> None:
    source = scripted(queued=[4, 1])
    batcher = Batcher(source, BatchPolicy(max_rows=4, max_queue_delay_ns=1000 * MS))
    assert batcher.next_batch() == [4]
    assert source.timeouts == [None]  # nothing more was asked for
    assert batcher.next_batch() == [1]


def test_batches_never_exceed_max_rows_and_every_request_runs_whole_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(11)
    requests = [(i, rng.randint(1, 5)) for i in range(300)]  # (id, rows)
    arrivals = [(rng.randrange(0, 50 * MS), r) for r in requests]
    source = ScriptedSource(arrivals, rows=lambda r: r[1])
    monkeypatch.setattr(batcher_module, "time", source)
    policy = BatchPolicy(max_rows=6, max_queue_delay_ns=MS // 2, preferred_rows=frozenset({4}))
    batcher = Batcher(source, policy)
    batches: list[list[tuple[int, int]]] = []
    while sum(map(len, batches)) < len(requests):
        batch = batcher.next_batch()
        assert 1 <= sum(rows for _, rows in batch) <= 6, batch
        batches.append(batch)
    assert sorted(r for batch in batches for r in batch) == requests
    assert len(batches) < len(requests)  # the script did make it batch


# ---- work conservation ----------------------------------------------------------------------


def test_idle_peers_get_a_fair_share_and_nobody_waits(scripted: Scripted) -> None:
    source = scripted(queued=[1] * 6)
    board = IdleBoard(3)
    board.flags[1] = board.flags[2] = True  # two peers waiting for work
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=1000 * MS), board, me=0)
    assert batcher.next_batch() == [1, 1]  # ceil(6 / 3)
    assert source.waiting() == 4  # left for the idle peers
    assert all(t is None or t == 0 for t in source.timeouts) and source.now_ns == 0  # no delay waited
    assert board.flags == [False, True, True]  # its own flag down, the peers' untouched


def test_the_fair_share_counts_only_idle_peers_and_is_capped_at_max_rows(scripted: Scripted) -> None:
    source = scripted(queued=[1] * 30)
    board = IdleBoard(4)
    board.flags[3] = True  # one idle peer, two busy ones
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=1000 * MS), board, me=0)
    assert batcher.next_batch() == [1] * 8  # ceil(30 / 2) = 15 rows, capped at 8
    assert source.waiting() == 22 and source.now_ns == 0  # and no more taken than that


def test_idle_peers_are_the_others_whose_flag_is_up() -> None:
    board = IdleBoard(3)
    board.flags[0] = board.flags[1] = True
    assert [board.idle_peers(me) for me in range(3)] == [1, 1, 2]


def test_busy_peers_let_it_batch_as_configured(scripted: Scripted) -> None:
    source = scripted(queued=[1] * 2, later=[(MS // 2, 1), (MS // 2, 1), (9 * MS, 1)])
    board = IdleBoard(2)  # the peer is busy computing
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=1 * MS), board, me=0)
    assert batcher.next_batch() == [1] * 4  # both queued, then it waited out the delay for more
    assert source.now_ns == 1 * MS


def test_its_own_flag_is_up_only_while_it_waits_for_a_first_request(scripted: Scripted) -> None:
    board = IdleBoard(2)
    seen: list[bool] = []
    source = scripted(later=[(MS, 1)])
    take = source.take

    def watching(max_n: int, timeout_s: float | None) -> list[int]:
        if timeout_s is None:
            seen.append(board.flags[0])
        return take(max_n, timeout_s)

    source.take = watching  # type: ignore[method-assign]
    batcher = Batcher(source, BatchPolicy(max_rows=4), board, me=0)
    assert batcher.next_batch() == [1]
    assert seen == [True] and board.flags == [False, False]
    assert board.idle_peers(0) == 0 and board.idle_peers(1) == 0


def test_without_a_delay_busy_peers_still_leave_a_share(scripted: Scripted) -> None:
    source = scripted(queued=[1] * 6)
    board = IdleBoard(2)  # the peer is busy computing; it will take the rest when it is done
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=0), board, me=0)
    assert batcher.next_batch() == [1, 1, 1]  # ceil(6 / 2)
    assert source.waiting() == 3


# ---- the end of the ring (a real Ring) ------------------------------------------------------


def _closed_ring_with(rows: list[int]) -> RingSource:
    ring = make_ring("mpmc", 16)
    for i, r in enumerate(rows):
        assert ring.try_push(i, aux0=r)
    ring.close()
    return RingSource(ring)


def _ids(batch: list[Item]) -> list[int]:
    return [item.request_id for item in batch]


def test_a_closed_ring_is_drained_carry_included_then_raises_ring_closed() -> None:
    source = _closed_ring_with([3, 3, 3, 1])
    batcher = Batcher(source, BatchPolicy(max_rows=4, max_queue_delay_ns=0), IdleBoard(1), me=0)
    batches = []
    with pytest.raises(RingClosed):
        for _ in range(10):
            batches.append(_ids(batcher.next_batch()))
    assert batches == [[0], [1], [2, 3]]  # 1 and 2 were carried over; every request ran once


@pytest.mark.parametrize(
    ("policy", "board"),
    [
        (BatchPolicy(max_rows=8, max_queue_delay_ns=2 * MS), None),
        (BatchPolicy(max_rows=8, max_queue_delay_ns=2 * MS), IdleBoard(2)),  # peer busy
        (BatchPolicy(max_rows=8, max_queue_delay_ns=0), None),  # process mode
    ],
    ids=["delay", "delay-busy-peer", "no-delay-no-board"],
)
def test_requests_queued_at_close_are_dispatched_before_ring_closed(
    policy: BatchPolicy, board: IdleBoard | None
) -> None:
    source = _closed_ring_with([1, 1, 1])
    batcher = Batcher(source, policy, board, me=0)
    assert _ids(batcher.next_batch()) == [0, 1, 2]
    with pytest.raises(RingClosed):
        batcher.next_batch()


# ---- the non-blocking batch (a GPU worker with a batch on its device) -------------------------


def test_try_next_batch_takes_what_is_queued_and_never_waits(scripted: Scripted) -> None:
    source = scripted(queued=[1, 2], later=[(1 * MS, 1)])
    batcher = Batcher(source, BatchPolicy(max_rows=4, max_queue_delay_ns=5 * MS), IdleBoard(1), me=0)
    assert batcher.try_next_batch() == [1, 2]  # no queue delay waited for the third
    assert source.now_ns == 0 and all(t == 0 for t in source.timeouts)
    assert batcher.try_next_batch() == []  # nothing queued now: answered at once, still at t=0
    assert source.now_ns == 0


def test_try_next_batch_starts_with_the_carry_and_keeps_max_rows(scripted: Scripted) -> None:
    source = scripted(queued=[3, 3, 1])
    batcher = Batcher(source, BatchPolicy(max_rows=4), None, me=0)
    assert batcher.try_next_batch() == [3]  # the second 3 is carried (it would make 6 rows)
    assert batcher.try_next_batch() == [3, 1]
    assert batcher.try_next_batch() == []


def test_try_next_batch_raises_ring_closed_once_drained() -> None:
    batcher = Batcher(_closed_ring_with([1, 1]), BatchPolicy(max_rows=1), IdleBoard(1), me=0)
    assert _ids(batcher.try_next_batch()) == [0]
    assert _ids(batcher.try_next_batch()) == [1]
    with pytest.raises(RingClosed):
        batcher.try_next_batch()
