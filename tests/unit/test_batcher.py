"""The dynamic batcher over a scripted source: delays, preferred sizes, carry-over, and work
conservation when peer workers sit idle."""

from collections import deque

from lumenrt.engine.batcher import Batcher, BatchPolicy, IdleBoard


class ListSource:
    """Requests are ints (their row counts); ``take`` never blocks past what is queued, and
    records the timeouts it was called with."""

    def __init__(self, rows: list[int]) -> None:
        self.queue = deque(rows)
        self.timeouts: list[float | None] = []

    def take(self, max_n: int, timeout_s: float | None) -> list[int]:
        self.timeouts.append(timeout_s)
        n = min(max_n, len(self.queue))
        return [self.queue.popleft() for _ in range(n)]

    def rows(self, request: int) -> int:
        return request

    def waiting(self) -> int:
        return len(self.queue)


def test_alone_it_gathers_up_to_max_rows() -> None:
    source = ListSource([1] * 10)
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=10**9))
    assert batcher.next_batch() == [1] * 8
    assert batcher.next_batch() == [1, 1]


def test_an_overflowing_request_is_carried_to_the_next_batch() -> None:
    source = ListSource([3, 3, 3])
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=10**9))
    assert batcher.next_batch() == [3, 3]
    assert batcher.next_batch() == [3]


def test_idle_peers_get_a_fair_share_and_nobody_waits() -> None:
    source = ListSource([1] * 6)
    board = IdleBoard(3)
    board.flags[1] = board.flags[2] = True  # two peers waiting for work
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=10**9), board, me=0)
    assert batcher.next_batch() == [1, 1]  # ceil(6 / 3)
    assert source.waiting() == 4  # left for the idle peers
    assert all(t is None or t == 0 for t in source.timeouts)  # no delay waited
    assert board.flags == [False, True, True]


def test_busy_peers_let_it_batch_as_configured() -> None:
    source = ListSource([1] * 6)
    board = IdleBoard(2)  # the peer is busy computing
    batcher = Batcher(source, BatchPolicy(max_rows=4, max_queue_delay_ns=10**9), board, me=0)
    assert batcher.next_batch() == [1] * 4


def test_its_own_flag_is_up_only_while_it_waits_for_a_first_request() -> None:
    board = IdleBoard(2)
    seen: list[bool] = []

    class Watching(ListSource):
        def take(self, max_n: int, timeout_s: float | None) -> list[int]:
            if timeout_s is None:
                seen.append(board.flags[0])
            return super().take(max_n, timeout_s)

    batcher = Batcher(Watching([1]), BatchPolicy(max_rows=4), board, me=0)
    assert batcher.next_batch() == [1]
    assert seen == [True] and board.flags == [False, False]
    assert board.idle_peers(0) == 0 and board.idle_peers(1) == 0


def test_without_a_delay_busy_peers_still_leave_a_share() -> None:
    source = ListSource([1] * 6)
    board = IdleBoard(2)  # the peer is busy computing; it will take the rest when it is done
    batcher = Batcher(source, BatchPolicy(max_rows=8, max_queue_delay_ns=0), board, me=0)
    assert batcher.next_batch() == [1, 1, 1]  # ceil(6 / 2)
    assert source.waiting() == 3
