"""Graceful shutdown of ``lumenrt serve``: SIGTERM drains in-flight requests, refuses new ones,
exits 0 and leaves no shared memory behind (thread and process mode)."""

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lumenrt.native import SHM_PREFIX, leftover_segments
from tests.e2e.conftest import start_serve

# A model that holds each request until the test creates the gate file, and tells the test it is
# holding one by creating the entered file (files: the model may run in a worker process).
GATED_MODEL = """
import os
import time
from pathlib import Path

import numpy as np


class Model:
    def load(self):
        self.dir = Path(os.environ["LUMENRT_TEST_GATE_DIR"])

    def infer(self, inputs):
        (self.dir / "entered").touch()
        deadline = time.monotonic() + 60
        while not (self.dir / "gate").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"y": inputs["x"] * 2}
"""
GATED_CONFIG = """
backend: python
max_batch_size: 4
input: [{name: x, datatype: FP32, dims: [2]}]
output: [{name: y, datatype: FP32, dims: [2]}]
"""


def _post(url: str, doc: object) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _wait_for(path: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_sigterm_drains_in_flight_and_refuses_new(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "config.yaml").write_text(GATED_CONFIG)
    (repo / "gated" / "1" / "model.py").write_text(GATED_MODEL)
    gate_dir = tmp_path / "gate"
    gate_dir.mkdir()
    monkeypatch.setenv("LUMENRT_TEST_GATE_DIR", str(gate_dir))

    server = start_serve("--repository", str(repo), "--mode", mode, "--workers", "1", "--grace-s", "60")
    base = f"http://{server.http_url}/v2"
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2]}]}
    held: list[tuple[int, dict[str, object]]] = []
    client = threading.Thread(target=lambda: held.append(_post(f"{base}/models/gated/infer", doc)))
    try:
        client.start()
        _wait_for(gate_dir / "entered")  # the request is inside the model
        # process mode shares unnamed memory with its workers: nothing is ever in /dev/shm
        assert leftover_segments(f"{SHM_PREFIX}{server.proc.pid}.") == []
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _status(f"{base}/health/ready") != 503:  # readiness turns false
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _status(f"{base}/health/live") == 200
        status, body = _post(f"{base}/models/gated/infer", doc)
        assert status == 503 and "shutting down" in str(body["error"])
        assert server.proc.poll() is None  # still draining the held request
    finally:
        (gate_dir / "gate").touch()
        client.join(60)
    assert held == [(200, held[0][1])]
    outputs = held[0][1]["outputs"]
    assert isinstance(outputs, list) and outputs[0]["data"] == [3.0, -4.0]
    assert server.stop() == 0, "\n".join(server.lines)
    assert any("stopped" in line for line in server.lines)
    assert leftover_segments(f"{SHM_PREFIX}{server.proc.pid}.") == []
