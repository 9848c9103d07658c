"""TCP write-side flow control over real loopback sockets: a client that pipelines requests and does
not read its answers makes the server stop reading (the transport's write buffer stays bounded:
its high-water mark plus the answers of the requests in flight when it crossed it); one that never
reads is aborted after ``idle_timeout_s``, one that reads slowly is left alone and gets every
answer. The server's side of a connection is probed on the server's loop. No assertion depends on
timing: waits are for conditions, with generous deadlines."""

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lumenrt.client import TcpClient
from lumenrt.engine.engine import Engine
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import ServeLimits
from lumenrt.ingress.tcp_server import MAX_IN_FLIGHT
from lumenrt.protocols import tcp as tp
from tests.integration.flow_clients import WAIT_S, Sampler, Sender, non_reading_client, probe, wait_for

PATIENT = ServeLimits(receive_timeout_s=30.0, idle_timeout_s=60.0)
# 2 s: a reader descheduled for a second on a busy machine is still not a stalled one
HASTY = ServeLimits(receive_timeout_s=2.0, idle_timeout_s=2.0)
WIDTH = 1024  # floats per answer: answers (4 KiB) far larger than requests (~100 bytes)
N = 3000  # ~12 MB of answers: far over the high-water mark and the socket buffers

WIDE_MODEL = f"""
import numpy as np


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        return {{"y": np.repeat(inputs["x"], {WIDTH // 2}, axis=1)}}
"""
WIDE_CONFIG = f"""backend: python
instance_group: {{count: 1}}
max_batch_size: 8
input:
  - {{name: x, datatype: FP32, dims: [2]}}
output:
  - {{name: y, datatype: FP32, dims: [{WIDTH}]}}
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    root: Path = tmp_path_factory.mktemp("tcp_flow_repo")
    (root / "wide" / "1").mkdir(parents=True)
    (root / "wide" / "1" / "model.py").write_text(WIDE_MODEL)
    (root / "wide" / "config.yaml").write_text(WIDE_CONFIG)
    with Engine(root, models=["wide"]) as e:
        yield e


def serve(engine: Engine, limits: ServeLimits) -> ServerThread:
    return ServerThread(engine, ServeOptions(http_port=None, grpc_port=None, tcp_port=0, limits=limits))


@pytest.fixture(scope="module")
def patient(engine: Engine) -> Iterator[ServerThread]:
    with serve(engine, PATIENT) as st:
        yield st


@pytest.fixture
def hasty(engine: Engine) -> Iterator[ServerThread]:
    with serve(engine, HASTY) as st:
        yield st


def x_of(rid: int) -> np.ndarray:
    return np.array([[rid, -rid]], np.float32)


def workload(n: int) -> bytes:
    """``n`` pipelined requests, ids 1..n, each input naming its id."""
    return b"".join(
        b"".join(bytes(p) for p in tp.encode_request(rid, "wide", {"x": x_of(rid)}))
        for rid in range(1, n + 1)
    )


def frame_size(f: tp.Frame) -> int:
    return tp.HEADER_BYTES + len(f.meta) + f.payload_bytes


class Reader:
    """Frames read from a socket, decoded as they arrive."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames: list[tp.Frame] = []
        self.decoder = tp.FrameDecoder(self.frames.append)

    def read(self, count: int) -> None:
        """Until ``count`` frames arrived in all; ConnectionError if the server closed first."""
        while len(self.frames) < count:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the server")
            self.decoder.feed(data)


def answer_size(st: ServerThread) -> int:
    """The bytes of one answer frame, from a client that reads."""
    with socket.create_connection(("127.0.0.1", st.ports["tcp"]), timeout=WAIT_S) as sock:
        sock.sendall(workload(1))
        reader = Reader(sock)
        reader.read(1)
    assert reader.frames[0].kind == tp.RESPONSE
    return frame_size(reader.frames[0])


def assert_bounded(sampler: Sampler, answer_bytes: int) -> None:
    """The write buffer held at most its high-water mark, the answer that crossed it, and the
    answers of the requests in flight when it did."""
    assert sampler.probes > 0 and sampler.high > 0
    bound = sampler.high + (MAX_IN_FLIGHT + 1) * answer_bytes
    assert sampler.most <= bound, (sampler.most, sampler.high, answer_bytes)
    assert bound < N * answer_bytes  # the bound says something: far under what was asked for


def test_a_client_that_never_reads_is_aborted_after_the_idle_timeout(hasty: ServerThread) -> None:
    answer_bytes = answer_size(hasty)
    with non_reading_client(hasty, "tcp") as sock:
        sampler = Sampler(lambda: probe(hasty, sock, "tcp"))
        sampler.start()
        sender = Sender(sock, workload(N))
        sender.start()
        try:
            wait_for(
                "the server pauses writing and reading",
                lambda: (p := probe(hasty, sock, "tcp")) is not None and p.write_paused and not p.reading,
            )
            # a graceful close would keep the connection until a client that never reads has
            # read its answers: it is gone only once aborted
            wait_for("the server drops the stalled connection", lambda: probe(hasty, sock, "tcp") is None)
        finally:
            sampler.stop()
        reader = Reader(sock)
        with pytest.raises(ConnectionError):  # reset (or closed): not a timeout
            reader.read(N)
        assert len(reader.frames) < N
        sender.join(WAIT_S)
        assert not sender.is_alive()
    assert_bounded(sampler, answer_bytes)
    with TcpClient("127.0.0.1", hasty.ports["tcp"]) as c:  # the server goes on
        np.testing.assert_array_equal(c.infer("wide", {"x": x_of(7)}).outputs["y"][0, :2], [7.0, 7.0])


def test_a_client_that_does_not_read_stops_the_server_then_gets_every_answer(
    patient: ServerThread,
) -> None:
    answer_bytes = answer_size(patient)
    with non_reading_client(patient, "tcp") as sock:
        sampler = Sampler(lambda: probe(patient, sock, "tcp"))
        sampler.start()
        sender = Sender(sock, workload(N))
        sender.start()
        try:
            wait_for(
                "the server pauses writing and reading",
                lambda: (p := probe(patient, sock, "tcp")) is not None and p.write_paused and not p.reading,
            )
            reader = Reader(sock)
            reader.read(N)
            sender.join(WAIT_S)
            assert not sender.is_alive() and sender.error is None
        finally:
            sampler.stop()
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing more: exactly one answer each
    assert sorted(f.request_id for f in reader.frames) == list(range(1, N + 1))
    dec = tp.ResponseDecoder()
    for f in reader.frames:
        _, outputs, _ = dec.decode(f)
        y = outputs["y"]
        assert y.shape == (1, WIDTH) and y[0, 0] == f.request_id and y[0, 1] == f.request_id
    assert_bounded(sampler, answer_bytes)


def test_a_slow_reader_is_not_taken_for_a_stalled_one(hasty: ServerThread) -> None:
    """It reads a little at a time for longer than the idle timeout: its writes pause and resume,
    and it gets every answer."""
    with non_reading_client(hasty, "tcp") as sock:
        sender = Sender(sock, workload(N))
        sender.start()
        wait_for(
            "the server pauses writing",
            lambda: (p := probe(hasty, sock, "tcp")) is not None and p.write_paused,
        )
        reader = Reader(sock)
        for count in range(50, N + 50, 50):
            reader.read(min(count, N))
            time.sleep(0.05)  # reading slowly is the behaviour under test: 60 pauses, 3 s in all
        sender.join(WAIT_S)
        assert not sender.is_alive() and sender.error is None
    assert sorted(f.request_id for f in reader.frames) == list(range(1, N + 1))
