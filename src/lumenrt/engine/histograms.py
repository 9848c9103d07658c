"""Fixed histogram buckets the engine counts into, for the Prometheus histograms (observability/).

A worker records a duration with one ``bisect_left`` over a fixed tuple of bounds and one ``+= 1``
on a plain list of ints that only it writes (no lock; nothing allocated beyond the int). The scrape
adds the workers' lists up (``WorkerStats.add``) and makes them cumulative.

Bucket ``i`` counts values ``<= bounds[i]`` and ``> bounds[i - 1]`` (Prometheus's ``le``); the last
bucket, ``len(bounds)``, counts what is above every bound (``+Inf``).
"""

# Durations, ns: 25 us .. 10 s, the buckets of every lumenrt_*_duration_seconds histogram (chosen to
# cover the inline lane's tens of microseconds up to a model slow enough to time out).
DURATION_BOUNDS_NS: tuple[int, ...] = (
    25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 25_000_000, 50_000_000,
    100_000_000, 250_000_000, 500_000_000,
    1_000_000_000, 2_500_000_000, 5_000_000_000, 10_000_000_000,
)  # fmt: skip

# Rows in one executed batch (lumenrt_batch_size).
BATCH_SIZE_BOUNDS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)


def duration_buckets() -> list[int]:
    """A fresh list of duration bucket counts (the last one: +Inf)."""
    return [0] * (len(DURATION_BOUNDS_NS) + 1)


def add_counts(into: list[int], other: list[int]) -> None:
    """Add ``other``'s bucket counts to ``into`` (same bounds)."""
    for i, n in enumerate(other):
        into[i] += n
