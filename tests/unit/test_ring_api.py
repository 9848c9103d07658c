"""The ring interface, in one process: the same body runs for mpmc, spsc, naive and batched."""

import threading
import time

import pytest

from lumenrt.native import Item, Region, Ring, RingClosed, make_ring, ring_required_bytes


def test_fifo_full_empty(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 8)
    assert ring.kind == ring_kind and ring.capacity == 8 and len(ring) == 0
    assert ring.try_pop() is None
    for i in range(8):
        assert ring.try_push(i, slot=i + 1, nbytes=10 * i, t_ns=7, aux0=99, kind=3)
    assert ring.try_push(100) is False
    assert len(ring) == 8
    for i in range(8):
        item = ring.try_pop()
        assert item is not None
        assert (item.request_id, item.slot, item.nbytes, item.t_ns, item.aux0, item.kind) == (
            i,
            i + 1,
            10 * i,
            7,
            99,
            3,
        )
    assert ring.try_pop() is None


def test_wraps_around_many_laps(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 4)
    for i in range(10_000):
        assert ring.push(i)
        item = ring.pop()
        assert item is not None and item.request_id == i


def test_pop_timeout_returns_none_after_deadline(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 4)
    t0 = time.monotonic()
    assert ring.pop(timeout_s=0.05) is None
    assert time.monotonic() - t0 >= 0.05
    assert ring.pop_many(4, timeout_s=0.01) == []
    assert ring.pop(timeout_s=0) is None


def test_push_timeout_when_full(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 2)
    assert ring.push(1) and ring.push(2)
    t0 = time.monotonic()
    assert ring.push(3, timeout_s=0.05) is False
    assert time.monotonic() - t0 >= 0.05


def test_pop_many_takes_what_is_there(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 128)
    for i in range(100):
        ring.push(i)
    first = ring.pop_many(30)
    assert [x.request_id for x in first] == list(range(30))
    rest = ring.pop_many(1000, timeout_s=0)
    assert [x.request_id for x in rest] == list(range(30, 100))


def test_close_drains_then_raises(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 8)
    ring.push(5)
    ring.close()
    ring.close()  # idempotent
    assert ring.closed
    with pytest.raises(RingClosed):
        ring.try_push(6)
    with pytest.raises(RingClosed):
        ring.push(6)
    item = ring.pop()
    assert item is not None and item.request_id == 5
    with pytest.raises(RingClosed):
        ring.pop()
    with pytest.raises(RingClosed):
        ring.pop_many(4)
    with pytest.raises(RingClosed):
        ring.try_pop()


def _wait_until_asleep(ring: Ring) -> None:
    deadline = time.monotonic() + 10
    while ring.stats()["futex_waits"] == 0:
        assert time.monotonic() < deadline, "consumer never went to sleep"
        time.sleep(0.001)


def test_sleeping_consumer_is_woken_by_push(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 8)
    got: list[Item | None] = []
    t = threading.Thread(target=lambda: got.append(ring.pop(timeout_s=30)))
    t.start()
    _wait_until_asleep(ring)
    ring.push(77)
    t.join(10)
    assert not t.is_alive()
    assert got[0] is not None and got[0].request_id == 77
    assert ring.stats()["futex_wakes"] >= 1


def test_close_wakes_sleeping_consumer(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 8)
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            ring.pop()
        except RingClosed as e:
            errors.append(e)

    t = threading.Thread(target=consume)
    t.start()
    _wait_until_asleep(ring)
    ring.close()
    t.join(10)
    assert not t.is_alive() and len(errors) == 1


def test_close_wakes_blocked_producer(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 2)
    errors: list[BaseException] = []

    def produce() -> None:  # one thread does all pushes: spsc allows a single producer
        try:
            ring.push(1)
            ring.push(2)
            ring.push(3)
        except RingClosed as e:
            errors.append(e)

    t = threading.Thread(target=produce)
    t.start()
    _wait_until_asleep(ring)
    ring.close()
    t.join(10)
    assert not t.is_alive() and len(errors) == 1


def test_no_syscall_while_neither_empty_nor_full(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 64)
    for i in range(50_000):
        ring.push(i)
        ring.pop()
    stats = ring.stats()
    assert stats["futex_waits"] == 0 and stats["futex_wakes"] == 0


def test_attach_sees_the_same_ring(ring_kind: str) -> None:
    region = Region.anonymous(ring_required_bytes(16) + 4096)
    ring = Ring.create(region, ring_kind, 16, offset=4096)
    other = Ring.attach(region, offset=4096)
    assert other.kind == ring_kind and other.capacity == 16
    ring.push(3)
    item = other.pop()
    assert item is not None and item.request_id == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "fifo", "capacity": 8}, "kind 'fifo'"),
        ({"kind": "mpmc", "capacity": 6}, "capacity 6"),
        ({"kind": "mpmc", "capacity": 1 << 20}, "needs"),
        ({"kind": "mpmc", "capacity": 8, "offset": 8}, "aligned"),
        ({"kind": "mpmc", "capacity": 8, "offset": 1 << 30}, "outside"),
    ],
)
def test_create_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    region = Region.anonymous(1 << 16)
    with pytest.raises(ValueError, match=message):
        Ring.create(region, **kwargs)  # type: ignore[arg-type]


def test_attach_rejects_uninitialised_memory() -> None:
    from lumenrt.native import LrtError

    with pytest.raises(LrtError, match="no valid structure"):
        Ring.attach(Region.anonymous(1 << 16))


@pytest.mark.parametrize(
    ("field", "value"),
    [("request_id", -1), ("slot", 1 << 32), ("nbytes", -5), ("kind", 1 << 40), ("t_ns", 1 << 64)],
)
def test_push_rejects_out_of_range_fields_by_name(field: str, value: int) -> None:
    ring = make_ring("mpmc", 4)
    kwargs = {"request_id": 1, field: value}
    with pytest.raises(ValueError, match=field):
        ring.try_push(**kwargs)
    assert len(ring) == 0


def test_push_argument_errors() -> None:
    ring = make_ring("mpmc", 4)
    with pytest.raises(TypeError, match="missing required argument 'request_id'"):
        ring.push()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'color'"):
        ring.push(1, color=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="timeout_s"):
        ring.pop(timeout_s=-1)
    with pytest.raises(ValueError, match="max_n"):
        ring.pop_many(0)


def test_region_cannot_close_while_used() -> None:
    region = Region.anonymous(ring_required_bytes(8))
    ring = Ring.create(region, "mpmc", 8)
    with pytest.raises(BufferError):
        region.close()
    del ring
    region.close()
    assert region.closed


def test_spsc_refuses_a_second_live_producer() -> None:
    from lumenrt.native import LrtError

    ring = make_ring("spsc", 8)
    ring.push(1)
    errors: list[BaseException] = []

    def other_producer() -> None:
        try:
            ring.push(2)
        except LrtError as e:
            errors.append(e)

    t = threading.Thread(target=other_producer)
    t.start()
    t.join(10)
    assert len(errors) == 1 and "spsc" in str(errors[0])


class _Interrupted(Exception):
    pass


def test_signal_interrupts_a_blocked_pop_and_runs_the_python_handler(ring_kind: str) -> None:
    """Untimed waits stay interruptible: Ctrl-C (here SIGALRM) reaches Python while pop() sleeps."""
    import signal

    ring = make_ring(ring_kind, 4)

    def on_alarm(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(_Interrupted):
            ring.pop()  # no timeout: only the signal can end this
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ring.stats()["futex_waits"] >= 1
    ring.push(1)  # the ring is still fine
    item = ring.pop(timeout_s=1)
    assert item is not None and item.request_id == 1


def test_signal_during_timed_pop_keeps_waiting_until_deadline() -> None:
    import signal

    ring = make_ring("mpmc", 4)
    calls: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda s, f: calls.append(s))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        t0 = time.monotonic()
        assert ring.pop(timeout_s=0.2) is None  # the handler ran, the wait went on to its deadline
        assert time.monotonic() - t0 >= 0.2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert calls == [signal.SIGALRM]
