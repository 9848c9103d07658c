"""Large requests received straight into the model's arena slot (ingress/lent_slot.py): HTTP
bodies (ingress/http_body.py) and TCP frame payloads (ingress/tcp_server.py). The answer is the same
as through the engine's own copy, the inputs are never copied again, and the lent slot comes back
on every path (answered, refused, client gone mid-request, model unloaded mid-request). Both front
ends on one server per worker mode, over real loopback sockets, with SqueezeNet's 600 KB input."""

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from lumenrt.client import InferenceError, TcpClient
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.auth import Gate, KeySource
from lumenrt.ingress.http_body import SlotBody
from lumenrt.ingress.service import ServeLimits
from lumenrt.models.builtin import builtin_examples
from lumenrt.protocols import tcp as tp
from tests.integration.flow_clients import read_response
from tests.integration.slot_checks import slots_back, wait_for

MODEL = "squeezenet"
KEY = "k" * 24


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    settings = EngineConfig(worker_mode=request.param, thread_count=1, pin=False)
    with (
        Engine(models=[MODEL], settings=settings) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=0)) as st,
    ):
        yield st


def _engine(server: ServerThread) -> Engine:
    return server.app.engine


def _image() -> np.ndarray:
    return builtin_examples(MODEL, 1)["data"]


def _binary_request(x: np.ndarray, *, size: int | None = None, model: str = MODEL) -> bytes:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "data",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes if size is None else size},
                }
            ],
            "outputs": [{"name": "prob", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + x.tobytes()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n\r\n"
    ).encode()
    return head + body


def _raw_request(x: np.ndarray) -> bytes:
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {x.nbytes}\r\n"
        "Inference-Header-Content-Length: 0\r\n\r\n"
    ).encode()
    return head + x.tobytes()


def _send_in_pieces(sock: socket.socket, raw: bytes, piece: int = 4096) -> None:
    """Many small writes, so the server gets the body in many chunks."""
    for at in range(0, len(raw), piece):
        sock.sendall(raw[at : at + piece])


def _exchange(server: ServerThread, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send_in_pieces(sock, raw)
        return read_response(sock)


def _output(headers: dict[str, str], body: bytes) -> np.ndarray:
    header_length = int(headers["inference-header-content-length"])
    return np.frombuffer(body[header_length:], np.float32)


def _slots_back(server: ServerThread) -> bool:
    return slots_back(_engine(server).runtime(MODEL))


@pytest.mark.parametrize("form", ["binary", "raw"])
def test_a_body_received_in_its_slot_gives_the_engines_answer_and_is_not_copied_again(
    server: ServerThread, form: str
) -> None:
    engine = _engine(server)
    x = _image()
    expected = engine.infer(MODEL, {"data": x}).outputs["prob"].ravel()
    before = engine.runtime(MODEL).inputs_in_place
    status, headers, body = _exchange(server, _binary_request(x) if form == "binary" else _raw_request(x))
    assert status == 200, body[:300]
    np.testing.assert_allclose(_output(headers, body), expected, rtol=1e-5, atol=1e-6)
    assert engine.runtime(MODEL).inputs_in_place == before + 1  # adopted where it was received
    stats = server.app.service.statistics(MODEL)["model_stats"][0]
    assert stats["lumenrt"]["inputs_in_place"] >= 1
    wait_for(lambda: _slots_back(server))


def test_a_body_whose_sizes_do_not_add_up_is_400_and_its_slot_comes_back(server: ServerThread) -> None:
    x = _image()
    status, _, body = _exchange(server, _binary_request(x, size=x.nbytes - 4))
    assert status == 400
    assert b"inputs[0]" in body and b"602108 bytes" in body
    wait_for(lambda: _slots_back(server))


def test_unknown_model_is_404_and_lends_no_slot(server: ServerThread) -> None:
    status, _, body = _exchange(server, _binary_request(_image(), model="nope"))
    assert status == 404 and b"nope" in body
    assert _slots_back(server)


def test_a_client_gone_mid_body_gives_its_slot_back(server: ServerThread) -> None:
    raw = _binary_request(_image())
    rt = _engine(server).runtime(MODEL)
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=30) as sock:
        sock.sendall(raw[: len(raw) // 2])
        wait_for(lambda: rt.receiving == 1)  # lent while the body arrives
    wait_for(lambda: _slots_back(server))


def _split_request(x: np.ndarray) -> tuple[bytes, bytes]:
    """A binary request: its HTTP headers with the JSON header, and its tensor bytes."""
    raw = _binary_request(x)
    split = len(raw) - x.nbytes
    return raw[:split], raw[split:]


def test_a_body_past_its_json_header_is_read_into_the_slot_not_through_the_parser(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the JSON header is in, the transport reads the tensor bytes straight into the slot
    (http_server.py, Receiving): the parser hands over none of them."""
    fed: list[int] = []
    feed = SlotBody.feed
    monkeypatch.setattr(SlotBody, "feed", lambda self, chunk: (fed.append(len(chunk)), feed(self, chunk))[1])
    engine, x = _engine(server), _image()
    rt = engine.runtime(MODEL)
    head, tensors = _split_request(x)
    before = rt.inputs_in_place
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=30) as sock:
        sock.sendall(head)
        wait_for(lambda: rt.receiving == 1)  # the headers and the JSON header are in
        _send_in_pieces(sock, tensors)
        status, headers, body = read_response(sock)
    assert status == 200, body[:300]
    np.testing.assert_allclose(
        _output(headers, body), engine.infer(MODEL, {"data": x}).outputs["prob"].ravel(), rtol=1e-5, atol=1e-6
    )
    assert sum(fed) == len(head) - head.index(b"\r\n\r\n") - 4  # the JSON header only
    assert rt.inputs_in_place == before + 1
    wait_for(lambda: _slots_back(server))


def test_requests_pipelined_after_a_body_read_into_its_slot_are_answered_in_order(
    server: ServerThread,
) -> None:
    """A read into the slot stops at the body's end: what follows is parsed afresh (a new parser
    after each such body), and every answer comes back in order."""
    engine, x = _engine(server), _image()
    expected = engine.infer(MODEL, {"data": x}).outputs["prob"].ravel()
    health = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    second = _binary_request(x * 0.5)
    expected_second = engine.infer(MODEL, {"data": x * 0.5}).outputs["prob"].ravel()
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send_in_pieces(sock, _binary_request(x) + health + second + health, piece=100_000)
        buf = bytearray()
        answers = [read_response(sock, buf) for _ in range(4)]
    assert [a[0] for a in answers] == [200, 200, 200, 200], [a[2][:200] for a in answers]
    np.testing.assert_allclose(_output(answers[0][1], answers[0][2]), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_output(answers[2][1], answers[2][2]), expected_second, rtol=1e-5, atol=1e-6)
    assert json.loads(answers[1][2]) == json.loads(answers[3][2]) == {"ready": True}
    wait_for(lambda: _slots_back(server))


def test_after_a_body_read_into_its_slot_that_asks_to_close_nothing_more_is_taken(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Connection: close`` on a body read past the parser: it is answered and the connection
    closes; a request pipelined after it is not parsed (as llhttp refuses data after close), so
    it is lent no slot and gets no answer."""
    rt = _engine(server).runtime(MODEL)
    lent: list[int] = []
    receive_slot = rt.receive_slot
    monkeypatch.setattr(rt, "receive_slot", lambda n: (lent.append(n), receive_slot(n))[1])
    x = _image()
    closing = _binary_request(x).replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n", 1)
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send_in_pieces(sock, closing + _binary_request(x), piece=100_000)
        buf = bytearray()
        status, headers, body = read_response(sock, buf)
        assert status == 200, body[:300]
        assert headers.get("connection") == "close"
        rest = bytes(buf)
        while chunk := sock.recv(65536):
            rest += chunk
        assert rest == b""  # no second answer: closed after the first
    assert len(lent) == 1  # the second body was never looked at
    wait_for(lambda: _slots_back(server))


def test_unloading_waits_for_a_read_into_a_revoked_slot_to_end() -> None:
    """A front end's transport holds a view of a lent slot for the length of one read (the slot
    may be revoked meanwhile, by an unload on another thread): the region unmaps once the read
    lets go, instead of the unload failing with BufferError."""
    settings = EngineConfig(worker_mode="process", thread_count=1, pin=False)
    with Engine(models=[MODEL], settings=settings) as engine:
        rt = engine.runtime(MODEL)
        lent = rt.receive_slot(1 << 16)
        assert lent is not None
        reading = [lent[1][100:]]  # what a transport's read holds: a slice of the lent view
        threading.Timer(0.2, reading.clear).start()  # the read ends
        engine.unload(MODEL)  # revokes the slot, then unmaps the region
        assert not reading
        assert MODEL not in engine.models()


def test_a_body_stalled_while_read_into_its_slot_is_408_and_its_slot_comes_back() -> None:
    limits = ServeLimits(receive_timeout_s=0.5)
    settings = EngineConfig(worker_mode="thread", thread_count=1, pin=False)
    with (
        Engine(models=[MODEL], settings=settings) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None, limits=limits)) as st,
    ):
        rt = engine.runtime(MODEL)
        head, tensors = _split_request(_image())
        with socket.create_connection(("127.0.0.1", st.ports["http"]), timeout=30) as sock:
            sock.sendall(head + tensors[: len(tensors) // 2])
            wait_for(lambda: rt.receiving == 1)
            status, headers, body = read_response(sock)  # nothing more sent
            assert status == 408, body
            assert headers.get("connection") == "close"
            assert sock.recv(1) == b""  # closed after the answer
        wait_for(lambda: _slots_back(st))


@contextlib.contextmanager
def _keys_required(server: ServerThread) -> Iterator[None]:
    """The server asks for an API key (``KEY``) to infer while the block runs."""
    service = server.app.service
    doc = json.dumps({"keys": [{"name": "app", "key": KEY, "groups": ["inference"]}]})
    service.gate = Gate(KeySource(env_text=doc))
    try:
        yield
    finally:
        service.gate = None


def test_a_client_the_gate_refuses_is_lent_no_slot(server: ServerThread) -> None:
    with _keys_required(server):
        raw = _binary_request(_image())
        rt = _engine(server).runtime(MODEL)
        with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=30) as sock:
            sock.sendall(raw[: len(raw) // 2])
            time.sleep(0.2)
            assert rt.receiving == 0  # nothing lent to a client without a key
            sock.sendall(raw[len(raw) // 2 :])
            status, _, _ = read_response(sock)
        assert status == 401
        keyed = raw.replace(b"Host: x\r\n", f"Host: x\r\nAuthorization: Bearer {KEY}\r\n".encode(), 1)
        before = rt.inputs_in_place
        status, _, body = _exchange(server, keyed)
        assert status == 200, body[:300]
        assert rt.inputs_in_place == before + 1
    wait_for(lambda: _slots_back(server))


def test_a_model_unloaded_while_its_body_arrives_answers_503_and_unloads() -> None:
    """The slot is revoked at close (the region unmaps: no BufferError), the request is answered
    503, and the model serves again once loaded. Process mode, where the region is unmapped at
    close (thread mode's goes with its last reference); a server of its own: the reload starts
    workers."""
    settings = EngineConfig(worker_mode="process", thread_count=1, pin=False)
    with (
        Engine(models=[MODEL], settings=settings) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=0)) as server,
    ):
        service = server.app.service
        raw = _binary_request(_image())
        with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=60) as sock:
            sock.sendall(raw[: len(raw) // 2])
            rt = engine.runtime(MODEL)
            wait_for(lambda: rt.receiving == 1)
            service.unload(MODEL)  # closes the runtime: raises if the region could not unmap
            sock.sendall(raw[len(raw) // 2 :])
            status, _, body = read_response(sock)
        assert status == 503, body
        assert b"unloaded" in body
        service.load(MODEL)
        status, _, body = _exchange(server, _binary_request(_image()))
        assert status == 200, body[:300]
        wait_for(lambda: _slots_back(server))
        # the same over TCP: the frame's payload arriving into its slot
        frame = _frame(7, _image())
        with _tcp_socket(server) as sock:
            sock.sendall(frame[: len(frame) // 2])
            rt = engine.runtime(MODEL)
            wait_for(lambda: rt.receiving == 1)
            service.unload(MODEL)
            sock.sendall(frame[len(frame) // 2 :])
            answer = _read_frame(sock)
        assert (answer.kind, answer.request_id) == (tp.ERROR, 7)
        error = tp.decode_error(answer.meta)
        assert error.status == 503 and "unloaded" in error.message
        service.load(MODEL)
        with TcpClient(port=server.ports["tcp"]) as client:
            assert client.infer(MODEL, {"data": _image()}).outputs["prob"].shape == (1, 1000)
        wait_for(lambda: _slots_back(server))


# ---- TCP frames --------------------------------------------------------------------------------------


def _frame(rid: int, x: np.ndarray, model: str = MODEL, datatype: np.dtype | None = None) -> bytes:
    data = x if datatype is None else x.view(datatype)
    return b"".join(bytes(p) for p in tp.encode_request(rid, model, {"data": data}))


def _tcp_socket(server: ServerThread) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.ports["tcp"]), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_frame(sock: socket.socket) -> tp.Frame:
    frames: list[tp.Frame] = []
    decoder = tp.FrameDecoder(frames.append)
    while not frames:
        data = sock.recv(1 << 16)
        assert data, "the server closed without answering"
        decoder.feed(data)
    return frames[0]


def test_a_tcp_payload_received_in_its_slot_gives_the_engines_answer_and_is_not_copied_again(
    server: ServerThread,
) -> None:
    engine = _engine(server)
    x = _image()
    expected = engine.infer(MODEL, {"data": x}).outputs["prob"]
    rt = engine.runtime(MODEL)
    before = rt.inputs_in_place
    with TcpClient(port=server.ports["tcp"]) as client:
        got = client.infer(MODEL, {"data": x}).outputs["prob"]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert rt.inputs_in_place == before + 1  # adopted where it was received
        for _ in range(3):  # one connection, one slot lent at a time, every time
            client.infer(MODEL, {"data": x})
    assert rt.inputs_in_place == before + 4
    wait_for(lambda: _slots_back(server))


def test_a_tcp_request_its_checks_refuse_is_400_and_its_slot_comes_back(server: ServerThread) -> None:
    """Lent (the metadata names the model and the payload adds up), then refused: INT32 is not
    the input's datatype."""
    rt = _engine(server).runtime(MODEL)
    before = rt.inputs_in_place
    with _tcp_socket(server) as sock:
        sock.sendall(_frame(3, _image(), datatype=np.dtype(np.int32)))
        answer = _read_frame(sock)
    error = tp.decode_error(answer.meta)
    assert answer.request_id == 3 and error.status == 400 and "data" in error.message
    assert rt.inputs_in_place == before
    wait_for(lambda: _slots_back(server))


def test_a_tcp_request_for_an_unknown_model_is_404_and_lends_no_slot(server: ServerThread) -> None:
    frame = _frame(5, _image(), model="nope")
    rt = _engine(server).runtime(MODEL)
    with _tcp_socket(server) as sock:
        sock.sendall(frame[: len(frame) // 2])
        time.sleep(0.2)
        assert rt.receiving == 0
        sock.sendall(frame[len(frame) // 2 :])
        answer = _read_frame(sock)
    assert tp.decode_error(answer.meta).status == 404
    assert _slots_back(server)


def test_a_tcp_client_gone_mid_frame_gives_its_slot_back(server: ServerThread) -> None:
    frame = _frame(9, _image())
    rt = _engine(server).runtime(MODEL)
    with _tcp_socket(server) as sock:
        _send_in_pieces(sock, frame[: len(frame) // 2])
        wait_for(lambda: rt.receiving == 1)  # lent while the payload arrives
    wait_for(lambda: _slots_back(server))


def test_a_tcp_connection_without_a_key_is_lent_no_slot(server: ServerThread) -> None:
    rt = _engine(server).runtime(MODEL)
    with _keys_required(server):
        frame = _frame(11, _image())
        with _tcp_socket(server) as sock:
            sock.sendall(frame[: len(frame) // 2])
            time.sleep(0.2)
            assert rt.receiving == 0  # nothing lent to a connection without a key
            sock.sendall(frame[len(frame) // 2 :])
            assert tp.decode_error(_read_frame(sock).meta).status == 401
        before = rt.inputs_in_place
        with TcpClient(port=server.ports["tcp"], api_key=KEY) as client:
            client.infer(MODEL, {"data": _image()})
        assert rt.inputs_in_place == before + 1
        with TcpClient(port=server.ports["tcp"]) as client, pytest.raises(InferenceError) as info:
            client.infer(MODEL, {"data": _image()})
        assert info.value.status == 401
    wait_for(lambda: _slots_back(server))
