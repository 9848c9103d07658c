"""The HTTP front end over real loopback sockets: bad input, limits, pipelining, timeouts."""

import json
import socket
import time
from collections.abc import Iterator

import pytest

from lumenrt.engine.engine import Engine
from lumenrt.models.builtin import builtin_examples
from lumenrt.server.app import ServeOptions, ServerThread
from lumenrt.server.service import ServeLimits

LIMITS = ServeLimits(max_body_bytes=1 << 20, max_elements=1 << 16, receive_timeout_s=0.5, idle_timeout_s=1.0)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with (
        Engine(models=["digits_mlp"]) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None, limits=LIMITS)) as st,
    ):
        yield st


def connect(server: ServerThread) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10)


def read_response(sock: socket.socket, buf: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response (status, lower-case headers, body); ``buf`` carries bytes read past it."""
    buf = buf if buf is not None else bytearray()
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a whole response: {bytes(buf)!r}")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a body")
        body += chunk
    del buf[:]
    buf += body[length:]
    return status, headers, bytes(body[:length])


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def exchange(server: ServerThread, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with connect(server) as sock:
        sock.sendall(raw)
        return read_response(sock)


def infer_json(rows: int = 1) -> bytes:
    x = builtin_examples("digits_mlp", rows)["input"]
    return json.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
            ]
        }
    ).encode()


def assert_error(response: tuple[int, dict[str, str], bytes], status: int, *fragments: str) -> None:
    got, _, body = response
    assert got == status, body
    message = json.loads(body)["error"]
    for fragment in fragments:
        assert fragment in message


def test_bad_json_is_400_and_the_server_stays_up(server: ServerThread) -> None:
    assert_error(
        exchange(server, request("POST", "/v2/models/digits_mlp/infer", b"{not json")), 400, "not valid JSON"
    )
    assert exchange(server, request("GET", "/v2/health/live"))[0] == 200


@pytest.mark.parametrize(
    ("doc", "fragments"),
    [
        ({"inputs": []}, ["inputs must be a non-empty list"]),
        ({"inputs": [{"name": "input", "datatype": "FP33", "shape": [1, 64], "data": [0] * 64}]}, ["FP33"]),
        ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, -64], "data": []}]}, ["shape"]),
        ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": ["a"] * 64}]}, ["'a'"]),
        ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64]}]}, ["no data"]),
        ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1 << 20], "data": []}]}, ["over the limit"]),
        ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0] * 64}], "outputs": [{"name": 3}]}, ["outputs[0].name"]),
        ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [40, 64], "data": [0] * 40 * 64}]}, ["max_batch_size"]),
        ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0] * 64}], "parameters": {"timeout": "soon"}}, ["parameters.timeout"]),
    ],
    ids=["no-inputs", "datatype", "negative-dim", "not-a-number", "no-data", "too-many-elements", "output-name", "batch", "timeout"],
)  # fmt: skip
def test_malformed_infer_bodies_name_the_field(
    server: ServerThread, doc: object, fragments: list[str]
) -> None:
    raw = request("POST", "/v2/models/digits_mlp/infer", json.dumps(doc).encode())
    assert_error(exchange(server, raw), 400, *fragments)


def test_nested_data_is_accepted(server: ServerThread) -> None:
    x = builtin_examples("digits_mlp", 2)["input"]
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 64], "data": x.tolist()}]}
    status, _, body = exchange(
        server, request("POST", "/v2/models/digits_mlp/infer", json.dumps(doc).encode())
    )
    assert status == 200
    label = next(o for o in json.loads(body)["outputs"] if o["name"] == "label")
    assert label["shape"] == [2] and len(label["data"]) == 2


def test_binary_sizes_that_do_not_add_up(server: ServerThread) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": 256},
                }
            ]
        }
    ).encode()
    path = "/v2/models/digits_mlp/infer"
    short = request("POST", path, header + bytes(100), {"Inference-Header-Content-Length": str(len(header))})
    assert_error(exchange(server, short), 400, "binary_data_size 256", "100 bytes")
    extra = request("POST", path, header + bytes(300), {"Inference-Header-Content-Length": str(len(header))})
    assert_error(exchange(server, extra), 400, "44 bytes of binary data left over")
    bad_len = request("POST", path, header, {"Inference-Header-Content-Length": str(len(header) + 5)})
    assert_error(exchange(server, bad_len), 400, "Inference-Header-Content-Length")


def test_raw_single_input_body(server: ServerThread) -> None:
    x = builtin_examples("digits_mlp", 3)["input"]
    raw = request(
        "POST", "/v2/models/digits_mlp/infer", x.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    status, headers, body = exchange(server, raw)
    assert status == 200, body
    n = int(headers["inference-header-content-length"])
    doc = json.loads(body[:n])
    probs = next(o for o in doc["outputs"] if o["name"] == "probabilities")
    assert probs["shape"] == [3, 10] and probs["parameters"]["binary_data_size"] == 3 * 10 * 4
    assert len(body) == n + 3 * 10 * 4 + 3 * 8
    ragged = request(
        "POST", "/v2/models/digits_mlp/infer", bytes(100), {"Inference-Header-Content-Length": "0"}
    )
    assert_error(exchange(server, ragged), 400, "whole number of 256-byte rows")


def test_oversize_body_is_refused_before_it_is_sent(server: ServerThread) -> None:
    head = b"POST /v2/models/digits_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(head)  # no body follows: the answer must not wait for it
        status, headers, body = read_response(sock)
        assert status == 413 and b"over the limit" in body
        assert headers.get("connection") == "close"
        assert sock.recv(1) == b""


def test_oversize_chunked_body_is_refused(server: ServerThread) -> None:
    head = b"POST /v2/models/digits_mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"%x\r\n%s\r\n" % (1 << 16, bytes(1 << 16))
    with connect(server) as sock:
        sock.sendall(head)
        try:
            for _ in range(40):  # 2.5 MiB > the 1 MiB limit
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert read_response(sock)[0] == 413


def test_malformed_http_is_400(server: ServerThread) -> None:
    assert_error(exchange(server, b"BLAH\x00\x01 / HTTP/9\r\n\r\n"), 400, "malformed HTTP")


def test_unknown_routes_and_methods(server: ServerThread) -> None:
    assert_error(exchange(server, request("GET", "/v1/models")), 404, "/v2")
    assert_error(exchange(server, request("GET", "/v2/models/digits_mlp/infer")), 405, "use POST")
    assert_error(exchange(server, request("GET", "/v2/models/nope")), 404, "unknown model 'nope'")
    assert_error(
        exchange(server, request("GET", "/v2/models/digits_mlp/versions/7")), 404, "no loaded version 7"
    )
    assert_error(exchange(server, request("GET", "/v2/models/digits_mlp/versions/x1")), 400, "version")


def test_pipelined_requests_are_answered_in_order(server: ServerThread) -> None:
    raw = (
        request("GET", "/v2/health/ready")
        + request("POST", "/v2/models/digits_mlp/infer", infer_json(2))
        + request("GET", "/v2/models/digits_mlp")
        + request("POST", "/v2/models/digits_mlp/infer", b"{")
        + request("POST", "/v2/models/digits_mlp/infer", infer_json(1))
    )
    with connect(server) as sock:
        sock.sendall(raw)
        buf = bytearray()
        answers = [read_response(sock, buf) for _ in range(5)]
    assert [a[0] for a in answers] == [200, 200, 200, 400, 200]
    assert json.loads(answers[1][2])["outputs"][0]["shape"][0] == 2
    assert json.loads(answers[2][2])["name"] == "digits_mlp"
    assert json.loads(answers[4][2])["outputs"][0]["shape"][0] == 1


def test_slow_request_is_cut_off_with_408(server: ServerThread) -> None:
    with connect(server) as sock:
        sock.sendall(b"POST /v2/models/digits_mlp/infer HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        status, _, body = read_response(sock)  # arrives after receive_timeout_s
        assert status == 408 and b"not received whole" in body
        assert sock.recv(1) == b""


def test_idle_connection_is_closed(server: ServerThread) -> None:
    with connect(server) as sock:
        sock.sendall(request("GET", "/v2/health/live"))
        assert read_response(sock)[0] == 200
        deadline = time.monotonic() + 10
        sock.settimeout(10)
        assert sock.recv(1) == b""  # closed by the server after idle_timeout_s
        assert time.monotonic() < deadline


def test_connection_close_is_honoured(server: ServerThread) -> None:
    with connect(server) as sock:
        sock.sendall(request("GET", "/v2/health/live", headers={"Connection": "close"}))
        status, headers, _ = read_response(sock)
        assert status == 200 and headers.get("connection") == "close"
        assert sock.recv(1) == b""


def test_half_open_client_does_not_hurt_others(server: ServerThread) -> None:
    sock = connect(server)
    sock.sendall(request("POST", "/v2/models/digits_mlp/infer", infer_json(1)))
    sock.close()  # gone before its answer
    status, _, body = exchange(server, request("POST", "/v2/models/digits_mlp/infer", infer_json(1)))
    assert status == 200
    label = next(o for o in json.loads(body)["outputs"] if o["name"] == "label")
    assert label["data"][0] in range(10)


def test_stop_accepting_refuses_with_503() -> None:
    with (
        Engine(models=["digits_mlp"]) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None)) as st,
    ):
        assert exchange(st, request("GET", "/v2/health/ready"))[0] == 200
        st.app.service.stop_accepting()
        assert exchange(st, request("GET", "/v2/health/ready"))[0] == 503
        assert exchange(st, request("GET", "/v2/health/live"))[0] == 200
        assert_error(
            exchange(st, request("POST", "/v2/models/digits_mlp/infer", infer_json())), 503, "shutting down"
        )
