"""Triton's batching semantics: a model is batched across requests only when its config has
``dynamic_batching``; without it each request runs alone, with exactly its own rows (a model that
is not safe to batch never sees another client's rows).

Each test holds the one worker inside a gated Python model while more requests queue, then opens
the gate: with dynamic batching the queued requests form batches, without it every ``infer`` call
sees one request's rows."""

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.client import HttpClient
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from tests.integration import batch_record_state as state
from tests.integration.flow_clients import wait_for

WAIT_S = 20.0
QUEUED = 15

MODEL_PY = """
from tests.integration.batch_record_state import CALLS, ENTERED, GATE


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        ENTERED.set()
        GATE.wait(30)
        x = inputs["x"]
        CALLS.append([int(v) for v in x[:, 0]])
        return {"y": x * 2}
"""


def write_model(root: Path, batching: str) -> Path:
    (root / "recorded" / "1").mkdir(parents=True, exist_ok=True)
    (root / "recorded" / "1" / "model.py").write_text(MODEL_PY)
    (root / "recorded" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 8\n"
        f"{batching}"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )
    return root


DYNAMIC = "dynamic_batching:\n  max_queue_delay_us: 0\n"
FIXED = EngineConfig(batching="fixed")  # batches exactly as the config says (adaptive may cap them)


def rows_of(n: int, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 2), n, dtype=np.float32)}


@pytest.fixture(autouse=True)
def gate_open_after() -> Iterator[None]:
    state.CALLS.clear()
    yield
    state.GATE.set()


def hold_then_queue(rt: Any, rows: int = 1) -> list[Any]:
    """Request 0 runs and blocks in the model; QUEUED more queue behind it; then the gate opens."""
    state.ENTERED.clear()
    state.GATE.clear()
    held = [rt.submit(rows_of(0))]
    assert state.ENTERED.wait(WAIT_S)
    queued = [rt.submit(rows_of(n, rows)) for n in range(1, QUEUED + 1)]
    assert rt.queued() == QUEUED
    state.GATE.set()
    return held + queued


def answer_all(rt: Any, reqs: list[Any]) -> None:
    for req in reqs:
        assert rt.wait(req, timeout_s=WAIT_S)
        assert req.error is None, req.error
        rt.release(req)


def test_without_dynamic_batching_each_request_runs_alone(tmp_path: Path) -> None:
    with Engine(write_model(tmp_path, ""), FIXED, models=["recorded"]) as eng:
        rt = eng.runtime("recorded")
        answer_all(rt, hold_then_queue(rt))
    assert len(state.CALLS) == QUEUED + 1
    assert all(len(set(call)) == 1 for call in state.CALLS), state.CALLS
    assert sorted(call[0] for call in state.CALLS) == list(range(QUEUED + 1))


def test_without_dynamic_batching_a_request_still_runs_all_its_rows(tmp_path: Path) -> None:
    with Engine(write_model(tmp_path, ""), FIXED, models=["recorded"]) as eng:
        rt = eng.runtime("recorded")
        answer_all(rt, hold_then_queue(rt, rows=3))
    assert state.CALLS[0] == [0]
    assert state.CALLS[1:] == [[n, n, n] for n in range(1, QUEUED + 1)]


def test_with_dynamic_batching_queued_requests_share_batches(tmp_path: Path) -> None:
    with Engine(write_model(tmp_path, DYNAMIC), FIXED, models=["recorded"]) as eng:
        rt = eng.runtime("recorded")
        answer_all(rt, hold_then_queue(rt))
    assert max(len(set(call)) for call in state.CALLS) > 1, state.CALLS
    assert max(len(call) for call in state.CALLS) <= 8  # max_batch_size
    assert sorted(v for call in state.CALLS for v in call) == list(range(QUEUED + 1))


@pytest.mark.parametrize("batching", ["", DYNAMIC], ids=["no_dynamic_batching", "dynamic_batching"])
def test_concurrent_http_clients(tmp_path: Path, batching: str) -> None:
    """16 HTTP clients of one row each: only a model with dynamic batching mixes their rows, and
    the model config endpoint says which it is."""
    eng = Engine(write_model(tmp_path, batching), FIXED, models=["recorded"])
    try:
        with ServerThread(eng, ServeOptions(http_port=0, grpc_port=0, tcp_port=0)) as st:
            rt = eng.runtime("recorded")
            state.ENTERED.clear()
            state.GATE.clear()

            def call(n: int) -> np.ndarray:
                with HttpClient("127.0.0.1", st.ports["http"]) as client:
                    out: np.ndarray = client.infer("recorded", rows_of(n), timeout_s=WAIT_S).outputs["y"]
                    return out

            with ThreadPoolExecutor(QUEUED + 1) as pool:
                first = pool.submit(call, 0)
                assert state.ENTERED.wait(WAIT_S)
                rest = [pool.submit(call, n) for n in range(1, QUEUED + 1)]
                wait_for("every request queued", lambda: rt.queued() == QUEUED)
                state.GATE.set()
                for n, fut in enumerate([first, *rest]):
                    np.testing.assert_array_equal(fut.result(WAIT_S), rows_of(n)["x"] * 2)
            with urllib.request.urlopen(
                f"http://127.0.0.1:{st.ports['http']}/v2/models/recorded/config"
            ) as r:
                config = json.loads(r.read())
    finally:
        state.GATE.set()
        eng.close()
    mixed = max(len(set(call)) for call in state.CALLS)
    if batching:
        assert mixed > 1 and "dynamic_batching" in config
        assert config["parameters"]["lumenrt_batching"] == {"string_value": "dynamic"}
    else:
        assert mixed == 1 and len(state.CALLS) == QUEUED + 1
        assert "dynamic_batching" not in config
        assert config["parameters"]["lumenrt_batching"] == {"string_value": "none (each request runs alone)"}
