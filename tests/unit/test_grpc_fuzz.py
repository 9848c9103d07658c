"""Property tests of the gRPC request decoding path: whatever a ModelInferRequest holds (random
fields, random protobuf bytes, valid requests mutated), ``GrpcServicer.model_infer`` answers or
raises ServerError (a status and a message), never another exception; and what it builds stays
within the limits (a shape over ``max_elements`` is refused before any array is made)."""

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.ingress.grpc_service import GrpcServicer, _decode_inputs
from lumenrt.ingress.service import InferenceService, ServeLimits
from lumenrt.models.builtin import builtin_examples
from lumenrt.protocols.errors import ServerError
from lumenrt.protocols.proto import grpc_service_pb2 as pb

MAX_ELEMENTS = 1 << 12
MODEL = "digits_mlp"
DATATYPES = ["FP32", "INT64", "BYTES", "BOOL", "FP16", "UINT8", "INT8", "nope", ""]


class Context:
    """What model_infer asks of grpc's context."""

    def time_remaining(self) -> float | None:
        return None

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


@pytest.fixture(scope="module")
def servicer() -> Iterator[GrpcServicer]:
    with Engine(models=[MODEL], settings=EngineConfig(thread_count=1, pin=False)) as engine:
        yield GrpcServicer(InferenceService(engine, ServeLimits(max_elements=MAX_ELEMENTS)))


def valid_request() -> Any:
    x = builtin_examples(MODEL, 1)["input"]
    req = pb.ModelInferRequest(model_name=MODEL)
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


tensors = st.builds(
    dict,
    name=st.sampled_from(["input", "x", ""]),
    datatype=st.sampled_from(DATATYPES),
    shape=st.lists(st.integers(-3, 1 << 40), max_size=5),
    raw=st.none() | st.binary(max_size=600),
    fp32=st.lists(st.floats(width=32), max_size=80),
    strings=st.lists(st.binary(max_size=5), max_size=10),
)


def build(model: str, entries: list[dict[str, Any]], outputs: list[str]) -> Any:
    req = pb.ModelInferRequest(model_name=model)
    for e in entries:
        t = req.inputs.add(name=e["name"], datatype=e["datatype"])
        t.shape.extend(e["shape"])
        if e["raw"] is not None:
            req.raw_input_contents.append(e["raw"])
        elif e["datatype"] == "BYTES":
            t.contents.bytes_contents.extend(e["strings"])
        else:
            t.contents.fp32_contents.extend(e["fp32"])
    for name in outputs:
        req.outputs.add(name=name)
    return req


def run(servicer: GrpcServicer, request: Any) -> None:
    try:
        response = asyncio.run(servicer.model_infer(request, Context()))
    except ServerError as err:
        assert 400 <= err.status < 600 and err.message
        return
    assert response.model_name == MODEL


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    model=st.sampled_from([MODEL, "nope", ""]),
    entries=st.lists(tensors, max_size=3),
    outputs=st.lists(st.sampled_from(["probabilities", "label", "x", ""]), max_size=3),
)
def test_random_requests_are_answered_or_refused_cleanly(
    servicer: GrpcServicer, model: str, entries: list[dict[str, Any]], outputs: list[str]
) -> None:
    run(servicer, build(model, entries, outputs))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_valid_requests_are_answered_or_refused_cleanly(servicer: GrpcServicer, data: Any) -> None:
    wire = bytearray(valid_request().SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(wire) - 1))
        wire[at] = data.draw(st.integers(0, 255))
    try:
        request = pb.ModelInferRequest.FromString(bytes(wire))
    except Exception:  # grpc answers a message that does not parse itself (INTERNAL), before us
        return
    run(servicer, request)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300))
def test_random_protobuf_bytes_are_decoded_or_refused_cleanly(data: bytes) -> None:
    try:
        request = pb.ModelInferRequest.FromString(data)
    except Exception:
        return
    try:
        _decode_inputs(request, MAX_ELEMENTS, MODEL)
    except ServerError as err:
        assert err.status == 400


def test_a_shape_over_the_limit_is_refused_before_any_array_is_made() -> None:
    req = pb.ModelInferRequest(model_name=MODEL)
    req.inputs.add(name="input", datatype="FP32", shape=[1 << 20, 1 << 20])
    req.raw_input_contents.append(b"")
    with pytest.raises(ServerError, match="over the limit"):
        _decode_inputs(req, MAX_ELEMENTS, MODEL)


def test_too_many_inputs_or_outputs_are_refused(servicer: GrpcServicer) -> None:
    req = pb.ModelInferRequest(model_name=MODEL)
    for i in range(1025):
        req.inputs.add(name=f"i{i}", datatype="FP32", shape=[1])
    with pytest.raises(ServerError, match="inputs has 1025 tensors, over the limit of 1024"):
        _decode_inputs(req, MAX_ELEMENTS, MODEL)
    req = valid_request()
    for i in range(1025):
        req.outputs.add(name=f"o{i}")
    with pytest.raises(ServerError, match="outputs has 1025 tensors"):
        asyncio.run(servicer.model_infer(req, Context()))
