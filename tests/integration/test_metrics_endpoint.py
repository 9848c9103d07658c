"""GET /metrics in a real server (ServerThread, loopback, port 0): requests sent over HTTP, TCP and
gRPC are counted by protocol and status, the end-to-end histogram counts each once, the engine's
histograms count every request that ran, and --metrics-port serves the same families. The server
lives for the module: each test compares a scrape before and after what it sends. Every body runs
with the inline lane and with the queue (the two ways a request reaches the model)."""

import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from prometheus_client.parser import text_string_to_metric_families

from lumenrt.client import HttpClient, InferenceError, TcpClient
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.models.builtin import builtin_examples

MODEL = "digits_mlp"
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (sample name, sorted labels) -> value


@pytest.fixture(scope="module", params=["inline", "queue"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    settings = EngineConfig(thread_count=1, lane=request.param, pin=False)
    with Engine(models=[MODEL], settings=settings) as engine:
        options = ServeOptions(http_port=0, grpc_port=0, tcp_port=0, metrics_port=0)
        with ServerThread(engine, options) as st:
            yield st


def get(port: int, path: str = "/metrics") -> tuple[int, str, str]:
    """(status, content type, body) of a GET on loopback."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.headers["content-type"], resp.read().decode()
    except urllib.error.HTTPError as e:
        with e:  # its socket
            return e.code, e.headers["content-type"], e.read().decode()


def scrape(port: int) -> Scrape:
    status, content_type, text = get(port)
    assert status == 200 and content_type == "text/plain; version=0.0.4; charset=utf-8"
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(scraped: Scrape, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v for (n, ls), v in scraped.items() if n == name and all((k, val) in ls for k, val in labels.items())
    )


def grpc_infer(st: ServerThread, x: np.ndarray) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{st.ports['grpc']}")
    try:
        given = tgrpc.InferInput("input", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        client.infer(MODEL, [given])
    finally:
        client.close()


def test_requests_are_counted_by_protocol_and_status(server: ServerThread) -> None:
    port = server.ports["http"]
    x = builtin_examples(MODEL, 1)["input"]
    before = scrape(port)
    with HttpClient("127.0.0.1", port) as hc:
        for _ in range(5):
            hc.infer(MODEL, {"input": x})
    with TcpClient("127.0.0.1", server.ports["tcp"]) as tc:
        for _ in range(4):
            tc.infer(MODEL, {"input": x})
        with pytest.raises(InferenceError) as refused:  # a shape the model does not take: 400
            tc.infer(MODEL, {"input": np.zeros((1, 3), np.float32)})
        assert refused.value.status == 400
    for _ in range(3):
        grpc_infer(server, x)
    after = scrape(port)

    def sent(name: str, **labels: str) -> float:
        return total(after, name, model=MODEL, **labels) - total(before, name, model=MODEL, **labels)

    assert sent("lumenrt_requests_total", protocol="http", status="200") == 5
    assert sent("lumenrt_requests_total", protocol="tcp", status="200") == 4
    assert sent("lumenrt_requests_total", protocol="tcp", status="400") == 1
    assert sent("lumenrt_requests_total", protocol="grpc", status="200") == 3
    assert sent("lumenrt_requests_total") == 13
    for protocol, n in (("http", 5), ("tcp", 5), ("grpc", 3)):
        assert sent("lumenrt_request_duration_seconds_count", protocol=protocol) == n
        assert sent("lumenrt_request_duration_seconds_bucket", protocol=protocol, le="+Inf") == n
    assert sent("nv_inference_request_success") == 12
    assert sent("nv_inference_request_failure") == 1
    # the engine's histograms: every request that ran, whether inline or through a worker
    assert sent("lumenrt_queue_duration_seconds_count") == 12
    assert sent("lumenrt_compute_duration_seconds_count") == 12
    assert sent("nv_inference_count") == 12  # one row each
    assert sent("lumenrt_batch_size_sum") == 12


def test_gauges_show_an_idle_server(server: ServerThread) -> None:
    scraped = scrape(server.ports["http"])
    assert total(scraped, "lumenrt_workers_ready", model=MODEL) == 1
    assert total(scraped, "lumenrt_queue_depth", model=MODEL) == 0
    assert total(scraped, "lumenrt_in_flight_requests") == 0
    assert total(scraped, "lumenrt_arena_slots_in_use", model=MODEL) == 0


def test_metrics_port_serves_the_same_families(server: ServerThread) -> None:
    def families(text: str) -> set[str]:
        return {family.name for family in text_string_to_metric_families(text)}

    status, _, on_http = get(server.ports["http"])
    assert status == 200
    status, _, on_own_port = get(server.ports["metrics"])
    assert status == 200
    assert families(on_own_port) == families(on_http)
    assert "nv_inference_request_success" in families(on_http)


def test_metrics_take_only_get(server: ServerThread) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{server.ports['http']}/metrics", b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=10)
    with answer.value:  # its socket
        assert answer.value.code == 405


def test_a_server_without_metrics_answers_404(server: ServerThread) -> None:
    options = ServeOptions(http_port=0, grpc_port=None, tcp_port=None, metrics=False)
    with ServerThread(server.app.engine, options) as bare:
        status, _, body = get(bare.ports["http"])
        assert "metrics" not in bare.ports
    assert status == 404 and "--no-metrics" in body
