"""A mock transport and a fake engine for driving the TCP front end without sockets: the real
InferenceService and TcpConnection run on a private event loop, over an engine whose one model
``double`` (input ``x`` FP32 [n, 2], output ``y`` = 2x) answers when a test lets it."""

import asyncio
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.engine.config import ModelConfig, TensorSpec
from lumenrt.engine.engine import InferResult
from lumenrt.engine.repository import ModelNotFound
from lumenrt.engine.request import StageTimes
from lumenrt.ingress.service import InferenceService, ServeLimits
from lumenrt.ingress.tcp_server import TcpConnection, TcpFrontEnd
from lumenrt.protocols import tcp as tp


class NoLane:
    """A runtime without an inline lane: every request goes through the (fake) engine."""

    active = False


class FakeRuntime:
    lane = NoLane()
    levels = 1

    def __init__(self) -> None:
        self.config = ModelConfig(
            name="double",
            backend="python",
            max_batch_size=8,
            inputs=(TensorSpec("x", "FP32", (2,)),),
            outputs=(TensorSpec("y", "FP32", (2,)),),
        )
        self.version = 1
        self.released = 0
        self.cancelled: list[Any] = []  # requests the service cancelled (their client went)

    def cancel(self, req: Any) -> None:
        self.cancelled.append(req)

    def release(self, req: Any) -> None:
        self.released += 1


@dataclass
class FakeRequest:
    context: Any
    outputs: dict[str, np.ndarray] | None = None
    error: Exception | None = None
    times: StageTimes = field(default_factory=StageTimes)


class FakeEngine:
    """``hold`` closed: requests wait until it opens."""

    def __init__(self) -> None:
        self.rt = FakeRuntime()
        self.hold = asyncio.Event()
        self.hold.set()
        self.started = 0
        self.finished = 0
        self.closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.inline = False  # answer inside submit_callback, before it returns
        # the server's loop (mock transports call the protocol from outside it)
        self.loop: asyncio.AbstractEventLoop | None = None

    def runtime(self, name: str, version: int | None = None) -> FakeRuntime:
        if name != "double" or version not in (None, 1):
            raise ModelNotFound(f"unknown model {name!r} (loaded: double)", Path("/nowhere"))
        return self.rt

    def submit_callback(
        self,
        rt: Any,
        inputs: Any,
        on_answer: Any,
        context: Any = None,
        *,
        timeout_s: float | None = None,
        priority: int = 0,
        received_slot: int = -1,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Any:
        """As Engine.submit_callback: the inputs are copied now (they are views of the connection's
        receive buffer), the answer comes back on the loop once ``hold`` is open."""
        self.started += 1
        x = np.array(inputs["x"])
        req = FakeRequest(context)
        if self.inline:  # as the real engine when its spin_us poll finds the answer at once
            req.outputs = {"y": x * 2}
            self.finished += 1
            on_answer(req)
            return req

        async def answer() -> None:
            try:
                await self.hold.wait()
                req.outputs = {"y": x * 2}
                req.times = StageTimes(enqueued_ns=10, dequeued_ns=20, compute_start_ns=30, compute_end_ns=45, completed_ns=50, batch_size=1)  # fmt: skip
            finally:
                self.finished += 1
            on_answer(req)

        task = (loop or self.loop or asyncio.get_running_loop()).create_task(answer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return req

    async def infer_async(
        self,
        model: str,
        inputs: Any,
        *,
        version: int | None = None,
        timeout_s: float | None = None,
        priority: int = 0,
    ) -> InferResult:
        self.started += 1
        try:
            await self.hold.wait()
            x = inputs["x"]
            times = StageTimes(enqueued_ns=10, dequeued_ns=20, compute_start_ns=30, compute_end_ns=45, completed_ns=50, batch_size=1)  # fmt: skip
            return InferResult(model, 1, {"y": x * 2}, times)
        finally:
            self.finished += 1


class FakeTransport:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.protocol: TcpConnection | None = None
        self.written = bytearray()
        self.closing = False
        self.eof_written = False
        self.reading = True

    def attach(self, protocol: TcpConnection) -> None:
        self.protocol = protocol
        protocol.connection_made(self)  # type: ignore[arg-type]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: Any) -> None:
        assert not self.closing and not self.eof_written, "write after close or write_eof"
        self.written += bytes(data)

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def get_write_buffer_size(self) -> int:
        return 0  # the client takes everything at once (tests/unit/test_connection.py buffers)

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            assert self.protocol is not None
            self.loop.call_soon(self.protocol.connection_lost, None)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def frames(self) -> list[tp.Frame]:
        """Every frame written so far (the written bytes must be whole frames)."""
        out: list[tp.Frame] = []
        dec = tp.FrameDecoder(out.append)
        dec.feed(bytes(self.written))
        assert dec.buffered_bytes == 0
        return out


class Harness:
    """A front end with one connection on a mock transport, on its own loop."""

    def __init__(self, limits: ServeLimits | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.engine = FakeEngine()
        self.engine.loop = self.loop
        self.service = InferenceService(self.engine, limits)  # type: ignore[arg-type]
        self.front = TcpFrontEnd(self.service, self.loop)
        self.transport = FakeTransport(self.loop)
        self.conn = TcpConnection(self.front)
        self.transport.attach(self.conn)

    def feed(self, data: bytes) -> None:
        deliver_on(self.loop, self.conn, data)

    def settle(self) -> None:
        """Run the loop until nothing is ready to run."""
        for _ in range(20):
            self.loop.run_until_complete(asyncio.sleep(0))

    def close(self) -> None:
        self.loop.run_until_complete(self.front.close())
        self.loop.close()


def request(rid: int, rows: int = 1, model: str = "double", **kw: Any) -> bytes:
    x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    return b"".join(bytes(p) for p in tp.encode_request(rid, model, {"x": x}, **kw))


def header(**fields: int) -> bytes:
    f = {
        "version": tp.VERSION,
        "kind": tp.REQUEST,
        "flags": 0,
        "reserved": 0,
        "rid": 1,
        "meta": 0,
        "payload": 0,
    }
    f.update(fields)
    return b"LRT" + struct.pack("<BBBHQII", *f.values())


def deliver(conn: Any, data: bytes) -> None:
    """Hand ``data`` to a protocol as its transport would: ``data_received`` for a plain protocol,
    ``get_buffer`` + ``buffer_updated`` (in as many reads as the buffers take) for a buffered one."""
    if not isinstance(conn, asyncio.BufferedProtocol):
        conn.data_received(data)
        return
    view = memoryview(data)
    while True:
        buf = conn.get_buffer(len(view))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        conn.buffer_updated(n)
        view = view[n:]
        if not view:
            return


def deliver_on(loop: asyncio.AbstractEventLoop, conn: Any, data: bytes) -> None:
    """``deliver`` from inside ``loop``, where a transport calls its protocol."""

    async def run() -> None:
        deliver(conn, data)

    loop.run_until_complete(run())
