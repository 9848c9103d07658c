"""The HTTP client's KServe V2 codec without sockets: a binary request is the JSON header then the
raw tensors with their sizes declared, the JSON fallback carries ``data`` lists, and responses in
either form (and error bodies) decode to results or InferenceError."""

import json

import numpy as np
import pytest

from lumenrt.client import InferenceError
from lumenrt.client.http import HEADER_LENGTH, decode_infer, encode_infer, infer_path
from lumenrt.protocols.parameters import TIMING_PARAMETER


def test_paths_quote_names_and_versions() -> None:
    assert infer_path("digits_mlp", None) == "/v2/models/digits_mlp/infer"
    assert infer_path("a/b c", 3) == "/v2/models/a%2Fb%20c/versions/3/infer"


def test_binary_request_layout() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([b"ab", b""], dtype=object)
    req = encode_infer("m", {"x": x, "s": s}, outputs=["y"], timeout_s=0.25, timing=True, request_id="7")
    n = int(req.headers[HEADER_LENGTH])
    head = json.loads(req.body[:n])
    assert head["id"] == "7"
    assert head["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
        {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 10}},
    ]
    assert head["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}]
    assert head["parameters"] == {TIMING_PARAMETER: True, "timeout": 250_000}
    assert req.body[n:] == x.tobytes() + b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    assert req.headers["Content-Type"] == "application/octet-stream"


def test_json_request_layout() -> None:
    req = encode_infer("m", {"x": np.array([[1, 2]], np.int32), "s": np.array(["h\u00e9"])}, binary=False)
    assert HEADER_LENGTH not in req.headers
    head = json.loads(req.body)
    assert head["inputs"][0] == {"name": "x", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}
    assert head["inputs"][1]["data"] == ["h\u00e9"]
    assert head["parameters"] == {"binary_data_output": False}


def binary_response(outputs: list[dict[str, object]], raws: list[bytes], params: dict[str, object]) -> tuple[dict[str, str], bytes]:  # fmt: skip
    head = json.dumps(
        {"model_name": "m", "model_version": "2", "outputs": outputs, "parameters": params}
    ).encode()
    return {HEADER_LENGTH.lower(): str(len(head))}, head + b"".join(raws)


def test_binary_and_json_outputs_decode() -> None:
    y = np.arange(4, dtype=np.int64).reshape(2, 2)
    headers, body = binary_response(
        [
            {"name": "y", "datatype": "INT64", "shape": [2, 2], "parameters": {"binary_data_size": 32}},
            {"name": "z", "datatype": "FP32", "shape": [2], "data": [0.5, 1.5]},
            {"name": "t", "datatype": "BYTES", "shape": [1], "data": ["ok"]},
        ],
        [y.tobytes()],
        {"lumenrt_compute_ns": 12, "lumenrt_batch_size": 1, "other": "x"},
    )
    result = decode_infer(200, headers, body)
    assert (result.model, result.version) == ("m", "2")
    np.testing.assert_array_equal(result.outputs["y"], y)
    np.testing.assert_array_equal(result.outputs["z"], np.array([0.5, 1.5], np.float32))
    assert result.outputs["t"].tolist() == [b"ok"]
    assert result.timing == {"compute_ns": 12, "batch_size": 1}


SHORT = b'{"outputs":[{"name":"y","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}]}'


@pytest.mark.parametrize(
    ("status", "headers", "body", "expected_status", "expected"),
    [
        (404, {}, b'{"error": "unknown model \'m\'"}', 404, "unknown model 'm'"),
        (503, {}, b"not json", 503, "not json"),
        (200, {HEADER_LENGTH.lower(): "999"}, b"{}", 502, "bad Inference-Header-Content-Length '999'"),
        (200, {}, b"{not json", 502, "bad inference response"),
        (200, {}, b'{"outputs": [{"name": "y", "datatype": "FP99", "shape": [1], "data": [1]}]}', 502, "FP99"),
        (200, {HEADER_LENGTH.lower(): str(len(SHORT))}, SHORT + b"xy", 502, "4 bytes of binary data past the body's end"),
    ],
)  # fmt: skip
def test_errors_and_bad_responses_raise_inference_error(
    status: int, headers: dict[str, str], body: bytes, expected_status: int, expected: str
) -> None:
    with pytest.raises(InferenceError) as info:
        decode_infer(status, headers, body)
    assert info.value.status == expected_status and expected in info.value.message


# ---- the async client's response parser (no sockets) -------------------------------------------------


def test_a_response_is_taken_whole_however_it_is_split() -> None:
    from lumenrt.client.http import _parse_response

    wire = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: x\r\n\r\nhelloHTTP/1.1 204 No"
    for cut in range(len(wire)):
        buffer = bytearray(wire[:cut])
        got = _parse_response(buffer)
        buffer += wire[cut:]
        if got is None:
            got = _parse_response(buffer)
        assert got == (200, {"content-length": "5", "content-type": "x"}, b"hello", True)
        assert buffer == b"HTTP/1.1 204 No"  # what follows stays for the next response


def test_chunked_and_closing_responses() -> None:
    from lumenrt.client.http import _parse_response

    chunked = bytearray(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    assert _parse_response(chunked) == (200, {"transfer-encoding": "chunked"}, b"abcde", True)
    assert chunked == b""
    assert _parse_response(bytearray(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nab")) is None
    closing = bytearray(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert _parse_response(closing) == (200, {"content-length": "0"}, b"", False)


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTX/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * 20000,  # a head past MAX_HEADER_BYTES, not ended
    ],
)
def test_bad_responses_end_the_connection(wire: bytes) -> None:
    from lumenrt.client.http import _parse_response

    with pytest.raises(ConnectionError):
        _parse_response(bytearray(wire))
