"""Warm-up runs before a model reports ready (issue 38), in both worker modes: a Python model whose
warm-up blocks on a signal file is not ready (``Engine.ready``, HTTP ``/v2/models/<m>/ready``) while
the warm-up is held, is ready once it is released, and its log shows every warm-up run (zeros)
before any real request. In process mode a replacement worker warms up too before the model is
ready again, and a request that waited for it runs after its warm-up.

The model and the test share files, not memory (process mode runs the model in other processes):
the model writes one line per ``infer`` call to ``calls.log`` and, for a warm-up call (all-zero
inputs), creates ``entered-<pid>`` and waits while ``hold`` exists."""

import http.client
import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from lumenrt.engine.engine import Engine, EngineConfig, InferResult
from lumenrt.ingress.app import ServeOptions, ServerThread
from tests.integration.flow_clients import WAIT_S, wait_for

WARMUP_RUNS = 2

MODEL_PY = """
import os
import time
from pathlib import Path

SIGNALS = Path({signals!r})


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        x = inputs["x"]
        warmup = not x.any()  # the engine warms up on zeros; the tests never send all-zero rows
        with open(SIGNALS / "calls.log", "a") as log:
            log.write(f"{{os.getpid()}} {{'warmup' if warmup else int(x[0, 0])}}\\n")
        if warmup:
            (SIGNALS / f"entered-{{os.getpid()}}").touch()
            deadline = time.monotonic() + 120
            while (SIGNALS / "hold").exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        return {{"y": x * 2}}
"""


def write_model(root: Path, signals: Path) -> None:
    (root / "warm" / "1").mkdir(parents=True)
    (root / "warm" / "1" / "model.py").write_text(MODEL_PY.format(signals=str(signals)))
    (root / "warm" / "config.yaml").write_text(
        f"backend: python\nmax_batch_size: 1\nwarmup: {WARMUP_RUNS}\n"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\noutput:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )


def calls(signals: Path) -> list[tuple[int, str]]:
    """(pid, 'warmup' or the request's first value) per infer call, in order."""
    log = signals / "calls.log"
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        pid, what = line.split()
        out.append((int(pid), what))
    return out


def http_status(port: int, method: str, path: str, body: str | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def model_ready_http(port: int) -> bool:
    status = http_status(port, "GET", "/v2/models/warm/ready")
    assert status in (200, 503), status
    return status == 200


def infer_http(port: int, value: int) -> float:
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [value, value]}]}
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request("POST", "/v2/models/warm/infer", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = json.loads(response.read())
        assert response.status == 200, payload
        return float(payload["outputs"][0]["data"][0])
    finally:
        conn.close()


@pytest.fixture
def signals(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "signals"
    folder.mkdir()
    yield folder
    (folder / "hold").unlink(missing_ok=True)  # never leave a worker waiting


@pytest.fixture(params=["thread", "process"])
def served(
    request: pytest.FixtureRequest, tmp_path: Path, signals: Path
) -> Iterator[tuple[Engine, ServerThread]]:
    """A server whose engine has nothing loaded yet: the test loads ``warm`` over HTTP."""
    repo = tmp_path / "repo"
    write_model(repo, signals)
    eng = Engine(repo, EngineConfig(worker_mode=request.param), models=[])
    try:
        with ServerThread(eng, ServeOptions(http_port=0, grpc_port=0, tcp_port=0)) as st:
            yield eng, st
    finally:
        (signals / "hold").unlink(missing_ok=True)
        eng.close()


def test_a_model_loading_is_not_ready_until_its_warmup_has_run(
    served: tuple[Engine, ServerThread], signals: Path
) -> None:
    eng, st = served
    port = st.ports["http"]
    (signals / "hold").touch()
    loaded: list[int] = []
    loader = threading.Thread(
        target=lambda: loaded.append(http_status(port, "POST", "/v2/repository/models/warm/load", "{}"))
    )
    loader.start()
    try:
        entered = wait_for("the warm-up began", lambda: sorted(signals.glob("entered-*")))
        # the warm-up is held: the model is not ready, over HTTP and in process, nor is the
        # runtime being loaded (the engine knows it by its id from before its workers start)
        (loading,) = [rt for rt in eng._by_id.values() if rt.config.name == "warm"]
        assert not loading.ready
        assert loading.statistics()["workers_ready"] == 0
        assert not model_ready_http(port)
        assert not eng.ready("warm")
        assert calls(signals) and all(what == "warmup" for _, what in calls(signals))
    finally:
        (signals / "hold").unlink()
        loader.join(WAIT_S)
    assert loaded == [200]
    assert model_ready_http(port) and eng.ready("warm") and eng.runtime("warm") is loading
    assert infer_http(port, 3) == 6.0
    # every warm-up run came before the first real request, in the worker that serves it
    log = calls(signals)
    assert [what for _, what in log] == ["warmup"] * WARMUP_RUNS + ["3"], log
    assert len({pid for pid, _ in log}) == 1 and len(entered) == 1
    if eng.runtime("warm").options.worker_mode == "process":
        assert entered[0].name == f"entered-{log[0][0]}" != f"entered-{os.getpid()}"


def test_a_replacement_worker_warms_up_before_the_model_is_ready_again(tmp_path: Path, signals: Path) -> None:
    """Process mode: the killed worker's replacement holds in its warm-up; the model is not ready
    meanwhile, and a request sent then runs after the replacement's warm-up, in it."""
    repo = tmp_path / "repo"
    write_model(repo, signals)
    with Engine(repo, EngineConfig(worker_mode="process"), models=["warm"]) as eng:
        rt = eng.runtime("warm")
        assert eng.ready("warm")
        (old_pid,) = rt.statistics()["pids"]
        assert [what for pid, what in calls(signals)] == ["warmup"] * WARMUP_RUNS
        (signals / "hold").touch()
        os.kill(old_pid, signal.SIGKILL)
        new_entered = wait_for(
            "the replacement's warm-up began",
            lambda: [p for p in signals.glob("entered-*") if p.name != f"entered-{old_pid}"],
        )
        new_pid = int(new_entered[0].name.split("-")[1])
        answers: list[InferResult] = []
        try:
            assert not eng.ready("warm")
            assert rt.statistics()["workers_ready"] == 0
            caller = threading.Thread(
                target=lambda: answers.append(eng.infer("warm", {"x": np.full((1, 2), 7, np.float32)}))
            )
            caller.start()
            wait_for("the request queued", lambda: rt.queued() == 1)
            assert not eng.ready("warm")  # still warming up: the request waits for it
        finally:
            (signals / "hold").unlink()
        caller.join(WAIT_S)
        assert len(answers) == 1
        np.testing.assert_array_equal(answers[0].outputs["y"], np.full((1, 2), 14, np.float32))
        wait_for("ready again", lambda: eng.ready("warm"))
        assert rt.statistics()["pids"] == [new_pid]
        replacement = [what for pid, what in calls(signals) if pid == new_pid]
        assert replacement == ["warmup"] * WARMUP_RUNS + ["7"], calls(signals)
