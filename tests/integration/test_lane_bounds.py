"""The inline lane takes only requests of known small cost and holds every request's deadline
(engine/lane.py invariants 6 and 7): a long request to a model with a variable dimension goes to
the workers, so the event loop goes on answering other connections while it computes; small
requests still run inline; a request whose deadline leaves no time to run it, or that ran past
its deadline, is answered with the timeout error, as the queue answers it."""

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lumenrt.client import HttpClient, InferenceError, InferResult
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.lane import SIZE_FACTOR
from lumenrt.engine.request import RequestTimeout
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.models.builtin import builtin_examples
from tests.integration import slow_model_state as state

WAIT_S = 20.0
HTTP_ONLY = ServeOptions(http_port=0, grpc_port=None, tcp_port=None)

# y = 2x over a variable-length x; a request of more than LONG elements blocks on GATE (the lane's
# probe runs one element)
VARY_PY = """
from tests.integration.slow_model_state import CALLS, ENTERED, GATE

LONG = 1000


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        x = inputs["x"]
        CALLS.append(int(x.size))
        if x.size > LONG:
            ENTERED.set()
            GATE.wait(30)
        return {"y": x * 2}
"""

# y = 2x; every run takes at least FLOOR_S (so the lane's probe measures at least that), and at
# least x's first element in microseconds
PACED_PY = """
import time

from tests.integration.slow_model_state import CALLS

FLOOR_S = 0.0002


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        x = inputs["x"]
        CALLS.append(int(x.size))
        time.sleep(max(FLOOR_S, float(x.flat[0]) / 1e6))
        return {"y": x * 2}
"""
FLOOR_US = 200


def write_vary(root: Path) -> Path:
    (root / "vary" / "1").mkdir(parents=True)
    (root / "vary" / "1" / "model.py").write_text(VARY_PY)
    (root / "vary" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 0\n"
        "input:\n  - {name: x, datatype: FP32, dims: [-1]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [-1]}\n"
        "instance_group: {count: 1}\n"
    )
    return root


def write_paced(root: Path, policy: str = "") -> Path:
    (root / "paced" / "1").mkdir(parents=True)
    (root / "paced" / "1" / "model.py").write_text(PACED_PY)
    batching = f"dynamic_batching:\n  default_queue_policy: {policy}\n" if policy else ""
    (root / "paced" / "config.yaml").write_text(
        f"backend: python\nmax_batch_size: 4\n{batching}"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )
    return root


def paced_x(run_us: int = 0) -> dict[str, np.ndarray]:
    """One row for ``paced``: its run takes at least ``run_us`` (and FLOOR_US)."""
    return {"x": np.array([[run_us, 1]], dtype=np.float32)}


@pytest.fixture(autouse=True)
def model_state() -> Iterator[None]:
    state.CALLS.clear()
    state.GATE.set()
    yield
    state.GATE.set()
    state.CALLS.clear()


def test_a_long_request_does_not_stall_another_connections_health_check(tmp_path: Path) -> None:
    """A million-element request goes to a worker (where it blocks in the model); meanwhile the
    event loop answers another connection's health check, and a small request there still runs
    on the lane. Then the long one is answered, right."""
    with (
        Engine(write_vary(tmp_path), models=["vary"], settings=EngineConfig(lane="inline")) as eng,
        ServerThread(eng, HTTP_ONLY) as st,
    ):
        rt = eng.runtime("vary")
        assert rt.lane.active
        lane_before = rt.lane.stats.requests
        long = {"x": np.arange(1 << 20, dtype=np.float32)}
        answers: list[InferResult | Exception] = []

        def send_long() -> None:
            try:
                with HttpClient("127.0.0.1", st.ports["http"], timeout_s=3 * WAIT_S) as client:
                    answers.append(client.infer("vary", long))
            except Exception as exc:  # shown by the assertion below
                answers.append(exc)

        state.ENTERED.clear()
        state.GATE.clear()
        sender = threading.Thread(target=send_long)
        try:
            sender.start()
            assert state.ENTERED.wait(WAIT_S)  # the long request is in the model, held there
            with HttpClient("127.0.0.1", st.ports["http"], timeout_s=WAIT_S) as other:
                assert other.live()  # the loop is not computing it
                small = other.infer("vary", {"x": np.ones(4, dtype=np.float32)})
            np.testing.assert_array_equal(small.outputs["y"], np.full(4, 2, dtype=np.float32))
            assert rt.lane.stats.requests == lane_before + 1  # the small one ran on the lane
            assert not answers  # the long one is still held in the model
        finally:
            state.GATE.set()
            sender.join(3 * WAIT_S)
        assert len(answers) == 1, answers
        got = answers[0]
        assert isinstance(got, InferResult), got
        np.testing.assert_array_equal(got.outputs["y"], long["x"] * 2)
        assert rt.lane.stats.requests == lane_before + 1  # the long one ran on a worker
        assert rt.lane.oversize == 1
        assert rt.statistics()["lane"]["oversize"] == 1


def test_small_requests_take_the_lane_and_larger_ones_the_workers(tmp_path: Path) -> None:
    """Up to SIZE_FACTOR times the probe's elements (one element here) a request runs inline;
    past that it is answered by a worker, right either way."""
    with (
        Engine(write_vary(tmp_path), models=["vary"], settings=EngineConfig(lane="inline")) as eng,
        ServerThread(eng, HTTP_ONLY) as st,
        HttpClient("127.0.0.1", st.ports["http"], timeout_s=WAIT_S) as client,
    ):
        rt = eng.runtime("vary")
        assert rt.lane.max_elements == SIZE_FACTOR
        before, all_before = rt.lane.stats.requests, rt.statistics()["requests"]
        for n in (1, SIZE_FACTOR):
            x = np.arange(n, dtype=np.float32)
            np.testing.assert_array_equal(client.infer("vary", {"x": x}).outputs["y"], x * 2)
        assert rt.lane.stats.requests == before + 2 and rt.lane.oversize == 0
        x = np.arange(SIZE_FACTOR + 1, dtype=np.float32)
        np.testing.assert_array_equal(client.infer("vary", {"x": x}).outputs["y"], x * 2)
        assert rt.lane.stats.requests == before + 2 and rt.lane.oversize == 1
        assert rt.statistics()["requests"] == all_before + 3  # each counted once, wherever it ran


def test_a_batch_of_more_rows_than_the_bound_goes_to_the_workers() -> None:
    """A model of fixed dimensions: its rows against SIZE_FACTOR (the probe ran one row)."""
    model = "digits_mlp"
    with Engine(models=[model], settings=EngineConfig(lane="inline")) as eng:
        rt = eng.runtime(model)
        assert rt.run_inline(builtin_examples(model, SIZE_FACTOR)) is not None
        assert rt.run_inline(builtin_examples(model, SIZE_FACTOR + 1)) is None
        assert rt.lane.oversize == 1
        before = rt.lane.stats.requests
        x = builtin_examples(model, SIZE_FACTOR + 1)
        assert eng.infer(model, x).outputs["probabilities"].shape[0] == SIZE_FACTOR + 1  # a worker's
        assert rt.lane.stats.requests == before


def test_a_deadline_that_leaves_no_time_to_run_is_answered_with_the_timeout_not_run(tmp_path: Path) -> None:
    """``paced`` runs no faster than FLOOR_US (its probe measured that much): a request with a
    shorter timeout cannot be answered in time, so the lane answers 504 at once and does not run
    it, over HTTP and in-process (0: a deadline already passed). A longer timeout runs inline."""
    with (
        Engine(write_paced(tmp_path), models=["paced"], settings=EngineConfig(lane="inline")) as eng,
        ServerThread(eng, HTTP_ONLY) as st,
        HttpClient("127.0.0.1", st.ports["http"], timeout_s=WAIT_S) as client,
    ):
        rt = eng.runtime("paced")
        assert rt.lane.active and rt.lane.probe_us >= FLOOR_US
        state.CALLS.clear()
        with pytest.raises(InferenceError, match="timed out") as err:
            client.infer("paced", paced_x(), timeout_s=FLOOR_US / 2 / 1e6)
        assert err.value.status == 504
        for timeout_s in (FLOOR_US / 2 / 1e6, 0.0):
            with pytest.raises(RequestTimeout, match="not run"):
                eng.infer("paced", paced_x(), timeout_s=timeout_s)
        assert state.CALLS == []  # none of them ran
        assert rt.lane.stats.expired == 3 and rt.statistics()["expired"] == 3
        before = rt.lane.stats.requests
        got = client.infer("paced", paced_x(), timeout_s=60)
        np.testing.assert_array_equal(got.outputs["y"], paced_x()["x"] * 2)
        assert rt.lane.stats.requests == before + 1 and state.CALLS == [2]  # inline, in time


def test_a_request_that_runs_past_its_deadline_on_the_lane_is_answered_with_the_timeout(
    tmp_path: Path,
) -> None:
    """As the event loop answers a queued request at its deadline while a worker still runs it."""
    with (
        Engine(write_paced(tmp_path), models=["paced"], settings=EngineConfig(lane="inline")) as eng,
        ServerThread(eng, HTTP_ONLY) as st,
        HttpClient("127.0.0.1", st.ports["http"], timeout_s=WAIT_S) as client,
    ):
        rt = eng.runtime("paced")
        before = rt.lane.stats.requests
        with pytest.raises(InferenceError, match="deadline passed") as err:
            client.infer("paced", paced_x(400_000), timeout_s=0.2)  # runs 0.4 s, 0.2 s allowed
        assert err.value.status == 504
        assert rt.lane.stats.requests == before + 1  # it ran, on the lane


@pytest.mark.parametrize(
    ("policy", "timeout_s", "answered"),
    [
        ("{default_timeout_microseconds: 100}", None, False),  # the level's timeout
        ("{default_timeout_microseconds: 100, allow_timeout_override: false}", 60.0, False),
        ("{default_timeout_microseconds: 100}", 60.0, True),  # its own overrides the level's
        ("{default_timeout_microseconds: 100, timeout_action: DELAY}", None, True),  # runs late
    ],
)
def test_the_lane_applies_the_queue_policys_timeout(
    tmp_path: Path, policy: str, timeout_s: float | None, answered: bool
) -> None:
    """The deadline a request gets on the lane is the one the queue would give it."""
    settings = EngineConfig(lane="inline")
    with Engine(write_paced(tmp_path, policy), models=["paced"], settings=settings) as eng:
        rt = eng.runtime("paced")
        assert rt.lane.active and rt.lane.probe_us >= FLOOR_US
        before, calls = rt.lane.stats.requests, len(state.CALLS)
        if answered:
            got = eng.infer("paced", paced_x(), timeout_s=timeout_s)
            np.testing.assert_array_equal(got.outputs["y"], paced_x()["x"] * 2)
            assert rt.lane.stats.requests == before + 1
        else:
            with pytest.raises(RequestTimeout, match="not run"):
                eng.infer("paced", paced_x(), timeout_s=timeout_s)
            assert rt.lane.stats.expired == 1 and len(state.CALLS) == calls  # not run


LEVELS = (
    "dynamic_batching:\n  priority_levels: 2\n  default_priority_level: 2\n"
    "  priority_queue_policy:\n    1: {default_timeout_microseconds: 100}\n"
)


def test_a_request_for_another_priority_level_goes_to_the_queue(tmp_path: Path) -> None:
    """The lane holds the default level's queue policy only: a request for another level (here
    one whose 100 us timeout the default level does not have) is scheduled in the queue, where its
    level's policy applies, over HTTP and in process."""
    (tmp_path / "paced" / "1").mkdir(parents=True)
    (tmp_path / "paced" / "1" / "model.py").write_text(PACED_PY)
    (tmp_path / "paced" / "config.yaml").write_text(
        f"backend: python\nmax_batch_size: 4\n{LEVELS}"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )
    with Engine(tmp_path, EngineConfig(lane="inline"), models=["paced"]) as eng:
        rt = eng.runtime("paced")
        assert rt.lane.active
        before = rt.lane.stats.requests
        got = eng.infer("paced", paced_x(), priority=2)  # the default level: the lane
        np.testing.assert_array_equal(got.outputs["y"], paced_x()["x"] * 2)
        assert rt.lane.stats.requests == before + 1
        eng.infer("paced", paced_x(), priority=1, timeout_s=60)  # its own timeout: it runs, queued
        with ServerThread(eng, HTTP_ONLY) as st, HttpClient("127.0.0.1", st.ports["http"]) as client:
            client.infer("paced", paced_x(), priority=1, timeout_s=60)
        assert rt.lane.stats.requests == before + 1  # neither level-1 request ran on the lane
        assert rt.statistics()["requests"] - rt.lane.stats.requests == 2  # the workers ran both
