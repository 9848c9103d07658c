"""The binary TCP protocol end to end on loopback (ServerThread, port 0) with the built-in models
and a gated Python model: results equal ``engine.infer``, pipelining, out-of-order answers, error
frames, a client that disconnects mid-request, timing, concurrent asyncio clients, and the limits
(oversize frame, slow and idle connections) with small ServeLimits."""

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from lumenrt.client import AsyncTcpClient, InferenceError, TcpClient
from lumenrt.engine.engine import Engine
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import ServeLimits
from lumenrt.models.builtin import builtin_examples
from lumenrt.protocols import tcp as tp
from tests.integration import slow_model_state

MODELS = ["digits_mlp", "tabular_xgb"]
WAIT_S = 20.0  # the most any condition below is waited for

GATED_MODEL = """
from tests.integration.slow_model_state import ENTERED, GATE


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        ENTERED.set()
        GATE.wait(30)
        return {"y": inputs["x"] * 2}
"""

TEXT_MODEL = """
import numpy as np


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        text = inputs["text"]
        out = np.empty(text.shape, dtype=object)
        out.reshape(-1)[:] = [bytes(t).upper() for t in text.reshape(-1)]
        return {"upper": out}
"""


def tcp_only(limits: ServeLimits | None = None) -> ServeOptions:
    if limits is None:
        return ServeOptions(http_port=None, grpc_port=None, tcp_port=0)
    return ServeOptions(http_port=None, grpc_port=None, tcp_port=0, limits=limits)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(models=MODELS) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[ServerThread]:
    with ServerThread(engine, tcp_only()) as st:
        yield st


@pytest.fixture
def client(server: ServerThread) -> Iterator[TcpClient]:
    with TcpClient("127.0.0.1", server.ports["tcp"]) as c:
        yield c


@pytest.fixture(scope="module")
def python_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root: Path = tmp_path_factory.mktemp("tcp_repo")
    for name, code, cfg in [
        ("gated", GATED_MODEL, "max_batch_size: 0\ninput:\n  - {name: x, datatype: FP32, dims: [2]}\noutput:\n  - {name: y, datatype: FP32, dims: [2]}\n"),
        ("text", TEXT_MODEL, "max_batch_size: 4\ninput:\n  - {name: text, datatype: BYTES, dims: [2]}\noutput:\n  - {name: upper, datatype: BYTES, dims: [2]}\n"),
    ]:  # fmt: skip
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(code)
        (root / name / "config.yaml").write_text("backend: python\ninstance_group: {count: 1}\n" + cfg)
    slow_model_state.GATE.set()
    with Engine(root, models=["gated", "text"]) as eng, ServerThread(eng, tcp_only()) as st:
        yield st
    slow_model_state.GATE.set()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """The gated model blocks while this is clear; set again at the end whatever happens."""
    slow_model_state.ENTERED.clear()
    slow_model_state.GATE.clear()
    yield slow_model_state.GATE
    slow_model_state.GATE.set()


@pytest.fixture(scope="module")
def strict_server() -> Iterator[ServerThread]:
    limits = ServeLimits(max_body_bytes=4096, receive_timeout_s=0.5, idle_timeout_s=1.0)
    with Engine(models=["digits_mlp"]) as eng, ServerThread(eng, tcp_only(limits)) as st:
        yield st


def rows(model: str, n: int) -> dict[str, np.ndarray]:
    return builtin_examples(model, n)


def assert_equal_outputs(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
        assert got[name].dtype == want[name].dtype


def raw_connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_frames(sock: socket.socket, count: int | None = None) -> tuple[list[tp.Frame], bool]:
    """Frames until ``count`` arrived or the server closed (then True)."""
    frames: list[tp.Frame] = []
    dec = tp.FrameDecoder(frames.append)
    while count is None or len(frames) < count:
        data = sock.recv(1 << 16)
        if not data:
            return frames, True
        dec.feed(data)
    return frames, False


def frame_bytes(rid: int, model: str, inputs: dict[str, np.ndarray], **kw: object) -> bytes:
    return b"".join(bytes(p) for p in tp.encode_request(rid, model, inputs, **kw))  # type: ignore[arg-type]


# ---- results ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("batch", [1, 4])
def test_results_equal_engine_infer(client: TcpClient, engine: Engine, model: str, batch: int) -> None:
    inputs = rows(model, batch)
    result = client.infer(model, inputs)
    assert (result.model, result.version) == (model, "1")
    assert_equal_outputs(result.outputs, engine.infer(model, inputs).outputs)


def test_requested_outputs_only_in_the_order_asked(client: TcpClient, engine: Engine) -> None:
    inputs = rows("digits_mlp", 2)
    result = client.infer("digits_mlp", inputs, outputs=["label"], version=1)
    assert list(result.outputs) == ["label"]
    np.testing.assert_array_equal(
        result.outputs["label"], engine.infer("digits_mlp", inputs).outputs["label"]
    )


def test_bytes_tensors_round_trip(python_server: ServerThread) -> None:
    text = np.array([[b"abc", b""], ["d\u00e9".encode(), b"x y"]], dtype=object)
    with TcpClient("127.0.0.1", python_server.ports["tcp"]) as c:
        out = c.infer("text", {"text": text}).outputs["upper"]
    assert out.tolist() == [[b"ABC", b""], ["D\u00e9".encode(), b"X Y"]]


def test_timing_fields_present_only_when_asked(client: TcpClient) -> None:
    timed = client.infer("digits_mlp", rows("digits_mlp", 1), timing=True)
    assert set(timed.timing) == set(tp.TIMING_FIELDS)
    assert timed.timing["compute_ns"] > 0 and timed.timing["batch_size"] >= 1
    assert timed.timing["engine_ns"] >= timed.timing["compute_ns"]
    assert client.infer("digits_mlp", rows("digits_mlp", 1)).timing == {}


# ---- many requests per connection ------------------------------------------------------------------


def test_fifty_pipelined_requests_are_all_answered_with_their_ids(
    server: ServerThread, engine: Engine
) -> None:
    sent: dict[int, tuple[str, dict[str, np.ndarray]]] = {}
    for i in range(50):
        model = MODELS[i % 2]
        sent[1000 + i] = (model, rows(model, 1 + i % 4))
    with raw_connect(server.ports["tcp"]) as sock:
        sock.sendall(b"".join(frame_bytes(rid, m, x) for rid, (m, x) in sent.items()))
        frames, closed = read_frames(sock, 50)
    assert not closed
    assert sorted(f.request_id for f in frames) == sorted(sent)
    dec = tp.ResponseDecoder()
    for f in frames:
        model, inputs = sent[f.request_id]
        _, outputs, _ = dec.decode(f)
        assert_equal_outputs(outputs, engine.infer(model, inputs).outputs)


def test_client_send_then_recv_in_any_order(client: TcpClient, engine: Engine) -> None:
    batches = [rows("digits_mlp", n) for n in (1, 2, 3, 4, 5)]
    ids = [client.send("digits_mlp", b) for b in batches]
    for rid, b in reversed(list(zip(ids, batches, strict=True))):
        assert_equal_outputs(client.recv(rid).outputs, engine.infer("digits_mlp", b).outputs)


def test_infer_many_keeps_order_and_gives_errors_in_place(client: TcpClient, engine: Engine) -> None:
    good = rows("digits_mlp", 1)
    batch = [good, {"input": good["input"].astype(np.float64)}] * 150  # more than one window
    results = client.infer_many("digits_mlp", batch, window=64)
    want = engine.infer("digits_mlp", good).outputs
    for i, r in enumerate(results):
        if i % 2:
            assert isinstance(r, InferenceError) and r.status == 400
        else:
            assert not isinstance(r, InferenceError)
            assert_equal_outputs(r.outputs, want)


def test_a_later_request_answered_first(python_server: ServerThread, gate: threading.Event) -> None:
    with TcpClient("127.0.0.1", python_server.ports["tcp"]) as c:
        slow = c.send("gated", {"x": np.array([1.0, 2.0], np.float32)})
        assert slow_model_state.ENTERED.wait(WAIT_S)
        fast = c.send("text", {"text": np.array([[b"a", b"b"]], dtype=object)})
        assert c.recv(fast).outputs["upper"].tolist() == [[b"A", b"B"]]  # while the first is held
        gate.set()
        np.testing.assert_array_equal(c.recv(slow).outputs["y"], [2.0, 4.0])


def test_async_client_matches_out_of_order_answers(
    python_server: ServerThread, gate: threading.Event
) -> None:
    async def run() -> None:
        async with AsyncTcpClient("127.0.0.1", python_server.ports["tcp"]) as c:
            slow = asyncio.ensure_future(c.infer("gated", {"x": np.array([3.0, 4.0], np.float32)}))
            await asyncio.get_running_loop().run_in_executor(None, slow_model_state.ENTERED.wait, WAIT_S)
            fast = await c.infer("text", {"text": np.array([[b"q", b"r"]], dtype=object)})
            assert fast.outputs["upper"].tolist() == [[b"Q", b"R"]]
            assert not slow.done()
            gate.set()
            np.testing.assert_array_equal((await slow).outputs["y"], [6.0, 8.0])

    asyncio.run(run())


def test_concurrent_async_requests_over_one_connection(server: ServerThread, engine: Engine) -> None:
    x = rows("digits_mlp", 32)["input"]
    want = engine.infer("digits_mlp", {"input": x}).outputs

    async def run() -> list[dict[str, np.ndarray]]:
        async with AsyncTcpClient("127.0.0.1", server.ports["tcp"]) as c:
            results = await asyncio.gather(
                *(c.infer("digits_mlp", {"input": x[i % 32 : i % 32 + 1]}) for i in range(200))
            )
            return [r.outputs for r in results]

    for i, outputs in enumerate(asyncio.run(run())):
        np.testing.assert_array_equal(outputs["label"], want["label"][i % 32 : i % 32 + 1])
        np.testing.assert_allclose(
            outputs["probabilities"], want["probabilities"][i % 32 : i % 32 + 1], rtol=1e-5
        )


def test_async_client_raises_inference_errors(server: ServerThread) -> None:
    async def run() -> InferenceError:
        async with AsyncTcpClient("127.0.0.1", server.ports["tcp"]) as c:
            with pytest.raises(InferenceError) as info:
                await c.infer("nope", rows("digits_mlp", 1))
            await c.infer("digits_mlp", rows("digits_mlp", 1))  # the connection goes on
            return info.value

    err = asyncio.run(run())
    assert err.status == 404 and "unknown model 'nope'" in err.message


# ---- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "inputs", "status", "expected"),
    [
        ("nope", {"input": np.zeros((1, 64), np.float32)}, 404, "unknown model 'nope'"),
        (
            "digits_mlp",
            {"input": np.zeros((1, 64), np.float64)},
            400,
            "datatype FP64 but the model takes FP32",
        ),
        (
            "digits_mlp",
            {"input": np.zeros((1, 63), np.float32)},
            400,
            "shape [1, 63] does not match [batch, 64]",
        ),
        ("digits_mlp", {"pixels": np.zeros((1, 64), np.float32)}, 400, "unknown input 'pixels'"),
        ("digits_mlp", {"input": np.zeros((33, 64), np.float32)}, 400, "exceeds max_batch_size 32"),
    ],
)
def test_bad_requests_get_error_frames(
    client: TcpClient, model: str, inputs: dict[str, np.ndarray], status: int, expected: str
) -> None:
    with pytest.raises(InferenceError) as info:
        client.infer(model, inputs)
    assert info.value.status == status and expected in info.value.message
    client.infer("digits_mlp", rows("digits_mlp", 1))  # the same connection still works


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"not a frame at all, just some bytes", "not a lumenrt frame"),
        (b"LRT\x03" + bytes(20), "protocol version 3 is not supported: this end speaks version 2"),
    ],
)  # fmt: skip
def test_a_bad_frame_gets_an_error_with_id_0_then_the_connection_closes(
    server: ServerThread, data: bytes, expected: str
) -> None:
    with raw_connect(server.ports["tcp"]) as sock:
        sock.sendall(data)
        frames, closed = read_frames(sock)
    assert closed and len(frames) == 1
    assert frames[0].request_id == 0
    info = tp.decode_error(frames[0].meta)
    assert info.status == 400 and expected in info.message


def test_client_disconnect_mid_request_does_not_hurt_the_server(
    python_server: ServerThread, gate: threading.Event
) -> None:
    port = python_server.ports["tcp"]
    with raw_connect(port) as sock:
        sock.sendall(frame_bytes(1, "gated", {"x": np.array([1.0, 1.0], np.float32)}))
        assert slow_model_state.ENTERED.wait(WAIT_S)
    with TcpClient("127.0.0.1", port) as c:  # a new connection works while that request runs
        assert c.infer("text", {"text": np.array([[b"z", b"y"]], dtype=object)}).outputs["upper"].tolist() == [[b"Z", b"Y"]]  # fmt: skip
    gate.set()
    service = python_server.app.service
    wait_for(lambda: service.in_flight == 0, "the orphaned request to finish")
    with TcpClient("127.0.0.1", port) as c:
        np.testing.assert_array_equal(c.infer("gated", {"x": np.array([5.0, 6.0], np.float32)}).outputs["y"], [10.0, 12.0])  # fmt: skip


# ---- limits ----------------------------------------------------------------------------------------


def test_oversize_frame_is_rejected_before_the_body_is_read(strict_server: ServerThread) -> None:
    with raw_connect(strict_server.ports["tcp"]) as sock:
        sock.sendall(b"LRT\x02" + struct.pack("<BBHQII", tp.REQUEST, 0, 0, 77, 50, 1 << 20))  # no body sent
        frames, closed = read_frames(sock)
    assert closed and [f.request_id for f in frames] == [77]
    info = tp.decode_error(frames[0].meta)
    assert info.status == 413 and "over the limit of 4096 bytes" in info.message


def test_client_sees_oversize_as_an_inference_error(strict_server: ServerThread) -> None:
    with TcpClient("127.0.0.1", strict_server.ports["tcp"]) as c:
        with pytest.raises(InferenceError) as info:
            c.infer("digits_mlp", rows("digits_mlp", 32))  # 8 KiB of input
        assert info.value.status == 413
        assert c.infer("digits_mlp", rows("digits_mlp", 1)).outputs["label"].shape == (1,)  # reconnected


def test_a_slow_frame_is_cut_off_after_the_receive_timeout(strict_server: ServerThread) -> None:
    frame = frame_bytes(5, "digits_mlp", rows("digits_mlp", 1))
    with raw_connect(strict_server.ports["tcp"]) as sock:
        sock.sendall(frame[: len(frame) // 2])
        frames, closed = read_frames(sock)  # blocks until the server answers and closes
    assert closed and [f.request_id for f in frames] == [0]
    info = tp.decode_error(frames[0].meta)
    assert info.status == 408 and "frame not received whole within 0.5 s" in info.message


def test_an_idle_connection_is_closed(strict_server: ServerThread) -> None:
    with raw_connect(strict_server.ports["tcp"]) as sock:
        assert sock.recv(1) == b""  # blocks until the server closes it


def test_client_reconnects_after_an_idle_close(strict_server: ServerThread) -> None:
    front = strict_server.app.front_ends["tcp"]
    with TcpClient("127.0.0.1", strict_server.ports["tcp"], idle_check_s=0) as c:
        c.infer("digits_mlp", rows("digits_mlp", 1))
        wait_for(lambda: not front.connections, "the server to close the idle connection")  # type: ignore[attr-defined]
        assert c.infer("digits_mlp", rows("digits_mlp", 1)).outputs["label"].shape == (1,)
