"""Property tests of the HTTP decoders: whatever bytes arrive, the answer is a clean HTTP error or a
result, never an exception, a hang or a crash of the connection handler.

Two levels: the V2 body decoder (``parse_infer_request``) on arbitrary and mutated bodies, and a
whole ``HttpConnection`` driven through a mock transport with arbitrary byte streams in arbitrary
chunks (the real engine answers the requests that are valid).
"""

import asyncio
import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.ingress.app import new_event_loop
from lumenrt.ingress.http_server import HttpConnection, HttpServer
from lumenrt.ingress.service import InferenceService, ServeLimits
from lumenrt.ingress.v2_http import parse_infer_request
from lumenrt.models.builtin import builtin_examples
from lumenrt.protocols.errors import ServerError
from lumenrt.protocols.http_headers import CONTINUE

MAX_ELEMENTS = 1 << 12
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=30,
)
tensor_entry = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["input", "x", ""]) | json_values,
        "datatype": st.sampled_from(["FP32", "INT64", "BYTES", "BOOL", "FP16", "UINT8", "nope"])
        | json_values,
        "shape": st.lists(st.integers(-2, 70), max_size=4) | json_values,
    },
    optional={
        "data": json_values
        | st.lists(st.floats(width=32) | st.integers(-5, 5) | st.text(max_size=3), max_size=70),
        "parameters": st.fixed_dictionaries(
            {}, optional={"binary_data_size": st.integers(-3, 300) | json_values}
        ),
    },
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "inputs": st.lists(tensor_entry, max_size=3) | json_values,
        "outputs": st.lists(st.fixed_dictionaries({"name": json_values}), max_size=2) | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["timeout", "binary_data_output", "lumenrt_timing"]), json_values
        ),
        "id": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(doc=documents, tail=st.binary(max_size=300), as_header=st.booleans())
def test_v2_body_decoder_returns_or_raises_400(doc: dict[str, Any], tail: bytes, as_header: bool) -> None:
    header = json.dumps(doc).encode()
    body = header + tail if as_header else header
    try:
        parsed = parse_infer_request(body, len(header) if as_header else None, MAX_ELEMENTS)
    except ServerError as err:
        assert err.status == 400 and err.message
        return
    for wi in parsed.inputs:
        assert wi.array.shape == wi.shape
        assert wi.array.size <= MAX_ELEMENTS


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=400), header_length=st.none() | st.integers(0, 500))
def test_v2_body_decoder_on_arbitrary_bytes(body: bytes, header_length: int | None) -> None:
    try:
        parse_infer_request(body, header_length, MAX_ELEMENTS)
    except ServerError as err:
        assert err.status == 400 and err.message


# ---- a whole connection, mock transport -------------------------------------------------------------


class MockTransport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.out += data

    def writelines(self, chunks: list[Any]) -> None:
        for c in chunks:
            self.write(bytes(c))

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0  # everything written is taken at once (no client is slow here)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str) -> Any:
        return None


@pytest.fixture(scope="module")
def loop_and_server() -> Iterator[tuple[asyncio.AbstractEventLoop, HttpServer]]:
    loop = new_event_loop()
    errors: list[Any] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    # spin_us=0: an infer is always answered after data_received returns (with the default spin,
    # a fast worker's answer could arrive inside submit, and the tests' "owed" states would vary)
    with Engine(models=["digits_mlp"], settings=EngineConfig(spin_us=0)) as engine:
        service = InferenceService(engine, ServeLimits(max_body_bytes=4096, max_header_bytes=1024))
        yield loop, HttpServer(service)
    loop.close()
    assert not errors, errors


def _valid_requests() -> list[bytes]:
    x = builtin_examples("digits_mlp", 1)["input"]
    doc = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": x.ravel().tolist()}]}
    )
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
    packed = gzip.compress(doc.encode())
    return [
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v2/models/digits_mlp/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
        % (len(doc), doc.encode()),
        b"POST /v2/models/digits_mlp/infer HTTP/1.1\r\nInference-Header-Content-Length: %d\r\n"
        b"Content-Length: %d\r\n\r\n%s%s" % (len(header), len(header) + 256, header, x.tobytes()),
        # the headers that change what a request means: compressed, chunked, Expect, HTTP/1.0
        b"POST /v2/models/digits_mlp/infer HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n"
        b"Expect: 100-continue\r\n\r\n%s" % (len(packed), packed),
        b"POST /v2/models/digits_mlp/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(doc), doc.encode()),
        b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    ]


VALID = _valid_requests()


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(st.sampled_from(VALID), min_size=1, max_size=3))
    stream = bytearray(b"".join(parts))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(len(stream) - 1, 0)))
        if op == "flip" and stream:
            stream[at] = draw(st.integers(0, 255))
        elif op == "cut":
            del stream[at : at + draw(st.integers(1, 64))]
        else:
            stream[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(stream)


def _drive(loop: asyncio.AbstractEventLoop, server: HttpServer, stream: bytes, cuts: list[int]) -> bytes:
    async def run() -> bytes:
        conn = HttpConnection(server)
        transport = MockTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        at = 0
        for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
            if transport.closed:
                break
            conn.data_received(stream[at:cut])
            at = max(at, cut)
        for _ in range(400):  # let engine answers arrive (each is one loop wake-up)
            if not conn._busy and not conn._queue:
                break
            await asyncio.sleep(0.005)
        assert not conn._busy, "a request was never answered"
        conn.connection_lost(None)
        return bytes(transport.out)

    return loop.run_until_complete(run())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=mutated_streams() | st.binary(max_size=600), cuts=st.lists(st.integers(0, 2000), max_size=5))
def test_connection_answers_any_byte_stream_cleanly(
    loop_and_server: tuple[asyncio.AbstractEventLoop, HttpServer], stream: bytes, cuts: list[int]
) -> None:
    loop, server = loop_and_server
    out = _drive(loop, server, stream, cuts)
    for status, head in responses(out):
        assert status in (100, 200, 400, 404, 405, 408, 413, 415, 417, 431, 501, 503, 505), head


def responses(out: bytes) -> Iterator[tuple[int, bytes]]:
    """(status, head) of each response in ``out``, which must hold whole responses only."""
    at = 0
    while at < len(out):
        end = out.index(b"\r\n\r\n", at) + 4
        head = out[at:end]
        assert head.startswith(b"HTTP/1.1 "), out[at : at + 200]
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        yield int(head[9:12]), head
        at = end + length


def test_100_continue_waits_for_the_answers_owed_before_it(
    loop_and_server: tuple[asyncio.AbstractEventLoop, HttpServer],
) -> None:
    loop, server = loop_and_server
    first = VALID[1]  # an infer: answered by the engine, after data_received returns
    body = VALID[1].partition(b"\r\n\r\n")[2]
    expect = (
        b"POST /v2/models/digits_mlp/infer HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
    )

    async def run() -> tuple[bytes, bytes]:
        conn = HttpConnection(server)
        transport = MockTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(first + expect % len(body))
        assert conn._busy and b"100 Continue" not in transport.out  # owed: the first answer comes first
        for _ in range(400):
            if b"100 Continue" in transport.out:
                break
            await asyncio.sleep(0.005)
        before = bytes(transport.out)
        conn.data_received(body)
        for _ in range(400):
            if not conn._busy and not conn._queue:
                break
            await asyncio.sleep(0.005)
        conn.connection_lost(None)
        return before, bytes(transport.out)

    before, after = loop.run_until_complete(run())
    assert before.startswith(b"HTTP/1.1 200 ") and before.endswith(CONTINUE)  # after the first answer
    assert after.count(b"HTTP/1.1 200 ") == 2 and after.count(CONTINUE) == 1
