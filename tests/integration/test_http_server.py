"""The HTTP front end over real loopback sockets: bad input, limits, pipelining, timeouts, the headers
that change what a request means, and request parameters."""

import gzip
import json
import socket
import time
import zlib
from collections.abc import Iterator

import pytest

from lumenrt.engine.engine import Engine
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import ServeLimits
from lumenrt.models.builtin import builtin_examples
from lumenrt.protocols.http_headers import CONTINUE
from tests.integration.flow_clients import read_response

# short enough for the timeout tests, long enough that a test thread descheduled on a busy machine
# (the test run's other half runs beside this one) is not cut off mid-request
LIMITS = ServeLimits(max_body_bytes=1 << 20, max_elements=1 << 16, receive_timeout_s=2.0, idle_timeout_s=2.0)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with (
        Engine(models=["digits_mlp"]) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None, limits=LIMITS)) as st,
    ):
        yield st


def connect(server: ServerThread) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10)


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


# ---- headers that change the meaning of a request (lumenrt.protocols.http_headers) ---------------------

INFER = "/v2/models/digits_mlp/infer"


def labels(response: tuple[int, dict[str, str], bytes]) -> list[int]:
    status, headers, body = response
    assert status == 200, body
    n = int(headers.get("inference-header-content-length", len(body)))
    doc = json.loads(body[:n])
    label = next(o for o in doc["outputs"] if o["name"] == "label")
    data: list[int] = label["data"]
    return data


def test_http_10_closes_after_the_answer_unless_asked(server: ServerThread) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        status, headers, _ = read_response(sock)
        assert status == 200 and headers.get("connection") == "close"
        assert sock.recv(1) == b""
    with connect(server) as sock:
        buf = bytearray()
        body = infer_json(2)
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, _ = read_response(sock, buf)
        assert status == 200 and headers.get("connection") == "keep-alive"
        sock.sendall(b"POST %s HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (INFER.encode(), len(body), body))
        response = read_response(sock, buf)
        assert len(labels(response)) == 2
        assert response[1].get("connection") == "close"
        assert sock.recv(1) == b""


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v2/health/live HTTP/1.2\r\nHost: x\r\n\r\n",
        b"GET /v2/health/live HTTP/2.0\r\nHost: x\r\n\r\n",
        b"GET /v2/health/live HTTP/3.0\r\nHost: x\r\n\r\n",
        b"GET /v2/health/live HTTP/0.9\r\n\r\n",
        b"GET /v2/health/live\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ],
    ids=["1.2", "2.0", "3.0", "0.9", "0.9-bare", "h2-preface"],
)
def test_other_http_versions_are_refused_with_505(server: ServerThread, head: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(head)
        response = read_response(sock)
        assert_error(response, 505, "HTTP")
        assert sock.recv(1) == b""


def test_upgrade_is_ignored_and_the_connection_stays_http_11(server: ServerThread) -> None:
    upgrade = (
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n"
    )
    with connect(server) as sock:
        sock.sendall(upgrade + request("POST", INFER, infer_json(1)))
        buf = bytearray()
        assert read_response(sock, buf)[0] == 200  # not 101: still HTTP/1.1
        assert len(labels(read_response(sock, buf))) == 1


def test_connect_is_refused(server: ServerThread) -> None:
    assert_error(exchange(server, b"CONNECT example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n"), 405, "CONNECT")


def chunked(body: bytes, size: int, trailer: bytes = b"") -> bytes:
    chunks = [
        b"%x;ext=1\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
        for i in range(0, len(body), size)
    ]
    return b"".join(chunks) + b"0\r\n" + trailer + b"\r\n"


def test_chunked_body_is_decoded_and_trailers_are_dropped(server: ServerThread) -> None:
    body = infer_json(3)
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % INFER.encode()
    # merged into the headers, this trailer would turn the body into a raw tensor (and fail)
    trailer = b"Inference-Header-Content-Length: 0\r\n"
    stream = chunked(body, 100, trailer)
    with connect(server) as sock:
        sock.sendall(head)
        sock.sendall(stream[: len(stream) // 2])  # a chunk cut in two on the wire
        sock.sendall(stream[len(stream) // 2 :])
        assert len(labels(read_response(sock))) == 3


@pytest.mark.parametrize(
    ("headers", "status", "fragment"),
    [
        (b"Transfer-Encoding: gzip\r\n", 501, "'gzip'"),
        (b"Transfer-Encoding: gzip, chunked\r\n", 501, "'gzip, chunked'"),
        (b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 501, "'gzip, chunked'"),
        (b"Transfer-Encoding: identity\r\n", 501, "'identity'"),
        (b"Transfer-Encoding: chunked, gzip\r\n", 400, "Transfer-Encoding"),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", 400, "Content-Length and Transfer-Encoding"),
        (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400, "Content-Length and Transfer-Encoding"),
    ],
    ids=["gzip", "gzip-chunked", "two-lines", "identity", "chunked-not-last", "te-then-cl", "cl-then-te"],
)
def test_transfer_encodings_other_than_chunked_are_refused(
    server: ServerThread, headers: bytes, status: int, fragment: str
) -> None:
    raw = b"POST %s HTTP/1.1\r\nHost: x\r\n%s\r\n5\r\nhello\r\n0\r\n\r\n" % (INFER.encode(), headers)
    with connect(server) as sock:
        sock.sendall(raw)
        response = read_response(sock)
        assert_error(response, status, fragment)
        assert response[1].get("connection") == "close"
        assert sock.recv(1) == b""


def test_transfer_encoding_in_http_10_is_refused(server: ServerThread) -> None:
    raw = b"POST %s HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" % INFER.encode()
    assert_error(exchange(server, raw), 400, "Transfer-Encoding", "HTTP/1.0")


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "deflate", "identity", "identity, gzip"])
def test_compressed_json_body_is_decoded(server: ServerThread, coding: str) -> None:
    body = infer_json(2)
    plain = labels(exchange(server, request("POST", INFER, body)))
    packed = (
        zlib.compress(body) if coding == "deflate" else body if coding == "identity" else gzip.compress(body)
    )
    answer = exchange(server, request("POST", INFER, packed, {"Content-Encoding": coding}))
    assert labels(answer) == plain
    assert "content-encoding" not in answer[1]


def test_compressed_binary_body_counts_the_header_length_decoded(server: ServerThread) -> None:
    x = builtin_examples("digits_mlp", 2)["input"]
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [2, 64],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    packed = gzip.compress(header + x.tobytes())
    headers = {"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(len(header))}
    assert len(labels(exchange(server, request("POST", INFER, packed, headers)))) == 2
    # checked against the decoded body's length, not the compressed one
    headers["Inference-Header-Content-Length"] = str(len(header) + x.nbytes + 1)
    assert_error(
        exchange(server, request("POST", INFER, packed, headers)), 400, "Inference-Header-Content-Length"
    )


def test_compressed_and_chunked_body(server: ServerThread) -> None:
    packed = gzip.compress(infer_json(1))
    head = (
        b"POST %s HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n" % INFER.encode()
    )
    assert len(labels(exchange(server, head + chunked(packed, 50)))) == 1


def test_compression_bomb_is_413_and_the_connection_goes_on(server: ServerThread) -> None:
    bomb = gzip.compress(bytes(4 << 20))  # 4 MiB of zeros in ~4 KiB; the limit is 1 MiB
    assert len(bomb) < 64 << 10
    with connect(server) as sock:
        sock.sendall(
            request("POST", INFER, bomb, {"Content-Encoding": "gzip"}) + request("POST", INFER, infer_json(1))
        )
        buf = bytearray()
        assert_error(read_response(sock, buf), 413, "Content-Encoding gzip", "decoded body", "1048576")
        assert len(labels(read_response(sock, buf))) == 1  # answered in turn, same connection


@pytest.mark.parametrize(
    ("coding", "body", "fragment"),
    [
        ("gzip", b"not gzip at all", "not valid gzip"),
        ("deflate", b"not zlib either", "not valid deflate"),
        ("gzip", gzip.compress(b'{"inputs": []}')[:-6], "ends inside"),
        ("deflate", zlib.compress(b"{}") + b"junk", "after the end"),
    ],
    ids=["gzip", "deflate", "truncated", "trailing"],
)
def test_corrupt_compressed_body_is_400(
    server: ServerThread, coding: str, body: bytes, fragment: str
) -> None:
    with connect(server) as sock:
        sock.sendall(
            request("POST", INFER, body, {"Content-Encoding": coding}) + request("GET", "/v2/health/live")
        )
        buf = bytearray()
        assert_error(read_response(sock, buf), 400, f"Content-Encoding {coding}", fragment)
        assert read_response(sock, buf)[0] == 200


@pytest.mark.parametrize(
    ("coding", "fragment"), [("br", "'br'"), ("zstd", "'zstd'"), ("gzip, deflate", "more than one coding")]
)
def test_unsupported_content_encoding_is_415(server: ServerThread, coding: str, fragment: str) -> None:
    response = exchange(server, request("POST", INFER, b"xxxx", {"Content-Encoding": coding}))
    assert_error(response, 415, "Content-Encoding", fragment)
    assert response[1]["accept-encoding"] == "gzip, deflate"


def test_accept_encoding_is_a_preference_the_answer_is_identity(server: ServerThread) -> None:
    response = exchange(
        server, request("POST", INFER, infer_json(1), {"Accept-Encoding": "gzip;q=1, identity;q=0"})
    )
    assert len(labels(response)) == 1
    assert "content-encoding" not in response[1]


def test_expect_100_continue_is_answered_before_the_body(server: ServerThread) -> None:
    body = infer_json(2)
    with connect(server) as sock:
        sock.sendall(
            request("POST", INFER, b"", {"Expect": "100-continue"}).replace(
                b"Content-Length: 0", b"Content-Length: %d" % len(body)
            )
        )
        interim = b""
        while len(interim) < len(CONTINUE):
            chunk = sock.recv(len(CONTINUE) - len(interim))
            assert chunk, "closed before 100 Continue"
            interim += chunk
        assert interim == CONTINUE
        sock.sendall(body)
        assert len(labels(read_response(sock))) == 2


def test_expect_100_continue_with_a_body_over_the_limit_is_413_at_once(server: ServerThread) -> None:
    head = (
        b"POST %s HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2000000\r\n\r\n"
        % INFER.encode()
    )
    with connect(server) as sock:
        sock.sendall(head)
        status, _, body = read_response(sock)  # the first bytes back: no 100 before it
        assert status == 413 and b"over the limit" in body
        assert sock.recv(1) == b""


def test_expect_100_continue_in_http_10_is_ignored(server: ServerThread) -> None:
    body = infer_json(1)
    head = b"POST %s HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (
        INFER.encode(),
        len(body),
    )
    with connect(server) as sock:
        sock.sendall(head)
        sock.sendall(body)
        assert len(labels(read_response(sock))) == 1  # read_response would choke on a 100 first


def test_other_expectations_are_417(server: ServerThread) -> None:
    response = exchange(server, request("POST", INFER, infer_json(1), {"Expect": "200-ok"}))
    assert_error(response, 417, "Expect", "'200-ok'")
    assert response[1].get("connection") == "close"


# ---- request parameters (lumenrt.protocols.parameters) -------------------------------------------------


def infer_doc(**extra: object) -> dict[str, object]:
    doc = json.loads(infer_json(1))
    assert isinstance(doc, dict)
    doc.update(extra)
    return doc


def with_input_parameters(params: object) -> dict[str, object]:
    doc = infer_doc()
    doc["inputs"][0]["parameters"] = params  # type: ignore[index]
    return doc


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (infer_doc(parameters={"lumenrt_timing": "yes"}), 'parameters.lumenrt_timing: must be a boolean, got "yes"'),
        (infer_doc(parameters={"lumenrt_timing": 1}), "parameters.lumenrt_timing: must be a boolean, got 1"),
        (infer_doc(parameters={"binary_data_output": "true"}), 'parameters.binary_data_output: must be a boolean, got "true"'),
        (infer_doc(parameters={"timeout": -1}), "parameters.timeout: must be an integer number of microseconds"),
        (infer_doc(parameters={"timeout": 1.5}), "parameters.timeout: must be an integer number of microseconds"),
        (infer_doc(parameters={"timeout": True}), "parameters.timeout:"),
        (infer_doc(parameters={"timeout": 1 << 32}), "in 0..4294967295"),
        (infer_doc(parameters={"priority": -2}), "parameters.priority: must be a non-negative integer, got -2"),
        (infer_doc(parameters={"priority": "high"}), "parameters.priority"),
        (infer_doc(parameters={"sequence_id": 7}), "parameters.sequence_id: sequence batching is not supported"),
        (infer_doc(parameters={"sequence_start": True}), "parameters.sequence_start"),
        (infer_doc(parameters=[1]), "parameters must be a JSON object"),
        (infer_doc(parameters=""), "parameters must be a JSON object"),
        (with_input_parameters({"binary_data_size": -1}), "inputs[0].parameters.binary_data_size: must be a non-negative integer, got -1"),
        (with_input_parameters({"binary_data_size": "256"}), 'inputs[0].parameters.binary_data_size: must be a non-negative integer, got "256"'),
        (with_input_parameters({"binary_data_size": 256.0}), "inputs[0].parameters.binary_data_size"),
        (with_input_parameters({"shared_memory_region": "r", "shared_memory_byte_size": 4}), "inputs[0] ('input'): has both data and parameters.shared_memory_region"),
        (with_input_parameters(7), "inputs[0].parameters must be a JSON object"),
        (infer_doc(outputs=[{"name": "label", "parameters": {"binary_data": "yes"}}]), 'outputs[0].parameters.binary_data: must be a boolean, got "yes"'),
        (infer_doc(outputs=[{"name": "label", "parameters": {"classification": 3}}]), "outputs[0].parameters.classification: the classification extension is not supported"),
        (infer_doc(outputs=[{"name": "label", "parameters": {"shared_memory_region": "r"}}]), "outputs[0].parameters.shared_memory_byte_size: required with shared_memory_region"),
    ],
    ids=[
        "timing-string", "timing-int", "binary-output-string", "timeout-negative", "timeout-float",
        "timeout-bool", "timeout-over-cap", "priority-negative", "priority-string", "sequence-id",
        "sequence-start", "parameters-list", "parameters-string", "size-negative", "size-string", "size-float",
        "input-shm", "input-parameters-int", "binary-data-string", "classification", "output-shm",
    ],
)  # fmt: skip
def test_bad_parameters_are_400_naming_the_parameter(
    server: ServerThread, doc: object, fragment: str
) -> None:
    assert_error(exchange(server, request("POST", INFER, json.dumps(doc).encode())), 400, fragment)


def test_good_parameters_are_honoured(server: ServerThread) -> None:
    params = {
        "timeout": 5_000_000,
        "priority": 1,
        "lumenrt_timing": True,
        "sequence_id": 0,
        "binary_data_output": False,
    }
    doc = infer_doc(parameters=params, outputs=[{"name": "label", "parameters": {"binary_data": True}}])
    status, headers, body = exchange(server, request("POST", INFER, json.dumps(doc).encode()))
    assert status == 200, body
    head = json.loads(body[: int(headers["inference-header-content-length"])])
    assert head["parameters"]["lumenrt_batch_size"] >= 1
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 8
    null = infer_doc(parameters={"timeout": None, "lumenrt_timing": None})  # null: not given
    assert labels(exchange(server, request("POST", INFER, json.dumps(null).encode())))


def test_repository_parameters_are_checked(server: ServerThread) -> None:
    index = exchange(server, request("POST", "/v2/repository/index", b'{"ready": "yes"}'))
    assert_error(index, 400, 'ready: must be a boolean, got "yes"')
    ready = exchange(server, request("POST", "/v2/repository/index", b'{"ready": true}'))
    assert ready[0] == 200 and {m["name"] for m in json.loads(ready[2])} == {"digits_mlp"}
    load = request("POST", "/v2/repository/models/digits_mlp/load", b'{"parameters": {"config": "{}"}}')
    assert_error(exchange(server, load), 400, "load parameters are not supported", "config")
