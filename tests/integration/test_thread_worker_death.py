"""A thread-mode worker that dies is supervised as a worker process is (thread_pool.py): the
requests it held are answered with WorkerDied, readiness is false until a replacement thread has
loaded a fresh session, and the replacement serves what was queued. A death is injected the way
a model can really kill its thread: ``sys.exit`` in ``infer`` raises SystemExit, which the
worker's per-batch ``except Exception`` (execute.py) does not catch.

Every wait is bounded (HANG_S): on a path that loses a request the test fails instead of hanging.
"""

import http.client
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.client.errors import InferenceError
from lumenrt.client.http import HttpClient
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.request import ModelNotReady, WorkerDied
from lumenrt.engine.worker import ThreadWorker
from lumenrt.ingress.app import ServeOptions, ServerThread
from tests.integration import worker_death_state as state
from tests.integration.test_engine_faults import HANG_S, wait_until

DIED = "model 'mortal': worker 0 died: SystemExit: the model called sys.exit; request failed"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("worker_death")
    state.write_mortal_model(root)
    return root


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    state.reset()
    yield
    state.release()


class Call:
    """One request in a thread of its own; ``answer`` is its result or the error it raised."""

    def __init__(self, what: str, fn: Callable[[], Any]) -> None:
        self.what = what
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._box["result"] = fn()
        except BaseException as e:
            self._box["error"] = e

    @property
    def answered(self) -> bool:
        return not self._thread.is_alive()

    def answer(self, timeout_s: float = HANG_S) -> Any:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            pytest.fail(f"{self.what}: no answer within {timeout_s} s (the request was lost)")
        return self._box.get("error", self._box.get("result"))


def rows(value: float, n: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((n, 2), value, np.float32)}


def sync_call(engine: Engine, what: str, value: float, n: int = 1) -> Call:
    return Call(what, lambda: engine.infer("mortal", rows(value, n)))  # no deadline: waits for its answer


def http_call(port: int, what: str, value: float) -> Call:
    def run() -> Any:
        with HttpClient(port=port, timeout_s=HANG_S) as client:
            return client.infer("mortal", rows(value))

    return Call(what, run)


def model_ready_status(port: int) -> int:
    """The HTTP model readiness endpoint's status (200 ready, 503 not)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/v2/models/mortal/ready")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def assert_died(call: Call) -> None:
    answer = call.answer()
    if isinstance(answer, InferenceError):  # over HTTP
        assert answer.status == 503 and DIED in answer.message, (call.what, answer)
    else:
        assert isinstance(answer, WorkerDied) and str(answer) == DIED, (call.what, answer)


def assert_doubled(call: Call, value: float, n: int = 1) -> None:
    answer = call.answer()
    assert not isinstance(answer, BaseException), (call.what, answer)
    np.testing.assert_array_equal(answer.outputs["y"], np.full((n, 2), 2 * value, np.float32))


def test_dead_thread_worker_fails_what_it_held_is_replaced_and_readiness_follows(repo: Path) -> None:
    """Requests from several threads (synchronous callers without a deadline, and an HTTP client:
    the event loop's asynchronous path) queued behind a batch; the next batch kills the worker.
    What it held (that batch and the request it carried over) is answered with WorkerDied at
    once; readiness is false, in the engine and at /v2/models/mortal/ready, while the
    replacement loads (held on RELOAD_GATE); then the replacement, a new thread, serves the
    request still queued and later ones."""
    options = ServeOptions(http_port=0, grpc_port=None, tcp_port=None)
    with (
        Engine(repo, EngineConfig(thread_count=1), models=["mortal"]) as engine,
        ServerThread(engine, options) as server,
    ):
        rt = engine.runtime("mortal")
        port = server.ports["http"]
        assert engine.ready("mortal") and model_ready_status(port) == 200
        first_thread = rt.workers.tasks()[0]
        state.RELOAD_GATE.clear()
        state.GATE.clear()
        r0 = sync_call(engine, "r0", 1.0)
        assert state.ENTERED.wait(HANG_S), "the first request never reached the model"
        # queued behind r0 in this order, each in the ring before the next is sent. With one
        # worker and no queue delay the next batch takes what is queued up to 4 rows: r1, r2, r3
        # (1 + 1 + 2 rows); r4 (2 rows) does not fit and is carried over; r5 stays in the ring.
        queued = [
            lambda: sync_call(engine, "r1 (kills the worker)", -1.0),
            lambda: http_call(port, "r2 (HTTP)", 2.0),
            lambda: sync_call(engine, "r3", 3.0, 2),
            lambda: sync_call(engine, "r4 (carried over)", 4.0, 2),
            lambda: sync_call(engine, "r5 (left queued)", 5.0),
        ]
        calls: list[Call] = []
        for make in queued:
            calls.append(make())
            wait_until(lambda: len(rt.ring) == len(calls), f"{calls[-1].what} queued")
        r1, r2, r3, r4, r5 = calls
        state.GATE.set()
        assert_doubled(r0, 1.0)
        for held in (r1, r2, r3, r4):
            assert_died(held)
        assert state.BATCHES[:2] == [[1.0], [-1.0, 2.0, 3.0, 3.0]], state.BATCHES  # the batch that died
        assert state.RELOADING.wait(HANG_S), "no replacement started"
        # the replacement is loading (held on RELOAD_GATE): not ready, r5 waits for it
        assert not engine.ready("mortal") and model_ready_status(port) == 503
        stats = rt.statistics()
        assert stats["worker_deaths"] == 1 and stats["workers_ready"] == 0, stats
        assert not r5.answered
        state.RELOAD_GATE.set()
        wait_until(lambda: engine.ready("mortal"), "the replacement to load")
        assert model_ready_status(port) == 200
        assert_doubled(r5, 5.0)
        assert_doubled(Call("after", lambda: engine.infer("mortal", rows(6.0, 3))), 6.0, 3)
        assert all(4.0 not in batch for batch in state.BATCHES)  # r4 never ran: it was answered
        replacement_thread = rt.workers.tasks()[0]
        assert replacement_thread[1] not in (0, first_thread[1])  # a new thread
        stats = rt.statistics()
        assert stats["worker_deaths"] == 1 and stats["replacement_failures"] == 0, stats
        assert stats["failures"] == 4 and len(state.LOADS) == 2, stats
        wait_until(lambda: rt.table.free == len(rt.table.records), "every request record released")


def test_replacement_that_cannot_load_is_retried_and_not_ready_meanwhile(repo: Path) -> None:
    """Two loads of the replacement fail: each counts in replacement_failures, readiness stays
    false, and the third attempt (after a backoff) serves the request queued meanwhile."""
    state.FAIL_LOADS[0] = 2
    with Engine(repo, EngineConfig(thread_count=1), models=["mortal"]) as engine:
        rt = engine.runtime("mortal")
        assert_died(sync_call(engine, "the fatal request", -1.0))
        waiting = sync_call(engine, "queued while no worker can load", 7.0)

        def failed_twice() -> bool:
            assert not engine.ready("mortal")  # no worker has loaded meanwhile
            return bool(rt.statistics()["replacement_failures"] >= 2)

        wait_until(failed_twice, "two failed loads of the replacement", timeout_s=HANG_S)
        wait_until(lambda: engine.ready("mortal"), "the third load", timeout_s=HANG_S)
        assert_doubled(waiting, 7.0)
        stats = rt.statistics()
        assert stats["worker_deaths"] == 1 and stats["replacement_failures"] == 2, stats
        assert len(state.LOADS) == 4  # the first, two failed, the one that serves: no more tries


def test_replacement_thread_that_cannot_start_is_retried(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process cannot start the replacement's thread once (as when it is out of threads):
    that counts in replacement_failures and the start is tried again; the request queued
    meanwhile is served by the replacement."""
    with Engine(repo, EngineConfig(thread_count=1), models=["mortal"]) as engine:
        rt = engine.runtime("mortal")
        refused: list[ThreadWorker] = []
        start = ThreadWorker.start

        def start_once_refused(worker: ThreadWorker) -> None:
            if not refused:
                refused.append(worker)
                raise RuntimeError("can't start new thread")
            start(worker)

        monkeypatch.setattr(ThreadWorker, "start", start_once_refused)
        state.GATE.clear()
        fatal = sync_call(engine, "the fatal request", -1.0)
        assert state.ENTERED.wait(HANG_S)
        waiting = sync_call(engine, "queued behind it", 9.0)
        wait_until(lambda: len(rt.ring) == 1, "the second request queued")
        state.GATE.set()
        assert_died(fatal)
        wait_until(
            lambda: engine.ready("mortal"), "a replacement started on the second try", timeout_s=HANG_S
        )
        assert_doubled(waiting, 9.0)
        stats = rt.statistics()
        assert len(refused) == 1 and stats["worker_deaths"] == 1 and stats["replacement_failures"] == 1, stats


def test_no_replacement_once_shutdown_began_and_what_is_queued_is_still_answered(repo: Path) -> None:
    """After begin_shutdown a death is not replaced: what the worker held fails with WorkerDied,
    the model stays not ready, and the request still queued (no worker left to take it) is
    answered when the engine closes, not left waiting."""
    engine = Engine(repo, EngineConfig(thread_count=1), models=["mortal"])
    try:
        rt = engine.runtime("mortal")
        state.GATE.clear()
        fatal = sync_call(engine, "the fatal request", -1.0)
        assert state.ENTERED.wait(HANG_S)
        queued = sync_call(engine, "queued behind it", 8.0)
        wait_until(lambda: len(rt.ring) == 1, "the second request queued")
        engine.begin_shutdown()
        state.GATE.set()
        assert_died(fatal)
        wait_until(lambda: not rt.workers.tasks()[0][0], "the dead worker's thread to end")
        assert not engine.ready("mortal") and not queued.answered
        assert rt.statistics()["worker_deaths"] == 1 and len(state.LOADS) == 1
    finally:
        engine.close()
    answer = queued.answer()
    assert isinstance(answer, ModelNotReady) and "unloaded before the request ran" in str(answer), answer
