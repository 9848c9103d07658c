"""``lumenrt serve --api-keys`` as a real process: tritonclient, lumenrt's clients and perf_analyzer
(its ``-H`` header) get in with a key and not without; SIGHUP reloads the keys; the key's text
appears nowhere in what the server prints."""

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from lumenrt.client import HttpClient, InferenceError, TcpClient
from lumenrt.models.builtin import builtin_examples
from tests.benchmark_modules import import_benchmark_module
from tests.e2e.conftest import ServeProcess, start_serve

MODEL = "digits_mlp"
APP_KEY = "e2e-app-key-0123456789abcdef"
NEW_KEY = "e2e-new-key-0123456789abcdef"

perf_analyzer = import_benchmark_module("perf_analyzer")  # benchmarks/perf_analyzer.py
PROBLEM = perf_analyzer.perf_analyzer_problem()


def write_keys(path: Path, **keys: str) -> None:
    path.write_text(json.dumps({"keys": [{"name": n, "key": k, "groups": ["*"]} for n, k in keys.items()]}))
    path.chmod(0o600)


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    write_keys(path, app=APP_KEY)
    return path


@pytest.fixture(scope="module")
def secured(keys_file: Path) -> Iterator[ServeProcess]:
    env = {k: v for k, v in os.environ.items() if k != "LUMENRT_API_KEYS"}
    server = start_serve("--models", MODEL, "--api-keys", str(keys_file), env=env)
    yield server
    assert server.stop() == 0, "\n".join(server.lines)
    printed = "\n".join(server.lines)
    assert APP_KEY not in printed and NEW_KEY not in printed


def _x() -> np.ndarray:
    return builtin_examples(MODEL, 1)["input"]


def _tritonclient_status(server: ServeProcess, key: str | None) -> int:
    client = thttp.InferenceServerClient(server.http_url)
    given = thttp.InferInput("input", [1, 64], "FP32")
    given.set_data_from_numpy(_x())
    try:
        client.infer(MODEL, [given], headers=None if key is None else {"Authorization": f"Bearer {key}"})
        return 200
    except InferenceServerException as exc:
        return int(str(exc.status()))
    finally:
        client.close()


def test_clients_get_in_with_the_key_and_not_without(secured: ServeProcess) -> None:
    assert _tritonclient_status(secured, APP_KEY) == 200
    assert _tritonclient_status(secured, None) == 401
    with HttpClient("127.0.0.1", secured.ports["http"], api_key=APP_KEY) as hc:
        assert hc.infer(MODEL, {"input": _x()}).outputs
        assert hc.ready()  # health stays open
    with TcpClient("127.0.0.1", secured.ports["tcp"], api_key=APP_KEY) as tc:
        assert tc.infer(MODEL, {"input": _x()}).outputs
    with TcpClient("127.0.0.1", secured.ports["tcp"]) as tc, pytest.raises(InferenceError) as refused:
        tc.infer(MODEL, {"input": _x()})
    assert refused.value.status == 401


@pytest.mark.skipif(PROBLEM is not None, reason=f"perf_analyzer cannot run here: {PROBLEM}")
def test_perf_analyzer_sends_the_key_as_a_header(secured: ServeProcess) -> None:
    result = perf_analyzer.run_perf_analyzer(
        MODEL,
        secured.http_url,
        "http",
        concurrency=1,
        measurement_ms=500,
        extra_args=["-H", f"Authorization: Bearer {APP_KEY}"],
        stability_percentage=100,
        max_trials=10,  # 3 windows within 2x, of up to 10: CI stalls now and then
    )
    assert result["throughput_infer_per_s"] > 0
    with pytest.raises(RuntimeError):  # without the header every request is refused
        perf_analyzer.run_perf_analyzer(MODEL, secured.http_url, "http", measurement_ms=500, max_trials=1)


def test_sighup_reloads_the_keys(secured: ServeProcess, keys_file: Path) -> None:
    write_keys(keys_file, new=NEW_KEY)
    secured.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while not any("SIGHUP: reloaded api keys" in line for line in secured.lines):
        assert time.monotonic() < deadline, "\n".join(secured.lines)
        time.sleep(0.05)
    assert _tritonclient_status(secured, NEW_KEY) == 200
    assert _tritonclient_status(secured, APP_KEY) == 401
    write_keys(keys_file, app=APP_KEY)
    secured.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while _tritonclient_status(secured, APP_KEY) != 200:
        assert time.monotonic() < deadline, "\n".join(secured.lines)
        time.sleep(0.05)
