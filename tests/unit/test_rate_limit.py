"""The token buckets of ingress/rate_limit.py on a clock the test moves: burst, refill, Retry-After,
per-model and per-key limits, the bounded table, and the config section's errors."""

from pathlib import Path

import pytest

from lumenrt.engine.config import ConfigError
from lumenrt.ingress.rate_limit import Rate, RateLimiter, RateLimits, parse_rate_limits
from lumenrt.protocols.http_headers import HttpError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(limiter: RateLimiter, client: str, model: str = "m") -> HttpError | None:
    try:
        limiter.admit(client, model)
    except HttpError as exc:
        return exc
    return None


def test_a_burst_passes_then_the_next_waits_for_a_token() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimits(per_client=Rate(2.0, 3.0)), clock)
    assert [refused(limiter, "a") for _ in range(3)] == [None, None, None]
    over = refused(limiter, "a")
    assert over is not None and over.status == 429
    assert dict(over.headers)[b"retry-after"] == b"1"  # 0.5 s to a token, rounded up to whole seconds
    assert "retry after 0.500 s" in over.message and "'a'" in over.message
    clock.now += 0.5
    assert refused(limiter, "a") is None
    assert refused(limiter, "a") is not None


def test_a_refused_request_takes_no_token() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimits(per_client=Rate(1.0, 1.0)), clock)
    assert refused(limiter, "a") is None
    for _ in range(50):  # retrying early does not push the next token further away
        assert refused(limiter, "a") is not None
    clock.now += 1.0
    assert refused(limiter, "a") is None


def test_clients_are_limited_apart() -> None:
    limiter = RateLimiter(RateLimits(per_client=Rate(1.0, 1.0)), Clock())
    assert refused(limiter, "a") is None
    assert refused(limiter, "a") is not None
    assert refused(limiter, "b") is None


def test_a_model_limit_applies_on_that_model_only_and_a_key_limit_replaces_the_default() -> None:
    clock = Clock()
    limits = RateLimits(
        per_client=Rate(100.0, 100.0), models={"big": Rate(1.0, 1.0)}, clients={"ops": Rate(1.0, 2.0)}
    )
    limiter = RateLimiter(limits, clock)
    assert refused(limiter, "a", "big") is None
    over = refused(limiter, "a", "big")
    assert over is not None and "model 'big'" in over.message
    assert refused(limiter, "a", "small") is None  # other models: only the per-client limit
    assert refused(limiter, "ops", "small") is None
    assert refused(limiter, "ops", "small") is None
    assert refused(limiter, "ops", "small") is not None  # ops: 2, not 100


def test_the_table_stays_bounded_with_many_clients() -> None:
    limiter = RateLimiter(RateLimits(per_client=Rate(1.0, 1.0), max_clients=100), Clock())
    for i in range(10_000):
        limiter.admit(f"10.0.{i // 256}.{i % 256}", "m")
        refused(limiter, f"10.0.{i // 256}.{i % 256}")  # each one also refused once
    assert len(limiter) == 100
    assert len(limiter.refused) == 100


def test_no_limit_configured_admits_everything_and_keeps_no_bucket() -> None:
    limiter = RateLimiter(RateLimits(models={"big": Rate(1.0, 1.0)}), Clock())
    for _ in range(100):
        limiter.admit("a", "small")
    assert len(limiter) == 0


def test_the_config_section_is_parsed_and_its_errors_name_the_field() -> None:
    limits = parse_rate_limits(
        {"per_client": {"requests_per_s": 5}, "models": {"m": {"requests_per_s": 1, "burst": 4}}}, "x.yaml"
    )
    assert limits.per_client == Rate(5.0, 5.0)
    assert limits.models == {"m": Rate(1.0, 4.0)}
    cases = [
        ({"per_client": {"requests_per_s": 0}}, "rate_limits.per_client.requests_per_s"),
        ({"models": {"m": {"requests_per_s": 1, "burst": 0.5}}}, "rate_limits.models.m.burst"),
        ({"per_clent": {}}, "did you mean 'per_client'"),
        ({"max_clients": 0}, "rate_limits.max_clients"),
        ({"clients": {"ops": {"rate": 1}}}, "rate_limits.clients.ops"),
    ]
    for raw, expected in cases:
        with pytest.raises(ConfigError) as bad:
            parse_rate_limits(raw, Path("x.yaml"))
        assert expected in str(bad.value)
