"""The response cache in a real server (ServerThread, port 0) over HTTP, TCP and gRPC: a repeated
request is answered from the cache with the same bytes and counted in Triton's statistics
(``cache_hit``/``cache_miss``), a changed byte misses, a model without the cache never hits, and a
server without a budget warns and caches nothing. Every body runs over every protocol, with the
inline lane and with the queue (the two ways a miss reaches the model)."""

import asyncio
import json
import logging
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc

from lumenrt.client import HttpClient, TcpClient
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import InferenceService
from lumenrt.models.builtin import builtin_examples, ensure_builtin_repository

CACHED, PLAIN = "digits_cached", "digits_plain"
PROTOCOLS = ["http", "tcp", "grpc"]
OUTPUTS = ["probabilities", "label"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two copies of the built-in digits_mlp: one enables the response cache."""
    root = tmp_path_factory.mktemp("cache_repo")
    source = ensure_builtin_repository() / "digits_mlp"
    for name in (CACHED, PLAIN):
        shutil.copytree(source, root / name)
    config = root / CACHED / "config.yaml"
    config.write_text(config.read_text() + "response_cache: {enable: true}\n")
    return root


@pytest.fixture(scope="module", params=["inline", "queue"])
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[ServerThread]:
    settings = EngineConfig(thread_count=1, lane=request.param, pin=False)
    with Engine(repository, settings) as engine:
        options = ServeOptions(http_port=0, grpc_port=0, tcp_port=0, cache_size_bytes=1 << 20)
        with ServerThread(engine, options) as st:
            yield st


def infer(st: ServerThread, protocol: str, model: str, x: np.ndarray, outputs: list[str]) -> dict[str, Any]:
    """One request over ``protocol``; the outputs by name, in the order they came back."""
    if protocol == "http":
        with HttpClient("127.0.0.1", st.ports["http"]) as hc:
            return dict(hc.infer(model, {"input": x}, outputs=outputs).outputs)
    if protocol == "tcp":
        with TcpClient("127.0.0.1", st.ports["tcp"]) as tc:
            return {k: np.array(v) for k, v in tc.infer(model, {"input": x}, outputs=outputs).outputs.items()}
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{st.ports['grpc']}")
    try:
        given = tgrpc.InferInput("input", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        asked = [tgrpc.InferRequestedOutput(name) for name in outputs]
        result = client.infer(model, [given], outputs=asked)
        names = [o.name for o in result.get_response().outputs]
        return {name: result.as_numpy(name) for name in names}
    finally:
        client.close()


def cache_stats(st: ServerThread, model: str) -> tuple[int, int]:
    """(cache_hit count, cache_miss count) from the server's statistics endpoint."""
    url = f"http://127.0.0.1:{st.ports['http']}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as resp:
        stats = json.load(resp)["model_stats"][0]["inference_stats"]
    return stats["cache_hit"]["count"], stats["cache_miss"]["count"]


def distinct_input(seed: int) -> np.ndarray:
    """A request no other test sends (the server and its cache live for the module)."""
    return np.random.default_rng(seed).random((1, 64), dtype=np.float32) * 16


def seed_of(protocol: str, salt: int) -> int:
    return PROTOCOLS.index(protocol) * 100 + salt


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_repeated_request_is_a_hit_with_the_same_bytes(server: ServerThread, protocol: str) -> None:
    x = distinct_input(seed_of(protocol, 1))
    hits, misses = cache_stats(server, CACHED)
    first = infer(server, protocol, CACHED, x, OUTPUTS)
    assert cache_stats(server, CACHED) == (hits, misses + 1)
    second = infer(server, protocol, CACHED, x, OUTPUTS)
    assert cache_stats(server, CACHED) == (hits + 1, misses + 1)
    assert list(second) == list(first) == OUTPUTS
    for name in OUTPUTS:
        assert second[name].tobytes() == first[name].tobytes()
        assert second[name].shape == first[name].shape and second[name].dtype == first[name].dtype


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_hit_answers_the_outputs_asked_in_their_order(server: ServerThread, protocol: str) -> None:
    x = distinct_input(seed_of(protocol, 2))
    full = infer(server, protocol, CACHED, x, OUTPUTS)
    hits, misses = cache_stats(server, CACHED)
    label_first = infer(server, protocol, CACHED, x, ["label", "probabilities"])  # another key
    assert cache_stats(server, CACHED) == (hits, misses + 1)
    again = infer(server, protocol, CACHED, x, ["label", "probabilities"])
    assert cache_stats(server, CACHED) == (hits + 1, misses + 1)
    assert list(again) == list(label_first) == ["label", "probabilities"]
    assert again["label"].tobytes() == full["label"].tobytes()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_changed_byte_misses(server: ServerThread, protocol: str) -> None:
    x = distinct_input(seed_of(protocol, 3))
    infer(server, protocol, CACHED, x, OUTPUTS)
    changed = x.copy()
    changed.view(np.uint8)[0, 17] ^= 0x01
    hits, misses = cache_stats(server, CACHED)
    infer(server, protocol, CACHED, changed, OUTPUTS)
    assert cache_stats(server, CACHED) == (hits, misses + 1)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_without_the_cache_never_hits(server: ServerThread, protocol: str) -> None:
    x = builtin_examples("digits_mlp", 1)["input"]
    first = infer(server, protocol, PLAIN, x, OUTPUTS)
    second = infer(server, protocol, PLAIN, x, OUTPUTS)
    assert cache_stats(server, PLAIN) == (0, 0)
    assert second["label"].tobytes() == first["label"].tobytes()


def test_without_a_budget_a_model_that_enables_the_cache_warns_and_never_hits(
    repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = EngineConfig(thread_count=1, lane="queue", pin=False)
    with Engine(repository, settings, models=[CACHED]) as engine:
        with caplog.at_level(logging.WARNING, logger="lumenrt.ingress.service"):
            st = ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None))
        with st:  # starts it
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1 and CACHED in warnings[0] and "--cache-size-bytes" in warnings[0]
            x = distinct_input(999)
            infer(st, "http", CACHED, x, OUTPUTS)
            infer(st, "http", CACHED, x, OUTPUTS)
            assert cache_stats(st, CACHED) == (0, 0)


class _Pending:
    """A caller's record for ``InferenceService.submit`` that keeps what it is answered."""

    def __init__(self, rt: Any) -> None:
        self.runtime, self.outputs, self.timing, self.received_ns = rt, list(OUTPUTS), False, 0
        self.priority, self.protocol = 0, "inprocess"
        self.engine_request: Any = None
        self.answers: list[Any] = []
        self.done = asyncio.Event()

    def answer(self, outcome: Any) -> None:
        self.answers.append([(name, np.array(a)) for name, a in outcome.outputs])
        self.done.set()

    def fail(self, error: Any) -> None:
        self.answers.append(error)
        self.done.set()


def test_submit_and_infer_called_directly_answer_a_hit_at_once(repository: Path) -> None:
    """Callers that skip ``infer_inline``: ``submit`` answers a hit before it returns (no queue),
    ``infer`` returns it; each request is looked up once."""
    settings = EngineConfig(thread_count=1, lane="queue", pin=False)
    with Engine(repository, settings, models=[CACHED]) as engine:
        service = InferenceService(engine, cache_size_bytes=1 << 20)
        rt = service.runtime(CACHED)
        x = {"input": distinct_input(1234)}

        async def scenario() -> None:
            first = _Pending(rt)
            service.submit(first, dict(x), None)
            await asyncio.wait_for(first.done.wait(), 20)
            second = _Pending(rt)
            service.submit(second, dict(x), None)
            assert second.done.is_set()  # answered inside submit
            assert len(first.answers) == len(second.answers) == 1
            for (n1, a1), (n2, a2) in zip(first.answers[0], second.answers[0], strict=True):
                assert n1 == n2 and a1.tobytes() == a2.tobytes()
            outcome = await service.infer(rt, dict(x), list(OUTPUTS))
            assert [n for n, _ in outcome.outputs] == OUTPUTS

        asyncio.run(scenario())
        stats = service.statistics(CACHED)["model_stats"][0]["inference_stats"]
        assert (stats["cache_hit"]["count"], stats["cache_miss"]["count"]) == (2, 1)
        assert stats["success"]["count"] == 3


def model_config(st: ServerThread, model: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{st.ports['http']}/v2/models/{model}/config"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)  # type: ignore[no-any-return]


def test_model_config_and_grpc_statistics_show_the_cache(server: ServerThread) -> None:
    assert model_config(server, CACHED)["response_cache"] == {"enable": True}
    assert "response_cache" not in model_config(server, PLAIN)
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    try:
        x = distinct_input(4321)
        infer(server, "grpc", CACHED, x, OUTPUTS)
        infer(server, "grpc", CACHED, x, OUTPUTS)
        stats = client.get_inference_statistics(CACHED, as_json=True)["model_stats"][0]["inference_stats"]
        assert int(stats["cache_hit"]["count"]) >= 1 and int(stats["cache_hit"]["ns"]) > 0
        assert int(stats["cache_miss"]["count"]) >= 1 and int(stats["cache_miss"]["ns"]) > 0
    finally:
        client.close()
