"""``lumenrt serve``'s open-file limit (ingress/fd_limit.py) against a fake ``resource`` module:
raised to the hard limit within the cap, never lowered, a refusal reported, and the lifecycle line
and its warnings."""

import pytest

from lumenrt.ingress.fd_limit import (
    FD_LIMIT_CAP,
    FD_RESERVE,
    WANTED_CONNECTIONS,
    FdLimit,
    describe,
    raise_fd_limit,
)

INFINITY = -1  # what resource.RLIM_INFINITY is on Linux


class FakeResource:
    """getrlimit/setrlimit of RLIMIT_NOFILE only; ``refuse``: setrlimit raises it."""

    RLIMIT_NOFILE = 7
    RLIM_INFINITY = INFINITY

    def __init__(self, soft: int, hard: int, refuse: Exception | None = None) -> None:
        self.limits = (soft, hard)
        self.refuse = refuse
        self.set_calls: list[tuple[int, int]] = []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == self.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == self.RLIMIT_NOFILE
        self.set_calls.append(limits)
        if self.refuse is not None:
            raise self.refuse
        self.limits = limits


def raised(fake: FakeResource, cap: int = FD_LIMIT_CAP) -> FdLimit:
    return raise_fd_limit(cap, rlimit=fake)  # type: ignore[arg-type]


def test_the_soft_limit_goes_up_to_the_hard_one() -> None:
    fake = FakeResource(1024, 20_000)
    assert raised(fake) == FdLimit(1024, 20_000, 20_000)
    assert fake.set_calls == [(20_000, 20_000)]  # the hard limit itself is left alone


@pytest.mark.parametrize("hard", [INFINITY, 1 << 20])
def test_an_unlimited_or_huge_hard_limit_is_met_only_up_to_the_cap(hard: int) -> None:
    fake = FakeResource(1024, hard)
    got = raised(fake)
    assert got.after == FD_LIMIT_CAP and got.hard == (None if hard == INFINITY else hard)
    assert fake.set_calls == [(FD_LIMIT_CAP, hard)]


@pytest.mark.parametrize("soft", [FD_LIMIT_CAP, 200_000, INFINITY])
def test_a_soft_limit_already_at_or_above_the_cap_is_never_lowered(soft: int) -> None:
    fake = FakeResource(soft, INFINITY)
    got = raised(fake)
    assert got.after == got.before == soft and fake.set_calls == []


def test_a_refused_raise_keeps_the_old_limit_and_says_why() -> None:
    fake = FakeResource(256, INFINITY, refuse=ValueError("not allowed to raise maximum limit"))
    got = raised(fake)
    assert (got.before, got.after) == (256, 256)
    assert got.error == "ValueError: not allowed to raise maximum limit"
    line, warning = describe(got, per_client=0)
    assert "could not be raised: ValueError" in line and warning is not None


def test_the_line_says_old_and_new_and_how_many_connections_fit() -> None:
    line, warning = describe(FdLimit(1024, 20_000, 20_000), per_client=512)
    assert (
        line
        == f"open-file limit raised 1024 -> 20000 (hard 20000): about {20_000 - FD_RESERVE} connections fit"
    )
    assert warning is None


def test_a_limit_too_low_for_ten_thousand_connections_is_a_warning_naming_the_fix() -> None:
    _, warning = describe(FdLimit(1024, 4096, 4096), per_client=512)
    assert warning is not None
    assert f"only about {4096 - FD_RESERVE} connections fit" in warning and "ulimit -Hn" in warning
    assert 4096 - FD_RESERVE < WANTED_CONNECTIONS


def test_a_per_client_cap_the_limit_cannot_reach_is_a_warning() -> None:
    _, warning = describe(FdLimit(20_000, 20_000, 20_000), per_client=50_000)
    assert warning is not None and "--max-connections-per-client 50000" in warning
