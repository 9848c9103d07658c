"""The real ``tritonclient.http`` against ``lumenrt serve``: every built-in model, JSON and binary."""

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from lumenrt.engine.engine import Engine
from lumenrt.models.builtin import MODEL_NAMES, builtin_examples
from lumenrt.models.int8 import INT8_MODELS
from tests.e2e.conftest import ServeProcess

BATCH = {"squeezenet": 2, "digits_mlp": 3, "tabular_xgb": 4}


@pytest.fixture(scope="module")
def client(served: ServeProcess) -> Iterator[Any]:
    c = httpclient.InferenceServerClient(served.http_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def reference() -> Iterator[Engine]:
    """The same models in process: what the server must answer."""
    with Engine(models=MODEL_NAMES) as engine:
        yield engine


def _inputs(model: str, binary: bool) -> tuple[list[Any], dict[str, np.ndarray]]:
    arrays = builtin_examples(model, BATCH[model])
    inputs = []
    for name, array in arrays.items():
        inp = httpclient.InferInput(name, list(array.shape), "FP32")
        inp.set_data_from_numpy(array, binary_data=binary)
        inputs.append(inp)
    return inputs, arrays


def test_health(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    for model in MODEL_NAMES:
        assert client.is_model_ready(model)
        assert client.is_model_ready(model, "1")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata_lists_extensions(client: Any) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "lumenrt"
    for ext in ("binary_tensor_data", "statistics", "model_repository", "model_configuration"):
        assert ext in meta["extensions"]


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_model_metadata_has_batch_dimension(client: Any, reference: Engine, model: str) -> None:
    meta = client.get_model_metadata(model)
    cfg = reference.runtime(model).config
    assert meta["name"] == model and meta["versions"] == ["1"]
    assert [i["name"] for i in meta["inputs"]] == [s.name for s in cfg.inputs]
    for entry, spec in zip(meta["inputs"], cfg.inputs, strict=True):
        assert entry["shape"] == [-1, *spec.dims]
        assert entry["datatype"] == spec.datatype
    assert client.get_model_metadata(model, "1") == meta


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_model_config_is_triton_shaped(client: Any, reference: Engine, model: str) -> None:
    config = client.get_model_config(model)
    cfg = reference.runtime(model).config
    assert config["name"] == model
    assert config["max_batch_size"] == cfg.max_batch_size
    assert [i["name"] for i in config["input"]] == [s.name for s in cfg.inputs]
    assert all(
        i["data_type"] == f"TYPE_{s.datatype}" for i, s in zip(config["input"], cfg.inputs, strict=True)
    )
    assert [o["name"] for o in config["output"]] == [s.name for s in cfg.outputs]
    assert "dynamic_batching" in config
    assert config["instance_group"][0]["count"] >= 1


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_infer_matches_the_engine(client: Any, reference: Engine, model: str, binary: bool) -> None:
    inputs, arrays = _inputs(model, binary)
    outputs = [
        httpclient.InferRequestedOutput(s.name, binary_data=binary)
        for s in reference.runtime(model).config.outputs
    ]
    result = client.infer(model, inputs, outputs=outputs)
    expected = reference.infer(model, arrays).outputs
    assert result.get_response()["model_name"] == model
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_requested_outputs_only(client: Any, reference: Engine) -> None:
    inputs, arrays = _inputs("digits_mlp", True)
    result = client.infer(
        "digits_mlp", inputs, outputs=[httpclient.InferRequestedOutput("label", binary_data=False)]
    )
    assert [o["name"] for o in result.get_response()["outputs"]] == ["label"]
    assert result.as_numpy("probabilities") is None
    np.testing.assert_array_equal(
        result.as_numpy("label"), reference.infer("digits_mlp", arrays).outputs["label"]
    )


def test_default_outputs_are_all_outputs_in_binary(client: Any) -> None:
    inputs, _ = _inputs("digits_mlp", True)
    result = client.infer("digits_mlp", inputs)  # no outputs listed: tritonclient asks for binary
    names = {o["name"] for o in result.get_response()["outputs"]}
    assert names == {"probabilities", "label"}
    assert result.as_numpy("probabilities").shape == (BATCH["digits_mlp"], 10)


def test_timing_parameters_when_asked(client: Any) -> None:
    inputs, _ = _inputs("tabular_xgb", True)
    result = client.infer("tabular_xgb", inputs, parameters={"lumenrt_timing": True})
    params = result.get_response()["parameters"]
    assert params["lumenrt_batch_size"] >= BATCH["tabular_xgb"]
    assert params["lumenrt_compute_ns"] > 0
    assert params["lumenrt_engine_ns"] >= params["lumenrt_compute_ns"]


def test_unknown_model_is_404_naming_it(client: Any) -> None:
    inputs, _ = _inputs("digits_mlp", True)
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as info:
        client.infer("nope", inputs)
    assert info.value.status() == "404"


def test_wrong_datatype_names_the_input(client: Any) -> None:
    inp = httpclient.InferInput("input", [1, 64], "FP64")
    inp.set_data_from_numpy(np.zeros((1, 64), np.float64))
    with pytest.raises(InferenceServerException, match="input 'input': datatype FP64") as info:
        client.infer("digits_mlp", [inp])
    assert info.value.status() == "400"


def test_wrong_shape_and_batch_over_max_are_400(client: Any) -> None:
    inp = httpclient.InferInput("input", [1, 63], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 63), np.float32))
    with pytest.raises(InferenceServerException, match="shape"):
        client.infer("digits_mlp", [inp])
    inp = httpclient.InferInput("data", [9, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(np.zeros((9, 3, 224, 224), np.float32))
    with pytest.raises(InferenceServerException, match="max_batch_size 8"):
        client.infer("squeezenet", [inp])


def test_unknown_input_and_output_are_named(client: Any) -> None:
    inp = httpclient.InferInput("pixels", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
    with pytest.raises(InferenceServerException, match="unknown input 'pixels'"):
        client.infer("digits_mlp", [inp])
    inputs, _ = _inputs("digits_mlp", True)
    with pytest.raises(InferenceServerException, match="unknown output 'logits'"):
        client.infer("digits_mlp", inputs, outputs=[httpclient.InferRequestedOutput("logits")])


def test_statistics_count_requests(client: Any) -> None:
    before = client.get_inference_statistics("tabular_xgb")["model_stats"][0]
    inputs, _ = _inputs("tabular_xgb", True)
    for _ in range(3):
        client.infer("tabular_xgb", inputs)
    after = client.get_inference_statistics("tabular_xgb")["model_stats"][0]
    assert after["name"] == "tabular_xgb" and after["version"] == "1"
    success = after["inference_stats"]["success"]
    assert success["count"] == before["inference_stats"]["success"]["count"] + 3
    assert success["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["inference_count"] >= before["inference_count"] + 3 * BATCH["tabular_xgb"] - 12
    every = client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in every} == set(MODEL_NAMES)


def test_repository_unload_and_load(client: Any) -> None:
    index = {m["name"]: m for m in client.get_model_repository_index()}
    # the built-in repository lists the INT8 variants too, unloaded, once anything has built them
    assert set(MODEL_NAMES) <= set(index) <= set(MODEL_NAMES) | set(INT8_MODELS)
    assert index["tabular_xgb"]["state"] == "READY"
    assert all(index[name]["state"] == "UNAVAILABLE" for name in set(index) - set(MODEL_NAMES))
    client.unload_model("tabular_xgb")
    try:
        assert not client.is_model_ready("tabular_xgb")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["tabular_xgb"]["state"] == "UNAVAILABLE"
        inputs, _ = _inputs("tabular_xgb", True)
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer("tabular_xgb", inputs)
    finally:
        client.load_model("tabular_xgb")
    assert client.is_model_ready("tabular_xgb")
    with pytest.raises(InferenceServerException, match="no_such_model"):
        client.load_model("no_such_model")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_and_several_inputs_and_outputs(served_text: ServeProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(served_text.http_url)
    try:
        text = np.array([[b"abc", b"hello world"], [b"", "caf\u00e9".encode()]], dtype=object)
        scale = np.arange(6, dtype=np.float32).reshape(2, 3)
        a = httpclient.InferInput("text", [2, 2], "BYTES")
        a.set_data_from_numpy(text, binary_data=binary)
        b = httpclient.InferInput("scale", [2, 3], "FP32")
        b.set_data_from_numpy(scale, binary_data=binary)
        outputs = [
            httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("upper", "length", "scaled")
        ]
        result = client.infer("text", [a, b], outputs=outputs)
        upper = result.as_numpy("upper")
        as_bytes = [[x if isinstance(x, bytes) else x.encode() for x in row] for row in upper]  # JSON: str
        assert as_bytes == [[b"ABC", b"HELLO WORLD"], [b"", "CAF\u00e9".encode()]]  # bytes.upper: ASCII only
        np.testing.assert_array_equal(result.as_numpy("length"), [[3, 11], [0, 5]])
        np.testing.assert_array_equal(result.as_numpy("scaled"), scale * 2)
    finally:
        client.close()
