"""ModelInfer at the wire level (protocols/grpc_infer.py) against the generated protobuf classes:
requests cut the way protobuf would read them, answers that protobuf reads back as the message
``infer_response`` builds, and anything unusual left to protobuf."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumenrt.protocols import grpc_infer
from lumenrt.protocols.proto import grpc_service_pb2 as pb

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
shapes = st.lists(st.integers(0, 1 << 40), max_size=4)


def request(model: str, version: str, request_id: str, inputs: list, outputs: list, timing: bool) -> bytes:
    message = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, datatype, shape, raw in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(raw)
    for name in outputs:
        message.outputs.add(name=name)
    if timing:
        message.parameters["lumenrt_timing"].bool_param = True
    return bytes(message.SerializeToString())


@settings(max_examples=200)
@given(
    names,
    names,
    names,
    st.lists(st.tuples(names, names, shapes, st.binary(max_size=300)), max_size=4),
    st.lists(names, max_size=3),
    st.booleans(),
)
def test_a_request_is_cut_as_protobuf_reads_it(
    model: str, version: str, request_id: str, inputs: list, outputs: list, timing: bool
) -> None:
    message = request(model, version, request_id, inputs, outputs, timing)
    parts = grpc_infer.split_request(message)
    assert parts is not None
    assert parts.request_id == (request_id or None)
    assert [bytes(r) for r in parts.raw] == [raw for *_, raw in inputs]
    without = pb.ModelInferRequest.FromString(message)
    without.ClearField("id")
    without.ClearField("raw_input_contents")
    assert pb.ModelInferRequest.FromString(parts.key) == without  # the key is the rest, as sent
    if not request_id:
        raw = grpc_infer.raw_contents(message, len(parts.key), len(inputs))
        assert raw is not None and [bytes(r) for r in raw] == [r for *_, r in inputs]


def test_the_key_does_not_depend_on_the_id_or_the_contents() -> None:
    a = request("m", "", "1", [("x", "FP32", [1, 2], b"\0" * 8)], [], False)
    b = request("m", "", "2", [("x", "FP32", [1, 2], b"\1" * 8)], [], False)
    c = request("m", "", "1", [("x", "FP32", [2, 1], b"\0" * 8)], [], False)
    key = grpc_infer.split_request(a).key  # type: ignore[union-attr]
    assert key == grpc_infer.split_request(b).key  # type: ignore[union-attr]
    assert key != grpc_infer.split_request(c).key  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "message",
    [
        b"\x08\x01",  # a varint field: not a ModelInferRequest layout
        b"\x0a\x05ab",  # a length past the end
        b"\x3a\x01x\x0a\x01m",  # a field after the raw contents
        b"\x1a\x02\xff\xfe",  # an id that is not UTF-8
        b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a length varint that never ends
    ],
)
def test_unusual_requests_are_left_to_protobuf(message: bytes) -> None:
    assert grpc_infer.split_request(message) is None


def test_raw_contents_must_be_all_that_follows() -> None:
    message = request("m", "", "", [("x", "FP32", [1], b"abcd"), ("y", "FP32", [1], b"efgh")], [], False)
    key = grpc_infer.split_request(message).key  # type: ignore[union-attr]
    assert grpc_infer.raw_contents(message, len(key), 1) is None  # one more follows
    assert grpc_infer.raw_contents(message, len(key), 3) is None  # one fewer
    assert grpc_infer.raw_contents(message[:-1], len(key), 2) is None  # cut short


@settings(max_examples=200)
@given(
    names,
    st.integers(0, 1 << 62).map(str),
    st.lists(
        st.tuples(names, names, st.lists(st.integers(-5, 1 << 40), max_size=4), st.binary(max_size=200)),
        max_size=4,
    ),
    names,
    st.dictionaries(names, st.integers(-(1 << 63), (1 << 63) - 1), max_size=4),
)
def test_an_answer_reads_back_as_protobufs_own(
    model: str, version: str, outputs: list, request_id: str, parameters: dict
) -> None:
    prefix = grpc_infer.response_prefix(model, version, [(n, d, tuple(s)) for n, d, s, _ in outputs])
    params = grpc_infer.int64_parameters(parameters)
    ours = b"".join(grpc_infer.encode_response(prefix, request_id or None, params, [r for *_, r in outputs]))
    expected = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    for name, datatype, shape, raw in outputs:
        expected.outputs.add(name=name, datatype=datatype, shape=shape)
        expected.raw_output_contents.append(raw)
    for key, value in parameters.items():
        expected.parameters[key].int64_param = value
    assert pb.ModelInferResponse.FromString(ours) == expected
    if not parameters:  # one entry at most in a map has one order: then the same bytes too
        assert ours == expected.SerializeToString()


def test_an_answer_of_arrays_reads_back() -> None:
    probabilities = np.arange(10, dtype=np.float32).reshape(1, 10)
    prefix = grpc_infer.response_prefix("digits_mlp", "1", [("probabilities", "FP32", (1, 10))])
    message = pb.ModelInferResponse.FromString(
        b"".join(grpc_infer.encode_response(prefix, None, b"", [memoryview(probabilities).cast("B")]))
    )
    assert np.frombuffer(message.raw_output_contents[0], np.float32).tolist() == list(range(10))


@settings(max_examples=200)
@given(
    names,
    names,
    st.lists(st.tuples(names, names, shapes, st.binary(min_size=1, max_size=300)), min_size=1, max_size=4),
    st.lists(names, max_size=3),
    st.integers(0, 400),
)
def test_a_heads_fields_and_the_raw_layout_are_where_protobuf_puts_them(
    model: str, request_id: str, inputs: list, outputs: list, cut: int
) -> None:
    message = request(model, "", request_id, inputs, outputs, False)
    parts = grpc_infer.split_request(message)
    assert parts is not None
    head = pb.ModelInferRequest.FromString(message)
    head.ClearField("raw_input_contents")
    head_length = len(head.SerializeToString())  # where the raw contents begin
    cut = min(cut, len(message))
    found = grpc_infer.split_head(message[: len(message) - cut])
    if len(message) - cut <= head_length:  # cut before the first raw tag: not taken
        assert found is None
        return
    assert found is not None
    key, got_id, at = found
    assert at == head_length
    assert key == parts.key and got_id == (request_id or None)
    layout, length = grpc_infer.raw_layout(at, [len(raw) for *_, raw in inputs])
    assert length == len(message)
    for (framing, start), (*_, raw) in zip(layout, inputs, strict=True):
        assert message[start - len(framing) : start] == framing
        assert message[start : start + len(raw)] == raw


def test_a_head_cut_before_its_raw_contents_is_not_taken() -> None:
    message = request("m", "", "", [("x", "FP32", [4], b"\0" * 16)], ["y"], False)
    key = grpc_infer.split_request(message).key  # type: ignore[union-attr]
    assert grpc_infer.split_head(message[: len(key) - 1]) is None
    assert grpc_infer.split_head(message[: len(key)]) is None  # the raw contents' tag not in yet
    assert grpc_infer.split_head(message[: len(key) + 1]) == (key, None, len(key))
