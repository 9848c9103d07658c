"""The gRPC front end through the real tritonclient.grpc: health, metadata, config, inference (raw and
typed contents, BYTES), errors and their status codes, statistics, the model repository, and the
.proto's wire numbers checked against tritonclient's own descriptors. Every test runs against both
gRPC servers: lumenrt's own HTTP/2 server (``h2``, the default) and grpc.aio (``grpcio``)."""

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from lumenrt.engine.engine import Engine
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.service import ServeLimits
from lumenrt.protocols.proto import grpc_service_pb2 as pb
from tests.integration import slow_model_state

MODELS = ["squeezenet", "digits_mlp", "tabular_xgb"]


@pytest.fixture(scope="module", params=["h2", "grpcio"])
def grpc_kind(request: pytest.FixtureRequest) -> str:
    """Which gRPC server (ServeOptions.grpc_server)."""
    return str(request.param)


def options(grpc_kind: str, **kwargs: Any) -> ServeOptions:
    return ServeOptions(http_port=None, grpc_port=0, tcp_port=None, grpc_server=grpc_kind, **kwargs)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = Engine(models=MODELS)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine: Engine, grpc_kind: str) -> Iterator[ServerThread]:
    with ServerThread(engine, options(grpc_kind)) as st:
        yield st


@pytest.fixture
def client(server: ServerThread) -> Iterator[tgrpc.InferenceServerClient]:
    c = tgrpc.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    yield c
    c.close()


@pytest.fixture
def stub(server: ServerThread) -> Iterator[Any]:
    """tritonclient's own generated stub, for requests its high-level client will not build."""
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def digits_input(x: np.ndarray, name: str = "input", datatype: str = "FP32") -> tgrpc.InferInput:
    inp = tgrpc.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    return inp


def grpc_error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def rng_rows(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, cols), dtype=np.float32)


# ---- wire compatibility ---------------------------------------------------------------------------


def _theirs(full_name: str) -> str:
    return "inference." + full_name.removeprefix("lumenrt.inference.")


def _messages(descriptors: Any) -> Iterator[Any]:
    for d in descriptors:
        yield d
        yield from _messages(d.nested_types)


def test_proto_numbers_and_types_match_tritonclients() -> None:
    pool = service_pb2.DESCRIPTOR.pool
    assert model_config_pb2.DESCRIPTOR.pool is pool
    checked = 0
    for ours in _messages(pb.DESCRIPTOR.message_types_by_name.values()):
        theirs = pool.FindMessageTypeByName(_theirs(ours.full_name))
        for field in ours.fields:
            other = theirs.fields_by_name.get(field.name)
            assert other is not None, f"{ours.full_name}.{field.name} is not in Triton's {theirs.full_name}"
            where = f"{ours.full_name}.{field.name}"
            assert (field.number, field.type, field.is_repeated) == (
                other.number,
                other.type,
                other.is_repeated,
            ), where
            if field.message_type is not None:
                assert _theirs(field.message_type.full_name) == other.message_type.full_name, where
            if field.enum_type is not None:
                assert _theirs(field.enum_type.full_name) == other.enum_type.full_name, where
                values = {v.name: v.number for v in other.enum_type.values}
                assert {v.name: v.number for v in field.enum_type.values}.items() <= values.items(), where
            checked += 1
    assert checked > 100
    theirs_service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        other = theirs_service.methods_by_name[method.name]
        assert _theirs(method.input_type.full_name) == other.input_type.full_name
        assert _theirs(method.output_type.full_name) == other.output_type.full_name


# ---- health and metadata --------------------------------------------------------------------------


def test_live_ready_and_model_ready(client: tgrpc.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    for name in MODELS:
        assert client.is_model_ready(name)
        assert client.is_model_ready(name, "1")
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("digits_mlp", "7")


def test_model_ready_with_a_malformed_version_is_invalid_argument(
    client: tgrpc.InferenceServerClient,
) -> None:
    err = grpc_error(lambda: client.is_model_ready("digits_mlp", "latest"))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "version" in err.message()


def test_server_metadata_lists_the_extensions(client: tgrpc.InferenceServerClient) -> None:
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "lumenrt"
    assert meta["version"]
    assert {"binary_tensor_data", "statistics", "model_repository", "model_configuration"} <= set(
        meta["extensions"]
    )


def test_model_metadata_has_a_variable_batch_dimension(client: tgrpc.InferenceServerClient) -> None:
    meta = client.get_model_metadata("digits_mlp", as_json=True)
    assert meta["name"] == "digits_mlp"
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "64"]}]
    outputs = {o["name"]: o for o in meta["outputs"]}
    assert outputs["probabilities"] == {"name": "probabilities", "datatype": "FP32", "shape": ["-1", "10"]}
    assert outputs["label"] == {"name": "label", "datatype": "INT64", "shape": ["-1"]}


def test_model_metadata_of_an_unknown_model_is_not_found(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.get_model_metadata("no_such_model"))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in err.message()


def test_model_config_is_triton_shaped(client: tgrpc.InferenceServerClient, engine: Engine) -> None:
    config = client.get_model_config("squeezenet", as_json=True)["config"]
    assert config["name"] == "squeezenet"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 8
    assert config["input"] == [
        {"name": "data", "data_type": "TYPE_FP32", "dims": ["3", "224", "224"]}
    ]  # FORMAT_NONE is the default: not printed
    assert config["output"] == [{"name": "prob", "data_type": "TYPE_FP32", "dims": ["1000"]}]
    (group,) = config["instance_group"]
    assert group["kind"] == "KIND_CPU"
    assert group["count"] >= 1
    cfg = engine.runtime("squeezenet").config
    assert cfg.dynamic_batching is not None
    batching = config["dynamic_batching"]
    assert batching.get("preferred_batch_size", []) == list(cfg.dynamic_batching.preferred_batch_size)
    assert int(batching.get("max_queue_delay_microseconds", 0)) == cfg.dynamic_batching.max_queue_delay_us
    assert batching["default_queue_policy"]["max_queue_size"] == cfg.dynamic_batching.max_queue_size
    assert "latest" in config["version_policy"]


def test_model_config_of_a_scalar_output(client: tgrpc.InferenceServerClient) -> None:
    config = client.get_model_config("tabular_xgb").config
    assert config.max_batch_size == 64
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("input", model_config_pb2.TYPE_FP32, [30])
    ]
    assert [(o.name, list(o.dims)) for o in config.output] == [("probability", [])]


# ---- inference ------------------------------------------------------------------------------------


def test_infer_returns_every_output_as_the_engine_does(
    client: tgrpc.InferenceServerClient, engine: Engine
) -> None:
    x = rng_rows(5, 64)
    result = client.infer("digits_mlp", [digits_input(x)], request_id="req-7")
    expected = engine.infer("digits_mlp", {"input": x}).outputs
    response = result.get_response()
    assert response.model_name == "digits_mlp"
    assert response.model_version == "1"
    assert response.id == "req-7"
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("probabilities", "FP32", [5, 10]),
        ("label", "INT64", [5]),
    ]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-6)
    np.testing.assert_array_equal(result.as_numpy("label"), expected["label"])


def test_infer_of_every_builtin_model_equals_the_engine(
    client: tgrpc.InferenceServerClient, engine: Engine
) -> None:
    images = np.random.default_rng(1).random((2, 3, 224, 224), dtype=np.float32)
    result = client.infer("squeezenet", [digits_input(images, "data")])
    expected = engine.infer("squeezenet", {"data": images}).outputs["prob"]
    np.testing.assert_allclose(result.as_numpy("prob"), expected, rtol=1e-5, atol=1e-7)
    rows = rng_rows(3, 30, seed=2)
    result = client.infer("tabular_xgb", [digits_input(rows)])
    expected = engine.infer("tabular_xgb", {"input": rows}).outputs["probability"]
    assert result.as_numpy("probability").shape == (3,)
    np.testing.assert_allclose(result.as_numpy("probability"), expected, rtol=1e-6)


def test_requested_outputs_are_the_only_ones_returned(client: tgrpc.InferenceServerClient) -> None:
    x = rng_rows(2, 64)
    result = client.infer("digits_mlp", [digits_input(x)], outputs=[tgrpc.InferRequestedOutput("label")])
    assert [o.name for o in result.get_response().outputs] == ["label"]
    assert result.as_numpy("probabilities") is None
    assert result.as_numpy("label").shape == (2,)


def test_timing_parameter_adds_stage_times(client: tgrpc.InferenceServerClient) -> None:
    result = client.infer("digits_mlp", [digits_input(rng_rows(1, 64))], parameters={"lumenrt_timing": True})
    params = result.get_response().parameters
    assert params["lumenrt_batch_size"].int64_param >= 1
    assert params["lumenrt_compute_ns"].int64_param > 0
    assert params["lumenrt_engine_ns"].int64_param >= params["lumenrt_compute_ns"].int64_param
    plain = client.infer("digits_mlp", [digits_input(rng_rows(1, 64))])
    assert not plain.get_response().parameters


def typed_request(model: str, name: str, datatype: str, shape: list[int]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = name, datatype
    tensor.shape.extend(shape)
    return request


def test_typed_contents_infer_like_raw_contents(stub: Any, engine: Engine) -> None:
    x = rng_rows(2, 64, seed=3)
    request = typed_request("digits_mlp", "input", "FP32", [2, 64])
    request.inputs[0].contents.fp32_contents.extend(x.reshape(-1).tolist())
    response = stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == ["probabilities", "label"]
    probabilities = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 10)
    expected = engine.infer("digits_mlp", {"input": x}).outputs["probabilities"]
    np.testing.assert_allclose(probabilities, expected, rtol=1e-6)


def test_typed_contents_of_the_wrong_count_are_rejected(stub: Any) -> None:
    request = typed_request("digits_mlp", "input", "FP32", [1, 64])
    request.inputs[0].contents.fp32_contents.extend([0.5] * 63)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'input'" in info.value.details()
    assert "fp32_contents has 63 values" in info.value.details()


def test_typed_contents_in_the_wrong_field_are_rejected(stub: Any) -> None:
    request = typed_request("digits_mlp", "input", "FP32", [1, 64])
    request.inputs[0].contents.fp64_contents.extend([0.5] * 64)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents.fp64_contents given for a FP32 tensor" in info.value.details()


# ---- errors ---------------------------------------------------------------------------------------


def test_unknown_model_is_not_found_and_named(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.infer("no_such_model", [digits_input(rng_rows(1, 64))]))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in err.message()


def test_wrong_datatype_is_invalid_argument_naming_the_input(client: tgrpc.InferenceServerClient) -> None:
    x = rng_rows(1, 64).astype(np.float64)
    err = grpc_error(lambda: client.infer("digits_mlp", [digits_input(x, datatype="FP64")]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'input'" in err.message()
    assert "FP64" in err.message()


def test_wrong_shape_is_invalid_argument(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.infer("digits_mlp", [digits_input(rng_rows(1, 63))]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'input'" in err.message()
    assert "63" in err.message()


def test_batch_over_max_batch_size_is_invalid_argument(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.infer("digits_mlp", [digits_input(rng_rows(33, 64))]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "max_batch_size" in err.message()


def test_unknown_input_and_output_names_are_rejected(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.infer("digits_mlp", [digits_input(rng_rows(1, 64), "pixels")]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'pixels'" in err.message()
    outputs = [tgrpc.InferRequestedOutput("logits")]
    err = grpc_error(lambda: client.infer("digits_mlp", [digits_input(rng_rows(1, 64))], outputs=outputs))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "'logits'" in err.message()


def test_raw_contents_of_the_wrong_size_are_rejected(stub: Any) -> None:
    request = typed_request("digits_mlp", "input", "FP32", [1, 64])
    request.raw_input_contents.append(b"\0" * (64 * 4 - 1))
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'input'" in info.value.details()
    assert "255 bytes" in info.value.details()


def test_raw_contents_count_must_match_the_inputs(stub: Any) -> None:
    request = typed_request("digits_mlp", "input", "FP32", [1, 64])
    request.raw_input_contents.extend([b"\0" * 256, b"\0" * 256])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents has 2 entries" in info.value.details()


def test_a_malformed_parameter_is_rejected(client: tgrpc.InferenceServerClient) -> None:
    x = digits_input(rng_rows(1, 64))
    err = grpc_error(lambda: client.infer("digits_mlp", [x], parameters={"lumenrt_timing": "yes"}))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert 'parameters.lumenrt_timing: must be a boolean, got "yes"' in err.message()


def digits_request() -> Any:
    request = typed_request("digits_mlp", "input", "FP32", [1, 64])
    request.raw_input_contents.append(rng_rows(1, 64).tobytes())
    return request


def _set(params: Any, name: str, kind: str, value: Any) -> None:
    setattr(params[name], kind, value)


@pytest.mark.parametrize(
    ("where", "name", "kind", "value", "fragment"),
    [
        ("request", "lumenrt_timing", "string_param", "yes", 'parameters.lumenrt_timing: must be a boolean, got "yes"'),
        ("request", "lumenrt_timing", "int64_param", 1, "parameters.lumenrt_timing: must be a boolean, got 1"),
        ("request", "timeout", "int64_param", -1, "parameters.timeout: must be an integer number of microseconds"),
        ("request", "timeout", "double_param", 1.5, "parameters.timeout: must be an integer number of microseconds"),
        ("request", "timeout", "bool_param", True, "parameters.timeout:"),
        ("request", "timeout", "uint64_param", 1 << 40, "in 0..4294967295"),
        ("request", "priority", "int64_param", -1, "parameters.priority: must be a non-negative integer, got -1"),
        ("request", "priority", "string_param", "high", "parameters.priority"),
        ("request", "sequence_id", "int64_param", 7, "parameters.sequence_id: sequence batching is not supported"),
        ("request", "binary_data_output", "string_param", "true", "parameters.binary_data_output: must be a boolean"),
        ("input", "binary_data_size", "int64_param", -3, "inputs[0].parameters.binary_data_size: must be a non-negative integer"),
        ("input", "shared_memory_region", "string_param", "r", "inputs[0].parameters.shared_memory_byte_size: required"),
        ("output", "binary_data", "string_param", "yes", 'outputs[0].parameters.binary_data: must be a boolean, got "yes"'),
        ("output", "classification", "int64_param", 3, "outputs[0].parameters.classification: the classification"),
        ("output", "shared_memory_region", "string_param", "r", "outputs[0].parameters.shared_memory_byte_size: required"),
    ],
    ids=[
        "timing-string", "timing-int", "timeout-negative", "timeout-double", "timeout-bool", "timeout-over-cap",
        "priority-negative", "priority-string", "sequence-id", "binary-output-string", "size-negative",
        "input-shm", "binary-data-string", "classification", "output-shm",
    ],
)  # fmt: skip
def test_bad_parameters_are_invalid_argument_naming_the_parameter(
    stub: Any, where: str, name: str, kind: str, value: Any, fragment: str
) -> None:
    request = digits_request()
    if where == "request":
        _set(request.parameters, name, kind, value)
    elif where == "input":
        _set(request.inputs[0].parameters, name, kind, value)
    else:
        _set(request.outputs.add(name="label").parameters, name, kind, value)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in info.value.details()


def test_good_parameters_are_honoured(client: tgrpc.InferenceServerClient, stub: Any) -> None:
    x = digits_input(rng_rows(1, 64))
    result = client.infer(
        "digits_mlp",
        [x],
        timeout=5_000_000,
        priority=1,
        parameters={"lumenrt_timing": True},
        client_timeout=30,
    )
    assert result.get_response().parameters["lumenrt_batch_size"].int64_param >= 1
    request = digits_request()
    _set(request.parameters, "timeout", "uint64_param", 5_000_000)  # either integer kind
    _set(request.parameters, "sequence_id", "int64_param", 0)  # the default: not a sequence
    _set(request.parameters, "my_backend_option", "string_param", "anything")  # not ours: passed over
    _set(
        request.outputs.add(name="label").parameters, "binary_data", "bool_param", False
    )  # HTTP's: no effect
    assert list(stub.ModelInfer(request).outputs[0].shape) == [1]


def test_load_parameters_are_refused(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.load_model("digits_mlp", config="{}"))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "load parameters are not supported (config)" in err.message()


def test_unserved_rpcs_are_unimplemented(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.get_cuda_shared_memory_status())
    assert err.status() == "StatusCode.UNIMPLEMENTED"


def test_system_shared_memory_is_off_by_default(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.get_system_shared_memory_status())
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "--allow-client-shm" in err.message()
    assert "system_shared_memory" not in client.get_server_metadata(as_json=True)["extensions"]


# ---- statistics and repository --------------------------------------------------------------------


def success_count(client: tgrpc.InferenceServerClient, model: str) -> tuple[int, int]:
    (stats,) = client.get_inference_statistics(model).model_stats
    return stats.inference_stats.success.count, stats.inference_stats.fail.count


def test_statistics_count_successes_and_failures(client: tgrpc.InferenceServerClient) -> None:
    ok_before, failed_before = success_count(client, "tabular_xgb")
    for seed in range(3):
        client.infer("tabular_xgb", [digits_input(rng_rows(2, 30, seed))])
    grpc_error(lambda: client.infer("tabular_xgb", [digits_input(rng_rows(65, 30))]))
    ok_after, failed_after = success_count(client, "tabular_xgb")
    assert ok_after == ok_before + 3
    assert failed_after == failed_before + 1
    (stats,) = client.get_inference_statistics("tabular_xgb").model_stats
    assert (stats.name, stats.version) == ("tabular_xgb", "1")
    assert stats.inference_count >= 3
    assert stats.execution_count >= 1
    assert stats.last_inference > 0
    assert stats.inference_stats.success.ns > 0
    assert sum(b.compute_infer.count for b in stats.batch_stats) >= 1
    every = client.get_inference_statistics().model_stats
    assert {s.name for s in every} == set(MODELS)


def test_repository_index_unload_and_load(client: tgrpc.InferenceServerClient) -> None:
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["tabular_xgb"].state == "READY"
    client.unload_model("tabular_xgb")
    try:
        assert not client.is_model_ready("tabular_xgb")
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["tabular_xgb"].state == "UNAVAILABLE"
        ready = {m.name for m in client.get_model_repository_index().models if m.state == "READY"}
        assert "tabular_xgb" not in ready
        err = grpc_error(lambda: client.infer("tabular_xgb", [digits_input(rng_rows(1, 30))]))
        assert err.status() == "StatusCode.NOT_FOUND"
        err = grpc_error(lambda: client.unload_model("tabular_xgb"))
        assert err.status() == "StatusCode.NOT_FOUND"
    finally:
        client.load_model("tabular_xgb")
    assert client.is_model_ready("tabular_xgb")
    result = client.infer("tabular_xgb", [digits_input(rng_rows(1, 30))])
    assert result.as_numpy("probability").shape == (1,)


def test_loading_an_unknown_model_fails_naming_it(client: tgrpc.InferenceServerClient) -> None:
    err = grpc_error(lambda: client.load_model("no_such_model"))
    assert err.status() in ("StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT")
    assert "no_such_model" in err.message()


# ---- limits and shutdown --------------------------------------------------------------------------


def test_a_message_over_the_limit_is_resource_exhausted(engine: Engine, grpc_kind: str) -> None:
    with ServerThread(engine, options(grpc_kind, limits=ServeLimits(max_body_bytes=4096))) as st:
        c = tgrpc.InferenceServerClient(f"127.0.0.1:{st.ports['grpc']}")
        try:
            err = grpc_error(lambda: c.infer("digits_mlp", [digits_input(rng_rows(32, 64))]))
            assert err.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert c.is_server_live()
        finally:
            c.close()


def test_a_stopped_server_refuses_rpcs(engine: Engine, grpc_kind: str) -> None:
    st = ServerThread(engine, options(grpc_kind)).start()
    port = st.ports["grpc"]
    c = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        assert c.is_server_ready()
        st.stop()
        assert st.drained is True
        err = grpc_error(lambda: c.is_server_live(client_timeout=5))
        assert err.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    finally:
        c.close()
        st.stop()


# ---- BYTES through a python-backend model ---------------------------------------------------------

ECHO_MODEL = """
import numpy as np


class Echo:
    def load(self):
        pass

    def infer(self, inputs):
        text = inputs["text"]
        scale = inputs["scale"]
        shouted = np.empty(text.shape, dtype=object)
        lengths = np.empty(text.shape, dtype=np.int32)
        for i, item in np.ndenumerate(text):
            shouted[i] = bytes(item).upper() + b"!"
            lengths[i] = int(len(item) * scale[i[0], 0])
        return {"shouted": shouted, "length": lengths}
"""


@pytest.fixture(scope="module")
def python_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python_repo")
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "1" / "model.py").write_text(ECHO_MODEL)
    (root / "echo" / "config.yaml").write_text(
        "backend: python\nmax_batch_size: 4\n"
        "input:\n  - {name: text, datatype: BYTES, dims: [2]}\n  - {name: scale, datatype: FP32, dims: [1]}\n"
        "output:\n  - {name: shouted, datatype: BYTES, dims: [2]}\n  - {name: length, datatype: INT32, dims: [2]}\n"
        "instance_group: {count: 1}\n"
    )
    slow_model_state.write_slow_model(root)
    return root


@pytest.fixture(scope="module")
def bytes_server(python_repo: Path, grpc_kind: str) -> Iterator[ServerThread]:
    eng = Engine(python_repo, models=["echo"])
    try:
        with ServerThread(eng, options(grpc_kind)) as st:
            yield st
    finally:
        eng.close()


def test_bytes_tensors_round_trip(bytes_server: ServerThread) -> None:
    c = tgrpc.InferenceServerClient(f"127.0.0.1:{bytes_server.ports['grpc']}")
    try:
        text = np.array([[b"abc", b""], [b"\xff\x00z", "h\u00e9".encode()]], dtype=object)
        scale = np.array([[1.0], [2.0]], dtype=np.float32)
        inputs = [tgrpc.InferInput("text", [2, 2], "BYTES"), tgrpc.InferInput("scale", [2, 1], "FP32")]
        inputs[0].set_data_from_numpy(text)
        inputs[1].set_data_from_numpy(scale)
        result = c.infer("echo", inputs)
        assert [(o.name, o.datatype) for o in result.get_response().outputs] == [
            ("shouted", "BYTES"),
            ("length", "INT32"),
        ]
        shouted = result.as_numpy("shouted")
        assert shouted.shape == (2, 2)
        assert shouted.tolist() == [[b"ABC!", b"!"], [b"\xff\x00Z!", "H\u00e9".encode() + b"!"]]
        np.testing.assert_array_equal(result.as_numpy("length"), [[3, 0], [6, 6]])
        metadata = c.get_model_metadata("echo", as_json=True)
        assert metadata["inputs"][0] == {"name": "text", "datatype": "BYTES", "shape": ["-1", "2"]}
        config = c.get_model_config("echo").config
        assert config.input[0].data_type == model_config_pb2.TYPE_STRING
    finally:
        c.close()


def test_bytes_from_typed_contents(bytes_server: ServerThread) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{bytes_server.ports['grpc']}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = typed_request("echo", "text", "BYTES", [1, 2])
        request.inputs[0].contents.bytes_contents.extend([b"hi", b"yo"])
        scale = request.inputs.add(name="scale", datatype="FP32", shape=[1, 1])
        scale.contents.fp32_contents.append(1.0)
        request.outputs.add(name="shouted")
        response = stub.ModelInfer(request)
    assert [o.name for o in response.outputs] == ["shouted"]
    assert response.raw_output_contents[0] == b"\x03\0\0\0HI!\x03\0\0\0YO!"


def test_shutdown_lets_an_in_flight_request_finish(python_repo: Path, grpc_kind: str) -> None:
    gate, entered = slow_model_state.GATE, slow_model_state.ENTERED
    eng = Engine(python_repo, models=["slow"])
    st = ServerThread(eng, options(grpc_kind)).start()
    c = tgrpc.InferenceServerClient(f"127.0.0.1:{st.ports['grpc']}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    stopper = threading.Thread(target=st.stop)
    try:
        gate.clear()
        entered.clear()
        x = np.array([1.5, -2.0], dtype=np.float32)
        c.async_infer(
            "slow", [digits_input(x, "x")], callback=lambda result, error: answers.put((result, error))
        )
        assert entered.wait(10)  # the request is inside the model
        stopper.start()
        while st.app.service.accepting:  # shutdown has begun (readiness false) ...
            stopper.join(0.001)
        gate.set()  # ... and only now may the request finish
        result, error = answers.get(timeout=30)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        stopper.join(30)
        assert st.drained is True
    finally:
        gate.set()
        c.close()
        if stopper.is_alive():
            stopper.join(30)
        st.stop()
        eng.close()


# ---- deadlines: the client's gRPC deadline and the server-side timeout parameter --------------------


def slow_request(value: float) -> Any:
    request = typed_request("slow", "x", "FP32", [2])
    request.raw_input_contents.append(np.array([value, -value], dtype=np.float32).tobytes())
    return request


def doubled(response: Any) -> list[float]:
    values: list[float] = np.frombuffer(response.raw_output_contents[0], dtype="<f4").tolist()
    return values


@pytest.fixture
def slow_server(python_repo: Path, grpc_kind: str) -> Iterator[tuple[ServerThread, Any]]:
    """The ``slow`` model (one worker, held on GATE) served over gRPC, and a stub to it."""
    eng = Engine(python_repo, models=["slow"])
    try:
        with (
            ServerThread(eng, options(grpc_kind)) as st,
            grpc.insecure_channel(f"127.0.0.1:{st.ports['grpc']}") as channel,
        ):
            yield st, service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        slow_model_state.GATE.set()
        eng.close()


def wait_idle(st: ServerThread, held: int = 0) -> None:
    """Until the server holds only ``held`` requests (it lets go of one whose deadline passed)."""
    deadline = time.monotonic() + 10
    while st.app.service.in_flight > held:
        assert time.monotonic() < deadline, "the server still holds the request"
        threading.Event().wait(0.01)


def test_a_client_deadline_that_passes_inside_the_model_is_deadline_exceeded(
    slow_server: tuple[ServerThread, Any],
) -> None:
    st, stub = slow_server
    gate, entered = slow_model_state.GATE, slow_model_state.ENTERED
    gate.clear()
    entered.clear()
    c = tgrpc.InferenceServerClient(f"127.0.0.1:{st.ports['grpc']}")
    try:
        x = digits_input(np.array([1.5, -2.0], dtype=np.float32), "x")
        # the model is gated: the deadline passes inside it, however slow the way there
        err = grpc_error(lambda: c.infer("slow", [x], client_timeout=5.0))
        assert err.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert entered.is_set()  # it was running in the model when the deadline passed
        wait_idle(st)  # the server cancelled its side while the model still runs
        gate.set()
        # the server stays healthy: the next request is answered, on the same channel too
        assert doubled(stub.ModelInfer(slow_request(2.0), timeout=30)) == [4.0, -4.0]
        assert c.is_server_live() and c.is_server_ready()
        (stats,) = c.get_inference_statistics("slow").model_stats
        assert (stats.inference_stats.success.count, stats.inference_stats.fail.count) == (1, 1)
    finally:
        gate.set()
        c.close()


def test_a_queued_request_past_its_timeout_parameter_is_not_run(
    slow_server: tuple[ServerThread, Any],
) -> None:
    st, stub = slow_server
    gate, entered = slow_model_state.GATE, slow_model_state.ENTERED
    gate.clear()
    entered.clear()
    try:
        first = stub.ModelInfer.future(slow_request(1.0), timeout=30)
        assert entered.wait(10)  # the one worker is held inside the model
        timed = slow_request(2.0)
        timed.parameters["timeout"].int64_param = 100_000  # 0.1 s, server side; no client deadline
        late = stub.ModelInfer.future(timed)
        queued = stub.ModelInfer.future(slow_request(3.0), timeout=1.0)  # client deadline, in the queue
        # answered at its deadline, while the worker is still held: not when a worker reaches it
        err = late.exception(30)
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "deadline passed" in err.details() and "before a worker answered" in err.details()
        assert queued.exception(30).code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_idle(st, held=1)  # the server's side of `queued` is cancelled too: it will not run
        assert not gate.is_set()
        gate.set()
        assert doubled(first.result(30)) == [2.0, -2.0]
        wait_idle(st)
        assert doubled(stub.ModelInfer(slow_request(4.0), timeout=30)) == [8.0, -8.0]
        assert stub.ServerReady(service_pb2.ServerReadyRequest()).ready
        # both dropped unrun, each counted once: `late` past its timeout parameter (expired);
        # `queued` cancelled by its client at the client's deadline, which is the server's deadline
        # for it too (expired, or cancelled if the worker took it within that instant)
        stats = st.app.engine.runtime("slow").statistics()
        assert stats["expired"] >= 1 and stats["expired"] + stats["cancelled"] == 2
    finally:
        gate.set()
