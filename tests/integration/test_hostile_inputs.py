"""Hostile requests against a real server (ServerThread, raw sockets on loopback): each is answered
with a clear error naming the limit, before anything is allocated for what it claims, and the
server goes on serving. Then the model repository: load and unload cannot name a path outside it,
and a symlink out of it is refused."""

import gzip
import json
import socket
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from lumenrt.client import HttpClient, TcpClient
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import ServeLimits
from lumenrt.models.builtin import builtin_examples
from lumenrt.protocols import tcp

MODEL = "digits_mlp"
LIMITS = ServeLimits(max_body_bytes=1 << 20, max_connections_per_client=4, max_chunks=64)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    options = ServeOptions(http_port=0, grpc_port=0, tcp_port=0, limits=LIMITS)
    with (
        Engine(models=[MODEL], settings=EngineConfig(thread_count=1, pin=False)) as engine,
        ServerThread(engine, options) as st,
    ):
        yield st


def exchange(st: ServerThread, raw: bytes) -> tuple[int, str]:
    """One raw HTTP request; (status, body) of its answer."""
    with socket.create_connection(("127.0.0.1", st.ports["http"]), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(head.split(b" ")[1]), body.decode(errors="replace")


def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def still_serving(st: ServerThread) -> None:
    with HttpClient("127.0.0.1", st.ports["http"]) as client:
        assert client.infer(MODEL, {"input": builtin_examples(MODEL, 1)["input"]}).outputs


def test_deep_json_is_refused_before_it_is_parsed(server: ServerThread) -> None:
    body = b'{"inputs": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    status, text = exchange(server, post(f"/v2/models/{MODEL}/infer", body))
    assert status == 400 and "JSON nested deeper than the limit of 64 levels" in text
    status, text = exchange(server, post("/v2/repository/index", b"[" * 1000 + b"]" * 1000))
    assert status == 400 and "deeper than the limit" in text
    still_serving(server)


def test_too_many_tensors_are_refused(server: ServerThread) -> None:
    entry = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    status, text = exchange(
        server, post(f"/v2/models/{MODEL}/infer", json.dumps({"inputs": [entry] * 1025}).encode())
    )
    assert status == 400 and "inputs has 1025 tensors, over the limit of 1024" in text
    doc = {"inputs": [entry], "outputs": [{"name": "y"}] * 1025}
    status, text = exchange(server, post(f"/v2/models/{MODEL}/infer", json.dumps(doc).encode()))
    assert status == 400 and "outputs has 1025 tensors" in text
    still_serving(server)


def test_bytes_elements_claiming_more_than_was_sent_are_refused(server: ServerThread) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "BYTES",
                    "shape": [1 << 20],
                    "parameters": {"binary_data_size": 8},
                }
            ]
        }
    ).encode()
    raw = struct.pack("<I", 0xFFFFFFFF) + b"abcd"
    status, text = exchange(
        server,
        post(
            f"/v2/models/{MODEL}/infer", header + raw, {"Inference-Header-Content-Length": str(len(header))}
        ),
    )
    assert status == 400 and "cannot hold 1048576 BYTES elements" in text
    header = json.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 8}}
            ]
        }
    ).encode()
    status, text = exchange(
        server,
        post(
            f"/v2/models/{MODEL}/infer", header + raw, {"Inference-Header-Content-Length": str(len(header))}
        ),
    )
    assert status == 400 and "claims 4294967295 bytes but only 4 remain" in text
    still_serving(server)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_compression_bomb_stops_at_the_body_limit(server: ServerThread, coding: str) -> None:
    plain = b"\0" * (64 << 20)  # 64 MiB of zeros: ~64 KiB compressed
    packed = gzip.compress(plain, 9) if coding == "gzip" else zlib.compress(plain, 9)
    assert len(packed) < LIMITS.max_body_bytes
    status, text = exchange(server, post(f"/v2/models/{MODEL}/infer", packed, {"Content-Encoding": coding}))
    assert status == 413 and "limit" in text
    still_serving(server)


def test_too_many_headers_or_chunks_are_refused(server: ServerThread) -> None:
    headers = "".join(f"X-H{i}: v\r\n" for i in range(101))
    status, text = exchange(server, f"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    assert status == 431 and "more than 100 header fields" in text
    chunks = b"".join(b"1\r\n \r\n" for _ in range(65)) + b"0\r\n\r\n"
    head = f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    status, text = exchange(server, head + chunks)
    assert status == 413 and "more than 64 chunks" in text
    still_serving(server)


def test_connections_past_the_per_client_limit_are_refused_until_some_close(server: ServerThread) -> None:
    held = [socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10) for _ in range(4)]
    try:
        for sock in held:  # each is served (and so counted) before the next opens
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        status, text = exchange(server, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 429 and "too many connections from 127.0.0.1: the limit is 4 per client" in text
        with TcpClient("127.0.0.1", server.ports["tcp"]) as tc:  # each front end counts its own
            assert tc.infer(MODEL, {"input": builtin_examples(MODEL, 1)["input"]}).outputs
    finally:
        for sock in held:
            sock.close()
    still_serving(server)


def test_tcp_connections_past_the_limit_get_an_error_frame(server: ServerThread) -> None:
    held = [TcpClient("127.0.0.1", server.ports["tcp"]) for _ in range(4)]
    try:
        for client in held:
            client.infer(MODEL, {"input": builtin_examples(MODEL, 1)["input"]})
        with socket.create_connection(("127.0.0.1", server.ports["tcp"]), timeout=10) as sock:
            data = b""
            while (
                len(data) < tcp.HEADER_BYTES
                or len(data) < tcp.HEADER_BYTES + struct.unpack_from("<I", data, 16)[0]
            ):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        info = tcp.decode_error(data[tcp.HEADER_BYTES :])
        assert info.status == 429 and "the limit is 4 per client" in info.message
    finally:
        for client in held:
            client.close()


# ---- the model repository ----------------------------------------------------------------------

CONFIG = "backend: python\nmax_batch_size: 0\ninput:\n- {name: x, datatype: FP32, dims: [1]}\noutput:\n- {name: y, datatype: FP32, dims: [1]}\n"
CODE = "class Model:\n    def load(self, folder):\n        pass\n\n    def infer(self, inputs):\n        return {'y': inputs['x']}\n"


def make_model(folder: Path) -> None:
    (folder / "1").mkdir(parents=True)
    (folder / "config.yaml").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(CODE)


@pytest.fixture(scope="module")
def repo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    base = tmp_path_factory.mktemp("repo")
    repo, outside = base / "models", base / "outside"
    make_model(repo / "echo")
    make_model(outside / "evil")
    (repo / "linked").symlink_to(outside / "evil")  # a model folder that leads out
    make_model(repo / "code_link")
    (repo / "code_link" / "1" / "model.py").unlink()
    (repo / "code_link" / "1" / "model.py").symlink_to(outside / "evil" / "1" / "model.py")
    with (
        Engine(repo, settings=EngineConfig(thread_count=1, pin=False), models=["echo"]) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=0, tcp_port=None)) as st,
    ):
        yield st


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("..", "is not a model name"),
        ("%2e%2e", "is not a model name"),
        ("..%2foutside%2fevil", "no route"),  # unquoted, it is a longer path: no such route
        (".hidden", "is not a model name"),
        ("linked", "outside the model repository"),
        ("code_link", "outside the model repository"),
    ],
)
def test_load_cannot_reach_outside_the_repository(
    repo_server: ServerThread, name: str, expected: str
) -> None:
    status, text = exchange(repo_server, post(f"/v2/repository/models/{name}/load", b""))
    assert status in (400, 404) and expected in text
    status, _ = exchange(repo_server, post("/v2/repository/models/echo/load", b""))
    assert status == 200


@pytest.mark.parametrize("name", ["../outside/evil", "/etc", "linked", "code_link", "a\0b"])
def test_grpc_load_cannot_reach_outside_the_repository(repo_server: ServerThread, name: str) -> None:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{repo_server.ports['grpc']}")
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model(name)
        assert "not a model name" in str(refused.value) or "outside the model repository" in str(
            refused.value
        )
        assert client.is_model_ready("echo")
    finally:
        client.close()
