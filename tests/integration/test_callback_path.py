"""The ingress -> engine contract for queued requests: a front end submits and is called back on
the loop's thread, with no Task and no Future per request (service.submit, Engine.submit_callback);
every request still gets exactly its own answer, in both worker modes; and the server does not ask
asyncio for its running loop per request (loop_lookups.py)."""

import asyncio
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from lumenrt.client import HttpClient, TcpClient
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.models.builtin import builtin_examples
from tests.integration.loop_lookups import loop_lookups

MODEL = "digits_mlp"
SLEEP_CODE = asyncio.sleep.__code__
N = 200


class Counting:
    """Counts the Tasks and Futures the server's loop creates while ``on`` (a task factory, and a
    wrapper of ``create_future``; the futures of ``asyncio.sleep``, the sweepers' timers, are not
    counted)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.tasks = 0
        self.futures = 0
        self.on = False
        self._lock = threading.Lock()

    def install(self) -> None:
        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            if self.on:
                with self._lock:
                    self.tasks += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        original = self.loop.create_future

        def create_future() -> asyncio.Future[Any]:
            if self.on and sys._getframe(1).f_code is not SLEEP_CODE:  # the sweepers' timers
                with self._lock:
                    self.futures += 1
            return original()

        self.loop.set_task_factory(factory)
        self.loop.create_future = create_future  # type: ignore[method-assign]


@pytest.fixture(scope="module", params=["thread", "process"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[ServerThread, Counting, Engine]]:
    settings = EngineConfig(worker_mode=request.param, lane="queue", thread_count=1)
    with (
        Engine(models=[MODEL], settings=settings) as engine,
        ServerThread(engine, ServeOptions(http_port=0, grpc_port=0, tcp_port=0)) as st,
    ):
        counting = Counting(st.loop)
        st.loop.call_soon_threadsafe(counting.install)
        st.call(asyncio.sleep(0))  # installed
        yield st, counting, engine


def expected(rows: int) -> dict[str, np.ndarray]:
    return builtin_examples(MODEL, rows)


@pytest.mark.parametrize("protocol", ["tcp", "http"])
def test_queued_requests_are_answered_without_a_task_or_future_each(
    served: tuple[ServerThread, Counting, Engine], protocol: str
) -> None:
    st, counting, engine = served
    rt = engine.runtime(MODEL)
    reference = {rows: engine.infer(MODEL, expected(rows)).outputs for rows in (1, 2, 3)}
    before = rt.statistics()["requests"]
    port = st.ports[protocol]
    client: Any = TcpClient("127.0.0.1", port) if protocol == "tcp" else HttpClient("127.0.0.1", port)
    counting.tasks = counting.futures = 0
    counting.on = True
    try:  # (the connection is made by the first request: counted, as it is one of the N)
        with client, loop_lookups() as lookups:
            for i in range(N):
                rows = i % 3 + 1
                got = client.infer(MODEL, expected(rows)).outputs
                for name, want in reference[rows].items():
                    np.testing.assert_allclose(got[name], want, rtol=1e-6)
    finally:
        counting.on = False
    assert rt.statistics()["requests"] - before == N  # all through the workers (lane: queue)
    assert rt.statistics()["lane"]["requests"] == 0
    assert counting.tasks == 0 and counting.futures == 0, (counting.tasks, counting.futures)
    # the loop is kept, not asked for per request (a getpid() each on 3.11); an HTTP connection
    # asks once, when it is made
    assert lookups[0] <= 1, lookups[0]
    assert rt.table.free == len(rt.table.records)  # every record released after its answer
    # the counter sees what the awaitable API creates: a Task, and a Future per request
    counting.on = True
    try:
        st.call(engine.infer_async(MODEL, expected(1)))
    finally:
        counting.on = False
    assert counting.tasks >= 1 and counting.futures >= 1, (counting.tasks, counting.futures)
