"""``drain_delay_s`` (``lumenrt serve --drain-delay-s``): once shutdown begins, readiness is false at
once but requests are still answered for the delay, then refused with 503; a second signal
(``cut_drain``) ends the delay early."""

import asyncio
import contextlib
import http.client
import json
import time

from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import ServeLimits

MODEL = "digits_mlp"
BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]})


def request(port: int, method: str, path: str, body: str | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body, {"Content-Type": "application/json"} if body else {})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def test_requests_are_served_through_the_delay_then_refused() -> None:
    # a delay well past the 0.8 s the loop below checks: a busy machine may stall a round trip
    limits = ServeLimits(drain_delay_s=3.0, grace_s=5)
    with Engine(models=[MODEL], settings=EngineConfig(thread_count=1, pin=False)) as engine:
        server = ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None, limits=limits))
        with server:
            port = server.ports["http"]
            assert request(port, "GET", "/v2/health/ready") == 200
            shutdown = asyncio.run_coroutine_threadsafe(server.app.shutdown(), server.loop)
            # the shutdown runs on the server's loop: wait until it has begun (on a busy machine a
            # request can come first, seen once)
            began = time.monotonic()
            while not server.app.service.draining and time.monotonic() - began < 5:
                time.sleep(0.001)
            assert server.app.service.draining
            started = time.monotonic()
            while server.app.service.accepting and time.monotonic() - started < 0.8:
                assert request(port, "GET", "/v2/health/ready") == 503  # the balancer's signal
                assert request(port, "POST", f"/v2/models/{MODEL}/infer", BODY) == 200  # still served
                time.sleep(0.05)
            assert time.monotonic() - started >= 0.8  # served through the delay (it lasts 3 s)
            deadline = time.monotonic() + 5
            while server.app.service.accepting and time.monotonic() < deadline:
                time.sleep(0.01)
            # refused: 503 while in-flight requests finish, or no listener once they have
            with contextlib.suppress(ConnectionRefusedError):
                assert request(port, "POST", f"/v2/models/{MODEL}/infer", BODY) == 503
            assert shutdown.result(10) is True


def test_a_second_signal_ends_the_delay() -> None:
    limits = ServeLimits(drain_delay_s=60.0, grace_s=5)
    with Engine(models=[MODEL], settings=EngineConfig(thread_count=1, pin=False)) as engine:
        server = ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None, limits=limits))
        with server:
            shutdown = asyncio.run_coroutine_threadsafe(server.app.shutdown(), server.loop)
            time.sleep(0.2)
            server.loop.call_soon_threadsafe(server.app.service.cut_drain)
            shutdown.result(10)  # well before the 60 s delay
            assert not server.app.service.accepting
