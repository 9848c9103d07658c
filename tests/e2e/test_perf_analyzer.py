"""Triton's perf_analyzer, unchanged, against ``lumenrt serve`` over HTTP and gRPC, with tensors in
the request and in system shared memory (a smoke test: it must run to completion and report; the
figures themselves belong to the benchmarks)."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.benchmark_modules import import_benchmark_module
from tests.e2e.conftest import ServeProcess, start_serve

perf_analyzer = import_benchmark_module("perf_analyzer")  # benchmarks/perf_analyzer.py
perf_analyzer_problem, run_perf_analyzer = (
    perf_analyzer.perf_analyzer_problem,
    perf_analyzer.run_perf_analyzer,
)

PROBLEM = perf_analyzer_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"perf_analyzer cannot run here: {PROBLEM}")


def _success_count(served: ServeProcess, model: str) -> int:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(served.http_url)
    try:
        stats: dict[str, Any] = client.get_inference_statistics(model)
    finally:
        client.close()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("model", "batch"), [("digits_mlp", 1), ("tabular_xgb", 4)])
def test_perf_analyzer_runs_and_reports(served: ServeProcess, protocol: str, model: str, batch: int) -> None:
    before = _success_count(served, model)
    url = served.http_url if protocol == "http" else served.grpc_url
    result = run_perf_analyzer(
        model,
        url,
        "http" if protocol == "http" else "grpc",
        concurrency=2,
        measurement_ms=1000,
        batch_size=batch,
        input_data="random",
        stability_percentage=100,  # a smoke test on a noisy machine
        max_trials=10,  # 3 windows within 2x, of up to 10: CI stalls now and then
    )
    assert result["concurrency"] == 2
    assert result["throughput_infer_per_s"] > 0
    assert 0 < result["p50_us"] <= result["p99_us"]
    # perf_analyzer's requests really reached the model (it reads these same statistics too)
    assert _success_count(served, model) > before


@pytest.fixture(scope="module")
def served_shm() -> Iterator[ServeProcess]:
    """A server with Triton's system shared-memory extension on (it is off by default)."""
    server = start_serve("--allow-client-shm", "--models", "digits_mlp")
    yield server
    assert server.stop() == 0, "\n".join(server.lines)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(served_shm: ServeProcess, protocol: str) -> None:
    before = _success_count(served_shm, "digits_mlp")
    result = run_perf_analyzer(
        "digits_mlp",
        served_shm.http_url if protocol == "http" else served_shm.grpc_url,
        "http" if protocol == "http" else "grpc",
        concurrency=1,
        measurement_ms=1000,
        extra_args=["--shared-memory", "system", "--output-shared-memory-size", "4096"],
        input_data="random",
        stability_percentage=100,
        max_trials=10,  # 3 windows within 2x, of up to 10: CI stalls now and then
    )
    assert result["throughput_infer_per_s"] > 0
    assert _success_count(served_shm, "digits_mlp") > before
    # it registered its regions (the server logs each one) and unregistered them when done
    assert any("shared memory: region 'input" in line and "registered" in line for line in served_shm.lines)
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(served_shm.http_url)
    try:
        assert client.get_system_shared_memory_status() == []
    finally:
        client.close()
