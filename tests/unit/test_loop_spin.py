"""LoopSpinner (ingress/loop_spin.py) on a fake loop and clock: bounded, one callback at most,
nothing at all with a zero window."""

from collections.abc import Callable

import pytest

from lumenrt.ingress import loop_spin
from lumenrt.ingress.loop_spin import LoopSpinner


class FakeLoop:
    def __init__(self) -> None:
        self.ready: list[Callable[[], None]] = []

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.ready.append(callback)

    def turn(self) -> None:
        """One turn of the loop: the callbacks ready at its start."""
        ready, self.ready = self.ready, []
        for callback in ready:
            callback()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    now = [1_000_000_000]
    monkeypatch.setattr(loop_spin.time, "monotonic_ns", lambda: now[0])
    return now


def test_a_zero_window_schedules_nothing(clock: list[int]) -> None:
    loop = FakeLoop()
    spinner = LoopSpinner(loop, 0)  # type: ignore[arg-type]
    spinner.seen()
    assert loop.ready == [] and not spinner.spinning and spinner.count == 1


def test_requests_never_stack_callbacks(clock: list[int]) -> None:
    loop = FakeLoop()
    spinner = LoopSpinner(loop, 100)  # type: ignore[arg-type]
    for _ in range(5):
        spinner.seen()
    assert len(loop.ready) == 1 and spinner.spinning
    loop.turn()
    spinner.seen()
    assert len(loop.ready) == 1


def test_it_spins_for_the_window_after_the_last_request_then_sleeps(clock: list[int]) -> None:
    loop = FakeLoop()
    spinner = LoopSpinner(loop, 100)  # type: ignore[arg-type]
    spinner.seen()
    loop.turn()  # the window opens at this turn: 100 us from now
    clock[0] += 60_000
    loop.turn()
    assert spinner.spinning and len(loop.ready) == 1
    spinner.seen()  # a request 60 us in: the window runs 100 us from the next turn
    clock[0] += 30_000
    loop.turn()
    clock[0] += 90_000  # 150 us after the first request, 90 after the second's turn
    loop.turn()
    assert spinner.spinning
    clock[0] += 20_000
    loop.turn()
    assert not spinner.spinning and loop.ready == []  # asleep: nothing queued
    assert spinner.turns == 5
    spinner.seen()  # the next request starts it again
    assert spinner.spinning and len(loop.ready) == 1
