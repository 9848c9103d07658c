"""The pure parts of benchmarks/connections.py (no server, no crowd): the interleaved order of its
rounds, and the figures it reports from them (medians, the p99 ratio against the bound, drops)."""

from typing import Any

from tests.benchmark_modules import import_benchmark_module

connections = import_benchmark_module("connections")


def test_rounds_alternate_so_that_each_condition_comes_first_half_the_time() -> None:
    assert connections.rounds_plan(3) == [
        (0, "without"),
        (0, "with"),
        (1, "with"),
        (1, "without"),
        (2, "without"),
        (2, "with"),
    ]


def load(r: int, condition: str, protocol: str, p99: float, errors: int = 0) -> dict[str, Any]:
    return {
        "round": r,
        "condition": condition,
        "protocol": protocol,
        "counts": {"errors": errors},
        "throughput_per_s": 1000.0,
        "latency_us": {"p50": p99 / 2, "p99": p99},
    }


def crowd(kib: float, dropped: int) -> dict[str, Any]:
    return {p: {"opened": 5000, "failed": {}, "kib_per_connection": kib} for p in ("http", "tcp")} | {
        "check": {p: {"answered": 5000 - dropped, "dropped": dropped} for p in ("http", "tcp")}
    }


def test_the_ratio_is_median_with_over_median_without_and_a_drop_misses_the_bound() -> None:
    loads = [load(r, c, "tcp", p99) for r, c, p99 in [(0, "without", 100), (0, "with", 110),
             (1, "with", 900), (1, "without", 120), (2, "without", 500), (2, "with", 130)]]  # fmt: skip
    summary = connections.summarize({"loads": loads, "openings": [crowd(2.5, 0), crowd(0.1, 0)]}, ["tcp"])
    tcp = summary["protocols"]["tcp"]
    assert (tcp["p99_us_without"], tcp["p99_us_with"], tcp["p99_ratio"]) == (120, 130, round(130 / 120, 3))
    assert tcp["p99_ratio_per_round"] == [1.1, 7.5, 0.26] and tcp["within_bound"]
    assert summary["kib_per_idle_connection"] == {"http": 2.5, "tcp": 2.5}  # the first crowd's
    assert (summary["dropped"], summary["checked"], summary["meets_bound"]) == (0, 20_000, True)
    dropped = connections.summarize({"loads": loads, "openings": [crowd(2.5, 1)]}, ["tcp"])
    assert dropped["dropped"] == 2 and not dropped["meets_bound"]
