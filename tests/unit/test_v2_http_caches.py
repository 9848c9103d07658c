"""The V2 HTTP codec's caches: a binary-form request header decoded once is reused for the same
bytes (and only then), and an all-binary response header is encoded once per signature; neither
changes what a request decodes to or what an answer says, and both stay bounded."""

import json

import numpy as np
import pytest

from lumenrt.client.http import encode_infer
from lumenrt.engine.request import StageTimes
from lumenrt.ingress import v2_http
from lumenrt.ingress.service import InferOutcome
from lumenrt.protocols.errors import ServerError

MAX_ELEMENTS = 1 << 20


def binary_request(x: np.ndarray, **kw: object) -> tuple[bytes, int]:
    req = encode_infer("m", {"x": x}, **kw)  # type: ignore[arg-type]
    return req.body, int(req.headers["Inference-Header-Content-Length"])


@pytest.fixture(autouse=True)
def empty_caches() -> None:
    v2_http._plans.clear()
    v2_http._headers.clear()


def test_a_repeated_header_decodes_to_the_same_request_from_the_cache() -> None:
    first, second = np.arange(8, dtype=np.float32).reshape(2, 4), np.ones((2, 4), dtype=np.float32)
    body1, n1 = binary_request(first, timeout_s=0.5)
    body2, n2 = binary_request(second, timeout_s=0.5)
    assert body1[:n1] == body2[:n2]  # same signature, same header bytes
    a = v2_http.parse_infer_request(body1, n1, MAX_ELEMENTS)
    assert len(v2_http._plans) == 1
    b = v2_http.parse_infer_request(body2, n2, MAX_ELEMENTS)  # from the plan
    assert len(v2_http._plans) == 1
    for parsed, want in ((a, first), (b, second)):
        (w,) = parsed.inputs
        assert (w.name, w.datatype, w.shape) == ("x", "FP32", (2, 4))
        np.testing.assert_array_equal(w.array, want)
        assert parsed.timeout_s == 0.5 and parsed.binary_output is True


def test_a_cached_header_still_checks_the_binary_part_with_the_same_messages() -> None:
    body, n = binary_request(np.ones((2, 4), dtype=np.float32))
    for bad in (body[:-4], body + b"\0\0\0\0"):
        v2_http._plans.clear()
        with pytest.raises(ServerError) as fresh:
            v2_http.parse_infer_request(bad, n, MAX_ELEMENTS)
        v2_http.parse_infer_request(body, n, MAX_ELEMENTS)  # the header is now cached
        with pytest.raises(ServerError) as cached:
            v2_http.parse_infer_request(bad, n, MAX_ELEMENTS)
        assert cached.value.status == fresh.value.status == 400
        assert cached.value.message == fresh.value.message  # names the field as before
        assert "binary data" in cached.value.message


def test_json_data_inputs_are_not_cached() -> None:
    doc = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).encode()
    v2_http.parse_infer_request(doc, len(doc), MAX_ELEMENTS)
    assert v2_http._plans == {}


def test_the_plan_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(v2_http, "PLAN_CACHE_ENTRIES", 4)
    for rows in range(1, 11):
        body, n = binary_request(np.ones((rows, 4), dtype=np.float32))
        v2_http.parse_infer_request(body, n, MAX_ELEMENTS)
        assert len(v2_http._plans) <= 4


def outcome(y: np.ndarray, **params: object) -> InferOutcome:
    return InferOutcome("m", 1, [("y", y)], StageTimes(), dict(params))


def test_response_headers_are_cached_per_signature_and_say_the_same() -> None:
    body, n = binary_request(np.ones((2, 4), dtype=np.float32))
    parsed = v2_http.parse_infer_request(body, n, MAX_ELEMENTS)
    y1, y2 = np.zeros((2, 3), dtype=np.float32), np.full((2, 3), 7, dtype=np.float32)
    h1, c1 = v2_http.encode_infer_response(outcome(y1), parsed)
    assert bytes(c1[0]) == y1.tobytes()
    h2, c2 = v2_http.encode_infer_response(outcome(y2), parsed)
    assert h1 == h2 and len(v2_http._headers) == 1
    assert bytes(c2[0]) == y2.tobytes()
    h3, _ = v2_http.encode_infer_response(outcome(np.zeros((5, 3), dtype=np.float32)), parsed)
    assert json.loads(h3)["outputs"][0]["shape"] == [5, 3]  # another shape, its own header
    fresh, _ = v2_http._encode(outcome(y2), parsed)
    assert fresh == h2


def test_a_long_request_id_is_not_kept() -> None:
    body, n = binary_request(np.ones((1, 4), dtype=np.float32), request_id="x" * 4096)
    parsed = v2_http.parse_infer_request(body, n, MAX_ELEMENTS)
    header, _ = v2_http.encode_infer_response(outcome(np.zeros((1, 3), dtype=np.float32)), parsed)
    assert json.loads(header)["id"] == "x" * 4096
    assert v2_http._headers == {} and v2_http._plans == {}  # neither header is kept: too long


def test_answers_with_parameters_share_the_header_kept_without_them() -> None:
    """Stage times asked for (``lumenrt_*`` parameters, different every answer) go into the
    signature's cached header: each answer says its own, exactly as encoded afresh."""
    body, n = binary_request(np.ones((1, 4), dtype=np.float32), request_id="r1")
    parsed = v2_http.parse_infer_request(body, n, MAX_ELEMENTS)
    y = np.zeros((1, 3), dtype=np.float32)
    plain, _ = v2_http.encode_infer_response(outcome(y), parsed)
    for queue_ns in (5, 123456789):
        answer = outcome(y, lumenrt_queue_ns=queue_ns, lumenrt_batch_size=1)
        header, chunks = v2_http.encode_infer_response(answer, parsed)
        assert header == v2_http._encode(answer, parsed)[0]
        assert json.loads(header)["parameters"] == {"lumenrt_queue_ns": queue_ns, "lumenrt_batch_size": 1}
        assert bytes(chunks[0]) == y.tobytes()
    assert list(v2_http._headers.values()) == [plain]  # one entry, kept without parameters
    v2_http._headers.clear()  # the first answer of a signature may carry parameters too
    answer = outcome(y, lumenrt_queue_ns=7)
    assert v2_http.encode_infer_response(answer, parsed)[0] == v2_http._encode(answer, parsed)[0]
    assert list(v2_http._headers.values()) == [plain]


def test_answers_with_bytes_are_never_cached() -> None:
    body, n = binary_request(np.ones((1, 4), dtype=np.float32))
    parsed = v2_http.parse_infer_request(body, n, MAX_ELEMENTS)
    text = np.array([b"a", b"bcd"], dtype=object)
    h, _ = v2_http.encode_infer_response(outcome(text), parsed)
    assert v2_http._headers == {}
    assert json.loads(h)["outputs"][0]["parameters"]["binary_data_size"] == 4 + 1 + 4 + 3


@pytest.mark.parametrize(
    ("outputs_doc", "default", "cached"),
    [
        ([{"name": "y", "parameters": {"binary_data": True}}], None, True),  # tritonclient's named output
        ([{"name": "y"}], True, True),  # named, binary by the request's default
        ([{"name": "y", "parameters": {"binary_data": False}}], True, False),  # named, as JSON
        ([{"name": "y"}], None, False),  # named, JSON by default
    ],
)
def test_named_outputs_are_cached_when_every_one_goes_out_binary(
    outputs_doc: list[dict[str, object]], default: bool | None, cached: bool
) -> None:
    """A request that names its outputs binary gets the same header as one that asks for binary
    outputs by default (cached once per signature); an output asked for as JSON data is never
    cached, and the header says each output as asked."""
    x = np.ones((1, 4), dtype=np.float32)
    doc: dict[str, object] = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}
        ],
        "outputs": outputs_doc,
    }
    if default is not None:
        doc["parameters"] = {"binary_data_output": default}
    head = json.dumps(doc).encode()
    parsed = v2_http.parse_infer_request(head + x.tobytes(), len(head), MAX_ELEMENTS)
    y = np.full((1, 3), 2, dtype=np.float32)
    header, chunks = v2_http.encode_infer_response(outcome(y), parsed)
    again, _ = v2_http.encode_infer_response(outcome(y + 1), parsed)
    assert header == v2_http._encode(outcome(y), parsed)[0]  # what it says, cached or not
    assert (header == again) is cached  # JSON data says the values: another answer, another header
    assert len(v2_http._headers) == (1 if cached else 0)
    (out,) = json.loads(header)["outputs"]
    if cached:
        assert out["parameters"]["binary_data_size"] == 12 and bytes(chunks[0]) == y.tobytes()
    else:
        assert out["data"] == [2.0, 2.0, 2.0] and chunks == []
