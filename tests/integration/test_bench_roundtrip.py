"""The round-trip measurement helpers (benchmarks/roundtrip.py) run end to end with tiny counts (behaviour only, no timing
asserted): the echo floor's server process is gone afterwards, and the report has both sides."""

from collections.abc import Iterator

import numpy as np
import pytest

from lumenrt.engine.engine import Engine
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.models.builtin import builtin_examples
from tests.benchmark_modules import import_benchmark_module

roundtrip = import_benchmark_module("roundtrip")
echo_floor, frame_sizes, stats = roundtrip.echo_floor, roundtrip.frame_sizes, roundtrip.stats
serve_vs_echo, tcp_round_trip = roundtrip.serve_vs_echo, roundtrip.tcp_round_trip


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with Engine(models=["digits_mlp"]) as eng, ServerThread(eng, ServeOptions(http_port=None, grpc_port=None, tcp_port=0)) as st:  # fmt: skip
        yield st


def test_echo_floor_returns_one_latency_per_round_trip() -> None:
    latencies = echo_floor(326, 20, response_bytes=149, warmup=5)
    assert len(latencies) == 20 and all(t > 0 for t in latencies)
    s = stats(latencies)
    assert s["n"] == 20 and s["p50_us"] <= s["p99_us"]


def test_frame_sizes_of_a_digits_request() -> None:
    inputs = builtin_examples("digits_mlp", 1)
    outputs = [("probabilities", np.zeros((1, 10), np.float32)), ("label", np.zeros(1, np.int64))]
    assert frame_sizes("digits_mlp", inputs, outputs) == (326, 149)


def test_tcp_round_trip_and_the_comparison(server: ServerThread) -> None:
    inputs = builtin_examples("digits_mlp", 1)
    port = server.ports["tcp"]
    assert len(tcp_round_trip("127.0.0.1", port, "digits_mlp", inputs, 10, warmup=2)) == 10
    report = serve_vs_echo("127.0.0.1", port, "digits_mlp", inputs, 20, blocks=2, warmup=5)
    assert (report["request_bytes"], report["response_bytes"]) == (326, 149)
    assert report["tcp"]["n"] == 20 and report["echo"]["n"] == 20 and report["ratio_p50"] > 0
