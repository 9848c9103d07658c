"""Scheduling: priority levels and per-level queue policies (size, timeout, REJECT/DELAY), requests
answered at their deadline over every protocol while the workers are busy, and queued requests
dropped when their client goes (HTTP, TCP) or cancels (gRPC).

Every test holds the one worker inside a gated Python model (gated_order_state), so what is queued
stays queued until the test opens the gate; the model records which requests ran, in order."""

import http.client
import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from lumenrt.client import HttpClient, InferenceError, TcpClient
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.request import InvalidInput, QueueFull, RequestTimeout
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.protocols import tcp as tp
from tests.integration import gated_order_state as state
from tests.integration.flow_clients import wait_for

WAIT_S = 20.0

MODEL_PY = """
from tests.integration.gated_order_state import ENTERED, GATE, ORDER


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        ENTERED.set()
        GATE.wait(30)
        x = inputs["x"]
        ORDER.extend(int(v) for v in x[:, 0])
        return {"y": x * 2}
"""


def write_model(root: Path, batching: str, max_batch_size: int = 1) -> Path:
    (root / "gated" / "1").mkdir(parents=True, exist_ok=True)
    (root / "gated" / "1" / "model.py").write_text(MODEL_PY)
    (root / "gated" / "config.yaml").write_text(
        f"backend: python\nmax_batch_size: {max_batch_size}\n"
        f"dynamic_batching:\n{batching}"
        "input:\n  - {name: x, datatype: FP32, dims: [2]}\n"
        "output:\n  - {name: y, datatype: FP32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )
    return root


LEVELS = """  priority_levels: 2
  default_priority_level: 2
  priority_queue_policy:
    1: {max_queue_size: 2}
    2: {max_queue_size: 3}
"""


def x_of(n: int) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 2), n, dtype=np.float32)}


@pytest.fixture(autouse=True)
def gate_open_after() -> Iterator[None]:
    state.ORDER.clear()
    yield
    state.GATE.set()


def marked_cancelled(rt: Any) -> int:
    """Request records the front ends have cancelled and no worker has dropped yet."""
    return sum(r.cancelled for r in rt.table.records)


def hold_worker(rt: Any) -> Any:
    """Request 0 runs and blocks in the model: every later request queues."""
    state.ENTERED.clear()
    state.GATE.clear()
    held = rt.submit(x_of(0))
    assert state.ENTERED.wait(WAIT_S)
    return held


def answered(rt: Any, req: Any) -> Any:
    assert rt.wait(req, timeout_s=WAIT_S)
    error, outputs = req.error, req.outputs
    rt.release(req)
    return error if error is not None else outputs


def test_high_priority_requests_queued_after_low_ones_run_first(tmp_path: Path) -> None:
    with Engine(write_model(tmp_path, LEVELS), models=["gated"]) as eng:
        rt = eng.runtime("gated")
        held = hold_worker(rt)
        low = [rt.submit(x_of(n)) for n in (1, 2, 3)]  # the default level: 2
        high = [rt.submit(x_of(n), priority=1) for n in (4, 5)]
        assert rt.queued() == 5
        state.GATE.set()
        for req in [held, *low, *high]:
            assert not isinstance(answered(rt, req), Exception)
        assert state.ORDER == [0, 4, 5, 1, 2, 3]
        assert rt.table.free == len(rt.table.records)


def test_each_level_has_its_own_queue_size(tmp_path: Path) -> None:
    with Engine(write_model(tmp_path, LEVELS), models=["gated"]) as eng:
        rt = eng.runtime("gated")
        held = hold_worker(rt)
        queued = [rt.submit(x_of(n), priority=2) for n in (1, 2, 3)]
        with pytest.raises(QueueFull, match="priority level 2: max_queue_size: 3"):
            rt.submit(x_of(9), priority=2)
        queued += [rt.submit(x_of(n), priority=1) for n in (4, 5)]  # level 1 still has room
        with pytest.raises(QueueFull, match="priority level 1: max_queue_size: 2"):
            rt.submit(x_of(9), priority=1)
        with pytest.raises(InvalidInput, match=r"priority must be 0 \(the default level\) \.\. 2"):
            rt.submit(x_of(9), priority=3)
        state.GATE.set()
        for req in [held, *queued]:
            answered(rt, req)
        assert 9 not in state.ORDER and rt.statistics()["rejected"] == 2


def policy_model(tmp_path: Path, policy: str) -> Path:
    return write_model(tmp_path, f"  default_queue_policy: {policy}\n")


def test_reject_answers_a_request_past_its_level_timeout_without_running_it(tmp_path: Path) -> None:
    # 1 us: long past when the worker is free again
    with Engine(policy_model(tmp_path, "{default_timeout_microseconds: 1}"), models=["gated"]) as eng:
        rt = eng.runtime("gated")
        state.ENTERED.clear()
        state.GATE.clear()
        held = rt.submit(x_of(0), timeout_s=60)  # its own timeout: allow_timeout_override
        assert state.ENTERED.wait(WAIT_S)
        late = rt.submit(x_of(1))
        state.GATE.set()
        assert not isinstance(answered(rt, held), Exception)
        assert isinstance(answered(rt, late), RequestTimeout)
        assert state.ORDER == [0] and rt.statistics()["expired"] == 1


def test_delay_runs_a_request_past_its_timeout_after_the_ones_on_time(tmp_path: Path) -> None:
    policy = "{default_timeout_microseconds: 1, timeout_action: DELAY}"
    with Engine(policy_model(tmp_path, policy), models=["gated"]) as eng:
        rt = eng.runtime("gated")
        state.ENTERED.clear()
        state.GATE.clear()
        held = rt.submit(x_of(0), timeout_s=60)
        assert state.ENTERED.wait(WAIT_S)
        late = rt.submit(x_of(1))  # the policy's 1 us: past it when a worker takes it
        on_time = [rt.submit(x_of(n), timeout_s=60) for n in (2, 3)]  # their own 60 s
        state.GATE.set()
        for req in (held, late, *on_time):
            assert not isinstance(answered(rt, req), Exception)  # not refused: it ran
        assert state.ORDER == [0, 2, 3, 1]  # put back once, behind the requests on time
        assert rt.statistics()["expired"] == 0


def test_delay_at_one_level_puts_its_late_request_behind_every_level(tmp_path: Path) -> None:
    batching = (
        "  priority_levels: 2\n  priority_queue_policy:\n"
        "    1: {default_timeout_microseconds: 1, timeout_action: DELAY}\n"
    )
    with Engine(write_model(tmp_path, batching), models=["gated"]) as eng:
        rt = eng.runtime("gated")
        held = hold_worker(rt)  # level 2 (the default): no timeout
        late = rt.submit(x_of(1), priority=1)  # level 1, past its 1 us when taken
        low = rt.submit(x_of(2), priority=2)
        state.GATE.set()
        for req in (held, late, low):
            assert not isinstance(answered(rt, req), Exception)
        assert state.ORDER == [0, 2, 1]


def test_without_timeout_override_the_level_timeout_wins(tmp_path: Path) -> None:
    batching = (
        "  priority_levels: 2\n  priority_queue_policy:\n"
        "    2: {default_timeout_microseconds: 1, allow_timeout_override: false}\n"
    )
    with Engine(write_model(tmp_path, batching), models=["gated"]) as eng:
        rt = eng.runtime("gated")
        state.ENTERED.clear()
        state.GATE.clear()
        held = rt.submit(x_of(0), priority=1)  # level 1: no timeout
        assert state.ENTERED.wait(WAIT_S)
        late = rt.submit(x_of(1), timeout_s=60, priority=2)  # ignored: level 2's 1 us holds
        state.GATE.set()
        answered(rt, held)
        assert isinstance(answered(rt, late), RequestTimeout)
        assert state.ORDER == [0]


def test_priority_levels_need_the_thread_pool(tmp_path: Path) -> None:
    write_model(tmp_path, LEVELS)
    with pytest.raises(ValueError, match="priority_levels > 1 needs the thread pool"):
        Engine(tmp_path, models=["gated"], settings=EngineConfig(worker_mode="process"))


# ---- over the wire ---------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Engine, ServerThread]]:
    eng = Engine(write_model(tmp_path, LEVELS, max_batch_size=4), models=["gated"])
    try:
        with ServerThread(eng, ServeOptions(http_port=0, grpc_port=0, tcp_port=0)) as st:
            yield eng, st
    finally:
        state.GATE.set()
        eng.close()
    rt = eng.runtime("gated")
    assert rt.table.free == len(rt.table.records), "request records leaked"


def grpc_request(n: int, **params: int) -> Any:
    req = pb.ModelInferRequest(model_name="gated")
    tensor = req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    req.raw_input_contents.append(x_of(n)["x"].tobytes())
    for key, value in params.items():
        req.parameters[key].int64_param = value
    del tensor
    return req


def test_a_bad_priority_is_refused_naming_the_parameter(served: tuple[Engine, ServerThread]) -> None:
    _, st = served
    with HttpClient("127.0.0.1", st.ports["http"]) as client:
        with pytest.raises(
            InferenceError, match=r"parameters\.priority: model 'gated' has priority levels 1\.\.2"
        ) as e:
            client.infer("gated", x_of(1), priority=7)
        assert e.value.status == 400
    with TcpClient("127.0.0.1", st.ports["tcp"]) as tcp:
        with pytest.raises(InferenceError, match="the header's priority field") as e:
            tcp.infer("gated", x_of(1), priority=7)
        assert e.value.status == 400
        assert tcp.infer("gated", x_of(1), priority=1).outputs["y"][0, 0] == 2  # the connection goes on
    with grpc.insecure_channel(f"127.0.0.1:{st.ports['grpc']}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as rpc:
            stub.ModelInfer(grpc_request(1, priority=7), timeout=WAIT_S)
        assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "parameters.priority" in str(rpc.value.details())


def hold_served(eng: Engine) -> Any:
    """Another caller's request blocks the one worker (answered when the gate opens)."""
    return hold_worker(eng.runtime("gated"))


def test_deadlines_are_answered_at_the_deadline_over_every_protocol(
    served: tuple[Engine, ServerThread],
) -> None:
    eng, st = served
    rt = eng.runtime("gated")
    held = hold_served(eng)
    # each answer arrives while the gate is still shut: at its deadline, not when a worker gets to it
    with HttpClient("127.0.0.1", st.ports["http"]) as client:
        with pytest.raises(InferenceError, match="deadline passed") as e:
            client.infer("gated", x_of(1), timeout_s=0.05)
        assert e.value.status == 504
    with TcpClient("127.0.0.1", st.ports["tcp"]) as tcp:
        with pytest.raises(InferenceError, match="deadline passed") as e:
            tcp.infer("gated", x_of(2), timeout_s=0.05)
        assert e.value.status == 504
    with grpc.insecure_channel(f"127.0.0.1:{st.ports['grpc']}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as rpc:
            stub.ModelInfer(grpc_request(3, timeout=50_000), timeout=WAIT_S)  # the server's timeout
        assert rpc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "deadline passed" in str(rpc.value.details())
    assert not state.GATE.is_set() and state.ORDER == []
    state.GATE.set()
    answered(rt, held)
    # the workers reach the three later and drop them unrun
    wait_for("the three expired requests dropped", lambda: rt.statistics()["expired"] == 3)
    assert state.ORDER == [0]


def send_http(port: int, n: int) -> socket.socket:
    """An HTTP infer request written on a raw socket (not read): the caller closes it."""
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}]}).encode()  # fmt: skip
    body = header + x_of(n)["x"].tobytes()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v2/models/gated/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(header), len(body)) + body
    )
    return sock


def send_tcp(port: int, n: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    for part in tp.encode_request(n + 1, "gated", x_of(n)):
        sock.sendall(part)
    return sock


def reset(sock: socket.socket) -> None:
    """Close the way a killed client does: at once, with a reset."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.parametrize("send", [send_http, send_tcp], ids=["http", "tcp"])
@pytest.mark.parametrize("close", [socket.socket.close, reset], ids=["close", "reset"])
def test_a_client_that_goes_has_its_queued_requests_dropped(
    served: tuple[Engine, ServerThread], send: Any, close: Any
) -> None:
    eng, st = served
    rt = eng.runtime("gated")
    held = hold_served(eng)
    port = st.ports["http" if send is send_http else "tcp"]
    sock = send(port, 1)
    wait_for("the request queued", lambda: rt.queued() == 1)
    close(sock)
    wait_for("the request cancelled", lambda: marked_cancelled(rt) == 1)
    state.GATE.set()
    answered(rt, held)
    wait_for("the cancelled request dropped", lambda: rt.statistics()["cancelled"] == 1)
    assert state.ORDER == [0]  # request 1 never ran
    with HttpClient("127.0.0.1", st.ports["http"]) as client:  # the server goes on
        assert client.infer("gated", x_of(5)).outputs["y"][0, 0] == 10


def test_a_grpc_client_that_cancels_has_its_queued_request_dropped(
    served: tuple[Engine, ServerThread],
) -> None:
    eng, st = served
    rt = eng.runtime("gated")
    held = hold_served(eng)
    with grpc.insecure_channel(f"127.0.0.1:{st.ports['grpc']}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelInfer.future(grpc_request(1), timeout=WAIT_S)
        wait_for("the request queued", lambda: rt.queued() == 1)
        call.cancel()
        wait_for("the request cancelled", lambda: marked_cancelled(rt) == 1)
    state.GATE.set()
    answered(rt, held)
    wait_for("the cancelled request dropped", lambda: rt.statistics()["cancelled"] == 1)
    assert state.ORDER == [0]


def test_http_priority_parameter_orders_the_queue(served: tuple[Engine, ServerThread]) -> None:
    """Over the wire too: a priority-1 request sent after priority-2 ones runs before them."""
    eng, st = served
    rt = eng.runtime("gated")
    held = hold_served(eng)
    conns = []
    for n, priority in ((1, 2), (2, 2), (3, 1)):
        conn = http.client.HTTPConnection("127.0.0.1", st.ports["http"], timeout=WAIT_S)
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [n, n]}], "parameters": {"priority": priority}})  # fmt: skip
        conn.request("POST", "/v2/models/gated/infer", body, {"Content-Type": "application/json"})
        conns.append(conn)
        wait_for(f"{n} requests queued", lambda k=n: rt.queued() == k)
    state.GATE.set()
    answered(rt, held)
    for conn in conns:
        assert conn.getresponse().status == 200
        conn.close()
    assert state.ORDER[0] == 0 and state.ORDER[1] == 3  # then 1 and 2, in one batch or two
    assert sorted(state.ORDER[2:]) == [1, 2]


def test_async_callers_cancelled_at_any_moment_leak_no_record() -> None:
    """Cancelled before, while or just after its answer arrives: every record comes back."""
    import asyncio

    from lumenrt.models.builtin import builtin_examples

    x = builtin_examples("digits_mlp", 1)
    with Engine(models=["digits_mlp"], settings=EngineConfig(lane="queue")) as eng:
        rt = eng.runtime("digits_mlp")

        async def main() -> int:
            answered = 0
            for i in range(300):
                task = asyncio.ensure_future(eng.infer_async("digits_mlp", x, timeout_s=0.001 * (i % 3)))
                for _ in range(i % 7):  # cancel after 0..6 loop turns: before, during or after its answer
                    await asyncio.sleep(0)
                task.cancel()
                try:
                    await task
                    answered += 1
                except (asyncio.CancelledError, RequestTimeout):
                    pass
            # let the workers' last answers come back to the loop
            for _ in range(2000):
                if rt.table.free == len(rt.table.records):
                    break
                await asyncio.sleep(0.001)
            return answered

        asyncio.run(main())
        assert rt.table.free == len(rt.table.records), "request records leaked"
