"""The live view's arithmetic (``lumenrt.dashboard.live_metrics``) and figures, without sockets:
parsing an exposition, rates and quantiles from two scrapes with known answers, counter resets,
missing metrics, the bounded history."""

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from lumenrt.dashboard import live_figures
from lumenrt.dashboard.live_metrics import (
    History,
    IntervalStats,
    MetricsError,
    Scrape,
    histogram_quantile,
    interval_stats,
    metrics_url,
    parse_scrape,
)

INF = math.inf
DURATION_BUCKETS_S: tuple[float, ...] = (
    25e-6,
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
)
DURATION_BUCKETS_S += (100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10)  # the fixed bounds

SAMPLE = """\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="digits_mlp",version="1"} 12
# HELP lumenrt_requests_total Requests answered
# TYPE lumenrt_requests_total counter
lumenrt_requests_total{model="digits_mlp",version="1",protocol="http",status="200"} 10
lumenrt_requests_total{model="digits_mlp",version="1",protocol="tcp",status="200"} 5
lumenrt_requests_total{model="digits_mlp",version="2",protocol="grpc",status="503"} 3
lumenrt_requests_total{model="squeezenet",version="1",protocol="http",status="504"} 1
# TYPE lumenrt_request_duration_seconds histogram
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="http",le="0.001"} 4
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="http",le="0.01"} 10
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="http",le="+Inf"} 10
lumenrt_request_duration_seconds_count{model="digits_mlp",version="1",protocol="http"} 10
lumenrt_request_duration_seconds_sum{model="digits_mlp",version="1",protocol="http"} 0.03
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="tcp",le="0.001"} 5
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="tcp",le="0.01"} 5
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="tcp",le="+Inf"} 5
lumenrt_request_duration_seconds_count{model="digits_mlp",version="1",protocol="tcp"} 5
lumenrt_request_duration_seconds_sum{model="digits_mlp",version="1",protocol="tcp"} 0.002
# TYPE lumenrt_queue_depth gauge
lumenrt_queue_depth{model="digits_mlp",version="1"} 2
lumenrt_queue_depth{model="digits_mlp",version="2"} 1
lumenrt_queue_depth{model="squeezenet",version="1"} 0
# TYPE lumenrt_in_flight_requests gauge
lumenrt_in_flight_requests 3
"""


# --- the URL ----------------------------------------------------------------------------------------


def test_base_url_gets_metrics_path() -> None:
    assert metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("127.0.0.1:8002") == "http://127.0.0.1:8002/metrics"
    assert metrics_url("https://host/prefix/metrics") == "https://host/prefix/metrics"


@pytest.mark.parametrize("url", ["ftp://host/metrics", "http://", "http://host:notaport/metrics"])
def test_bad_url_is_refused_naming_the_flag(url: str) -> None:
    with pytest.raises(MetricsError, match=r"^--live: "):
        metrics_url(url)


# --- parsing ----------------------------------------------------------------------------------------


def test_parse_sums_protocols_and_versions_per_model() -> None:
    scrape = parse_scrape(SAMPLE, 5.0)
    assert scrape.time_s == 5.0
    assert sorted(scrape.models) == ["digits_mlp", "squeezenet"]  # unlabelled gauges are not models
    digits = scrape.models["digits_mlp"]
    assert digits.requests == 18 and digits.errors == 3
    assert digits.buckets == {0.001: 9, 0.01: 15, INF: 15}
    assert digits.queue_depth == 3
    squeezenet = scrape.models["squeezenet"]
    assert (squeezenet.requests, squeezenet.errors, squeezenet.buckets) == (1, 1, {})


def test_parse_reads_what_prometheus_client_writes() -> None:
    registry = CollectorRegistry()
    requests = Counter("lumenrt_requests", "", ["model", "protocol", "status"], registry=registry)
    duration = Histogram(
        "lumenrt_request_duration_seconds", "", ["model"], buckets=(0.001, 0.01), registry=registry
    )
    requests.labels("m", "http", "200").inc(7)
    for value_s in (0.0005, 0.002, 0.02):
        duration.labels("m").observe(value_s)
    model = parse_scrape(generate_latest(registry).decode(), 0.0).models["m"]
    assert model.requests == 7 and model.buckets == {0.001: 1, 0.01: 2, INF: 3}


@pytest.mark.parametrize("text", ["<html><body>not found</body></html>", "foo bar baz", "x{a=1} 2"])
def test_text_that_is_not_prometheus_is_refused(text: str) -> None:
    with pytest.raises(MetricsError, match="not Prometheus text format"):
        parse_scrape(text, 0.0)


def test_bad_bucket_bound_is_refused_naming_the_metric() -> None:
    text = 'lumenrt_request_duration_seconds_bucket{model="m",le="big"} 1\n'
    with pytest.raises(MetricsError, match="lumenrt_request_duration_seconds_bucket: le='big'"):
        parse_scrape(text, 0.0)


def test_server_without_lumenrt_metrics_has_no_models() -> None:
    assert parse_scrape("# TYPE up gauge\nup 1\n", 0.0).models == {}
    assert parse_scrape("", 0.0).models == {}


# --- quantiles --------------------------------------------------------------------------------------


def test_quantile_is_interpolated_within_its_bucket() -> None:
    buckets = {0.001: 0, 0.0025: 50, 0.005: 90, 0.01: 100, INF: 100}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.0025)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.00175)  # halfway through (1, 2.5] ms
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.0095)  # 9 of the last bucket's 10


def test_quantile_in_first_bucket_starts_from_zero() -> None:
    assert histogram_quantile(0.5, {0.1: 10, INF: 10}) == pytest.approx(0.05)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    assert histogram_quantile(0.99, {0.05: 1, 0.1: 5, INF: 10}) == 0.1


def test_quantile_of_empty_or_boundless_histogram_is_none() -> None:
    assert histogram_quantile(0.5, {0.1: 0, INF: 0}) is None
    assert histogram_quantile(0.5, {}) is None
    assert histogram_quantile(0.5, {0.1: 3}) is None  # no +Inf bucket: not a histogram


def test_quantile_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"q: 1\.5"):
        histogram_quantile(1.5, {INF: 1})


# --- two scrapes ------------------------------------------------------------------------------------


def _registry_scrape(
    time_s: float, registry: CollectorRegistry
) -> Scrape:  # what a scrape of a server exporting ``registry`` gives
    return parse_scrape(generate_latest(registry).decode(), time_s)


def test_rates_and_quantiles_come_from_the_interval_only() -> None:
    registry = CollectorRegistry()
    requests = Counter("lumenrt_requests", "", ["model", "version", "protocol", "status"], registry=registry)
    duration = Histogram(
        "lumenrt_request_duration_seconds",
        "",
        ["model", "version"],
        buckets=DURATION_BUCKETS_S,
        registry=registry,
    )
    depth = Gauge("lumenrt_queue_depth", "", ["model", "version"], registry=registry)
    for _ in range(50):  # before the first scrape: slow requests that must not count
        requests.labels("m", "1", "http", "200").inc()
        duration.labels("m", "1").observe(0.2)
    before = _registry_scrape(10.0, registry)
    for i in range(100):  # in the interval: 100 requests, 4 of them failed, all within (1, 2.5] ms
        requests.labels("m", "1", "http", "200" if i >= 4 else "503").inc()
        duration.labels("m", "1").observe(0.0015)
    depth.labels("m", "1").set(7)
    stats = interval_stats(before, _registry_scrape(12.0, registry))["m"]
    assert stats.throughput_per_s == pytest.approx(50.0)  # 100 requests in 2 s
    assert stats.errors_per_s == pytest.approx(2.0)
    assert stats.p50_s == pytest.approx(0.001 + 0.0015 * 0.5)
    assert stats.p99_s == pytest.approx(0.001 + 0.0015 * 0.99)
    assert stats.queue_depth == 7


def test_counter_reset_counts_from_zero() -> None:
    before = parse_scrape(SAMPLE, 0.0)
    restarted = """\
lumenrt_requests_total{model="digits_mlp",version="1",protocol="http",status="200"} 4
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="http",le="0.001"} 0
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="http",le="0.01"} 4
lumenrt_request_duration_seconds_bucket{model="digits_mlp",version="1",protocol="http",le="+Inf"} 4
"""
    stats = interval_stats(before, parse_scrape(restarted, 1.0))
    assert list(stats) == ["digits_mlp"]  # squeezenet is gone after the restart
    digits = stats["digits_mlp"]
    assert digits.throughput_per_s == 4.0 and digits.errors_per_s == 0.0
    assert digits.p50_s == pytest.approx(0.001 + 0.009 * 0.5)  # only the 4 new requests
    assert digits.queue_depth is None  # the restarted server does not export the gauge


def test_model_new_in_the_second_scrape_counts_from_zero() -> None:
    stats = interval_stats(Scrape(0.0, {}), parse_scrape(SAMPLE, 2.0))
    assert stats["digits_mlp"].throughput_per_s == 9.0
    assert stats["digits_mlp"].p50_s == pytest.approx(0.001 * 7.5 / 9)


def test_model_without_duration_histogram_has_throughput_but_no_quantiles() -> None:
    stats = interval_stats(Scrape(0.0, {}), parse_scrape(SAMPLE, 1.0))["squeezenet"]
    assert stats == IntervalStats(
        throughput_per_s=1.0, errors_per_s=1.0, p50_s=None, p99_s=None, queue_depth=0
    )


def test_idle_interval_has_zero_throughput_and_no_quantiles() -> None:
    stats = interval_stats(parse_scrape(SAMPLE, 0.0), parse_scrape(SAMPLE, 1.0))["digits_mlp"]
    assert (stats.throughput_per_s, stats.p50_s, stats.p99_s) == (0.0, None, None)


def test_interval_must_move_forward() -> None:
    with pytest.raises(ValueError, match="later than"):
        interval_stats(parse_scrape(SAMPLE, 1.0), parse_scrape(SAMPLE, 1.0))


# --- history and figures ----------------------------------------------------------------------------


def _stats(throughput_per_s: float, p99_s: float | None = 0.002) -> IntervalStats:
    return IntervalStats(throughput_per_s, 0.0, None if p99_s is None else p99_s / 2, p99_s, 1.0)


def test_history_keeps_only_the_window() -> None:
    history = History(max_age_s=10.0)
    for t in range(30):
        history.add(float(t), {"b": _stats(t), "a": _stats(2 * t)})
    points = history.points()
    assert len(history) == 22 and {p.time_s for p in points} == {float(t) for t in range(19, 30)}
    assert history.models() == ["a", "b"]
    assert history.latest() == {"a": _stats(58), "b": _stats(29)}
    history.add(30.0, {"b": _stats(1)})  # "a" is gone (the server restarted without it)
    assert history.latest() == {"b": _stats(1)} and history.models() == ["a", "b"]


def test_history_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="max_age_s"):
        History(max_age_s=0)


def test_figures_draw_each_model_against_seconds_ago() -> None:
    history = History()
    history.add(100.0, {"a": _stats(5.0, None), "b": _stats(7.0)})
    history.add(101.0, {"a": _stats(6.0), "b": _stats(8.0)})
    points, models = history.points(), history.models()
    throughput = live_figures.throughput(points, models, now_s=101.0)
    assert [t.name for t in throughput.data] == ["a", "b"]
    assert list(throughput.data[0].x) == [-1.0, 0.0] and list(throughput.data[0].y) == [5.0, 6.0]
    latency = live_figures.latency(points, models, now_s=101.0)
    assert [t.name for t in latency.data] == ["a p99", "a p50", "b p99", "b p50"]
    assert list(latency.data[0].y) == [None, pytest.approx(2.0)]  # an idle interval is a gap, in ms
    assert [t.name for t in live_figures.queue_depth(points, models, now_s=101.0).data] == ["a", "b"]
