"""lumenrt's own gRPC server (ingress/grpc_h2.py) on real sockets, where HTTP/2 itself is the subject:
lumenrt's gRPC clients against both servers, grpcio's compressed calls, many calls on one
connection, and hand-made HTTP/2 (the ``h2`` package's client) for the limits, timeouts and
refusals a client library would never send."""

import asyncio
import gzip
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from lumenrt.client.grpc import AsyncGrpcClient, GrpcClient, GrpcError, encode_infer
from lumenrt.engine.engine import Engine
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import ServeLimits
from lumenrt.protocols import grpc_wire as wire
from lumenrt.protocols.hpack import encode_block
from lumenrt.protocols.http2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    REFUSED_STREAM,
    RST_STREAM,
    frame_header,
    settings_frame,
)
from lumenrt.protocols.proto import grpc_service_pb2 as pb
from tests.integration import slow_model_state
from tests.integration.h2_clients import INFER, RawH2, ended, status_of

MODEL = "digits_mlp"


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = Engine(models=[MODEL])
    yield eng
    eng.close()


def serve(engine: Engine, kind: str = "h2", **limits: Any) -> ServerThread:
    options = ServeOptions(
        http_port=None, grpc_port=0, tcp_port=None, grpc_server=kind, limits=ServeLimits(**limits)
    )
    return ServerThread(engine, options)


@pytest.fixture(scope="module", params=["h2", "grpcio"])
def server(engine: Engine, request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    with serve(engine, request.param) as st:
        yield st


@pytest.fixture(scope="module")
def h2_server(engine: Engine) -> Iterator[ServerThread]:
    with serve(engine) as st:
        yield st


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 64), dtype=np.float32)


# ---- lumenrt's clients, against both servers -------------------------------------------------------


def test_the_blocking_client_infers_and_names_errors(server: ServerThread, engine: Engine) -> None:
    x = rows(3)
    with GrpcClient("127.0.0.1", server.ports["grpc"]) as client:
        result = client.infer(MODEL, {"input": x}, timing=True)
        expected = engine.infer(MODEL, {"input": x}).outputs
        np.testing.assert_allclose(result.outputs["probabilities"], expected["probabilities"], rtol=1e-6)
        assert result.outputs["label"].tolist() == expected["label"].tolist()
        assert result.timing["batch_size"] >= 1
        with pytest.raises(GrpcError) as info:
            client.infer("no_such_model", {"input": x})
        assert (info.value.code, info.value.status) == (wire.NOT_FOUND, 404)
        assert "no_such_model" in info.value.message
        with pytest.raises(GrpcError) as info:
            client.infer(MODEL, {"input": rows(1)[:, :10]})
        assert info.value.code == wire.INVALID_ARGUMENT and "shape" in info.value.message
        assert client.infer(MODEL, {"input": x}, outputs=["label"]).outputs.keys() == {"label"}


def test_many_calls_at_once_on_one_connection_each_get_their_own_answer(
    server: ServerThread, engine: Engine
) -> None:
    inputs = [rows(1, seed) for seed in range(300)]
    expected = [int(engine.infer(MODEL, {"input": x}).outputs["label"][0]) for x in inputs]

    async def run() -> list[int]:
        async with AsyncGrpcClient("127.0.0.1", server.ports["grpc"]) as client:
            results = await asyncio.gather(*(client.infer(MODEL, {"input": x}) for x in inputs))
        return [int(r.outputs["label"][0]) for r in results]

    assert asyncio.run(run()) == expected


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_grpcio_compressed_calls_are_inflated(server: ServerThread, engine: Engine, compression: Any) -> None:
    x = rows(2)
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc']}", compression=compression) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name="input", datatype="FP32", shape=[2, 64])
        request.raw_input_contents.append(x.tobytes())
        response = stub.ModelInfer(request)
    labels = np.frombuffer(response.raw_output_contents[1], dtype=np.int64)
    assert labels.tolist() == engine.infer(MODEL, {"input": x}).outputs["label"].tolist()


# ---- hand-made HTTP/2 against lumenrt's server ------------------------------------------------------


def answers_a_call(client: "RawH2", stream_id: int) -> None:
    """A good ModelInfer call on ``stream_id`` is answered OK."""
    client.request(stream_id)
    client.conn.send_data(stream_id, infer_message(rows(1)), end_stream=True)
    client.flush()
    assert status_of(client.events(ended(stream_id)), stream_id) == (wire.OK, "")


def infer_message(x: np.ndarray) -> bytes:
    request = encode_infer(MODEL, {"input": x})
    return wire.frame_prefix(len(request)) + request


@pytest.fixture
def raw(h2_server: ServerThread) -> Iterator[RawH2]:
    client = RawH2(h2_server.ports["grpc"])
    yield client
    client.close()


def test_a_hand_made_call_is_answered_in_one_write(raw: RawH2) -> None:
    raw.request(1)
    raw.conn.send_data(1, infer_message(rows(1)), end_stream=True)
    raw.flush()
    events = raw.events(ended(1))
    assert status_of(events, 1) == (wire.OK, "")
    (data,) = [e.data for e in events if isinstance(e, h2.events.DataReceived)]
    response = pb.ModelInferResponse.FromString(data[5:])
    assert [o.name for o in response.outputs] == ["probabilities", "label"]


def test_a_message_over_the_limit_is_refused_from_its_prefix_and_the_connection_goes_on(
    engine: Engine,
) -> None:
    with serve(engine, max_body_bytes=1000) as st:
        client = RawH2(st.ports["grpc"])
        try:
            client.request(1)
            client.conn.send_data(1, wire.frame_prefix(50_000_000))  # the prefix alone: no body sent
            client.flush()
            events = client.events(ended(1))
            code, message = status_of(events, 1)
            assert code == wire.RESOURCE_EXHAUSTED and "50000000 bytes" in message
            assert any(isinstance(e, h2.events.StreamReset) and e.error_code == 0 for e in events)
            answers_a_call(client, 3)  # the connection goes on
        finally:
            client.close()


def test_a_gzip_message_that_inflates_past_the_limit_is_refused(engine: Engine) -> None:
    with serve(engine, max_body_bytes=100_000) as st:
        client = RawH2(st.ports["grpc"])
        try:
            client.conn.send_headers(1, [
                (b":method", b"POST"), (b":scheme", b"http"), (b":path", INFER),
                (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"grpc-encoding", b"gzip"),
            ])  # fmt: skip
            bomb = gzip.compress(b"\0" * 10_000_000)
            client.conn.send_data(1, wire.frame_prefix(len(bomb), compressed=True) + bomb, end_stream=True)
            client.flush()
            code, message = status_of(client.events(ended(1)), 1)
            assert code == wire.RESOURCE_EXHAUSTED and "inflates past" in message
        finally:
            client.close()


def test_unknown_methods_and_non_grpc_requests_are_refused(raw: RawH2) -> None:
    raw.request(1, path=b"/inference.GRPCInferenceService/ModelStreamInfer")
    raw.conn.end_stream(1)
    raw.flush()
    code, message = status_of(raw.events(ended(1)), 1)
    assert code == wire.UNIMPLEMENTED and "ModelStreamInfer" in message
    raw.request(3, content_type=b"application/json")
    raw.conn.end_stream(3)
    raw.flush()
    (head,) = [e for e in raw.events(ended(3)) if isinstance(e, h2.events.ResponseReceived)]
    assert dict(head.headers)[b":status"] == b"415"


def test_a_request_without_a_message_is_a_clear_error(raw: RawH2) -> None:
    raw.request(1)
    raw.conn.end_stream(1)
    raw.flush()
    code, message = status_of(raw.events(ended(1)), 1)
    assert code == wire.UNIMPLEMENTED and "without a request message" in message


# a call's request head, by hand (no dynamic table: it reads the same on any connection)
CALL_HEAD = encode_block(
    [(b":method", b"POST"), (b":scheme", b"http"), (b":path", INFER), (b"content-type", b"application/grpc")]
)


def refused_streams(sock: socket.socket, count: int) -> list[int]:
    """Read frames until ``count`` streams were reset REFUSED_STREAM; their ids."""
    refused: list[int] = []
    data = b""
    while len(refused) < count:
        data += sock.recv(65536)
        while len(data) >= 9:
            hi, lo, kind, _, stream = struct.unpack_from(">BHBBL", data)
            length = (hi << 16) | lo
            if len(data) < 9 + length:
                break
            if kind == RST_STREAM and struct.unpack_from(">L", data, 9)[0] == REFUSED_STREAM:
                refused.append(stream)
            data = data[9 + length :]
    return refused


def test_streams_past_the_limit_are_refused(h2_server: ServerThread) -> None:
    """Frames by hand (h2's client keeps to the server's limit of 100 itself)."""
    ids = list(range(1, 2 * 102, 2))
    with socket.create_connection(("127.0.0.1", h2_server.ports["grpc"]), timeout=5) as sock:
        sock.sendall(PREFACE + settings_frame([]))
        sock.sendall(b"".join(frame_header(len(CALL_HEAD), HEADERS, END_HEADERS, i) + CALL_HEAD for i in ids))
        assert refused_streams(sock, 2) == ids[100:]
        message = infer_message(rows(1))  # the open ones still work
        sock.sendall(frame_header(len(message), DATA, END_STREAM, 1) + message)
        answer = b""
        while b"grpc-status" not in answer:  # the trailers' name is sent literally
            answer += sock.recv(65536)


def test_a_call_that_stops_arriving_times_out_and_the_connection_goes_on(engine: Engine) -> None:
    with serve(engine, receive_timeout_s=0.3) as st:
        client = RawH2(st.ports["grpc"])
        try:
            client.request(1)
            client.conn.send_data(1, infer_message(rows(1))[:20])  # part of the message, then nothing
            client.flush()
            code, message = status_of(client.events(ended(1), timeout_s=5), 1)
            assert code == wire.DEADLINE_EXCEEDED and "did not arrive whole" in message
            answers_a_call(client, 3)  # the connection goes on
        finally:
            client.close()


def test_an_idle_connection_is_sent_goaway_and_closed(engine: Engine) -> None:
    with serve(engine, idle_timeout_s=0.3) as st:
        client = RawH2(st.ports["grpc"])
        try:
            events = client.events(lambda _: client.closed, timeout_s=5)
            goaways = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
            assert goaways and goaways[0].error_code == 0
        finally:
            client.close()


def test_a_bad_preface_gets_goaway_and_a_closed_connection(h2_server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", h2_server.ports["grpc"]), timeout=5) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    frames, at = [], 0
    while at + 9 <= len(data):
        hi, lo, kind, _, _ = struct.unpack_from(">BHBBL", data, at)
        frames.append(kind)
        at += 9 + ((hi << 16) | lo)
    assert frames[-1] == 7  # GOAWAY
    assert struct.unpack_from(">L", data, at - ((hi << 16) | lo) + 4)[0] == 1  # PROTOCOL_ERROR


def test_a_cancelled_call_leaves_nothing_behind(raw: RawH2, h2_server: ServerThread) -> None:
    raw.request(1)
    raw.conn.send_data(1, infer_message(rows(1))[:10])
    raw.conn.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
    answers_a_call(raw, 3)
    settle(h2_server, [])  # nothing held: no call, arriving or running, no bytes


def test_a_repeated_signature_is_checked_as_the_first_one_was(
    h2_server: ServerThread, engine: Engine
) -> None:
    """The second request of a signature takes its plan (grpc_service.prepare_infer_bytes): the same
    answers, and the same refusals for what changes between requests (the raw contents, the id)."""
    x = rows(2, seed=3)
    request = encode_infer(MODEL, {"input": x})
    with GrpcClient("127.0.0.1", h2_server.ports["grpc"]) as client:
        first, second = (pb.ModelInferResponse.FromString(client.call("ModelInfer", request)) for _ in "12")
        assert first == second
        expected = engine.infer(MODEL, {"input": x}).outputs["label"].tolist()
        assert np.frombuffer(second.raw_output_contents[1], np.int64).tolist() == expected
        short = pb.ModelInferRequest.FromString(request)
        short.raw_input_contents[0] = short.raw_input_contents[0][:-4]
        with pytest.raises(GrpcError) as info:
            client.call("ModelInfer", short.SerializeToString())
        assert info.value.code == wire.INVALID_ARGUMENT and "bytes" in info.value.message
        named = pb.ModelInferRequest.FromString(request)
        named.id = "req-7"
        assert (
            pb.ModelInferResponse.FromString(client.call("ModelInfer", named.SerializeToString())).id
            == "req-7"
        )
        with pytest.raises(GrpcError) as info:
            client.call("ModelInfer", b"\x0a\xff")  # not a message
        assert info.value.code == wire.INVALID_ARGUMENT and "does not parse" in info.value.message


# ---- the books: counters, resets, budgets ----------------------------------------------------------


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """The ``slow`` model (one worker, held on GATE), served over lumenrt's gRPC server."""
    root = tmp_path_factory.mktemp("slow_repo")
    slow_model_state.write_slow_model(root)
    eng = Engine(root, models=["slow"])
    try:
        with serve(eng) as st:
            yield st
    finally:
        slow_model_state.GATE.set()
        eng.close()


def slow_message() -> bytes:
    request = encode_infer("slow", {"x": np.array([1.0, 2.0], dtype=np.float32)})
    return wire.frame_prefix(len(request)) + request


def books(st: ServerThread) -> list[tuple[Any, ...]]:
    """Each connection's calls, arriving, running, buffered bytes and the session's held streams
    (read on the server's loop)."""

    async def read() -> list[tuple[Any, ...]]:
        conns = st.app.front_ends["grpc"].connections  # type: ignore[attr-defined]
        return [
            (len(c.calls), c._open, c._in_flight, c._buffered, c.session.extra_streams if c.session else 0)
            for c in conns
        ]

    return st.call(read())  # type: ignore[no-any-return]


def settle(st: ServerThread, busy: list[tuple[Any, ...]], timeout_s: float = 10.0) -> None:
    """Wait until the connections that hold anything hold ``busy`` (others, idle, may linger)."""
    deadline = time.monotonic() + timeout_s
    while [entry for entry in books(st) if any(entry)] != busy:
        assert time.monotonic() < deadline, books(st)
        time.sleep(0.02)


def test_a_call_reset_while_it_runs_is_dropped_and_leaves_the_books_even(slow: ServerThread) -> None:
    gate, entered = slow_model_state.GATE, slow_model_state.ENTERED
    client = RawH2(slow.ports["grpc"])
    try:
        gate.clear()
        entered.clear()
        client.request(1)
        client.conn.send_data(1, slow_message(), end_stream=True)
        client.flush()
        assert entered.wait(10)
        client.conn.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
        client.flush()
        settle(slow, [(1, 0, 1, 0, 1)])  # still running, counted against the stream limit
        gate.set()
        settle(slow, [])  # its answer came back and was dropped
        client.request(3)
        client.conn.send_data(3, slow_message(), end_stream=True)
        client.flush()
        assert status_of(client.events(ended(3)), 3) == (wire.OK, "")
    finally:
        gate.set()
        client.close()


def test_resetting_calls_as_fast_as_they_open_starts_no_more_than_the_stream_limit(
    slow: ServerThread,
) -> None:
    gate, entered = slow_model_state.GATE, slow_model_state.ENTERED
    block = CALL_HEAD
    message = slow_message()
    ids = list(range(1, 2 * 150, 2))
    try:
        gate.clear()
        entered.clear()
        with socket.create_connection(("127.0.0.1", slow.ports["grpc"]), timeout=5) as sock:
            sock.sendall(PREFACE + settings_frame([]))
            burst = b"".join(
                frame_header(len(block), HEADERS, END_HEADERS, i) + block
                + frame_header(len(message), DATA, END_STREAM, i) + message
                + frame_header(4, RST_STREAM, 0, i) + struct.pack(">L", 8)
                for i in ids
            )  # fmt: skip
            sock.sendall(burst)
            # refused: when their HEADERS came, 100 reset calls were still held (queued or running);
            # without the bound every stream would be taken, and this read would time out
            assert len(refused_streams(sock, 50)) == 50
            gate.set()
            settle(slow, [])
    finally:
        gate.set()


def test_a_request_ended_by_trailers_is_answered_and_counted_once(
    raw: RawH2, h2_server: ServerThread
) -> None:
    raw.request(1)
    raw.conn.send_data(1, infer_message(rows(1)))
    raw.conn.send_headers(1, [(b"x-trailer", b"1")], end_stream=True)
    raw.flush()
    assert status_of(raw.events(ended(1)), 1) == (wire.OK, "")
    settle(h2_server, [])


def test_the_requests_arriving_on_a_connection_share_one_byte_budget(engine: Engine) -> None:
    with serve(engine, max_body_bytes=100_000) as st:
        client = RawH2(st.ports["grpc"])
        try:
            client.events(lambda events: any(isinstance(e, h2.events.WindowUpdated) for e in events))
            for stream_id in (1, 3, 5):  # each claims 60 KB and sends 40 KB of it
                client.request(stream_id)
                body = wire.frame_prefix(60_000) + b"\0" * 40_000
                for at in range(0, len(body), 16384):  # h2 keeps to the frame size
                    client.conn.send_data(stream_id, body[at : at + 16384])
                client.flush()
            code, message = status_of(client.events(ended(5)), 5)
            assert code == wire.RESOURCE_EXHAUSTED and "more than 100000 bytes" in message
            assert books(st) == [(2, 2, 0, 80_010, 0)]  # the first two go on
        finally:
            client.close()
        settle(st, [])


def test_the_clients_reconnect_after_the_servers_goaway(engine: Engine) -> None:
    x = rows(1)
    with serve(engine, idle_timeout_s=0.3) as st:
        with GrpcClient("127.0.0.1", st.ports["grpc"], idle_check_s=0.5) as client:
            client.infer(MODEL, {"input": x})
            time.sleep(1.5)  # the server sends GOAWAY and closes the idle connection
            assert client.infer(MODEL, {"input": x}).outputs["label"].shape == (1,)

        async def run() -> None:
            async with AsyncGrpcClient("127.0.0.1", st.ports["grpc"]) as client:
                await client.infer(MODEL, {"input": x})
                await asyncio.sleep(1.5)
                await client.infer(MODEL, {"input": x})

        asyncio.run(run())


def test_a_call_cancelled_by_its_caller_does_not_break_the_connection(h2_server: ServerThread) -> None:
    async def run() -> None:
        async with AsyncGrpcClient("127.0.0.1", h2_server.ports["grpc"]) as client:
            for _ in range(20):  # cancel in flight, whatever point the answer has reached
                task = asyncio.ensure_future(client.infer(MODEL, {"input": rows(1)}))
                await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            result = await client.infer(MODEL, {"input": rows(1)})
            assert result.outputs["label"].shape == (1,)

    asyncio.run(run())
