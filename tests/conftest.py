"""Shared fixtures: every ring test body runs against every ring kind; teardown checks that no
shared-memory segment and no child process is left behind."""

import multiprocessing
import os
from collections.abc import Iterator

import pytest

from lumenrt.native import RING_KINDS, SHM_PREFIX, leftover_segments


def stress_scale() -> float:
    """LUMENRT_STRESS_SCALE multiplies the item counts of the stress tests (default 1)."""
    return float(os.environ.get("LUMENRT_STRESS_SCALE", "1"))


@pytest.fixture(params=RING_KINDS)
def ring_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Children and segments a test starts must be gone when it ends (those of wider-scoped
    fixtures, set up before this one, are theirs to clean up)."""
    mine = f"{SHM_PREFIX}{os.getpid()}."  # segments this process made (others may run tests beside us)
    before = set(leftover_segments(mine))
    children_before = set(multiprocessing.active_children())
    yield
    for child in set(multiprocessing.active_children()) - children_before:
        child.kill()
        child.join(5)
        pytest.fail(f"test left a child process running: {child}")
    left = set(leftover_segments(mine)) - before
    assert not left, f"shared memory left in /dev/shm: {sorted(left)}"
