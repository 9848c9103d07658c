"""More workers on one model than a 64-entry agent table holds (issue 38: ``--workers 70`` never
became ready, the workers past the 64th dying at their first pop). The rings' agent tables are
sized from the plan when the model loads: every worker is ready and takes requests, in both worker
modes; in-process callers beyond the old table are served; a count past any table is refused at
load, naming the model and the count.

Every worker taking a request is shown without timing: the test model holds each request until as
many distinct workers hold one as the model has (each worker holds one at a time: the model does
not batch), so the requests can only all be answered if every worker took one. Every wait is
bounded (HOLD_S in the model, HANG_S here) so that a defect fails instead of hanging."""

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.request import EngineError
from lumenrt.native import MAX_AGENTS

# More than 64, as the default plan gives one model on a host of 66 or more CPUs. In process mode
# each is a fresh interpreter importing numpy and lumenrt: 70 start in ~25 s on the 2-CPU VM.
N_WORKERS = 70
HOLD_S = 60.0  # the model holds a request at most this long waiting for the other workers
HANG_S = 240.0  # every answer by then, or the test fails

# Holds each request until WANT distinct (process, thread) pairs have entered ``infer``: a worker
# holds one request at a time (no dynamic batching), so WANT entered means WANT workers took one.
GATHER_PY = """
import os
import threading
import time
from pathlib import Path

ROOM = Path({room!r})
WANT = {want}
HOLD_S = {hold_s}


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        (ROOM / f"{{os.getpid()}}-{{threading.get_native_id()}}").touch()
        deadline = time.monotonic() + HOLD_S
        while len(os.listdir(ROOM)) < WANT and time.monotonic() < deadline:
            time.sleep(0.02)
        return {{"y": inputs["x"] * 2}}
"""

ECHO_PY = """
class Model:
    def load(self):
        pass

    def infer(self, inputs):
        return {"y": inputs["x"] * 2}
"""


def write_model(root: Path, name: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(code)
    (root / name / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 0\n"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [2]}\n"
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (tmp_path / "room").mkdir()
    write_model(root, "gather", GATHER_PY.format(room=str(tmp_path / "room"), want=N_WORKERS, hold_s=HOLD_S))
    write_model(root, "echo", ECHO_PY)
    return root


def infer_all(engine: Engine, model: str, n: int) -> list[np.ndarray]:
    """``n`` requests at once (one event loop), every answer within HANG_S."""

    async def run() -> list[np.ndarray]:
        xs = [np.array([i, -i], dtype=np.float32) for i in range(n)]
        results = await asyncio.wait_for(
            asyncio.gather(*(engine.infer_async(model, {"x": x}) for x in xs)), HANG_S
        )
        for x, r in zip(xs, results, strict=True):
            np.testing.assert_array_equal(r.outputs["y"], x * 2)
        return xs

    return asyncio.run(run())


def wait_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def entered(root: Path) -> set[str]:
    """(pid-tid) of each thread that entered the gather model's ``infer``."""
    return {p.name for p in (root.parent / "room").iterdir()}


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.close()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_more_than_64_workers_are_ready_and_each_takes_requests(
    repo: Path, engines: list[Engine], mode: str
) -> None:
    model, n = "gather", N_WORKERS
    engine = Engine(repo, EngineConfig(thread_count=n, worker_mode=mode), models=[model])
    engines.append(engine)
    assert engine.ready(model), f"{n} {mode} workers: the model must be ready once loaded"
    stats = engine.statistics(model)[0]
    assert stats["workers"] == n
    assert stats["ring"]["max_agents"] >= n + 1  # every worker and this caller
    infer_all(engine, model, n)
    took = entered(repo)
    assert len(took) == n, f"{len(took)} of {n} workers took a request"
    pids = {name.split("-")[0] for name in took}
    if mode == "thread":
        assert pids == {str(os.getpid())}  # n threads of this process
    else:
        assert len(pids) == n and str(os.getpid()) not in pids  # n worker processes
    assert engine.ready(model)
    assert engine.statistics(model)[0]["requests"] == n


def test_workers_past_any_agent_table_are_refused_at_load(repo: Path) -> None:
    n = MAX_AGENTS + 1
    with pytest.raises(ValueError, match=rf"model 'echo': {n} workers exceed the ring's agent table"):
        Engine(repo, EngineConfig(thread_count=n), models=["echo"])


def callers_at_once(engine: Engine, n: int) -> list[BaseException]:
    """``n`` threads call ``engine.infer`` and stay alive (each keeping its ring entry) until all
    have been answered; the errors they got."""
    errors: list[BaseException] = []
    all_answered = threading.Barrier(n + 1)

    def call(i: int) -> None:
        try:
            x = np.array([i, 1], dtype=np.float32)
            np.testing.assert_array_equal(engine.infer("echo", {"x": x}).outputs["y"], x * 2)
        except BaseException as e:
            errors.append(e)
        finally:
            all_answered.wait(HANG_S)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    all_answered.wait(HANG_S)
    for t in threads:
        t.join(HANG_S)
    return errors


def test_in_process_callers_beyond_64_threads_are_served(repo: Path, engines: list[Engine]) -> None:
    """Each thread calling ``infer`` holds an entry of the request ring's agent table: 200 live
    callers fit beside the 2 workers; a second 200, while the first have exited, find the entries
    of the exited threads reused (the table holds fewer than 400)."""
    engine = Engine(repo, EngineConfig(thread_count=2), models=["echo"])
    engines.append(engine)
    assert callers_at_once(engine, 200) == []
    assert callers_at_once(engine, 200) == []
    assert engine.statistics("echo")[0]["requests"] == 400
    assert engine.statistics("echo")[0]["ring"]["max_agents"] < 400  # so entries were reused


def test_a_caller_past_the_table_gets_a_clear_error(repo: Path, engines: list[Engine]) -> None:
    """More live callers than the table holds: the ones past it are refused at once with an error
    naming the model and the cause; the others are served, and so is everyone after."""
    engine = Engine(repo, EngineConfig(thread_count=2), models=["echo"])
    engines.append(engine)
    ring = engine.statistics("echo")[0]["ring"]
    wait_until(lambda: engine.statistics("echo")[0]["ring"]["agents"] == 2, "both workers at the ring")
    table = ring["max_agents"]
    errors = callers_at_once(engine, table)  # with the 2 workers: 2 more threads than the table
    assert len(errors) == 2, errors
    for e in errors:
        assert isinstance(e, EngineError)
        assert "model 'echo'" in str(e) and "too many threads use this ring" in str(e)
    assert callers_at_once(engine, 10) == []  # the exited callers' entries are reused
