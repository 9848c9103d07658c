"""Prometheus metrics: every family built at scrape time from counters the server keeps anyway.

Nothing here runs per request. The engine's workers count into plain ints and fixed bucket lists
of their own (engine/worker.py ``WorkerStats``, buckets from engine/histograms.py), the service
counts answers per protocol and status on the event-loop thread (ingress/service.py ``_count``);
a scrape adds those up (``ModelRuntime.statistics``) and hands them to prometheus_client's
exposition as custom families (a ``Collector`` on a private ``CollectorRegistry``, one per server).

Names (README "Metrics"): Triton's ``nv_inference_*`` where Triton has one, so that existing
dashboards work (labels ``model``, ``version``; cumulative microseconds), and ``lumenrt_*`` after
Prometheus's conventions (seconds, ``_total`` counters, histograms rather than summaries so that a
p99 can be aggregated across replicas).

Triton's counters are exposed untyped: prometheus_client's text format appends ``_total`` to a
counter's name, and Triton's names have none. PromQL's ``rate`` and ``increase`` work on them all
the same.

Threads: a scrape runs on the event loop (``GET /metrics`` on the HTTP port) or on the metrics
port's own thread (``--metrics-port``). It only reads: counters written by other threads are read
whole (ints and lists under the GIL), so a scrape may see one request counted in one family and
not yet in another, never a torn value.
"""

import asyncio
import ssl
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)

from lumenrt.engine.histograms import BATCH_SIZE_BOUNDS, DURATION_BOUNDS_NS
from lumenrt.engine.runtime import PLACEMENT_REPORT_MAX_AGE_S

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what ``exposition`` returns: the text format 0.0.4
PROTOCOLS = ("http", "grpc", "tcp", "inprocess")
REJECTION_REASONS = ("queue_full", "rate_limited", "deadline", "cancelled")

MODEL_LABELS = ["model", "version"]
# bucket bounds as ``le`` label values, written as the Go client writes them (2.5e-05, 0.5, 1, 10)
DURATION_LE = [f"{ns / 1e9:g}" for ns in DURATION_BOUNDS_NS] + ["+Inf"]
BATCH_SIZE_LE = [f"{rows:g}" for rows in BATCH_SIZE_BOUNDS] + ["+Inf"]

# Triton's cumulative counters: name, help, the key of the model's numbers (``_ModelNumbers``)
TRITON_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "success"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "failure"),
    ("nv_inference_count", "Number of inferences performed (a request of n rows counts n)", "inferences"),
    ("nv_inference_exec_count", "Number of model executions performed (batches)", "executions"),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds",
        "request_us",
    ),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", "queue_us"),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds",
        "input_us",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds",
        "infer_us",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds",
        "output_us",
    ),
)


def cumulative(counts: Iterable[int], le: list[str]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last one above every bound) as Prometheus's cumulative ``le`` buckets."""
    out: list[tuple[str, float]] = []
    total = 0
    for bound, n in zip(le, counts, strict=True):
        total += n
        out.append((bound, total))
    return out


def batch_size_counts(batch_rows: dict[int, int]) -> list[int]:
    """Batches per ``BATCH_SIZE_BOUNDS`` bucket, from the runtime's rows -> batches of that size."""
    counts = [0] * (len(BATCH_SIZE_BOUNDS) + 1)
    for rows, n in batch_rows.items():
        counts[bisect_left(BATCH_SIZE_BOUNDS, rows)] += n
    return counts


@dataclass(slots=True)
class _ModelNumbers:
    """One model version's figures at one scrape (from its runtime's and the service's statistics)."""

    labels: list[str]  # model, version
    stats: dict[str, Any]  # ModelRuntime.statistics()
    counters: Any  # the service's _Counters for it, or None (no answer yet)
    cache_hits: int
    cache_misses: int
    placement: list[dict[str, Any]]  # ModelRuntime.placement_report()

    def triton(self, key: str) -> float:
        s, c = self.stats, self.counters
        if key == "success":
            return c.success_count if c else 0
        if key == "failure":
            return c.fail_count if c else 0
        if key == "inferences":
            rows = s.get("batch_rows") or {}
            return sum(r * n for r, n in rows.items()) if rows else int(s.get("requests", 0))
        if key == "executions":
            return int(s.get("batches", 0))
        if key == "request_us":
            return (c.success_ns + c.fail_ns) // 1000 if c else 0
        return int(s.get(key.replace("_us", "_ns"), 0)) // 1000  # queue, input, infer, output


class ServiceCollector:
    """prometheus_client's custom collector over one ``InferenceService`` (and its engine)."""

    def __init__(self, service: Any) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        service = self._service
        models = list(self._models())
        yield from self._triton(models)
        yield from self._histograms(models)
        yield from self._counters(models)
        yield from self._gauges(models)
        yield from gpu_families(models)
        in_flight = GaugeMetricFamily(
            "lumenrt_in_flight_requests", "Requests received and not yet answered, every model"
        )
        in_flight.add_metric([], service.in_flight)
        yield in_flight
        yield from self._security()

    def _security(self) -> Iterator[Metric]:
        """Refusals of the key check and of the rate limits (ingress/auth.py, rate_limit.py):
        labelled by API key name (never the key); clients known only by address are 'anonymous',
        so that the label's values stay as few as the keys."""
        service = self._service
        gate, limiter = service.gate, service.limiter
        if gate is not None:
            refused = CounterMetricFamily(
                "lumenrt_auth_refusals", "Requests refused by the key check, by reason", labels=["reason"]
            )
            for reason, n in sorted(gate.refused.items()):
                refused.add_metric([reason], n)
            yield refused
        if limiter is not None:
            names = set(gate.keys.names()) if gate is not None else set()
            by_client: dict[str, int] = {}
            for client, n in list(limiter.refused.items()):
                label = client if client in names else "anonymous"
                by_client[label] = by_client.get(label, 0) + n
            limited = CounterMetricFamily(
                "lumenrt_rate_limited",
                "Requests refused by the rate limits, by client (API key name, or 'anonymous')",
                labels=["client"],
            )
            for client, n in sorted(by_client.items()):
                limited.add_metric([client], n)
            yield limited

    def _models(self) -> Iterator[_ModelNumbers]:
        service = self._service
        engine = service.engine
        counters = service.request_counters()
        cache = service.cache
        for name in engine.models():
            for rt in list(engine._runtimes.get(name, {}).values()):
                key = (rt.config.name, rt.version)
                hits = misses = 0
                if cache is not None:
                    peek = cache.peek_stats(*key)
                    hits, misses = peek.hits, peek.misses
                yield _ModelNumbers(
                    [key[0], str(key[1])],
                    rt.statistics(),
                    counters.get(key),
                    hits,
                    misses,
                    rt.placement_report(max_age_s=PLACEMENT_REPORT_MAX_AGE_S),
                )

    def _triton(self, models: list[_ModelNumbers]) -> Iterator[Metric]:
        for name, documentation, key in TRITON_COUNTERS:
            family = UnknownMetricFamily(name, documentation, labels=MODEL_LABELS)
            for m in models:
                family.add_metric(m.labels, m.triton(key))
            yield family
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model",
            labels=MODEL_LABELS,
        )
        for m in models:
            pending.add_metric(m.labels, int(m.stats.get("queued", 0)))
        yield pending

    def _histograms(self, models: list[_ModelNumbers]) -> Iterator[Metric]:
        request = HistogramMetricFamily(
            "lumenrt_request_duration_seconds",
            "End to end: the server received the request -> its answer handed to the front end",
            labels=[*MODEL_LABELS, "protocol"],
        )
        queue = HistogramMetricFamily(
            "lumenrt_queue_duration_seconds",
            "Queue wait of a request that ran: enqueued -> taken by a worker",
            labels=MODEL_LABELS,
        )
        compute = HistogramMetricFamily(
            "lumenrt_compute_duration_seconds",
            "Model run of the batch a request ran in: compute start -> end",
            labels=MODEL_LABELS,
        )
        batch = HistogramMetricFamily("lumenrt_batch_size", "Rows per executed batch", labels=MODEL_LABELS)
        for m in models:
            s = m.stats
            protocols = dict(m.counters.protocols) if m.counters else {}
            for protocol, p in sorted(protocols.items()):
                request.add_metric(
                    [*m.labels, protocol], cumulative(list(p.buckets), DURATION_LE), p.sum_ns / 1e9
                )
            queue.add_metric(
                m.labels, cumulative(s["queue_buckets"], DURATION_LE), int(s.get("queue_ns", 0)) / 1e9
            )
            compute.add_metric(
                m.labels, cumulative(s["compute_buckets"], DURATION_LE), int(s.get("infer_ns", 0)) / 1e9
            )
            rows = s.get("batch_rows") or {}
            batch.add_metric(
                m.labels,
                cumulative(batch_size_counts(rows), BATCH_SIZE_LE),
                sum(r * n for r, n in rows.items()),
            )
        yield from (request, queue, compute, batch)

    def _counters(self, models: list[_ModelNumbers]) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "lumenrt_requests",
            "Requests answered, by protocol and status (an HTTP-style code: 200, 400, 503, 504, 499...)",
            labels=[*MODEL_LABELS, "protocol", "status"],
        )
        rejections = CounterMetricFamily(
            "lumenrt_rejections",
            "Requests refused or dropped before they ran, by reason",
            labels=[*MODEL_LABELS, "reason"],
        )
        hits = CounterMetricFamily("lumenrt_cache_hits", "Response cache hits", labels=MODEL_LABELS)
        misses = CounterMetricFamily("lumenrt_cache_misses", "Response cache misses", labels=MODEL_LABELS)
        restarts = CounterMetricFamily(
            "lumenrt_worker_restarts", "Worker processes that died and were replaced", labels=MODEL_LABELS
        )
        for m in models:
            s = m.stats
            protocols = dict(m.counters.protocols) if m.counters else {}
            for protocol, p in sorted(protocols.items()):
                for status, n in sorted(dict(p.statuses).items()):
                    requests.add_metric([*m.labels, protocol, str(status)], n)
            by_reason = {
                "queue_full": int((s.get("rejections") or {}).get("queue_full", 0)),
                # refused by the rate limits (ingress/rate_limit.py): answered 429 on any protocol
                "rate_limited": sum(p.statuses.get(429, 0) for p in protocols.values()),
                "deadline": int(s.get("expired", 0)),
                "cancelled": int(s.get("cancelled", 0)),
            }
            for reason in REJECTION_REASONS:
                rejections.add_metric([*m.labels, reason], by_reason[reason])
            hits.add_metric(m.labels, m.cache_hits)
            misses.add_metric(m.labels, m.cache_misses)
            restarts.add_metric(m.labels, int(s.get("worker_deaths", 0)))
        yield from (requests, rejections, hits, misses, restarts)

    def _gauges(self, models: list[_ModelNumbers]) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "lumenrt_queue_depth", "Requests waiting for a worker, every priority level", labels=MODEL_LABELS
        )
        slots = GaugeMetricFamily(
            "lumenrt_arena_slots_in_use",
            "Arena slots held by requests in flight (a GPU model's large arena included)",
            labels=MODEL_LABELS,
        )
        ready = GaugeMetricFamily("lumenrt_workers_ready", "Workers loaded and running", labels=MODEL_LABELS)
        for m in models:
            s = m.stats
            depth.add_metric(m.labels, int(s.get("queued", 0)))
            arena, large = s.get("arena") or {}, s.get("large_arena") or {}
            slots.add_metric(m.labels, int(arena.get("in_use", 0)) + int(large.get("in_use", 0)))
            ready.add_metric(m.labels, int(s.get("workers_ready", 0)))
        local = GaugeMetricFamily(
            "lumenrt_worker_memory_local_ratio",
            "Share of the worker's process's resident memory on the worker's planned NUMA node "
            "(read from numa_maps at each scrape; thread mode: the server's whole process)",
            labels=[*MODEL_LABELS, "worker", "node"],
        )
        for m in models:
            for w in m.placement:
                if w["local_share"] is not None:
                    local.add_metric([*m.labels, str(w["worker"]), str(w["node"])], w["local_share"])
        yield from (depth, slots, ready, local)


GPU_STAGES = ("copy_in", "compute", "copy_out")


def gpu_families(models: list[_ModelNumbers]) -> Iterator[Metric]:
    """GPU instances' figures (engine/gpu/stats.py), only when some model has GPU instances:
    per model its device stage times, failed batches and the device memory its instances hold;
    per device this process's memory and NVML's (Triton's ``nv_gpu_*`` names; present only with
    nvidia-ml-py installed)."""
    gpus = [(m, m.stats["gpu"]) for m in models if m.stats.get("gpu")]
    if not gpus:
        return
    stages = CounterMetricFamily(
        "lumenrt_gpu_stage_seconds",
        "Device time of GPU instances' batches, by stage (copy_in, compute, copy_out)",
        labels=[*MODEL_LABELS, "stage"],
    )
    failures = CounterMetricFamily(
        "lumenrt_gpu_batch_failures",
        "Batches a GPU instance's device (or launch) failed",
        labels=MODEL_LABELS,
    )
    held = GaugeMetricFamily(
        "lumenrt_gpu_model_memory_bytes",
        "Device memory a model's GPU instances hold for themselves (weights, staging buffers)",
        labels=[*MODEL_LABELS, "gpu"],
    )
    devices: dict[str, dict[str, Any]] = {}
    for m, g in gpus:
        for stage in GPU_STAGES:
            stages.add_metric([*m.labels, stage], int(g[f"{stage}_ns"]) / 1e9)
        failures.add_metric(m.labels, int(g["failures"]))
        for index, d in sorted(g["devices"].items()):
            held.add_metric([*m.labels, index], int(d["model_memory_bytes"]))
            devices[index] = d
    process = GaugeMetricFamily(
        "lumenrt_gpu_process_memory_bytes",
        "Device memory this server process holds (every model, the allocator's cache included)",
        labels=["gpu"],
    )
    utilization = GaugeMetricFamily(
        "nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0] (NVML, last sample period)", labels=["gpu"]
    )
    used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes (NVML)", labels=["gpu"])
    total = GaugeMetricFamily(
        "nv_gpu_memory_total_bytes", "GPU total memory, in bytes (NVML)", labels=["gpu"]
    )
    for index, d in sorted(devices.items()):
        process.add_metric([index], int(d["process_memory_bytes"]))
        nvml = d.get("nvml")
        if nvml:
            utilization.add_metric([index], float(nvml["utilization"]))
            used.add_metric([index], float(nvml["memory_used_bytes"]))
            total.add_metric([index], float(nvml["memory_total_bytes"]))
    yield from (stages, failures, held, process)
    if any(d.get("nvml") for d in devices.values()):
        yield from (utilization, used, total)


class ServiceMetrics:
    """A server's metrics: its private registry and the text for ``GET /metrics``."""

    content_type = CONTENT_TYPE.encode()

    def __init__(self, service: Any) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ServiceCollector(service))

    def exposition(self) -> bytes:
        """Every family, in the text format 0.0.4 (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)


class MetricsListener:
    """``--metrics-port``: the metrics on a port of their own (as Triton's 8002), served by
    prometheus_client's HTTP server in a daemon thread; a front end for ``ServerApp`` (it closes
    with the others)."""

    def __init__(self, metrics: ServiceMetrics, host: str, port: int, tls: Any = None) -> None:
        """Listening when constructed (``port`` 0: any free port; ``self.port`` says which).
        ``tls``: the server's ``TlsFiles``: HTTPS with its certificate (loaded once: a reload
        of the other front ends' certificates does not reach this port)."""
        self._server: Any
        files: dict[str, Any] = {}
        if tls is not None:
            files = {
                "certfile": str(tls.cert),
                "keyfile": str(tls.key),
                "tls_min_version": ssl.TLSVersion.TLSv1_2,
            }
            if tls.client_ca is not None:
                files.update(client_cafile=str(tls.client_ca), client_auth_required=True)
        self._server, self._thread = start_http_server(port, host, metrics.registry, **files)
        self.port = int(self._server.server_port)

    async def stop_listening(self) -> None:
        await asyncio.to_thread(self._stop)

    async def close(self) -> None:
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()  # returns once serve_forever has ended
            server.server_close()
            self._thread.join(10)
