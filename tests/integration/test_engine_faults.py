"""The engine's fault paths: each path that takes a request answers it, within a bound. Every wait
here has a timeout that turns a hang into a failure (``answered_within``)."""

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.backends.base import Placement
from lumenrt.engine import engine as engine_module
from lumenrt.engine import execute as execute_module
from lumenrt.engine.config import ConfigError
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.process_pool import SPAWN, ProcessPool
from lumenrt.engine.process_worker import WorkerSpec, worker_main
from lumenrt.engine.repository import ModelRepository
from lumenrt.engine.request import EngineError, InvalidInput, QueueFull, WorkerDied
from lumenrt.native import PassedFd, create_unnamed
from tests.integration import slow_model_state
from tests.integration.test_engine import write_add_model, write_py_model

HANG_S = 20.0  # far beyond any answer here: past it, the path hung


def answered_within(fn: Callable[[], Any], timeout_s: float = HANG_S) -> Any:
    """Run ``fn`` in a thread; its result or exception, or a test failure if it has not returned
    within ``timeout_s`` (a hang)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        pytest.fail(f"no answer within {timeout_s} s: the path hangs")
    if "error" in box:
        return box["error"]
    return box["result"]


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


# A python model with a variable dimension; the first element says how long to take (process mode).
VAR_PY = """
import time


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        x = inputs["x"]
        time.sleep(float(x[0, 0]))
        return {"y": x * 2}
"""

# Loads only while FLAG does not exist (a replacement that fails to load, on demand).
FLAKY_PY = """
import os
import time

FLAG = {flag!r}


class Model:
    def load(self):
        if os.path.exists(FLAG):
            raise RuntimeError("refusing to load: " + FLAG)

    def infer(self, inputs):
        time.sleep(float(inputs["x"][0, 0]))
        return {{"y": inputs["x"] * 2}}
"""


def write_python_model(root: Path, name: str, code: str, dims: str, max_queue: int = 64) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(code)
    (root / name / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 4\n"
        f"dynamic_batching: {{max_queue_delay_us: 0, max_queue_size: {max_queue}}}\n"
        f"input:\n  - {{name: x, datatype: FP32, dims: {dims}}}\n"
        f"output:\n  - {{name: y, datatype: FP32, dims: {dims}}}\n"
        "instance_group: {count: 1}\n"
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults")
    write_add_model(root)
    write_py_model(root, max_queue=5)  # "slow": blocks on slow_model_state.GATE (thread mode)
    write_python_model(root, "var", VAR_PY, "[-1]")
    write_python_model(root, "paced", VAR_PY, "[2]", max_queue=5)
    write_python_model(root, "flaky", FLAKY_PY.format(flag=str(root / "flaky.flag")), "[2]")
    return root


@pytest.fixture
def gate() -> Iterator[None]:
    slow_model_state.GATE.clear()
    slow_model_state.ENTERED.clear()
    slow_model_state.CALLS.clear()
    yield
    slow_model_state.GATE.set()


def infer_in_thread(engine: Engine, model: str, x: np.ndarray, out: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            out.append(engine.infer(model, {"x": x}))
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---- thread mode: a worker never dies with requests unanswered --------------------------------


def test_gather_error_fails_the_batch_and_the_worker_serves_on(
    repo: Path, gate: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Engine(repo, EngineConfig(thread_count=1), models=["slow"]) as engine:
        first: list[Any] = []
        t0 = infer_in_thread(engine, "slow", np.ones((1, 2), np.float32), first)
        assert slow_model_state.ENTERED.wait(HANG_S)  # the worker is inside infer()

        def broken_gather(*args: object) -> None:
            raise RuntimeError("injected: gathering failed")

        monkeypatch.setattr(execute_module, "gather", broken_gather)
        rt = engine.runtime("slow")
        queued: list[Any] = []
        threads = [infer_in_thread(engine, "slow", np.ones((1, 2), np.float32), queued) for _ in range(2)]
        wait_until(lambda: len(rt.ring) == 2, "two queued requests")
        slow_model_state.GATE.set()
        for t in (t0, *threads):
            t.join(HANG_S)
            assert not t.is_alive(), "a request was never answered"
        assert len(queued) == 2 and all(isinstance(r, EngineError) for r in queued), queued
        assert all("could not run the batch" in str(r) and "injected" in str(r) for r in queued)
        monkeypatch.undo()
        result = answered_within(lambda: engine.infer("slow", {"x": np.ones((1, 2), np.float32)}))
        np.testing.assert_array_equal(result.outputs["y"], np.full((1, 2), 2, np.float32))
        assert engine.ready("slow")
        assert rt.statistics()["failures"] == 2 and rt.table.free == len(rt.table.records)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_requests_of_different_variable_shapes_each_get_their_answer(repo: Path, mode: str) -> None:
    """Two queued requests whose variable dimension differs cannot be concatenated: each runs in
    its own group (before: the thread worker died silently, the process worker crashed)."""
    with Engine(repo, EngineConfig(thread_count=1, worker_mode=mode), models=["var"]) as engine:
        busy: list[Any] = []
        t0 = infer_in_thread(engine, "var", np.full((1, 2), 0.5, np.float32), busy)  # 0.5 s in the model
        wait_until(lambda: engine.statistics("var")[0]["ring"]["popped"] >= 1, "the first request taken")
        results: dict[int, Any] = {}

        def call(width: int) -> None:
            results[width] = answered_within(
                lambda: engine.infer("var", {"x": np.zeros((1, width), np.float32)})
            )

        threads = [threading.Thread(target=call, args=(w,)) for w in (3, 5, 3)]
        for t in threads:
            t.start()
        for t in (t0, *threads):
            t.join(HANG_S + 5)
        for width in (3, 5):
            r = results[width]
            assert not isinstance(r, BaseException), r
            assert r.outputs["y"].shape == (1, width)
        assert engine.ready("var")


# ---- admission: refused pushes, the queue bound, the batch cap -----------------------------------


def test_push_the_ring_refuses_is_answered_at_once_and_leaks_nothing(repo: Path) -> None:
    """spsc takes one producer thread: a second live producer is refused by the ring. That request
    is answered at once (not left waiting on a latch nobody sets) and its record and slot return."""
    with Engine(repo, EngineConfig(thread_count=1, queue_type="spsc"), models=["add"]) as engine:
        x = np.ones((1, 4), np.float32)
        engine.infer("add", {"x": x})  # this thread is the ring's producer from now on
        rt = engine.runtime("add")
        sync = answered_within(lambda: engine.infer("add", {"x": x}), timeout_s=10)
        assert isinstance(sync, EngineError) and "refused" in str(sync), sync

        async def one_async() -> Any:
            return await engine.infer_async("add", {"x": x})

        asynchronous = answered_within(lambda: asyncio.run(one_async()), timeout_s=10)
        assert isinstance(asynchronous, EngineError) and "refused" in str(asynchronous), asynchronous
        assert rt.table.free == len(rt.table.records)
        assert rt.arena is not None and rt.arena.stats()["in_use"] == 0
        np.testing.assert_array_equal(engine.infer("add", {"x": x}).outputs["y"], x + 1)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_queue_admits_exactly_max_queue_size_and_names_the_limit(repo: Path, gate: None, mode: str) -> None:
    """max_queue_size 5 (not a power of two): with the worker busy, exactly 5 requests wait; the
    6th is refused at once with a 503 that names max_queue_size."""
    model = "slow" if mode == "thread" else "paced"
    with Engine(repo, EngineConfig(thread_count=1, worker_mode=mode), models=[model]) as engine:
        rt = engine.runtime(model)
        held = rt.submit({"x": np.full((1, 2), 1.0, np.float32)})  # "paced": 1 s in the model
        wait_until(lambda: rt.statistics()["ring"]["popped"] >= 1, "the worker to take the first")
        accepted, refused = [], []
        for _ in range(9):
            try:
                accepted.append(rt.submit({"x": np.zeros((1, 2), np.float32)}))
            except QueueFull as e:
                refused.append(e)
        assert len(accepted) == 5 and len(refused) == 4
        assert all("max_queue_size: 5" in str(e) and e.status == 503 for e in refused)
        slow_model_state.GATE.set()
        for req in [held, *accepted]:
            assert rt.wait(req, timeout_s=HANG_S), "a queued request was never answered"
            rt.release(req)


def test_batch_size_caps_rows_per_batch_for_every_model(repo: Path) -> None:
    with Engine(repo, EngineConfig(thread_count=1, batch_size=2), models=["add"]) as engine:
        assert engine.metadata("add")["max_batch_size"] == 2
        with pytest.raises(InvalidInput, match="2"):
            engine.infer("add", {"x": np.zeros((3, 4), np.float32)})

        async def many() -> None:
            await asyncio.gather(
                *(engine.infer_async("add", {"x": np.full((1, 4), i, np.float32)}) for i in range(40))
            )

        answered_within(lambda: asyncio.run(many()))
        rows = engine.statistics("add")[0]["batch_rows"]
        assert sum(rows.values()) >= 20 and max(rows) <= 2, rows


def test_standard_allocator_with_process_workers_is_refused_naming_both_keys() -> None:
    with pytest.raises(ConfigError) as e:
        EngineConfig(allocator_type="standard", worker_mode="process")
    assert "engine.allocator_type" in str(e.value) and "engine.worker_mode" in str(e.value)


# ---- async completions, reloads ------------------------------------------------------------------


def test_async_completions_reach_the_loop_when_the_completion_ring_is_full(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker never waits on a full completion ring (before: a 30 s push whose failure was
    ignored, and the caller's future never resolved): what does not fit overflows, and every
    future resolves."""
    monkeypatch.setattr(engine_module, "COMPLETION_CAPACITY", 2)
    with Engine(repo, EngineConfig(thread_count=1, spin_us=0), models=["add"]) as engine:

        async def main() -> tuple[list[Any], int]:
            tasks = [
                asyncio.ensure_future(engine.infer_async("add", {"x": np.full((1, 4), i, np.float32)}))
                for i in range(8)
            ]
            await asyncio.sleep(0)  # every task has submitted
            deadline = time.monotonic() + HANG_S
            completions = engine._async
            assert completions is not None
            # every completion pushed (a worker counts a request before it answers it)
            while len(completions.ring) + len(completions.overflow) < 8 and time.monotonic() < deadline:
                time.sleep(0.01)  # the loop is blocked: completions cannot be drained meanwhile
            results = await asyncio.wait_for(asyncio.gather(*tasks), HANG_S)
            assert engine._async is not None
            return results, engine._async.overflowed

        results, overflowed = answered_within(lambda: asyncio.run(main()))
        assert [int(r.outputs["y"][0, 0]) for r in results] == [i + 1 for i in range(8)]
        assert overflowed >= 6  # 8 completions while the loop slept, 2 fit in the ring


def test_reloads_do_not_keep_closed_runtimes(repo: Path) -> None:
    with Engine(repo, EngineConfig(thread_count=1), models=["add"]) as engine:
        x = np.ones((1, 4), np.float32)
        for _ in range(6):
            engine.load("add")

            async def one() -> Any:
                return await engine.infer_async("add", {"x": x})

            asyncio.run(one())
        engine.load("add")
        assert len(engine._by_id) == 1, engine._by_id


# ---- process mode: supervision -------------------------------------------------------------------


def test_failed_replacement_is_retried_not_ready_meanwhile_and_supervision_goes_on(repo: Path) -> None:
    flag = repo / "flaky.flag"
    with Engine(repo, EngineConfig(thread_count=1, worker_mode="process"), models=["flaky"]) as engine:
        rt = engine.runtime("flaky")
        assert isinstance(rt.workers, ProcessPool)
        flag.write_text("x")
        try:
            first = rt.statistics()["pids"][0]
            os.kill(first, signal.SIGKILL)
            wait_until(lambda: not engine.ready("flaky"), "the death noticed")
            attempts: set[int] = set()  # replacements tried (each a new process)

            def tried_twice() -> bool:
                assert not engine.ready("flaky")  # a replacement that cannot load: not ready
                attempts.update(p for p in rt.statistics()["pids"] if p not in (0, first))
                return len(attempts) >= 2

            wait_until(tried_twice, "a second replacement after the first failed to load")
        finally:
            flag.unlink()
        wait_until(lambda: engine.ready("flaky"), "the replacement to load")
        # supervision still works: a worker killed while it holds a request fails that request
        out: list[Any] = []
        t = infer_in_thread(engine, "flaky", np.full((1, 2), 5.0, np.float32), out)
        wait_until(lambda: rt.statistics()["ring"]["popped"] >= 1, "the request taken")
        time.sleep(0.2)  # inside infer() (the model sleeps 5 s)
        os.kill(rt.statistics()["pids"][0], signal.SIGKILL)
        t.join(HANG_S)
        assert not t.is_alive() and len(out) == 1 and isinstance(out[0], WorkerDied), out
        wait_until(lambda: engine.ready("flaky"), "the second replacement")
        y = engine.infer("flaky", {"x": np.zeros((1, 2), np.float32)}).outputs["y"]
        assert y.shape == (1, 2)
        assert rt.statistics()["worker_deaths"] >= 3 and rt.statistics()["replacement_failures"] >= 1


def test_no_replacement_once_shutdown_began(repo: Path) -> None:
    with Engine(repo, EngineConfig(thread_count=1, worker_mode="process"), models=["paced"]) as engine:
        rt = engine.runtime("paced")
        assert isinstance(rt.workers, ProcessPool)
        out: list[Any] = []
        t = infer_in_thread(engine, "paced", np.full((1, 2), 5.0, np.float32), out)
        wait_until(lambda: rt.statistics()["ring"]["popped"] >= 1, "the request taken")
        engine.begin_shutdown()
        pid = rt.statistics()["pids"][0]
        os.kill(pid, signal.SIGKILL)
        t.join(HANG_S)
        assert not t.is_alive() and isinstance(out[0], WorkerDied), out
        wait_until(lambda: rt.statistics()["worker_deaths"] == 1, f"the death reported ({rt.statistics()})")
        assert rt.statistics()["pids"][0] == pid and not engine.ready("paced")
        assert rt.statistics()["failures"] == 1  # failed for the death: counted, as in the thread pool


def test_worker_whose_engine_died_before_it_armed_exits_at_once(repo: Path) -> None:
    """The parent-death signal only covers a parent that dies after it is armed: a worker that
    finds another parent (its engine died while it started) exits before touching anything."""
    lm = ModelRepository(repo).load("add")[0]
    region, fd = create_unnamed(4096, tag="t")
    wake = os.eventfd(0)
    try:
        spec = WorkerSpec(
            memory=PassedFd(fd),
            notifier=PassedFd(wake),
            memory_bytes=4096,
            parent_pid=os.getpid() + 1_000_000,  # not our pid: as if the engine were gone
            offsets={},
            config=lm.config,
            model_path=lm.model_path,
            placement=Placement(cores=()),
            index=0,
            n_workers=1,
            pin=False,
            hold_capacity=1,
            hold_bytes=64,
            table_size=1,
        )
        proc = SPAWN.Process(target=worker_main, args=(spec,))
        proc.start()
        proc.join(HANG_S)
        assert proc.exitcode == 0  # offsets {} would raise KeyError had it gone on
    finally:
        region.close()
        os.close(fd)
        os.close(wake)
