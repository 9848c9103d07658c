"""Rate limits in a real server (ServerThread, loopback): one body per protocol. A client over its
budget is refused (HTTP 429 with Retry-After, gRPC RESOURCE_EXHAUSTED, a TCP error frame) while
another client goes on; without keys clients are told apart by address; the refusals are counted
in the metrics. The budget refills at 1 request per 10 s, so the burst's requests and the refused
one cannot be separated by a refill however slow the machine is."""

import http.client
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from lumenrt.client import InferenceError, TcpClient
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.auth import Gate, KeySource
from lumenrt.ingress.rate_limit import Rate, RateLimits
from lumenrt.models.builtin import builtin_examples

MODEL = "digits_mlp"
BURST = 3
SLOW = Rate(0.1, BURST)  # a token every 10 s
KEYS = {name: f"{name}-key-0123456789abcdef" for name in ("alice", "bob")}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(models=[MODEL], settings=EngineConfig(thread_count=1, pin=False)) as e:
        yield e


def _serve(engine: Engine, limits: RateLimits, auth: bool) -> ServerThread:
    gate = None
    if auth:
        doc = {"keys": [{"name": n, "key": k, "groups": ["*"]} for n, k in KEYS.items()]}
        gate = Gate(KeySource(env_text=json.dumps(doc)))
    return ServerThread(
        engine, ServeOptions(http_port=0, grpc_port=0, tcp_port=0, auth=gate, rate_limits=limits)
    )


def _x() -> np.ndarray:
    return builtin_examples(MODEL, 1)["input"]


def _http(st: ServerThread, key: str | None, source: str = "127.0.0.1") -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", st.ports["http"], timeout=10, source_address=(source, 0))
    x = _x()
    body = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
            ]
        }
    )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=body, headers=headers)
        resp = conn.getresponse()
        text = resp.read().decode()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, text
    finally:
        conn.close()


def http_status(st: ServerThread, key: str) -> tuple[int, str]:
    status, headers, text = _http(st, key)
    if status == 429:
        retry_after = int(headers["retry-after"])
        assert 1 <= retry_after <= 10, retry_after  # whole seconds to the next token
    return status, text


def grpc_status(st: ServerThread, key: str) -> tuple[int, str]:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{st.ports['grpc']}")
    given = tgrpc.InferInput("input", [1, 64], "FP32")
    given.set_data_from_numpy(_x())
    try:
        client.infer(MODEL, [given], headers={"authorization": f"Bearer {key}"})
        return 200, ""
    except InferenceServerException as exc:
        assert str(exc.status()) == "StatusCode.RESOURCE_EXHAUSTED", exc
        return 429, str(exc.message())
    finally:
        client.close()


def tcp_status(st: ServerThread, key: str) -> tuple[int, str]:
    with TcpClient("127.0.0.1", st.ports["tcp"], api_key=key) as client:
        try:
            client.infer(MODEL, {"input": _x()})
        except InferenceError as exc:
            return exc.status, exc.message
    return 200, ""


SENDERS = {"http": http_status, "grpc": grpc_status, "tcp": tcp_status}


@pytest.mark.parametrize("protocol", SENDERS)
def test_a_client_over_its_budget_is_refused_and_another_is_not(engine: Engine, protocol: str) -> None:
    send = SENDERS[protocol]
    with _serve(engine, RateLimits(per_client=SLOW), auth=True) as st:
        assert [send(st, KEYS["alice"])[0] for _ in range(BURST)] == [200] * BURST
        status, message = send(st, KEYS["alice"])
        assert status == 429
        assert "client 'alice' is over its rate limit: retry after" in message
        assert KEYS["alice"] not in message
        assert send(st, KEYS["bob"])[0] == 200  # bob's bucket is his own
        assert send(st, KEYS["alice"])[0] == 429  # still refused, and refusals took no token


def test_without_keys_clients_are_told_apart_by_address(engine: Engine) -> None:
    with _serve(engine, RateLimits(per_client=SLOW), auth=False) as st:
        assert [_http(st, None)[0] for _ in range(BURST)] == [200] * BURST
        status, _, text = _http(st, None)
        assert status == 429 and "client '127.0.0.1'" in text
        assert _http(st, None, source="127.0.0.2")[0] == 200


def test_a_model_limit_and_its_refusals_in_the_metrics(engine: Engine) -> None:
    limits = RateLimits(models={MODEL: Rate(0.1, 1)})
    with _serve(engine, limits, auth=True) as st:
        assert http_status(st, KEYS["alice"])[0] == 200
        status, message = http_status(st, KEYS["alice"])
        assert status == 429 and f"the rate limit on model '{MODEL}'" in message
        conn = http.client.HTTPConnection("127.0.0.1", st.ports["http"], timeout=10)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEYS['bob']}"})
        text = conn.getresponse().read().decode()
        conn.close()
    assert f'lumenrt_rejections_total{{model="{MODEL}",reason="rate_limited",version="1"}} 1.0' in text
    assert 'lumenrt_rate_limited_total{client="alice"} 1.0' in text
    assert f'lumenrt_requests_total{{model="{MODEL}",protocol="http",status="429",version="1"}} 1.0' in text
