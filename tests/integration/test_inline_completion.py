"""How answers come back to the event loop, in both worker modes (one test body each): the inline
completion (a lone request's answer waited for on the loop, engine.py) wakes nobody, and one
caller's callback raising does not keep the answers taken with it from theirs."""

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.process_pool import ProcessPool
from lumenrt.native import Notifier
from tests.integration.test_engine import write_add_model

MODES = ["thread", "process"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inline")
    write_add_model(root)
    # no batching delay: a lone request is computed at once
    (root / "add" / "config.yaml").write_text("backend: onnxruntime\nmax_batch_size: 8\n")
    return root


def _engine(repo: Path, mode: str, spin_us: int, workers: int) -> Iterator[Engine]:
    with Engine(repo, EngineConfig(worker_mode=mode, thread_count=workers, spin_us=spin_us)) as engine:
        yield engine


@pytest.fixture(params=MODES)
def waiting_engine(request: pytest.FixtureRequest, repo: Path) -> Iterator[Engine]:
    """The loop waits up to 0.2 s for a lone request's answer: long enough for any answer. One
    worker (an idle worker spins as long, on a CPU the other tests share)."""
    yield from _engine(repo, request.param, 200_000, 1)


@pytest.fixture(params=MODES)
def draining_engine(request: pytest.FixtureRequest, repo: Path) -> Iterator[Engine]:
    """No inline completion: every answer comes through the loop's reader."""
    yield from _engine(repo, request.param, 0, 2)


def _notifier(engine: Engine) -> Notifier:
    """The notifier the model's answers wake the loop through."""
    workers = engine.runtime("add").workers
    if isinstance(workers, ProcessPool):
        assert workers.notifier is not None
        return workers.notifier
    assert engine._async is not None
    return engine._async.notifier


def test_an_answer_waited_for_on_the_loop_wakes_nobody(waiting_engine: Engine) -> None:
    """A client sending one request at a time: the loop sleeps between requests (armed), then
    waits for each answer itself. The worker finds the notifier disarmed and writes no eventfd,
    so the loop is not woken again for an answer it already has. Before the loop disarmed it,
    each of these answers cost an eventfd write and a wake-up (writes == n). A few may still
    write on a loaded machine: a worker that answers before the loop has disarmed (the loop
    preempted between the push and the disarm) finds it armed."""
    engine = waiting_engine
    rt = engine.runtime("add")
    n = 40
    got: list[float] = []

    async def one_at_a_time() -> tuple[dict[str, int], dict[str, int]]:
        loop = asyncio.get_running_loop()
        before: dict[str, int] = {}
        for i in range(n + 1):
            answered = loop.create_future()

            def on_answer(req: object, answered: asyncio.Future[None] = answered) -> None:
                got.append(float(req.outputs["y"][0, 0]))  # type: ignore[attr-defined]
                rt.release(req)  # type: ignore[arg-type]
                answered.set_result(None)

            engine.submit_callback(rt, {"x": np.full((1, 4), i, np.float32)}, on_answer)
            assert answered.done(), "answered inline, before submit_callback returned"
            await asyncio.sleep(0.002)  # the loop sleeps in epoll, as between a client's requests
            if i == 0:  # the first binds the loop and attaches the pools: count from here
                before = _notifier(engine).stats()
        return before, _notifier(engine).stats()

    before, after = asyncio.run(one_at_a_time())
    assert got == [i + 1.0 for i in range(n + 1)]
    assert after["notify_calls"] - before["notify_calls"] == n  # every answer was notified
    assert after["writes"] - before["writes"] <= n // 4  # and (nearly) none of them woke the loop
    assert rt.table.free == len(rt.table.records)


def test_a_call_back_that_raises_does_not_stop_the_others(
    draining_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Answers drained together: one caller's call back raising is logged, and every other caller
    drained with it is still answered (the loop's reader goes on)."""
    engine = draining_engine
    rt = engine.runtime("add")
    answered: list[np.ndarray] = []
    kept: list[object] = []

    def boom(req: object) -> None:
        kept.append(req)
        raise RuntimeError("a caller's call back failed")

    def take(req: object) -> None:
        answered.append(req.outputs["y"].copy())  # type: ignore[attr-defined]
        rt.release(req)  # type: ignore[arg-type]

    async def submit_all() -> None:
        for i in range(8):  # submitted in one loop turn: their answers are drained together
            engine.submit_callback(rt, {"x": np.full((1, 4), i, np.float32)}, boom if i == 1 else take)
        deadline = time.monotonic() + 30
        while len(answered) < 7:
            assert time.monotonic() < deadline, f"{len(answered)} of 7 answered"
            await asyncio.sleep(0.005)

    asyncio.run(submit_all())
    assert sorted(float(y[0, 0]) for y in answered) == [i + 1.0 for i in range(8) if i != 1]
    assert "answering a request failed" in caplog.text and len(kept) == 1
    caplog.clear()  # its traceback holds the drain's frames: the ring and notifier, views of the region
    rt.release(kept[0])  # type: ignore[arg-type]
    assert rt.table.free == len(rt.table.records)
