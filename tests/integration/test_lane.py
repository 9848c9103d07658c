"""The inline lane (engine/lane.py): a small model answered on the thread that received the request,
in both worker modes and through every front end; the same outputs and statistics as the worker
path; and the cases where it must hand the request to the queue instead."""

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.client import HttpClient, InferenceError, TcpClient
from lumenrt.client.http import encode_infer
from lumenrt.engine.config import ConfigError
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.request import InvalidInput
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.models.builtin import builtin_examples
from tests.integration import slow_model_state
from tests.integration.flow_clients import read_response
from tests.integration.loop_lookups import loop_lookups
from tests.integration.test_engine import write_py_model

MODEL = "digits_mlp"
WAIT_S = 20.0


def one() -> dict[str, np.ndarray]:
    return builtin_examples(MODEL, 1)


@pytest.fixture(scope="module", params=["thread", "process"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    with Engine(models=[MODEL], settings=EngineConfig(worker_mode=request.param, lane="inline")) as eng:
        yield eng


def test_inline_answers_what_the_workers_answer(engine: Engine) -> None:
    rt = engine.runtime(MODEL)
    assert rt.lane.active and rt.lane.probe_us > 0
    x = builtin_examples(MODEL, 3)
    before = rt.statistics()["requests"]
    inline = rt.run_inline(x)
    assert inline is not None
    req = rt.run(x)  # through the ring to a worker
    assert req.error is None and req.outputs is not None
    queued = req.outputs
    assert set(inline) == set(queued)
    for name in queued:
        np.testing.assert_allclose(inline[name], queued[name], rtol=1e-6)
    rt.release(req)
    stats = rt.statistics()
    assert stats["requests"] == before + 2  # counted whichever way it ran
    assert stats["lane"]["requests"] >= 1


def test_the_in_process_api_takes_the_lane_with_times_of_its_own(engine: Engine) -> None:
    rt = engine.runtime(MODEL)
    before = rt.lane.stats.requests
    first = engine.infer(MODEL, one())
    second = engine.infer(MODEL, one())
    assert rt.lane.stats.requests == before + 2
    assert first.times is not second.times and first.times is not rt.lane.times
    assert first.times.compute_end_ns > first.times.compute_start_ns > 0
    assert first.times.compute_start_ns <= second.times.compute_start_ns


def _distinct(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input": rng.random((1, 64), dtype=np.float32) * 16}


def test_front_end_requests_run_on_bound_arrays_and_the_api_keeps_arrays_of_its_own(engine: Engine) -> None:
    """lane.py invariant 5: a front end's one-row request (no ``times``) answers in the lane's
    bound arrays, the same each time and right for each input; ``Engine.infer`` gets arrays that
    a later request does not overwrite."""
    rt = engine.runtime(MODEL)
    assert rt.lane.describe()["bound"] is True  # digits_mlp's outputs are [batch, 10] and [batch]
    want = [engine.infer(MODEL, _distinct(i)).outputs for i in range(4)]
    kept = {k: v.copy() for k, v in want[0].items()}
    seen: set[int] = set()
    for i in range(4):
        got = rt.run_inline(_distinct(i))
        assert got is not None
        seen.update(id(a) for a in got.values())
        for name, value in want[i].items():
            np.testing.assert_allclose(got[name], value, rtol=1e-6)
    assert len(seen) == 2  # two outputs, the same two arrays every time
    for name, value in kept.items():  # the API's first answer is untouched by what ran after
        np.testing.assert_array_equal(want[0][name], value)
    rows = rt.run_inline(builtin_examples(MODEL, 3))  # three rows: not the bound shape
    assert rows is not None and id(rows["probabilities"]) not in seen


def test_inline_refuses_bad_input_naming_it(engine: Engine) -> None:
    rt = engine.runtime(MODEL)
    with pytest.raises(InvalidInput, match="input 'input'"):
        rt.run_inline({"input": np.zeros((1, 3), dtype=np.float32)})
    with pytest.raises(InvalidInput, match="missing input"):
        rt.run_inline({})


def test_inline_hands_over_when_requests_wait_in_the_ring(engine: Engine) -> None:
    rt = engine.runtime(MODEL)
    assert rt.lane.run(one(), queued=0) is not None
    assert rt.lane.run(one(), queued=1) is None  # a request waits in the ring: keep order


def test_queue_loads_no_lane_and_auto_decides_by_the_probe() -> None:
    with Engine(models=[MODEL], settings=EngineConfig(lane="queue")) as eng:
        rt = eng.runtime(MODEL)
        assert not rt.lane.active and rt.run_inline(one()) is None
    with Engine(models=[MODEL], settings=EngineConfig(lane="auto", lane_max_us=0)) as eng:
        rt = eng.runtime(MODEL)
        assert rt.lane.probe_us > 0 and not rt.lane.active  # no model computes in 0 us
        assert rt.statistics()["lane"]["active"] is False
    with Engine(models=[MODEL], settings=EngineConfig(lane="auto", lane_max_us=1_000_000)) as eng:
        assert eng.runtime(MODEL).lane.active
    process = EngineConfig(lane="auto", lane_max_us=1_000_000, worker_mode="process")
    with Engine(models=[MODEL], settings=process) as eng:
        # process mode keeps the model out of the server process (a native crash stays in a
        # worker): auto never runs it inline
        assert not eng.runtime(MODEL).lane.active


def test_lane_key_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"engine\.lane"):
        EngineConfig(lane="fast")
    with pytest.raises(ConfigError, match=r"engine\.lane_max_us"):
        EngineConfig(lane_max_us=-1)
    with pytest.raises(ConfigError, match=r"engine\.lane_turn_us"):
        EngineConfig(lane_turn_us=-1)


def test_a_busy_queue_sends_requests_to_the_workers(tmp_path: Path) -> None:
    """A request that finds another waiting in the ring queues behind it, and all are answered."""
    write_py_model(tmp_path, max_queue=8)
    slow_model_state.GATE.set()
    with Engine(tmp_path, models=["slow"], settings=EngineConfig(lane="inline")) as eng:
        rt = eng.runtime("slow")
        x = {"x": np.ones((1, 2), dtype=np.float32)}
        assert rt.run_inline(x) is not None  # gate open: runs here; this thread owns the lane
        slow_model_state.ENTERED.clear()
        slow_model_state.GATE.clear()
        try:
            held = rt.submit(x)  # the worker takes it and blocks in the model
            assert slow_model_state.ENTERED.wait(WAIT_S)
            waiting = rt.submit(x)  # waits in the ring
            assert len(rt.ring) == 1
            assert rt.run_inline(x) is None  # the lane does not overtake it
        finally:
            slow_model_state.GATE.set()
        for req in (held, waiting):
            assert rt.wait(req, timeout_s=WAIT_S)
            assert req.error is None
            rt.release(req)


@contextlib.contextmanager
def held_lane(tmp_path: Path) -> Iterator[tuple[Any, dict[str, np.ndarray]]]:
    """The gated Python model on an inline lane, with another thread's request blocked in it:
    yields (its runtime, an input); on leaving, the gate opens and that request is answered."""
    write_py_model(tmp_path, max_queue=8)
    with Engine(tmp_path, models=["slow"], settings=EngineConfig(lane="inline")) as eng:
        rt = eng.runtime("slow")
        x = {"x": np.ones((1, 2), dtype=np.float32)}
        slow_model_state.ENTERED.clear()
        slow_model_state.GATE.clear()
        box: list[Any] = []
        runner = threading.Thread(target=lambda: box.append(rt.run_inline(x)))
        try:
            runner.start()
            assert slow_model_state.ENTERED.wait(WAIT_S)  # the other thread holds the lane
            yield rt, x
        finally:
            slow_model_state.GATE.set()
            runner.join(WAIT_S)
        np.testing.assert_array_equal(box[0]["y"], x["x"] * 2)


def test_one_request_at_a_time_on_the_lane(tmp_path: Path) -> None:
    """While one caller's request runs on the lane (blocked in the model), another caller queues."""
    with held_lane(tmp_path) as (rt, x):
        assert rt.run_inline(x) is None
        queued = rt.submit(x)  # so this caller's request goes to the workers
        slow_model_state.GATE.set()
        assert rt.wait(queued, timeout_s=WAIT_S)
        assert queued.error is None
        rt.release(queued)


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[ServerThread]:
    with ServerThread(engine, ServeOptions(http_port=0, grpc_port=0, tcp_port=0)) as st:
        yield st


def test_front_ends_answer_on_the_lane(engine: Engine, server: ServerThread) -> None:
    import tritonclient.grpc as grpcclient

    rt = engine.runtime(MODEL)
    x = builtin_examples(MODEL, 2)
    want = engine.infer(MODEL, x).outputs
    before = rt.lane.stats.requests
    with TcpClient("127.0.0.1", server.ports["tcp"]) as tcp:
        got_tcp = tcp.infer(MODEL, x, timing=True)
    with HttpClient("127.0.0.1", server.ports["http"]) as http:
        got_http = http.infer(MODEL, x).outputs
        stats = http.get_json(f"/v2/models/{MODEL}/stats")["model_stats"][0]
        config = http.get_json(f"/v2/models/{MODEL}/config")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    try:
        inp = grpcclient.InferInput("input", list(x["input"].shape), "FP32")
        inp.set_data_from_numpy(x["input"])
        got_grpc = client.infer(MODEL, [inp])
    finally:
        client.close()
    for name, value in want.items():
        np.testing.assert_allclose(got_tcp.outputs[name], value, rtol=1e-6)
        np.testing.assert_allclose(got_http[name], value, rtol=1e-6)
        np.testing.assert_allclose(got_grpc.as_numpy(name), value, rtol=1e-6)
    assert rt.lane.stats.requests == before + 3
    assert got_tcp.timing["queue_ns"] == 0 and got_tcp.timing["compute_ns"] > 0  # never queued
    assert stats["lumenrt"]["lane"]["active"] is True
    assert config["parameters"]["lumenrt_lane"]["string_value"] == "inline"


def test_the_lane_does_not_ask_for_the_running_loop_per_request(engine: Engine, server: ServerThread) -> None:
    rt = engine.runtime(MODEL)
    x = builtin_examples(MODEL, 1)
    want = engine.infer(MODEL, x).outputs["probabilities"]
    before = rt.lane.stats.requests
    with (
        TcpClient("127.0.0.1", server.ports["tcp"]) as tcp,
        HttpClient("127.0.0.1", server.ports["http"]) as http,
    ):
        tcp.infer(MODEL, x), http.infer(MODEL, x)  # connected (an HTTP connection asks once)
        with loop_lookups() as lookups:
            for _ in range(20):
                np.testing.assert_allclose(tcp.infer(MODEL, x).outputs["probabilities"], want, rtol=1e-6)
                np.testing.assert_allclose(http.infer(MODEL, x).outputs["probabilities"], want, rtol=1e-6)
    assert rt.lane.stats.requests == before + 42  # each in a loop turn of its own
    assert lookups[0] == 0  # the turn's reset is scheduled on the kept loop (a getpid() each on 3.11)


def test_pipelined_answers_each_carry_their_own_inputs_result(engine: Engine, server: ServerThread) -> None:
    """Many one-row requests sent before any answer is read, over TCP and HTTP: those the lane
    runs answer in its reused arrays, so each answer must have been copied out before the next
    ran (lane.py invariant 5); every answer matches its own input."""
    n = 64
    want = [engine.infer(MODEL, _distinct(i)).outputs["probabilities"] for i in range(n)]
    lane_before = engine.runtime(MODEL).lane.stats.requests
    with TcpClient("127.0.0.1", server.ports["tcp"]) as tcp:
        ids = [tcp.send(MODEL, _distinct(i)) for i in range(n)]
        for i, rid in enumerate(ids):
            np.testing.assert_allclose(tcp.recv(rid).outputs["probabilities"], want[i], rtol=1e-6)
    _pipelined_answers_match(server.ports["http"], want)
    assert engine.runtime(MODEL).lane.stats.requests > lane_before  # some ran on the lane


def _pipelined(n: int) -> bytes:
    """``n`` one-row infer requests (inputs ``_distinct(i)``) in one buffer, for one write."""
    out = []
    for i in range(n):
        req = encode_infer(MODEL, _distinct(i), outputs=["probabilities"])
        head = "".join(f"{k}: {v}\r\n" for k, v in req.headers.items())
        out.append(
            f"POST {req.path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(req.body)}\r\n{head}\r\n".encode()
            + req.body
        )
    return b"".join(out)


def _pipelined_answers_match(port: int, want: list[np.ndarray]) -> None:
    """``_pipelined(len(want))`` in one write to the HTTP port; each answer is its own input's."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(_pipelined(len(want)))
        buf = bytearray()
        for expected in want:
            status, headers, answer = read_response(sock, buf)
            assert status == 200, answer[:200]
            at = int(headers["inference-header-content-length"])
            np.testing.assert_allclose(np.frombuffer(answer[at:], np.float32), expected.ravel(), rtol=1e-6)


@pytest.mark.parametrize("turn_us", [0, 60_000_000])
def test_a_turn_runs_inline_until_its_budget_then_hands_the_rest_to_the_workers(turn_us: int) -> None:
    """32 pipelined requests in one write reach the loop in one turn (engine.lane_turn_us): with
    a budget of a minute every one runs inline there; with 0, one a turn, and the second goes to
    the workers. Every answer is its own either way."""
    n = 32
    settings = EngineConfig(lane="inline", lane_turn_us=turn_us)
    with (
        Engine(models=[MODEL], settings=settings) as eng,
        ServerThread(eng, ServeOptions(http_port=0, grpc_port=None, tcp_port=None)) as st,
    ):
        want = [eng.infer(MODEL, _distinct(i)).outputs["probabilities"] for i in range(n)]
        rt = eng.runtime(MODEL)
        lane_before, all_before = rt.lane.stats.requests, rt.statistics()["requests"]
        _pipelined_answers_match(st.ports["http"], want)
        inline = rt.lane.stats.requests - lane_before
        if turn_us:
            assert inline == n
        else:
            assert 1 <= inline < n
        assert rt.statistics()["requests"] - all_before == n  # inline or not, each counted once


def test_front_ends_name_the_field_on_the_lane(server: ServerThread) -> None:
    bad = {"input": np.zeros((1, 5), dtype=np.float32)}
    with TcpClient("127.0.0.1", server.ports["tcp"]) as tcp:
        with pytest.raises(InferenceError, match="input") as err:
            tcp.infer(MODEL, bad)
        assert err.value.status == 400
        assert tcp.infer(MODEL, one()).outputs  # the connection goes on
    with HttpClient("127.0.0.1", server.ports["http"]) as http:
        with pytest.raises(InferenceError, match="input") as err:
            http.infer(MODEL, bad)
        assert err.value.status == 400


def test_auto_leaves_python_models_to_the_workers(tmp_path: Path) -> None:
    """A Python model may block (this one waits on a gate): auto never runs it on the lane."""
    write_py_model(tmp_path, max_queue=8)
    slow_model_state.GATE.clear()  # were it probed at load, the load would block here
    try:
        settings = EngineConfig(lane="auto", lane_max_us=1_000_000)
        with Engine(tmp_path, models=["slow"], settings=settings) as eng:
            rt = eng.runtime("slow")
            assert not rt.lane.active and rt.lane.probe_us == 0
    finally:
        slow_model_state.GATE.set()


def test_closing_waits_for_the_request_on_the_lane_then_turns_it_away(tmp_path: Path) -> None:
    """An unload while a request runs on the lane: that request is answered, later ones queue."""
    with held_lane(tmp_path) as (rt, x):
        closer = threading.Thread(target=rt.lane.close)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive()  # waits for the running request
        slow_model_state.GATE.set()
        closer.join(WAIT_S)
        assert not closer.is_alive()
        assert not rt.lane.active and rt.run_inline(x) is None


@pytest.mark.parametrize("lane", ["inline", "queue"])
def test_loop_spin_keeps_the_loop_polling_after_requests_then_lets_it_sleep(lane: str) -> None:
    settings = EngineConfig(lane=lane, loop_spin_us=20_000)
    x = builtin_examples(MODEL, 1)
    with (
        Engine(models=[MODEL], settings=settings) as eng,
        ServerThread(eng, ServeOptions(http_port=0, grpc_port=None, tcp_port=0)) as st,
    ):
        want = eng.infer(MODEL, x).outputs["probabilities"]
        spinner = st.app.service.spinner
        assert spinner is not None and spinner.window_ns == 20_000_000
        with (
            TcpClient("127.0.0.1", st.ports["tcp"]) as tcp,
            HttpClient("127.0.0.1", st.ports["http"]) as http,
        ):
            for _ in range(10):
                np.testing.assert_allclose(tcp.infer(MODEL, x).outputs["probabilities"], want, rtol=1e-6)
                np.testing.assert_allclose(http.infer(MODEL, x).outputs["probabilities"], want, rtol=1e-6)
        # every request opens the window; so does every answer a worker sends back (queue lane)
        assert spinner.count == (20 if lane == "inline" else 40)
        deadline = time.monotonic() + 10
        while spinner.spinning and time.monotonic() < deadline:  # 20 ms after the last request
            time.sleep(0.01)
        assert not spinner.spinning
        assert spinner.turns > 20  # it polled between the requests, not once each
        turns = spinner.turns
        time.sleep(0.1)
        assert spinner.turns == turns  # asleep while no request comes


def test_no_loop_spin_by_default(server: ServerThread) -> None:
    assert server.app.service.spinner is None
