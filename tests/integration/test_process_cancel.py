"""Cancellation in process mode (issue 38): a request cancelled while it waits in the ring is
answered as cancelled and never runs; one cancelled while its worker process runs it finishes there
and its answer is dropped; either way its request record and arena slot come back, it is counted,
and the same worker process goes on serving. Cancelled by an ``infer_async`` caller, by
``ModelRuntime.cancel`` for a synchronous request, and by an HTTP or TCP client that goes away.

The model runs in a worker process, so it and the test share files, not memory: it appends each
request's first value to ``calls.log``, creates ``entered-<value>`` and waits while ``hold``
exists. One worker, no dynamic batching: each request runs alone, in order."""

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.client import HttpClient
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.request import InferRequest, RequestCancelled
from lumenrt.engine.runtime import ModelRuntime
from lumenrt.ingress.app import ServeOptions, ServerThread
from tests.integration.flow_clients import WAIT_S, wait_for
from tests.integration.test_scheduling import reset, send_http, send_tcp, x_of

MODEL_PY = """
import time
from pathlib import Path

SIGNALS = Path({signals!r})


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        x = inputs["x"]
        if x.any():  # not the warm-up's zeros (there is none; kept out of the log all the same)
            value = int(x[0, 0])
            with open(SIGNALS / "calls.log", "a") as log:
                log.write(f"{{value}}\\n")
            (SIGNALS / f"entered-{{value}}").touch()
            deadline = time.monotonic() + 120
            while (SIGNALS / "hold").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return {{"y": x * 2}}
"""


@pytest.fixture(scope="module")
def signals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("signals")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, signals: Path) -> Iterator[tuple[Engine, ServerThread]]:
    """One process-mode engine (one worker process) behind a server, for every test here: each
    leaves it as it found it (nothing queued, nothing held, every record back)."""
    root = tmp_path_factory.mktemp("repo")
    (root / "gated" / "1").mkdir(parents=True)
    (root / "gated" / "1" / "model.py").write_text(MODEL_PY.format(signals=str(signals)))
    (root / "gated" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 1\n"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\noutput:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )
    eng = Engine(root, EngineConfig(worker_mode="process"), models=["gated"])
    try:
        with ServerThread(eng, ServeOptions(http_port=0, grpc_port=0, tcp_port=0)) as st:
            yield eng, st
    finally:
        (signals / "hold").unlink(missing_ok=True)
        eng.close()


@pytest.fixture
def rt(served: tuple[Engine, ServerThread], signals: Path) -> Iterator[ModelRuntime]:
    """The model's runtime, its worker free; after the test: released, every record and slot
    back, the same worker process still serving."""
    eng, _ = served
    runtime = eng.runtime("gated")
    pids = runtime.statistics()["pids"]
    for leftover in [signals / "calls.log", *signals.glob("entered-*")]:
        leftover.unlink(missing_ok=True)
    try:
        yield runtime
    finally:
        (signals / "hold").unlink(missing_ok=True)
    wait_for("every request record back", lambda: runtime.table.free == len(runtime.table.records))
    stats = runtime.statistics()
    assert stats["arena"]["in_use"] == 0, "arena slots leaked"
    assert stats["queued"] == 0
    assert stats["pids"] == pids and stats["worker_deaths"] == 0, "the worker process was replaced"
    assert eng.ready("gated")


def ran(signals: Path) -> list[int]:
    """The values of the requests the model ran, in order."""
    log = signals / "calls.log"
    return [int(line) for line in log.read_text().splitlines()] if log.exists() else []


def hold_worker(rt: ModelRuntime, signals: Path) -> InferRequest:
    """Request 1 runs in the worker process and waits there until ``hold`` goes."""
    (signals / "hold").touch()
    held = rt.submit(x_of(1))
    wait_for("request 1 inside the model", lambda: (signals / "entered-1").exists())
    return held


def answer_of(rt: ModelRuntime, req: InferRequest) -> Any:
    """A synchronous request's outputs or error, once answered; its record released."""
    assert rt.wait(req, timeout_s=WAIT_S)
    try:
        return req.error if req.error is not None else req.outputs
    finally:
        rt.release(req)


def cancelled_count(rt: ModelRuntime) -> int:
    return int(rt.statistics()["cancelled"])


async def until(what: str, cond: Callable[[], bool]) -> None:
    """Wait on the event loop (which must go on draining answers) until ``cond()``."""
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"not within {WAIT_S:g} s: {what}"
        await asyncio.sleep(0.005)


def test_async_callers_that_cancel_get_cancelled_and_a_queued_request_never_runs(
    served: tuple[Engine, ServerThread], rt: ModelRuntime, signals: Path
) -> None:
    """Two ``infer_async`` callers cancel: one whose request is running in the worker process,
    one whose request waits behind it. Both get CancelledError at once; the queued request is
    dropped unrun when the worker reaches it, and the next request is answered."""
    eng, _ = served
    before = cancelled_count(rt)

    async def main() -> np.ndarray:
        (signals / "hold").touch()
        running = asyncio.ensure_future(eng.infer_async("gated", x_of(1)))
        await until("request 1 inside the model", (signals / "entered-1").exists)
        queued = asyncio.ensure_future(eng.infer_async("gated", x_of(2)))
        await until("request 2 queued", lambda: rt.queued() == 1)
        running.cancel()
        queued.cancel()
        for task in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert sum(r.cancelled for r in rt.table.records) == 2  # both flagged for the worker
        (signals / "hold").unlink()
        result = await asyncio.wait_for(eng.infer_async("gated", x_of(3)), WAIT_S)
        # the dropped request and the finished one come back through the loop: their records too
        await until("every record back", lambda: rt.table.free == len(rt.table.records))
        return result.outputs["y"]

    y = asyncio.run(main())
    np.testing.assert_array_equal(y, x_of(3)["x"] * 2)
    assert ran(signals) == [1, 3]  # 1 was running when cancelled: it finished; 2 never ran
    assert cancelled_count(rt) - before == 1


def test_a_synchronous_request_cancelled_while_queued_is_answered_cancelled(
    served: tuple[Engine, ServerThread], rt: ModelRuntime, signals: Path
) -> None:
    eng, _ = served
    before = cancelled_count(rt)
    held = hold_worker(rt, signals)
    queued = rt.submit(x_of(2))
    queued_index = queued.index
    wait_for("request 2 queued", lambda: rt.queued() == 1)
    rt.cancel(queued)
    (signals / "hold").unlink()
    np.testing.assert_array_equal(answer_of(rt, held)["y"], x_of(1)["x"] * 2)
    error = answer_of(rt, queued)
    assert isinstance(error, RequestCancelled), error
    assert "cancel" in str(error)
    assert cancelled_count(rt) - before == 1
    y = eng.infer("gated", x_of(3)).outputs["y"]  # the worker goes on
    np.testing.assert_array_equal(y, x_of(3)["x"] * 2)
    assert ran(signals) == [1, 3]
    # the cancelled request's record, once reused, carries no cancellation: its next request runs
    for n in range(len(rt.table.records)):
        req = rt.submit(x_of(4))
        index = req.index
        answer = answer_of(rt, req)
        assert not isinstance(answer, Exception), (n, answer)
        if index == queued_index:
            break
    else:
        pytest.fail(f"record {queued_index} never reused")
    assert cancelled_count(rt) - before == 1


@pytest.mark.parametrize("send", [send_http, send_tcp], ids=["http", "tcp"])
@pytest.mark.parametrize("close", [socket.socket.close, reset], ids=["close", "reset"])
def test_a_client_that_goes_has_its_queued_request_dropped_in_process_mode(
    served: tuple[Engine, ServerThread], rt: ModelRuntime, signals: Path, send: Any, close: Any
) -> None:
    _, st = served
    before = cancelled_count(rt)
    held = hold_worker(rt, signals)
    sock = send(st.ports["http" if send is send_http else "tcp"], 2)
    wait_for("request 2 queued", lambda: rt.queued() == 1)
    close(sock)
    wait_for("request 2 cancelled", lambda: sum(r.cancelled for r in rt.table.records) == 1)
    (signals / "hold").unlink()
    np.testing.assert_array_equal(answer_of(rt, held)["y"], x_of(1)["x"] * 2)
    wait_for("request 2 dropped unrun", lambda: cancelled_count(rt) - before == 1)
    with HttpClient("127.0.0.1", st.ports["http"]) as client:  # the server and its worker go on
        assert client.infer("gated", x_of(5)).outputs["y"][0, 0] == 10
    assert ran(signals) == [1, 5]
