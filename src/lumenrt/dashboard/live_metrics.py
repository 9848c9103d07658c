"""What the live view plots, computed from two scrapes of a server's ``/metrics`` (no I/O here).

A scrape is parsed with ``prometheus_client.parser`` into a ``Scrape``: per model, the total of
``lumenrt_requests_total`` (all protocols and statuses, and separately the non-2xx ones), the
cumulative buckets of ``lumenrt_request_duration_seconds`` (summed over protocol and version), and
``lumenrt_queue_depth``. ``interval_stats`` turns two scrapes into the last interval's throughput,
p50 and p99 per model; ``History`` keeps those points for a bounded time.

Counter resets (the server restarted between scrapes) are handled as Prometheus' ``rate`` does: a
counter that went down counts from zero, so the interval's increase is the new value. A histogram
is treated as one series: if its count or any bucket went down, the new buckets are the increase.

Quantiles follow the definition of Prometheus' ``histogram_quantile``: the rank ``q * count`` falls
in the first bucket whose cumulative count reaches it, and the value is interpolated linearly
between that bucket's lower bound (the previous bucket's upper bound, 0 for the first bucket) and
its upper bound; a rank in the ``+Inf`` bucket gives the highest finite upper bound.
(https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile)
"""

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

REQUESTS_TOTAL = "lumenrt_requests_total"
REQUEST_DURATION = "lumenrt_request_duration_seconds"
QUEUE_DEPTH = "lumenrt_queue_depth"
DEFAULT_HISTORY_S = 600.0  # the issue asks for "e.g. the last 10 minutes"


class MetricsError(ValueError):
    """A scrape that is not Prometheus text, or a URL that cannot be a metrics URL."""


@dataclass
class ModelScrape:
    """One model's numbers in one scrape (cumulative since the server started, except the gauge)."""

    requests: float = 0.0
    errors: float = 0.0  # requests answered with a status other than 2xx
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound (s) -> cumulative count
    queue_depth: float | None = None


@dataclass(frozen=True)
class Scrape:
    """A parsed scrape: when it was taken (a monotonic clock, seconds) and each model's numbers."""

    time_s: float
    models: Mapping[str, ModelScrape]


@dataclass(frozen=True)
class IntervalStats:
    """One model over the interval between two scrapes. A quantile is None when the interval had
    no requests (or the server exports no duration histogram)."""

    throughput_per_s: float
    errors_per_s: float
    p50_s: float | None
    p99_s: float | None
    queue_depth: float | None


@dataclass(frozen=True)
class LivePoint:
    """One model's interval, stamped with the end of the interval."""

    time_s: float
    model: str
    stats: IntervalStats


def metrics_url(url: str) -> str:
    """The metrics URL for what the user gave: a server's base URL gets ``/metrics`` appended; a
    URL without a scheme gets ``http://``. Raises MetricsError naming ``--live`` otherwise."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise MetricsError(f"--live: {url!r}: the scheme must be http or https")
    if not parts.hostname:
        raise MetricsError(f"--live: {url!r}: no host (expected e.g. http://127.0.0.1:8000/metrics)")
    try:
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError as e:
        raise MetricsError(f"--live: {url!r}: {e}") from None
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _bound(le: str) -> float:
    try:
        return float(le)  # "+Inf" parses to inf
    except ValueError:
        raise MetricsError(f"{REQUEST_DURATION}_bucket: le={le!r} is not a number") from None


def parse_scrape(text: str, time_s: float) -> Scrape:
    """Parse one exposition (Prometheus text format). Metrics other than the three used are
    ignored; a model that appears in any of them is listed. Raises MetricsError on bad text."""
    models: dict[str, ModelScrape] = {}
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError) as e:  # the parser's errors: ValueError, TypeError for a few lines
        raise MetricsError(f"not Prometheus text format: {e}") from None
    for sample in samples:
        model = sample.labels.get("model")
        if model is None:
            continue
        value = float(sample.value)
        if sample.name == REQUESTS_TOTAL:
            entry = models.setdefault(model, ModelScrape())
            entry.requests += value
            if not sample.labels.get("status", "200").startswith("2"):
                entry.errors += value
        elif sample.name == REQUEST_DURATION + "_bucket":
            entry = models.setdefault(model, ModelScrape())
            le = _bound(sample.labels.get("le", ""))
            entry.buckets[le] = entry.buckets.get(le, 0.0) + value
        elif sample.name == QUEUE_DEPTH:
            entry = models.setdefault(model, ModelScrape())
            entry.queue_depth = (entry.queue_depth or 0.0) + value
    return Scrape(time_s=time_s, models=models)


def counter_increase(before: float, after: float) -> float:
    """A counter's increase between two readings; a decrease means it was reset (counts from 0)."""
    return after if after < before else after - before


def bucket_increase(before: Mapping[float, float], after: Mapping[float, float]) -> dict[float, float]:
    """The interval's cumulative buckets. A bucket that went down, or a bound that is new or gone,
    means the histogram was reset (or re-created): the interval's buckets are then ``after``."""
    if set(before) != set(after) or any(after[le] < before[le] for le in after):
        return dict(after)
    return {le: after[le] - before[le] for le in after}


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The q-quantile (0 <= q <= 1) of cumulative ``buckets`` (upper bound -> count, with an
    ``inf`` bound), interpolated within its bucket; None when there is no ``inf`` bucket or no
    observation."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: {q} is not within [0, 1]")
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    counts = [buckets[b] for b in bounds]
    for i in range(1, len(counts)):  # cumulative counts never go down; repair any that do
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, c in enumerate(counts) if c >= rank)
    if index == len(bounds) - 1:  # in the +Inf bucket: the highest finite bound is all we know
        return bounds[-2] if len(bounds) > 1 else None
    upper = bounds[index]
    if index == 0:
        lower, below = 0.0, 0.0
        if upper <= 0:
            return upper
    else:
        lower, below = bounds[index - 1], counts[index - 1]
    in_bucket = counts[index] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def interval_stats(before: Scrape, after: Scrape) -> dict[str, IntervalStats]:
    """Each model of ``after`` over the interval since ``before`` (a model new in ``after`` counts
    from zero). Raises ValueError when ``after`` is not later than ``before``."""
    elapsed_s = after.time_s - before.time_s
    if elapsed_s <= 0:
        raise ValueError(f"after.time_s ({after.time_s}) must be later than before.time_s ({before.time_s})")
    stats = {}
    for model, now in after.models.items():
        then = before.models.get(model, ModelScrape())
        buckets = bucket_increase(then.buckets, now.buckets)
        stats[model] = IntervalStats(
            throughput_per_s=counter_increase(then.requests, now.requests) / elapsed_s,
            errors_per_s=counter_increase(then.errors, now.errors) / elapsed_s,
            p50_s=histogram_quantile(0.50, buckets),
            p99_s=histogram_quantile(0.99, buckets),
            queue_depth=now.queue_depth,
        )
    return stats


class History:
    """The last ``max_age_s`` of points, oldest first (not thread-safe: one Streamlit session)."""

    def __init__(self, max_age_s: float = DEFAULT_HISTORY_S) -> None:
        if max_age_s <= 0:
            raise ValueError(f"max_age_s: {max_age_s} must be > 0")
        self.max_age_s = max_age_s
        self._points: deque[LivePoint] = deque()
        self._latest: dict[str, IntervalStats] = {}

    def add(self, time_s: float, stats: Mapping[str, IntervalStats]) -> None:
        """Append one interval's stats (stamped ``time_s``) and drop points older than the window."""
        self._points.extend(LivePoint(time_s, model, s) for model, s in sorted(stats.items()))
        self._latest = dict(stats)
        while self._points and self._points[0].time_s < time_s - self.max_age_s:
            self._points.popleft()

    def points(self) -> list[LivePoint]:
        return list(self._points)

    def models(self) -> list[str]:
        return sorted({p.model for p in self._points})

    def latest(self) -> dict[str, IntervalStats]:
        """The models of the newest interval (a model the server no longer exports is not in it)."""
        return dict(self._latest)

    def __len__(self) -> int:
        return len(self._points)


def series(points: Iterable[LivePoint], model: str) -> list[LivePoint]:
    """One model's points, oldest first."""
    return [p for p in points if p.model == model]
