"""Process mode: worker processes over shared memory, real ONNX Runtime; a SIGKILLed worker fails
exactly what it held, is replaced, and the model is ready again; the shared memory is unnamed
(nothing in /dev/shm at any time)."""

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.request import InvalidInput, RequestTimeout, WorkerDied
from lumenrt.native import SHM_PREFIX, leftover_segments
from tests.integration.test_engine import write_add_model

SLOW_PY = """
import time


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        time.sleep(float(inputs["x"][0, 0]))  # the request says how long to take
        return {"y": inputs["x"] * 2}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prepo")
    write_add_model(root)
    (root / "sleepy" / "1").mkdir(parents=True)
    (root / "sleepy" / "1" / "model.py").write_text(SLOW_PY)
    (root / "sleepy" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 1\ndynamic_batching: {max_queue_delay_us: 0}\n"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\noutput:\n  - {name: y, datatype: FP32, dims: [2]}\n"
    )
    return root


def _engine(repo: Path, queue_type: str) -> Iterator[Engine]:
    eng = Engine(repo, EngineConfig(worker_mode="process", thread_count=2, queue_type=queue_type))
    mine = f"{SHM_PREFIX}{os.getpid()}."
    try:
        assert not leftover_segments(mine), "process mode must share unnamed memory, not /dev/shm"
        maps = Path(f"/proc/{os.getpid()}/maps").read_text()
        assert maps.count("/memfd:lumenrt.model-") >= 2, "one memfd mapping per model"
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="module", params=["mpmc", "naive"])
def engine(request: pytest.FixtureRequest, repo: Path) -> Iterator[Engine]:
    """One engine per queue type for the tests that leave it as they found it (starting worker
    processes is the slow part)."""
    yield from _engine(repo, request.param)


@pytest.fixture(params=["mpmc", "naive"])
def own_engine(request: pytest.FixtureRequest, repo: Path) -> Iterator[Engine]:
    """An engine of the test's own: its worker is killed and replaced (a new child process)."""
    yield from _engine(repo, request.param)


@pytest.fixture
def fresh_engine(repo: Path) -> Iterator[Engine]:
    """An engine of the test's own over the mpmc request ring, for tests of the completion ring
    (always mpmc, whatever the queue type)."""
    yield from _engine(repo, "mpmc")


def test_outputs_equal_thread_mode_and_batches_form(engine: Engine, repo: Path) -> None:
    results: dict[int, np.ndarray] = {}

    def client(c: int) -> None:
        for i in range(30):
            x = np.full((1 + i % 3, 4), c * 100 + i, np.float32)
            results[c * 100 + i] = engine.infer("add", {"x": x}).outputs["y"]

    threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, y in results.items():
        assert np.all(y == key + 1)
    with Engine(repo, EngineConfig(thread_count=1), models=["add"]) as ref:
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        np.testing.assert_array_equal(
            engine.infer("add", {"x": x}).outputs["y"], ref.infer("add", {"x": x}).outputs["y"]
        )
    stats = engine.statistics("add")[0]
    assert stats["requests"] >= 121 and stats["arena"]["in_use"] == 0


def test_bad_input_refused_before_the_worker(engine: Engine) -> None:
    with pytest.raises(InvalidInput, match="shape"):
        engine.infer("add", {"x": np.zeros((1, 3), np.float32)})


def test_killed_worker_fails_its_requests_is_replaced_and_ready_again(own_engine: Engine) -> None:
    engine = own_engine
    rt = engine.runtime("sleepy")
    pids = rt.statistics()["pids"]
    outcomes: list[object] = []
    lock = threading.Lock()

    def call(seconds: float) -> None:
        try:
            r: object = engine.infer("sleepy", {"x": np.full((1, 2), seconds, np.float32)})
        except Exception as e:
            r = e
        with lock:
            outcomes.append(r)

    # two long requests: each worker holds one
    threads = [threading.Thread(target=call, args=(3.0,)) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while rt.statistics()["ring"]["popped"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.1)  # both are inside infer()
    # readiness sampled from the kill on, while the other request still runs: it must turn false
    # at the death and true again once the replacement has loaded
    readiness: list[bool] = []

    def sample() -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            readiness.append(engine.ready("sleepy"))
            if False in readiness and readiness[-1]:
                return
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    os.kill(pids[0], signal.SIGKILL)
    sampler.start()
    for t in threads:
        t.join(60)
    died = [o for o in outcomes if isinstance(o, WorkerDied)]
    ok = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(died) == 1 and len(ok) == 1, outcomes  # exactly the killed worker's request failed
    assert "died" in str(died[0])
    # not ready from the death until the replacement has loaded (a replacement that cannot load
    # keeps it not ready: test_engine_faults.py::test_failed_replacement_is_retried...)
    assert rt.statistics()["worker_deaths"] == 1
    sampler.join(60)
    assert False in readiness, "never not ready after the death"
    assert readiness[-1] and engine.ready("sleepy"), "not ready again after the replacement loaded"
    new_pids = rt.statistics()["pids"]
    assert new_pids[0] != pids[0] and new_pids[1] == pids[1]
    assert rt.statistics()["worker_deaths"] == 1
    y = engine.infer("sleepy", {"x": np.zeros((1, 2), np.float32)}).outputs["y"]
    assert np.all(y == 0)
    assert rt.statistics()["arena"]["in_use"] == 0


def test_async_answers_reach_the_loop_through_the_models_own_ring_with_no_thread_between(
    engine: Engine,
) -> None:
    """Worker processes push asynchronous answers to their model's completion ring, which the
    event loop drains itself: the engine's own completion ring carries none of them, no consumer
    ever sleeps on the model's ring (no futex wake-up per answer), and no completion thread runs."""
    rt = engine.runtime("add")
    before = rt.workers._completions.stats()
    engine_ring = engine._async.ring.stats()["pushed"] if engine._async is not None else 0

    async def many() -> list[np.ndarray]:
        results = await asyncio.gather(
            *(engine.infer_async("add", {"x": np.full((1, 4), i, np.float32)}) for i in range(200))
        )
        return [r.outputs["y"] for r in results]

    outputs = asyncio.run(many())
    for i, y in enumerate(outputs):
        np.testing.assert_array_equal(y, np.full((1, 4), i + 1, np.float32))
    after = rt.workers._completions.stats()
    assert after["popped"] - before["popped"] == 200  # every answer came through the model's ring
    assert after["futex_wakes"] == before["futex_wakes"]  # nobody slept on it: no wake-up
    assert engine._async is not None and engine._async.ring.stats()["pushed"] == engine_ring
    assert not [t.name for t in threading.enumerate() if t.name.endswith("-done")]
    assert rt.table.free == len(rt.table.records)


def test_killed_worker_fails_its_async_request_through_the_loop(fresh_engine: Engine) -> None:
    """The supervisor's WORKER_DIED notice for an asynchronous request reaches its caller through
    the event loop; the other worker's request is answered."""
    engine = fresh_engine
    rt = engine.runtime("sleepy")
    pid = rt.statistics()["pids"][0]

    async def two_then_kill() -> list[object]:
        calls = [
            asyncio.ensure_future(engine.infer_async("sleepy", {"x": np.full((1, 2), 2.0, np.float32)}))
            for _ in range(2)
        ]
        deadline = time.monotonic() + 30
        while rt.statistics()["ring"]["popped"] < 2:  # each worker holds one
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)

    outcomes = asyncio.run(two_then_kill())
    died = [o for o in outcomes if isinstance(o, WorkerDied)]
    answered = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(died) == 1 and len(answered) == 1, outcomes  # exactly the killed worker's request failed
    assert rt.table.free == len(rt.table.records)


def test_unloading_from_another_thread_answers_what_the_loop_awaits(fresh_engine: Engine) -> None:
    """``lumenrt serve`` unloads from an executor thread while its loop runs: the loop still drains
    the model's ring (its last drain is its own, then it lets go), so requests in flight are
    answered, and the reader is gone before the eventfd closes."""
    engine = fresh_engine
    rt = engine.runtime("sleepy")
    pool = rt.workers

    async def unload_while_busy() -> list[object]:
        loop = asyncio.get_running_loop()
        calls = [
            asyncio.ensure_future(engine.infer_async("sleepy", {"x": np.full((1, 2), 0.3, np.float32)}))
            for _ in range(4)
        ]
        await asyncio.sleep(0.05)
        await asyncio.wait_for(loop.run_in_executor(None, engine.unload, "sleepy"), 30)
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)

    outcomes = asyncio.run(unload_while_busy())
    assert len(outcomes) == 4 and all(not isinstance(o, Exception) for o in outcomes), outcomes
    assert pool._loop is None and pool.notifier is None  # let go, then released


def test_an_answer_waited_for_after_the_unload_is_still_there(fresh_engine: Engine) -> None:
    """``submit`` without a call back, answered by its worker, then the model unloaded before its
    caller looked: ``wait`` gives the answer (read out of the slot before the memory went)."""
    engine = fresh_engine
    rt = engine.runtime("add")
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    req = rt.submit({"x": x})
    wait_until_set = time.monotonic() + 30
    while not rt.table.latches.is_set(req.index):  # answered by the worker, not read by anyone
        assert time.monotonic() < wait_until_set
        time.sleep(0.005)
    engine.unload("add")
    assert rt.wait(req, timeout_s=5)
    assert req.error is None and req.outputs is not None
    np.testing.assert_array_equal(req.outputs["y"], x + 1)
    rt.release(req)


def test_deadlines_still_answer_after_another_model_is_unloaded(fresh_engine: Engine) -> None:
    """The loop's deadline timer drains the process pools it knows: one unloaded meanwhile is
    skipped, so a request that outlives its deadline is still answered then (RequestTimeout)."""
    engine = fresh_engine

    async def unload_then_time_out() -> object:
        loop = asyncio.get_running_loop()
        await engine.infer_async("add", {"x": np.zeros((1, 4), np.float32)})  # the loop knows both pools
        await loop.run_in_executor(None, engine.unload, "add")
        try:
            return await asyncio.wait_for(
                engine.infer_async("sleepy", {"x": np.full((1, 2), 2.0, np.float32)}, timeout_s=0.2), 10
            )
        except Exception as e:
            return e

    outcome = asyncio.run(unload_then_time_out())
    assert isinstance(outcome, RequestTimeout), outcome
