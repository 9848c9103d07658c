"""What the tests of requests received into a lent arena slot share: waiting for a condition, and
whether a model's slots are all back (none lent, none in use)."""

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def slots_back(rt: Any) -> bool:
    """No slot of the runtime lent or in use (every request answered and released)."""
    return bool(rt.receiving == 0 and rt.arena is not None and rt.arena.stats()["in_use"] == 0)
