"""``lumenrt.client.HttpClient`` and ``AsyncHttpClient`` against the KServe V2 HTTP front end
(ServerThread, port 0): binary tensors and the JSON fallback give what ``engine.infer`` gives,
errors become InferenceError, timing comes back when asked, many async requests at once."""

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from lumenrt.client import AsyncHttpClient, HttpClient, InferenceError
from lumenrt.engine.engine import Engine
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.models.builtin import builtin_examples

MODELS = ["digits_mlp", "tabular_xgb"]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(models=MODELS) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[ServerThread]:
    with ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None)) as st:
        yield st


@pytest.fixture
def client(server: ServerThread) -> Iterator[HttpClient]:
    with HttpClient("127.0.0.1", server.ports["http"]) as c:
        yield c


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
        assert got[name].shape == want[name].shape


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("binary", [True, False])
def test_results_equal_engine_infer(client: HttpClient, engine: Engine, model: str, binary: bool) -> None:
    inputs = builtin_examples(model, 3)
    result = client.infer(model, inputs, binary=binary)
    assert (result.model, result.version) == (model, "1")
    assert_close(result.outputs, engine.infer(model, inputs).outputs)


@pytest.mark.parametrize("binary", [True, False])
def test_chosen_outputs_only(client: HttpClient, engine: Engine, binary: bool) -> None:
    inputs = builtin_examples("digits_mlp", 2)
    result = client.infer("digits_mlp", inputs, outputs=["label"], version=1, binary=binary)
    assert list(result.outputs) == ["label"]
    np.testing.assert_array_equal(
        result.outputs["label"], engine.infer("digits_mlp", inputs).outputs["label"]
    )


def test_timing_comes_back_when_asked(client: HttpClient) -> None:
    inputs = builtin_examples("digits_mlp", 1)
    timed = client.infer("digits_mlp", inputs, timing=True, timeout_s=5)
    assert timed.timing["compute_ns"] > 0 and timed.timing["batch_size"] >= 1
    assert client.infer("digits_mlp", inputs).timing == {}


@pytest.mark.parametrize(
    ("model", "inputs", "status", "expected"),
    [
        ("nope", {"input": np.zeros((1, 64), np.float32)}, 404, "nope"),
        ("digits_mlp", {"input": np.zeros((1, 64), np.float64)}, 400, "FP64"),
        ("digits_mlp", {"input": np.zeros((1, 63), np.float32)}, 400, "[1, 63]"),
    ],
)
def test_errors_raise_inference_error(
    client: HttpClient, model: str, inputs: dict[str, np.ndarray], status: int, expected: str
) -> None:
    with pytest.raises(InferenceError) as info:
        client.infer(model, inputs)
    assert info.value.status == status and expected in info.value.message
    assert client.live() and client.ready()


def test_metadata(client: HttpClient) -> None:
    meta = client.model_metadata("digits_mlp")
    assert meta["name"] == "digits_mlp"
    assert meta["inputs"][0]["name"] == "input"
    with pytest.raises(InferenceError) as info:
        client.model_metadata("nope")
    assert info.value.status == 404


def test_async_client_many_requests_at_once(server: ServerThread, engine: Engine) -> None:
    x = builtin_examples("digits_mlp", 16)["input"]
    want = engine.infer("digits_mlp", {"input": x}).outputs["label"]

    async def run() -> list[np.ndarray]:
        async with AsyncHttpClient("127.0.0.1", server.ports["http"], max_connections=4) as c:
            results = await asyncio.gather(
                *(
                    c.infer("digits_mlp", {"input": x[i % 16 : i % 16 + 1]}, binary=i % 2 == 0)
                    for i in range(40)
                )
            )
            with pytest.raises(InferenceError) as info:
                await c.infer("nope", {"input": x[:1]})
            assert info.value.status == 404
            assert (await c.get_json("/v2/models/digits_mlp"))["name"] == "digits_mlp"
            return [r.outputs["label"] for r in results]

    for i, label in enumerate(asyncio.run(run())):
        np.testing.assert_array_equal(label, want[i % 16 : i % 16 + 1])
