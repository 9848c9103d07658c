"""Per-client rate limits: token buckets keyed by the client (its API key's name, or its address
when authentication is off), server-wide and per model.

Config file section (``lumenrt serve --config``)::

    rate_limits:
      per_client: {requests_per_s: 200, burst: 400}   # each client, all models together
      models:                                         # each client, on this model
        squeezenet: {requests_per_s: 20, burst: 40}
      clients:                                        # by key name (or address): replaces per_client
        ops: {requests_per_s: 2000, burst: 2000}
      max_clients: 10000                              # buckets kept (least recently used dropped)

A request over a limit is answered 429 (HTTP, with ``Retry-After``), RESOURCE_EXHAUSTED (gRPC) or
an error frame (TCP), before any of it reaches the engine. Only inference requests are counted.

Invariants
  1. Event-loop thread only: no locks.
  2. A bucket holds ``tokens`` as of ``at``; it is refilled lazily when taken from (rate * elapsed,
     at most ``burst``), so an idle client costs nothing and no timer runs.
  3. The table holds at most ``max_clients`` buckets: the least recently used one is dropped to
     make room. A dropped client comes back with a full bucket, which can only let it send more
     than its rate after ``max_clients`` other clients were seen since its last request.
  4. A refused request takes no token: a client that keeps retrying early stays refused only until
     its bucket refills, never longer.
"""

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lumenrt.engine.config import ConfigError, check_keys
from lumenrt.protocols.http_headers import HttpError

SECTION = "rate_limits"
DEFAULT_MAX_CLIENTS = 10_000
_KEYS = ("per_client", "models", "clients", "max_clients")


@dataclass(frozen=True, slots=True)
class Rate:
    requests_per_s: float
    burst: float  # the bucket's size: how many requests may come at once after a pause


@dataclass(frozen=True, slots=True)
class RateLimits:
    per_client: Rate | None = None
    models: Mapping[str, Rate] = field(default_factory=dict)
    clients: Mapping[str, Rate] = field(default_factory=dict)
    max_clients: int = DEFAULT_MAX_CLIENTS

    @property
    def active(self) -> bool:
        return self.per_client is not None or bool(self.models) or bool(self.clients)


def parse_rate_limits(raw: Any, source: Path | str) -> RateLimits:
    """The ``rate_limits`` section; ConfigError names the field."""
    section = check_keys(raw, _KEYS, source, SECTION)
    per_client = section.get("per_client")
    max_clients = section.get("max_clients", DEFAULT_MAX_CLIENTS)
    if isinstance(max_clients, bool) or not isinstance(max_clients, int) or max_clients < 1:
        raise ConfigError(source, f"{SECTION}.max_clients", f"must be an integer >= 1, got {max_clients!r}")
    return RateLimits(
        per_client=None if per_client is None else _rate(per_client, source, f"{SECTION}.per_client"),
        models=_rates(section.get("models"), source, f"{SECTION}.models"),
        clients=_rates(section.get("clients"), source, f"{SECTION}.clients"),
        max_clients=max_clients,
    )


def _rates(raw: Any, source: Path | str, where: str) -> dict[str, Rate]:
    if raw is None:
        return {}
    table = check_keys(raw, None, source, where)
    return {name: _rate(value, source, f"{where}.{name}") for name, value in table.items()}


def _rate(raw: Any, source: Path | str, where: str) -> Rate:
    entry = check_keys(raw, ("requests_per_s", "burst"), source, where)
    per_s = entry.get("requests_per_s")
    if isinstance(per_s, bool) or not isinstance(per_s, (int, float)) or not per_s > 0 or math.isinf(per_s):
        raise ConfigError(source, f"{where}.requests_per_s", f"must be a number > 0, got {per_s!r}")
    burst = entry.get("burst", max(1.0, float(per_s)))
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not burst >= 1 or math.isinf(burst):
        raise ConfigError(source, f"{where}.burst", f"must be a number >= 1, got {burst!r}")
    return Rate(float(per_s), float(burst))


class _Bucket:
    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at


class RateLimiter:
    """The buckets of every limited client (see the module docstring)."""

    def __init__(self, limits: RateLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()
        self.refused: dict[str, int] = {}  # client -> requests refused (bounded like the buckets)

    def __len__(self) -> int:
        return len(self._buckets)

    def admit(self, client: str, model: str) -> None:
        """Take a token from each bucket that limits ``client`` (on ``model``); raise 429 if one
        is empty (then no token is taken: invariant 4)."""
        limits = self.limits
        overall = limits.clients.get(client, limits.per_client)
        on_model = limits.models.get(model)
        if overall is None and on_model is None:
            return
        now = self._clock()
        wait_s = 0.0
        over = ""
        buckets = []
        for key, rate, what in (
            ((client, ""), overall, "its rate limit"),
            ((client, model), on_model, f"the rate limit on model {model!r}"),
        ):
            if rate is None:
                continue
            bucket = self._bucket(key, rate, now)
            wait = _wait_s(bucket, rate)
            if wait > wait_s:
                wait_s, over = wait, what
            buckets.append(bucket)
        if wait_s > 0:
            self._count_refusal(client)
            raise HttpError(
                429,
                f"client {client!r} is over {over}: retry after {wait_s:.3f} s",
                [(b"retry-after", b"%d" % max(1, math.ceil(wait_s)))],
            )
        for bucket in buckets:
            bucket.tokens -= 1.0

    def _bucket(self, key: tuple[str, str], rate: Rate, now: float) -> _Bucket:
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is None:
            if len(buckets) >= self.limits.max_clients:
                buckets.popitem(last=False)
            bucket = buckets[key] = _Bucket(rate.burst, now)
        else:
            buckets.move_to_end(key)
            bucket.tokens = min(rate.burst, bucket.tokens + (now - bucket.at) * rate.requests_per_s)
            bucket.at = now
        return bucket

    def _count_refusal(self, client: str) -> None:
        refused = self.refused
        if client not in refused and len(refused) >= self.limits.max_clients:
            refused.pop(next(iter(refused)))
        refused[client] = refused.get(client, 0) + 1


def _wait_s(bucket: _Bucket, rate: Rate) -> float:
    """Seconds until the bucket holds a whole token (0: it does now)."""
    if bucket.tokens >= 1.0:
        return 0.0
    return (1.0 - bucket.tokens) / rate.requests_per_s
