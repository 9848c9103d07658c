"""execute.py: every request of a batch is answered exactly once, whatever fails (a recording sink,
a scripted session; no threads, no rings)."""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from lumenrt.engine import execute as execute_module
from lumenrt.engine.config import model_config_from_dict
from lumenrt.engine.execute import BatchPlan, execute_batch
from lumenrt.engine.worker import batch_plan


@dataclass
class Req:
    x: np.ndarray
    cancelled: bool = False
    expired: bool = False


@dataclass
class RecordingSink:
    answers: dict[int, list[Any]] = field(default_factory=dict)  # id(request) -> what it got
    batches: list[tuple[int, int]] = field(default_factory=list)
    fail_answer_for: int | None = None  # id of a request whose answer raises (as a full slot would)

    def inputs(self, request: Req) -> dict[str, np.ndarray]:
        return {"x": request.x}

    def rows(self, request: Req) -> int:
        return int(request.x.shape[0])

    def dequeue(self, request: Req, now_ns: int) -> bool:
        if request.cancelled or request.expired:
            self._record(request, ("refused", "cancelled" if request.cancelled else "expired"))
            return True
        return False

    def ran(self, n_requests: int, rows: int, start_ns: int, end_ns: int) -> None:
        self.batches.append((n_requests, rows))

    def answer(
        self, request: Req, outputs: dict[str, Any], start_ns: int, end_ns: int, rows: int, now_ns: int
    ) -> None:
        if id(request) == self.fail_answer_for:
            raise RuntimeError("injected: the answer could not be written")
        self._record(request, ("ok", outputs["y"].copy()))

    def fail(self, request: Req, message: str, cause: BaseException) -> None:
        self._record(request, ("error", message))

    def answered(self, request: Req) -> bool:
        return id(request) in self.answers

    def _record(self, request: Req, what: Any) -> None:
        self.answers.setdefault(id(request), []).append(what)


class Doubler:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.calls = fail, 0

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.fail:
            raise ValueError("injected: the model failed")
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


def plan(dims: list[int]) -> BatchPlan:
    config = model_config_from_dict(
        {
            "name": "m",
            "backend": "python",
            "max_batch_size": 8,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": dims}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": dims}],
        },
        "test",
        "m",
    )
    return batch_plan(config)


def assert_each_answered_once(sink: RecordingSink, batch: list[Req]) -> None:
    assert sorted(sink.answers) == sorted(id(r) for r in batch)
    assert all(len(got) == 1 for got in sink.answers.values()), sink.answers


def test_each_request_gets_exactly_its_own_rows() -> None:
    batch = [Req(np.full((n, 2), i, np.float32)) for i, n in enumerate((1, 3, 2))]
    sink = RecordingSink()
    session = Doubler()
    ran = execute_batch(plan([2]), session, batch, sink)  # type: ignore[arg-type]
    assert_each_answered_once(sink, batch)
    assert session.calls == 1 and sink.batches == [(3, 6)]
    assert ran == 6  # the rows of its one model call (what adaptive batching learns from)
    for i, r in enumerate(batch):
        kind, y = sink.answers[id(r)][0]
        assert kind == "ok"
        np.testing.assert_array_equal(y, np.full(r.x.shape, 2 * i, np.float32))


def test_cancelled_and_expired_are_answered_and_never_run() -> None:
    batch = [Req(np.ones((1, 2), np.float32), cancelled=True), Req(np.ones((1, 2), np.float32), expired=True)]
    sink = RecordingSink()
    session = Doubler()
    ran = execute_batch(plan([2]), session, batch, sink)  # type: ignore[arg-type]
    assert_each_answered_once(sink, batch)
    assert session.calls == 0 and sink.batches == [] and ran == 0


def test_a_batch_with_a_request_not_run_reports_no_rows() -> None:
    batch = [Req(np.ones((1, 2), np.float32), expired=True), Req(np.ones((2, 2), np.float32))]
    sink = RecordingSink()
    ran = execute_batch(plan([2]), Doubler(), batch, sink)  # type: ignore[arg-type]
    assert_each_answered_once(sink, batch)
    assert sink.batches == [(1, 2)] and ran == 0  # 2 rows ran of the 3 formed: not its cost


def test_a_model_error_fails_its_group_with_the_models_message() -> None:
    batch = [Req(np.ones((1, 2), np.float32)) for _ in range(3)]
    sink = RecordingSink()
    assert execute_batch(plan([2]), Doubler(fail=True), batch, sink) == 0  # type: ignore[arg-type]
    assert_each_answered_once(sink, batch)
    assert all(
        got[0][0] == "error" and "injected: the model failed" in got[0][1] for got in sink.answers.values()
    )


def test_a_failing_answer_fails_only_the_unanswered_rest() -> None:
    batch = [Req(np.full((1, 2), i, np.float32)) for i in range(3)]
    sink = RecordingSink(fail_answer_for=id(batch[1]))
    execute_batch(plan([2]), Doubler(), batch, sink)  # type: ignore[arg-type]
    assert_each_answered_once(sink, batch)
    kinds = [sink.answers[id(r)][0][0] for r in batch]
    assert kinds == ["ok", "error", "error"]
    assert "could not run the batch" in sink.answers[id(batch[1])][0][1]


def test_a_gather_error_fails_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("injected: gathering failed")

    monkeypatch.setattr(execute_module, "gather", broken)
    batch = [Req(np.ones((1, 2), np.float32)) for _ in range(2)]
    sink = RecordingSink()
    assert execute_batch(plan([2]), Doubler(), batch, sink) == 0  # type: ignore[arg-type]
    assert_each_answered_once(sink, batch)
    assert all("injected: gathering failed" in got[0][1] for got in sink.answers.values())


def test_requests_of_different_variable_shapes_run_as_separate_groups() -> None:
    batch = [Req(np.ones((1, w), np.float32)) for w in (3, 5, 3)]
    sink = RecordingSink()
    session = Doubler()
    ran = execute_batch(plan([-1]), session, batch, sink)  # type: ignore[arg-type]
    assert_each_answered_once(sink, batch)
    assert session.calls == 2 and sorted(sink.batches) == [(1, 1), (2, 2)] and ran == 0
    assert all(sink.answers[id(r)][0][1].shape == r.x.shape for r in batch)
