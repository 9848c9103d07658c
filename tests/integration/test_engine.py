"""The engine in-process (thread mode), one body over every queue type and both allocators: real
ONNX Runtime and Python backends, batching under concurrency, deadlines, cancellation, queue-full,
and nothing leaked afterwards."""

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from lumenrt.engine.engine import Engine, EngineConfig, ModelNotFound
from lumenrt.engine.request import InvalidInput, QueueFull, RequestTimeout
from tests.integration import slow_model_state

QUEUE_TYPES = ["mpmc", "naive", "batched"]  # spsc takes one consumer: tested with one worker below
ALLOCATORS = ["lumen_arena", "standard"]

PY_MODEL = """
from tests.integration.slow_model_state import CALLS, ENTERED, GATE


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        ENTERED.set()
        GATE.wait(30)
        x = inputs["x"]
        CALLS.append(int(x.shape[0]))
        return {"y": x * 2}
"""


def write_add_model(root: Path) -> None:
    node = helper.make_node("Add", ["x", "one"], ["y"])
    graph = helper.make_graph(
        [node],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor("one", TensorProto.FLOAT, [4], [1.0] * 4)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    (root / "add" / "1").mkdir(parents=True)
    onnx.save(model, root / "add" / "1" / "model.onnx")
    (root / "add" / "config.yaml").write_text(
        "backend: onnxruntime\nmax_batch_size: 8\n"
        "dynamic_batching:\n  max_queue_delay_us: 2000\n  preferred_batch_size: [4, 8]\n"
    )


def write_py_model(root: Path, max_queue: int = 8, max_queue_delay_us: int = 0) -> None:
    (root / "slow" / "1").mkdir(parents=True)
    (root / "slow" / "1" / "model.py").write_text(PY_MODEL)
    (root / "slow" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 4\n"
        f"dynamic_batching:\n  max_queue_delay_us: {max_queue_delay_us}\n  max_queue_size: {max_queue}\n"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_add_model(root)
    write_py_model(root)
    return root


@pytest.fixture(params=[(q, a) for q in QUEUE_TYPES for a in ALLOCATORS], ids=lambda p: f"{p[0]}-{p[1]}")
def engine(request: pytest.FixtureRequest, repo: Path) -> Iterator[Engine]:
    queue_type, allocator = request.param
    eng = Engine(repo, EngineConfig(queue_type=queue_type, allocator_type=allocator, thread_count=2))
    yield eng
    eng.close()
    for stats in eng.statistics():
        arena = stats["arena"]
        assert arena is None or arena["in_use"] == 0, "arena slots leaked"
    for name in eng.models():
        rt = eng.runtime(name)
        assert rt.table.free == len(rt.table.records), "request records leaked"


def test_outputs_equal_calling_the_model_directly(engine: Engine) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    result = engine.infer("add", {"x": x})
    np.testing.assert_allclose(result.outputs["y"], x + 1)
    t = result.times
    assert (
        0
        < t.received_ns
        <= t.enqueued_ns
        <= t.dequeued_ns
        <= t.compute_start_ns
        <= t.compute_end_ns
        <= t.completed_ns
    )
    assert t.batch_size == 3  # alone: nothing else was in flight


def test_each_request_gets_its_own_rows_under_concurrency(engine: Engine) -> None:
    errors: list[str] = []

    def client(cid: int) -> None:
        for i in range(50):
            rows = 1 + (cid + i) % 3
            x = np.full((rows, 4), cid * 1000 + i, dtype=np.float32)
            y = engine.infer("add", {"x": x}).outputs["y"]
            if y.shape != (rows, 4) or not np.all(y == cid * 1000 + i + 1):
                errors.append(f"client {cid} request {i}: got {y}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stats = engine.statistics("add")[0]
    assert stats["requests"] == 300
    sent_rows = sum(1 + (c + i) % 3 for c in range(6) for i in range(50))
    assert sum(rows * n for rows, n in stats["batch_rows"].items()) == sent_rows  # each row ran once
    assert sum(stats["batch_rows"].values()) == stats["batches"]
    assert max(stats["batch_rows"]) <= 8  # never beyond max_batch_size


def test_requests_queued_behind_a_busy_worker_are_batched(engine: Engine) -> None:
    """The one worker is held inside the model by its first request while eight more queue up:
    they run as two full batches of max_batch_size 4, not one by one."""
    gate, calls = slow_model_state.GATE, slow_model_state.CALLS
    gate.clear()
    calls.clear()
    slow_model_state.ENTERED.clear()
    rt = engine.runtime("slow")
    x = np.ones((1, 2), np.float32)
    try:
        first = rt.submit({"x": x})
        assert slow_model_state.ENTERED.wait(10)  # the worker is inside the model
        queued = [rt.submit({"x": x * (i + 2)}) for i in range(8)]  # 8 = max_queue_size
    finally:
        gate.set()
    for i, req in enumerate([first, *queued]):
        assert rt.wait(req, timeout_s=30)
        assert req.error is None and req.outputs is not None
        np.testing.assert_allclose(req.outputs["y"], x * (i + 1) * 2)
        rt.release(req)
    assert calls == [1, 4, 4]
    stats = engine.statistics("slow")[0]
    assert stats["requests"] == 9 and stats["batches"] == 3
    assert stats["batch_rows"] == {1: 1, 4: 2}


def test_async_api_and_batching(engine: Engine) -> None:
    async def main() -> list[np.ndarray]:
        xs = [np.full((1, 4), i, dtype=np.float32) for i in range(64)]
        results = await asyncio.gather(*(engine.infer_async("add", {"x": x}) for x in xs))
        return [r.outputs["y"] for r in results]

    ys = asyncio.run(main())
    for i, y in enumerate(ys):
        assert np.all(y == i + 1)
    stats = engine.statistics("add")[0]
    assert stats["requests"] == 64 and sum(rows * n for rows, n in stats["batch_rows"].items()) == 64
    assert stats["batches"] < 64  # gathered while workers were busy


def test_requests_queued_when_the_engine_closes_still_run(tmp_path: Path) -> None:
    write_py_model(tmp_path, max_queue_delay_us=1000)
    gate, calls = slow_model_state.GATE, slow_model_state.CALLS
    gate.clear()
    calls.clear()
    slow_model_state.ENTERED.clear()
    x = np.ones((1, 2), np.float32)
    eng = Engine(tmp_path, EngineConfig(thread_count=1), models=["slow"])
    rt = eng.runtime("slow")
    try:
        first = rt.submit({"x": x})
        assert slow_model_state.ENTERED.wait(10)  # the worker is inside the model
        queued = [rt.submit({"x": x}) for _ in range(2)]
        rt.ring.close()  # shutdown step 1 (what Engine.close does first): nothing new gets in
    finally:
        gate.set()
    eng.close()  # joins the worker, which drained the ring first
    assert [rt.table.latches.is_set(r.index) for r in [first, *queued]] == [True] * 3
    assert calls == [1, 2]


def test_bad_input_is_refused_naming_the_problem(engine: Engine) -> None:
    with pytest.raises(InvalidInput, match="missing input 'x'"):
        engine.infer("add", {})
    with pytest.raises(InvalidInput, match="unknown input 'z'"):
        engine.infer("add", {"x": np.zeros((1, 4), np.float32), "z": np.zeros(1)})
    with pytest.raises(InvalidInput, match="datatype float64 but the model takes FP32"):
        engine.infer("add", {"x": np.zeros((1, 4))})
    with pytest.raises(InvalidInput, match=r"shape \[1, 5\] does not match \[batch, 4\]"):
        engine.infer("add", {"x": np.zeros((1, 5), np.float32)})
    with pytest.raises(InvalidInput, match="batch of 9 exceeds max_batch_size 8"):
        engine.infer("add", {"x": np.zeros((9, 4), np.float32)})
    with pytest.raises(ModelNotFound, match="unknown model 'nope'"):
        engine.infer("nope", {})


def test_queue_full_is_rejected_at_once_and_expired_requests_never_run(engine: Engine) -> None:
    gate, calls = slow_model_state.GATE, slow_model_state.CALLS
    gate.clear()
    calls.clear()
    slow_model_state.ENTERED.clear()
    x = np.ones((1, 2), np.float32)
    results: list[object] = []
    lock = threading.Lock()

    def call(timeout_s: float | None) -> None:
        try:
            r: object = engine.infer("slow", {"x": x}, timeout_s=timeout_s)
        except Exception as e:
            r = e
        with lock:
            results.append(r)

    first = threading.Thread(target=call, args=(None,))
    first.start()
    rt = engine.runtime("slow")
    deadline = time.monotonic() + 10
    assert slow_model_state.ENTERED.wait(10)  # the worker is inside the model with the first request
    expiring = [threading.Thread(target=call, args=(0.001,)) for _ in range(3)]
    for t in expiring:
        t.start()
    while rt.statistics()["ring"]["len"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    # fill the table: the next submit must fail at once, not wait
    fillers = []
    with pytest.raises(QueueFull, match="queue full"):
        for _ in range(100):
            fillers.append(rt.submit({"x": x}))
    time.sleep(0.01)  # let the 1 ms deadlines pass while the model is blocked
    gate.set()
    for t in [first, *expiring]:
        t.join(30)
    for req in fillers:
        assert rt.wait(req, timeout_s=30)
        rt.release(req)
    timeouts = [r for r in results if isinstance(r, RequestTimeout)]
    assert len(timeouts) == 3, results
    assert sum(calls) == 1 + len(fillers)  # the expired ones never reached the model


def test_cancelled_async_request_never_runs(engine: Engine) -> None:
    gate, calls = slow_model_state.GATE, slow_model_state.CALLS
    gate.clear()
    calls.clear()
    slow_model_state.ENTERED.clear()
    x = np.ones((1, 2), np.float32)

    async def main() -> None:
        first = asyncio.ensure_future(engine.infer_async("slow", {"x": x}))
        rt = engine.runtime("slow")
        while not slow_model_state.ENTERED.is_set():  # the worker is inside the model
            await asyncio.sleep(0.001)
        victim = asyncio.ensure_future(engine.infer_async("slow", {"x": x * 5}))
        await asyncio.sleep(0.01)
        victim.cancel()
        await asyncio.sleep(0.01)
        gate.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await victim
        while rt.table.free < len(rt.table.records):  # the cancelled record comes back too
            await asyncio.sleep(0.001)

    asyncio.run(main())
    assert calls == [1]
    assert engine.statistics("slow")[0]["cancelled"] == 1


def test_spsc_with_one_worker(repo: Path) -> None:
    with Engine(repo, EngineConfig(queue_type="spsc", thread_count=1), models=["add"]) as eng:
        x = np.ones((2, 4), np.float32)
        for _ in range(20):
            np.testing.assert_allclose(eng.infer("add", {"x": x}).outputs["y"], x + 1)


def test_close_refuses_new_requests(repo: Path) -> None:
    from lumenrt.engine.request import ModelNotReady

    eng = Engine(repo, EngineConfig(thread_count=1), models=["add"])
    assert eng.ready()
    eng.close()
    assert not eng.ready()
    with pytest.raises(ModelNotReady):
        eng.infer("add", {"x": np.ones((1, 4), np.float32)})


class _Interrupted(Exception):
    pass


def test_sync_caller_interrupted_while_waiting_leaks_nothing(repo: Path) -> None:
    """A signal handler that raises while engine.infer waits (Ctrl-C): the exception reaches the
    caller, the request is cancelled or finishes, and its record and arena slot come back."""
    import signal

    gate = slow_model_state.GATE
    gate.clear()
    slow_model_state.ENTERED.clear()

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted()

    old = signal.signal(signal.SIGALRM, interrupt)
    opener = threading.Timer(0.3, gate.set)  # the model finishes after the interrupt
    with Engine(repo, EngineConfig(thread_count=1), models=["slow"]) as eng:
        rt = eng.runtime("slow")
        try:
            opener.start()
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(_Interrupted):
                eng.infer("slow", {"x": np.ones((1, 2), np.float32)})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            opener.join(5)
            gate.set()
        assert slow_model_state.ENTERED.is_set()  # it was inside the model when interrupted
        assert rt.table.free == len(rt.table.records)
        assert rt.statistics()["arena"]["in_use"] == 0
        y = eng.infer("slow", {"x": np.ones((1, 2), np.float32)}).outputs["y"]
        np.testing.assert_allclose(y, 2.0)


@pytest.mark.parametrize("levels", [1, 2])
def test_sync_caller_with_a_deadline_is_answered_by_it_while_the_model_hangs(
    tmp_path: Path, levels: int
) -> None:
    """The worker is stuck inside the model past the caller's deadline: the caller gets
    RequestTimeout then, not when the model returns; its record comes back once the worker
    answers (with priority levels too: their own wait path)."""
    write_py_model(tmp_path)
    if levels > 1:
        config = tmp_path / "slow" / "config.yaml"
        config.write_text(
            config.read_text().replace("dynamic_batching:\n", "dynamic_batching:\n  priority_levels: 2\n")
        )
    entered, gate = slow_model_state.ENTERED, slow_model_state.GATE
    entered.clear()
    gate.clear()
    with Engine(tmp_path, EngineConfig(thread_count=1)) as eng:
        rt = eng.runtime("slow")
        try:
            with pytest.raises(
                RequestTimeout, match=r"model 'slow': deadline passed after .* before a worker answered"
            ):
                eng.infer("slow", {"x": np.ones((1, 2), np.float32)}, timeout_s=0.2)
            assert entered.is_set()  # it was inside the model: only the caller could answer it
            assert rt.table.free == len(rt.table.records) - 1  # parked until the worker answers
        finally:
            gate.set()
        (late,) = rt._late
        assert rt.table.latches.wait(late.index, timeout_s=30)  # the model returned: answered
        # the next admission (an asynchronous one: a front end's) gives the parked record back
        y = asyncio.run(eng.infer_async("slow", {"x": np.ones((1, 2), np.float32)}, timeout_s=30)).outputs[
            "y"
        ]
        np.testing.assert_allclose(y, 2.0)
        assert rt.table.free == len(rt.table.records) and not rt._late
        assert rt.statistics()["arena"]["in_use"] == 0
