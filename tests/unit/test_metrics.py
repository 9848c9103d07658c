"""observability/metrics.py: every family is built at scrape time from the service's answer counters
and the runtimes' statistics (a real InferenceService over a fake engine: no workers, no sockets);
the text is read back with prometheus_client's own parser."""

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from lumenrt.engine.histograms import BATCH_SIZE_BOUNDS, DURATION_BOUNDS_NS, duration_buckets
from lumenrt.engine.worker import WorkerStats
from lumenrt.ingress.service import InferenceService
from lumenrt.observability.metrics import CONTENT_TYPE, DURATION_LE, ServiceMetrics

TRITON = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count",
]
LUMENRT = [
    "lumenrt_request_duration_seconds",
    "lumenrt_queue_duration_seconds",
    "lumenrt_compute_duration_seconds",
    "lumenrt_batch_size",
    "lumenrt_requests",  # _total
    "lumenrt_rejections",
    "lumenrt_cache_hits",
    "lumenrt_cache_misses",
    "lumenrt_worker_restarts",
    "lumenrt_queue_depth",
    "lumenrt_in_flight_requests",
    "lumenrt_arena_slots_in_use",
    "lumenrt_workers_ready",
    "lumenrt_worker_memory_local_ratio",
]


@dataclass
class FakeConfig:
    name: str


@dataclass
class FakeRuntime:
    """What the collector reads of a ModelRuntime: its name, version and statistics()."""

    config: FakeConfig
    version: int
    stats: dict[str, Any] = field(default_factory=dict)
    placement: list[dict[str, Any]] = field(default_factory=list)  # ModelRuntime.placement_report()

    def placement_report(self, max_age_s: float = 0.0) -> list[dict[str, Any]]:
        return self.placement

    def statistics(self) -> dict[str, Any]:
        return {
            "requests": 0,
            "batches": 0,
            "expired": 0,
            "cancelled": 0,
            "rejections": {"queue_full": 0, "unloading": 0, "ring_refused": 0},
            "queue_ns": 0,
            "input_ns": 0,
            "infer_ns": 0,
            "output_ns": 0,
            "batch_rows": {},
            "queue_buckets": duration_buckets(),
            "compute_buckets": duration_buckets(),
            "queued": 0,
            "arena": None,
            "workers_ready": 1,
            "worker_deaths": 0,
            **self.stats,
        }


class FakeEngine:
    def __init__(self, *runtimes: FakeRuntime) -> None:
        self._runtimes: dict[str, dict[int, FakeRuntime]] = {}
        for rt in runtimes:
            self._runtimes.setdefault(rt.config.name, {})[rt.version] = rt

    def models(self) -> list[str]:
        return sorted(self._runtimes)


def runtime(name: str = "m", version: int = 1, **stats: Any) -> FakeRuntime:
    return FakeRuntime(FakeConfig(name), version, stats)


def scrape(service: InferenceService) -> dict[str, list[Sample]]:
    """Family name (as the parser gives it: counters without _total) -> its samples."""
    text = ServiceMetrics(service).exposition().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_every_family_is_exported_with_model_and_version_labels() -> None:
    a, b = runtime("a"), runtime("b", 2)
    for rt in (a, b):  # one worker bound to its node each (the locality gauge's samples)
        rt.placement = [{"worker": 0, "node": 0, "local_share": 1.0}]
    service = InferenceService(FakeEngine(a, b))  # type: ignore[arg-type]
    families = scrape(service)
    assert set(families) == set(TRITON) | set(LUMENRT)
    for name in set(families) - {
        "lumenrt_in_flight_requests",
        "lumenrt_request_duration_seconds",
        "lumenrt_requests",
    }:
        versions = {(s.labels["model"], s.labels["version"]) for s in families[name]}
        assert versions == {("a", "1"), ("b", "2")}, name


def test_answers_are_counted_by_protocol_and_status() -> None:
    rt = runtime()
    service = InferenceService(FakeEngine(rt))  # type: ignore[arg-type]
    for _ in range(3):
        service._count(rt, 0, True, "http")
    service._count(rt, 0, False, "tcp", 503)
    service._count(rt, 0, False, "tcp", 504)
    service._count(rt, 0, True, "grpc")
    families = scrape(service)
    requests = families["lumenrt_requests"]
    assert value(requests, "lumenrt_requests_total", protocol="http", status="200") == 3
    assert value(requests, "lumenrt_requests_total", protocol="tcp", status="503") == 1
    assert value(requests, "lumenrt_requests_total", protocol="tcp", status="504") == 1
    assert value(requests, "lumenrt_requests_total", protocol="grpc", status="200") == 1
    assert sum(s.value for s in requests) == 6
    durations = families["lumenrt_request_duration_seconds"]
    for protocol, n in (("http", 3), ("tcp", 2), ("grpc", 1)):
        assert value(durations, "lumenrt_request_duration_seconds_count", protocol=protocol) == n
        assert value(durations, "lumenrt_request_duration_seconds_bucket", protocol=protocol, le="+Inf") == n
    assert value(families["nv_inference_request_success"], "nv_inference_request_success") == 4
    assert value(families["nv_inference_request_failure"], "nv_inference_request_failure") == 2


def test_duration_buckets_are_cumulative_and_end_at_the_count() -> None:
    queue = duration_buckets()
    for ns in (10_000, 25_000, 25_001, 3_000_000, 20_000_000_000):  # 25 us: in the 25 us bucket (le)
        queue[bisect_left(DURATION_BOUNDS_NS, ns)] += 1
    rt = runtime(queue_buckets=queue, queue_ns=20_003_060_001, requests=5)
    samples = scrape(InferenceService(FakeEngine(rt)))["lumenrt_queue_duration_seconds"]  # type: ignore[arg-type]
    buckets = [value(samples, "lumenrt_queue_duration_seconds_bucket", le=le) for le in DURATION_LE]
    assert buckets == sorted(buckets)  # cumulative
    assert value(samples, "lumenrt_queue_duration_seconds_bucket", le="2.5e-05") == 2
    assert value(samples, "lumenrt_queue_duration_seconds_bucket", le="5e-05") == 3
    assert value(samples, "lumenrt_queue_duration_seconds_bucket", le="0.005") == 4
    assert value(samples, "lumenrt_queue_duration_seconds_bucket", le="10") == 4
    assert buckets[-1] == value(samples, "lumenrt_queue_duration_seconds_count") == 5
    assert value(samples, "lumenrt_queue_duration_seconds_sum") == pytest.approx(20.003060001)


def test_batch_size_histogram_comes_from_the_batches_per_size() -> None:
    rt = runtime(batch_rows={1: 3, 3: 2, 200: 1}, batches=6)
    samples = scrape(InferenceService(FakeEngine(rt)))["lumenrt_batch_size"]  # type: ignore[arg-type]
    got = {s.labels["le"]: s.value for s in samples if s.name == "lumenrt_batch_size_bucket"}
    assert got == {"1": 3, "2": 3, "4": 5, "8": 5, "16": 5, "32": 5, "64": 5, "128": 5, "+Inf": 6}
    assert len(got) == len(BATCH_SIZE_BOUNDS) + 1
    assert value(samples, "lumenrt_batch_size_count") == 6
    assert value(samples, "lumenrt_batch_size_sum") == 3 + 6 + 200
    inferences = scrape(InferenceService(FakeEngine(rt)))["nv_inference_count"]  # type: ignore[arg-type]
    assert value(inferences, "nv_inference_count") == 209  # Triton counts rows


def test_rejections_are_split_by_reason() -> None:
    rejections = {"queue_full": 4, "unloading": 1, "ring_refused": 0}
    rt = runtime(rejections=rejections, expired=2, cancelled=3)
    samples = scrape(InferenceService(FakeEngine(rt)))["lumenrt_rejections"]  # type: ignore[arg-type]
    got = {s.labels["reason"]: s.value for s in samples}
    assert got == {"queue_full": 4, "rate_limited": 0, "deadline": 2, "cancelled": 3}


def test_gauges_read_the_state_at_scrape_time() -> None:
    rt = runtime(queued=7, arena={"in_use": 5, "n_slots": 64}, large_arena={"in_use": 2}, workers_ready=2)
    service = InferenceService(FakeEngine(rt))  # type: ignore[arg-type]
    service.in_flight = 9
    families = scrape(service)
    assert value(families["lumenrt_queue_depth"], "lumenrt_queue_depth") == 7
    assert value(families["nv_inference_pending_request_count"], "nv_inference_pending_request_count") == 7
    assert value(families["lumenrt_arena_slots_in_use"], "lumenrt_arena_slots_in_use") == 5 + 2
    assert value(families["lumenrt_workers_ready"], "lumenrt_workers_ready") == 2
    assert value(families["lumenrt_in_flight_requests"], "lumenrt_in_flight_requests") == 9


def test_memory_locality_is_a_gauge_per_bound_worker() -> None:
    rt = runtime()
    rt.placement = [
        {"worker": 0, "node": 0, "local_share": 1.0},
        {"worker": 1, "node": 1, "local_share": 0.25},
        {"worker": 2, "node": -1, "local_share": None},  # not bound: no sample
    ]
    samples = scrape(InferenceService(FakeEngine(rt)))["lumenrt_worker_memory_local_ratio"]  # type: ignore[arg-type]
    got = {(s.labels["worker"], s.labels["node"]): s.value for s in samples}
    assert got == {("0", "0"): 1.0, ("1", "1"): 0.25}


def test_triton_durations_are_cumulative_microseconds() -> None:
    rt = runtime(queue_ns=5_000_999, input_ns=2_000, infer_ns=30_000, output_ns=1_000)
    families = scrape(InferenceService(FakeEngine(rt)))  # type: ignore[arg-type]
    assert value(families["nv_inference_queue_duration_us"], "nv_inference_queue_duration_us") == 5000
    assert (
        value(families["nv_inference_compute_input_duration_us"], "nv_inference_compute_input_duration_us")
        == 2
    )
    assert (
        value(families["nv_inference_compute_infer_duration_us"], "nv_inference_compute_infer_duration_us")
        == 30
    )
    assert (
        value(families["nv_inference_compute_output_duration_us"], "nv_inference_compute_output_duration_us")
        == 1
    )


def test_exposition_is_text_format_0_0_4() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    text = ServiceMetrics(InferenceService(FakeEngine(runtime()))).exposition().decode()  # type: ignore[arg-type]
    assert "# TYPE lumenrt_requests_total counter" in text
    assert "# TYPE lumenrt_request_duration_seconds histogram" in text
    assert "\nnv_inference_request_success{" in text  # Triton's name as is, no _total


def test_worker_stats_add_sums_buckets_and_batch_times() -> None:
    a, b = WorkerStats(), WorkerStats()
    a.queue_buckets[0] += 2
    b.queue_buckets[0] += 1
    b.compute_buckets[-1] += 1
    a.batch_ns[4] = [1, 2, 3]
    b.batch_ns[4] = [10, 20, 30]
    b.batch_ns[1] = [5, 6, 7]
    total = WorkerStats()
    total.add(a)
    total.add(b)
    assert total.queue_buckets[0] == 3 and total.compute_buckets[-1] == 1
    assert total.batch_ns == {4: [11, 22, 33], 1: [5, 6, 7]}
    assert a.batch_ns[4] == [1, 2, 3]  # the workers' own are left as they were
