"""A real ``lumenrt serve`` (its own process, loopback, port 0) with ``--access-log`` and ``--trace``:
one JSON line per request over HTTP, TCP and gRPC with the right id, status and model; the V2 ``id``
echoed in HTTP and gRPC answers; and OTLP/HTTP spans received by a local collector stand-in, one
parent per request with its stage children."""

import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc

from lumenrt.bench.serve_process import start_serve
from lumenrt.client import HttpClient, TcpClient

MODEL = "digits_mlp"
X = np.zeros((1, 64), np.float32)
COLLECT_TIMEOUT_S = 30.0


def http_infer_json(port: int, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer: dict[str, Any] = json.load(resp)
    return answer


def json_body(request_id: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}]
    }
    if request_id is not None:
        body["id"] = request_id
    return body


def grpc_infer(port: int, request_id: str) -> Any:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        given = tgrpc.InferInput("input", [1, 64], "FP32")
        given.set_data_from_numpy(X)
        return client.infer(MODEL, [given], request_id=request_id).get_response()
    finally:
        client.close()


def test_one_line_per_request_over_every_protocol(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    server = start_serve("--models", MODEL, "--access-log", str(log))
    try:
        ports = server.ports
        assert http_infer_json(ports["http"], json_body("http-7"))["id"] == "http-7"  # echoed
        assert "id" not in http_infer_json(ports["http"], json_body(None))  # none asked, none added
        with HttpClient("127.0.0.1", ports["http"]) as hc:  # the binary tensor extension
            hc.infer(MODEL, {"input": X}, request_id="http-bin")
        with TcpClient("127.0.0.1", ports["tcp"]) as tc:
            tcp_id = tc.infer(MODEL, {"input": X}).request_id
        assert grpc_infer(ports["grpc"], "grpc-9").id == "grpc-9"  # echoed
    finally:
        assert server.stop() == 0, "\n".join(server.lines)
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # flushed at shutdown
    assert len(lines) == 5, lines
    by_protocol = [(line["protocol"], line["id"]) for line in lines]
    assert by_protocol[0] == ("http", "http-7")
    assert by_protocol[1][0] == "http" and by_protocol[1][1].endswith("-1")  # generated
    assert by_protocol[2:] == [("http", "http-bin"), ("tcp", str(tcp_id)), ("grpc", "grpc-9")]
    for line in lines:
        assert (line["model"], line["version"], line["status"]) == (MODEL, 1, 200)
        assert line["total_us"] >= line["compute_us"] > 0


class Collector:
    """A stand-in for an OpenTelemetry collector's OTLP/HTTP receiver on 127.0.0.1:0."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        self.spans: list[Any] = []
        self.changed = threading.Condition()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with collector.changed:
                    for rs in message.resource_spans:
                        for ss in rs.scope_spans:
                            collector.spans.extend(ss.spans)
                    collector.changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1/traces"

    def wait_for(self, count: int) -> list[Any]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.spans) >= count, COLLECT_TIMEOUT_S), self.spans
            return list(self.spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def collector() -> Iterator[Collector]:
    pytest.importorskip("opentelemetry.sdk", reason="needs the 'trace' extra: pip install 'lumenrt[trace]'")
    c = Collector()
    yield c
    c.close()


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_trace_spans_have_a_parent_per_request_and_stage_children(collector: Collector) -> None:
    server = start_serve("--models", MODEL, "--trace", collector.url, "--lane", "queue")
    try:
        with HttpClient("127.0.0.1", server.ports["http"]) as hc:
            hc.infer(MODEL, {"input": X}, request_id="traced-1")
            hc.infer(MODEL, {"input": X}, request_id="traced-2")
    finally:
        assert server.stop() == 0, "\n".join(server.lines)  # shutdown exports what is buffered
    spans = collector.wait_for(2 * 5)
    parents = {s.span_id: s for s in spans if s.name == f"infer {MODEL}"}
    assert len(parents) == 2
    assert {attributes(p)["lumenrt.request_id"] for p in parents.values()} == {"traced-1", "traced-2"}
    for parent in parents.values():
        attrs = attributes(parent)
        assert (attrs["lumenrt.model"], attrs["lumenrt.protocol"]) == (MODEL, "http")
        assert attrs["http.response.status_code"] == 200
        assert parent.parent_span_id == b""  # a root
        children = [s for s in spans if s.parent_span_id == parent.span_id]
        assert [c.name for c in sorted(children, key=lambda c: c.start_time_unix_nano)] == [
            "queue", "batch", "compute", "return",
        ]  # fmt: skip
        for child in children:
            assert child.trace_id == parent.trace_id
            assert parent.start_time_unix_nano <= child.start_time_unix_nano
            assert child.end_time_unix_nano <= parent.end_time_unix_nano
