"""Completion latches and the two ring calls that use them (push_wait, pop_many's signal), in one
process; the same body runs for every ring kind. Across processes: native/tests/test_latch.c and
the process-mode engine tests."""

import threading
import time

import pytest

from lumenrt.native import Latches, Region, RingClosed, latches_required_bytes, make_ring


def make_latches(n: int) -> Latches:
    return Latches.create(Region.anonymous(latches_required_bytes(n)), n)


def test_set_wait_reset_and_timeout() -> None:
    latches = make_latches(4)
    assert len(latches) == 4
    assert not latches.is_set(2)
    assert latches.wait(2, timeout_s=0) is False
    t0 = time.monotonic()
    assert latches.wait(2, timeout_s=0.02, spin_ns=5_000_000) is False  # spins 5 ms, then sleeps
    assert time.monotonic() - t0 >= 0.02
    assert latches.set(2) is True  # the timed-out waiter left its sleeper mark: one wasted wake
    assert latches.is_set(2) and not latches.is_set(1) and not latches.is_set(3)
    assert latches.wait(2) is True
    latches.reset(2)
    assert not latches.is_set(2)
    assert latches.set(2) is False  # nobody waited: no system call


def test_bad_arguments_name_the_problem() -> None:
    latches = make_latches(2)
    with pytest.raises(IndexError, match="latch 2 out of range"):
        latches.set(2)
    with pytest.raises(IndexError, match="out of range"):
        latches.wait(-1)
    with pytest.raises(ValueError, match="spin_ns must be >= 0"):
        latches.wait(0, timeout_s=0, spin_ns=-1)
    with pytest.raises(ValueError, match="need 128 bytes"):
        Latches.create(Region.anonymous(64), 2)


def test_a_spinning_waiter_costs_the_setter_no_wake() -> None:
    latches = make_latches(1)
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(latches.wait(0, spin_ns=5_000_000_000)))
    waiter.start()
    time.sleep(0.01)  # the waiter is polling (for up to 5 s)
    woke = latches.set(0)
    waiter.join(10)
    assert results == [True]
    assert woke is False


def test_a_sleeping_waiter_is_woken() -> None:
    latches = make_latches(1)
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(latches.wait(0)))
    waiter.start()
    time.sleep(0.05)  # asleep on the futex by now
    assert latches.set(0) is True
    waiter.join(10)
    assert results == [True]


def test_push_wait_hands_over_and_pop_many_signals(ring_kind: str) -> None:
    """A caller pushes and waits on its latch; a worker pops, 'computes', and completes it through
    its next pop_many (signal list): the caller gets every answer, the list is emptied."""
    ring = make_ring(ring_kind, 8)
    ring.spin_ns = 200_000
    latches = make_latches(8)
    answered: list[int] = []
    stop = threading.Event()

    def worker() -> None:
        signal: list[int] = []
        while True:
            try:
                items = ring.pop_many(4, timeout_s=None, latches=latches, signal=signal)
            except RingClosed:
                assert signal == []  # delivered before RingClosed was raised
                return
            assert signal == []
            for item in items:
                answered.append(item.request_id)
                signal.append(item.aux0)  # the latch index travels in aux0 here

    t = threading.Thread(target=worker)
    t.start()
    for i in range(200):
        latch = i % 8
        latches.reset(latch)
        assert ring.push_wait(i, aux0=latch, latches=latches, latch=latch, spin_ns=100_000) is True
        assert latches.is_set(latch)
        assert answered[-1] == i
    stop.set()
    ring.close()
    t.join(10)
    assert answered == list(range(200))


def test_pop_many_signals_even_when_closed_or_timing_out(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 4)
    latches = make_latches(4)
    signal = [0, 1]
    assert ring.pop_many(2, timeout_s=0, latches=latches, signal=signal) == []
    assert signal == [] and latches.is_set(0) and latches.is_set(1)
    signal = [2]
    assert ring.pop_many(2, timeout_s=0.001, latches=latches, signal=signal) == []
    assert latches.is_set(2)
    ring.close()
    signal = [3]
    with pytest.raises(RingClosed):
        ring.pop_many(2, latches=latches, signal=signal)
    assert signal == [] and latches.is_set(3)


def test_push_wait_on_a_full_ring_refuses_at_once(ring_kind: str) -> None:
    ring = make_ring(ring_kind, 2)
    latches = make_latches(1)
    assert ring.try_push(1) and ring.try_push(2)
    t0 = time.monotonic()
    assert ring.push_wait(3, latches=latches, latch=0, spin_ns=10_000_000) is False
    assert time.monotonic() - t0 < 1.0  # no wait for room, nor on the latch
    assert len(ring) == 2
    ring.close()
    with pytest.raises(RingClosed):
        ring.push_wait(4, latches=latches, latch=0)


def test_signal_arguments_are_checked() -> None:
    ring = make_ring("mpmc", 4)
    with pytest.raises(TypeError, match="signal needs latches"):
        ring.pop_many(1, timeout_s=0, signal=[0])
    with pytest.raises(IndexError, match="out of range"):
        ring.pop_many(1, timeout_s=0, latches=make_latches(1), signal=[5])
    with pytest.raises(TypeError, match="latches=<Latches> and latch=<index> are required"):
        ring.push_wait(1)
    with pytest.raises(ValueError, match="spin_ns must be >= 0"):
        ring.spin_ns = -1
    ring.spin_ns = 1234
    assert ring.spin_ns == 1234


def test_timed_spin_catches_a_push_without_sleeping() -> None:
    ring = make_ring("mpmc", 4)
    ring.spin_ns = 2_000_000_000  # far longer than the push takes to come
    got: list[int] = []
    consumer = threading.Thread(target=lambda: got.append(ring.pop(timeout_s=10).request_id))  # type: ignore[union-attr]
    consumer.start()
    time.sleep(0.01)
    ring.push(7)
    consumer.join(10)
    assert got == [7]
    assert ring.stats()["futex_waits"] == 0
