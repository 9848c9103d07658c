"""The request parameters the server gives meaning to (``lumenrt.protocols.parameters``): one set of
checks for HTTP and gRPC, each error naming the parameter."""

from typing import Any

import pytest

from lumenrt.protocols.errors import ServerError
from lumenrt.protocols.parameters import (
    MAX_TIMEOUT_US,
    RequestParameters,
    SharedMemoryRef,
    grpc_values,
    input_parameters,
    output_parameters,
    refuse_load_parameters,
    request_parameters,
    shared_memory_ref,
)
from lumenrt.protocols.proto import grpc_service_pb2 as pb


def message(call: Any, *args: Any) -> str:
    with pytest.raises(ServerError) as info:
        call(*args)
    assert info.value.status == 400
    return info.value.message


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, RequestParameters()),
        ({"timeout": 0}, RequestParameters()),  # 0: no timeout, as Triton
        ({"timeout": 250_000}, RequestParameters(timeout_s=0.25)),
        ({"timeout": MAX_TIMEOUT_US}, RequestParameters(timeout_s=MAX_TIMEOUT_US / 1e6)),
        ({"lumenrt_timing": True, "binary_data_output": True}, RequestParameters(timing=True, binary_data_output=True)),
        ({"timeout": None, "lumenrt_timing": None}, RequestParameters()),  # null: not given
        ({"priority": 3, "sequence_id": 0, "sequence_start": False, "x_custom": [1]}, RequestParameters(priority=3)),
    ],
)  # fmt: skip
def test_good_request_parameters(params: dict[str, Any], expected: RequestParameters) -> None:
    assert request_parameters(params) == expected


@pytest.mark.parametrize(
    ("params", "text"),
    [
        ({"lumenrt_timing": "yes"}, 'parameters.lumenrt_timing: must be a boolean, got "yes"'),
        ({"lumenrt_timing": 0}, "parameters.lumenrt_timing: must be a boolean, got 0"),
        ({"binary_data_output": [True]}, "parameters.binary_data_output: must be a boolean, got [true]"),
        ({"timeout": -1}, "parameters.timeout: must be an integer number of microseconds in 0..4294967295"),
        ({"timeout": MAX_TIMEOUT_US + 1}, "got 4294967296"),
        ({"timeout": 2.5}, "parameters.timeout: must be an integer number of microseconds"),
        ({"timeout": False}, "parameters.timeout: must be an integer number of microseconds"),
        ({"timeout": "100"}, 'got "100"'),
        ({"priority": -1}, "parameters.priority: must be a non-negative integer, got -1"),
        ({"priority": True}, "parameters.priority: must be a non-negative integer, got true"),
        ({"sequence_id": "abc"}, 'parameters.sequence_id: sequence batching is not supported (stateless models only), got "abc"'),
        ({"sequence_end": True}, "parameters.sequence_end: sequence batching is not supported"),
    ],
)  # fmt: skip
def test_bad_request_parameters_name_the_parameter(params: dict[str, Any], text: str) -> None:
    assert text in message(request_parameters, params)


def test_input_and_output_parameters() -> None:
    assert input_parameters({}, "inputs[0].parameters") is None
    assert input_parameters({"binary_data_size": 0}, "inputs[0].parameters") == 0
    assert input_parameters({"binary_data_size": None, "x": 1}, "inputs[0].parameters") is None
    assert output_parameters({}, "outputs[1].parameters") is None
    assert output_parameters({"binary_data": False}, "outputs[1].parameters") is False
    assert "inputs[2].parameters.binary_data_size: must be a non-negative integer, got -4" in message(
        input_parameters, {"binary_data_size": -4}, "inputs[2].parameters"
    )
    assert "inputs[0].parameters: has both binary_data_size and shared_memory_region" in message(
        input_parameters, {"binary_data_size": 4, "shared_memory_region": "r"}, "inputs[0].parameters"
    )
    assert 'outputs[1].parameters.binary_data: must be a boolean, got "yes"' in message(
        output_parameters, {"binary_data": "yes"}, "outputs[1].parameters"
    )
    assert "outputs[0].parameters.classification: the classification extension is not supported" in message(
        output_parameters, {"classification": 2}, "outputs[0].parameters"
    )


def test_load_parameters_are_refused_naming_them() -> None:
    refuse_load_parameters({}, "m")
    assert "model 'm': load parameters are not supported (config, file:1/model.onnx)" in message(
        refuse_load_parameters, {"file:1/model.onnx": "", "config": ""}, "m"
    )


def test_grpc_parameters_are_checked_as_their_values() -> None:
    request = pb.ModelInferRequest()
    request.parameters["lumenrt_timing"].string_param = "yes"
    request.parameters["timeout"].uint64_param = 5
    request.parameters["priority"].int64_param = 2
    request.parameters["ratio"].double_param = 0.5
    request.parameters["flag"].bool_param = False
    request.parameters["unset"].CopyFrom(pb.InferParameter())
    assert grpc_values(request.parameters) == {
        "lumenrt_timing": "yes",
        "timeout": 5,
        "priority": 2,
        "ratio": 0.5,
        "flag": False,
        "unset": None,
    }
    assert 'parameters.lumenrt_timing: must be a boolean, got "yes"' in message(
        request_parameters, grpc_values(request.parameters)
    )


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, None),
        ({"binary_data_size": 8}, None),
        ({"shared_memory_region": "in", "shared_memory_byte_size": 256}, SharedMemoryRef("in", 0, 256)),
        ({"shared_memory_region": "in", "shared_memory_byte_size": 4, "shared_memory_offset": 64}, SharedMemoryRef("in", 64, 4)),
        ({"shared_memory_region": None, "shared_memory_byte_size": None}, None),  # null: not given
    ],
)  # fmt: skip
def test_shared_memory_parameters(params: dict[str, Any], expected: SharedMemoryRef | None) -> None:
    assert shared_memory_ref(params, "inputs[0].parameters") == expected


@pytest.mark.parametrize(
    ("params", "text"),
    [
        ({"shared_memory_byte_size": 4}, "inputs[0].parameters.shared_memory_region: required with the other"),
        ({"shared_memory_offset": 0}, "inputs[0].parameters.shared_memory_region: required with the other"),
        ({"shared_memory_region": "in"}, "inputs[0].parameters.shared_memory_byte_size: required with shared_memory_region"),
        ({"shared_memory_region": 3, "shared_memory_byte_size": 4}, "inputs[0].parameters.shared_memory_region: must be a non-empty string, got 3"),
        ({"shared_memory_region": "", "shared_memory_byte_size": 4}, "inputs[0].parameters.shared_memory_region: must be a non-empty string"),
        ({"shared_memory_region": "in", "shared_memory_byte_size": -1}, "inputs[0].parameters.shared_memory_byte_size: must be a non-negative integer, got -1"),
        ({"shared_memory_region": "in", "shared_memory_byte_size": 4, "shared_memory_offset": "8"}, 'inputs[0].parameters.shared_memory_offset: must be a non-negative integer, got "8"'),
    ],
)  # fmt: skip
def test_bad_shared_memory_parameters_name_the_parameter(params: dict[str, Any], text: str) -> None:
    assert text in message(shared_memory_ref, params, "inputs[0].parameters")
