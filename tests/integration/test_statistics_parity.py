"""Both worker modes report the same statistics: the same keys, and the same counts for the same
requests, whatever the queue and allocator (one test body over mode x queue x allocator, less the
combination the engine refuses)."""

from collections.abc import Iterator

import pytest

from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.histograms import DURATION_BOUNDS_NS
from lumenrt.models.builtin import builtin_examples

MODEL = "digits_mlp"
KEYS = {
    "name", "version", "ready", "workers", "worker_mode", "queue_type", "allocator_type", "requests",
    "batches", "failures", "expired", "cancelled", "rejected", "arena_fallbacks", "inputs_in_place", "queue_ns",
    "input_ns", "infer_ns", "output_ns", "batch_rows", "arena", "large_arena", "ring", "lane", "batching", "worker_deaths",
    "replacement_failures", "pids", "rejections", "batch_ns", "queue_buckets", "compute_buckets",
    "queued", "workers_ready", "gpu",
}  # fmt: skip
CONFIGS = [
    (mode, queue, allocator)
    for mode in ("thread", "process")
    for queue in ("mpmc", "naive")
    for allocator in ("lumen_arena", "standard")
    if not (mode == "process" and allocator == "standard")
]


@pytest.fixture(params=CONFIGS, ids=lambda c: "-".join(c))
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    mode, queue, allocator = request.param
    settings = EngineConfig(worker_mode=mode, queue_type=queue, allocator_type=allocator, thread_count=2)
    with Engine(models=[MODEL], settings=settings) as eng:
        yield eng


def test_statistics_have_the_same_shape_and_counts(engine: Engine) -> None:
    x = builtin_examples(MODEL, 2)
    for _ in range(5):
        engine.infer(MODEL, x)
    stats = engine.runtime(MODEL).statistics()
    assert set(stats) == KEYS
    assert stats["worker_mode"] == engine.settings.worker_mode
    assert stats["requests"] == 5 and stats["failures"] == stats["expired"] == stats["cancelled"] == 0
    assert 1 <= stats["batches"] <= 5
    assert sum(rows * n for rows, n in stats["batch_rows"].items()) == 10  # every row, once
    assert sum(stats["batch_rows"].values()) == stats["batches"]
    assert stats["infer_ns"] > 0 and stats["queue_ns"] >= 0 and stats["output_ns"] >= 0
    assert stats["lane"]["mode"] == "queue" and stats["lane"]["requests"] == 0
    assert len(stats["pids"]) == stats["workers"] >= 1
    assert stats["workers_ready"] == stats["workers"] and stats["queued"] == 0
    assert stats["rejections"] == {"queue_full": 0, "unloading": 0, "ring_refused": 0}
    assert stats["gpu"] is None  # no GPU instances (engine/gpu/stats.py otherwise)


def test_histograms_count_every_request_run_in_both_modes(engine: Engine) -> None:
    x = builtin_examples(MODEL, 2)
    for _ in range(5):
        engine.infer(MODEL, x)
    stats = engine.runtime(MODEL).statistics()
    assert len(stats["queue_buckets"]) == len(stats["compute_buckets"]) == len(DURATION_BOUNDS_NS) + 1
    assert sum(stats["queue_buckets"]) == sum(stats["compute_buckets"]) == 5


def test_batch_stats_times_are_filled_per_batch_size_in_both_modes(engine: Engine) -> None:
    x = builtin_examples(MODEL, 2)
    for _ in range(5):
        engine.infer(MODEL, x)
    stats = engine.runtime(MODEL).statistics()
    assert set(stats["batch_ns"]) == set(stats["batch_rows"])
    for input_ns, infer_ns, output_ns in stats["batch_ns"].values():
        assert infer_ns > 0 and input_ns >= 0 and output_ns > 0
    assert sum(times[1] for times in stats["batch_ns"].values()) <= stats["infer_ns"]
