"""The TCP protocol codec (no sockets): every V2 datatype round-trips through request and response
frames, the cached encoders write exactly what the plain ones do, the decoder reassembles frames
from any chunking, and every malformed header, metadata block or tensor is a ProtocolError that
names the problem."""

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from lumenrt.protocols import raw
from lumenrt.protocols import tcp as tp
from lumenrt.protocols.tcp import Frame, FrameDecoder, ProtocolError

EXAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 65535]], dtype=np.uint16),
    "UINT32": np.array([[1, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[1, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, 127]], dtype=np.int8),
    "INT16": np.array([[-(2**15), 2**15 - 1]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[0.5, -2.0, np.inf]], dtype=np.float16),
    "FP32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "FP64": np.array([[np.pi, -0.0]], dtype=np.float64),
    "BYTES": np.array([[b"", b"abc", "h\u00e9".encode()]], dtype=object),
}


def frames_of(data: bytes, **limits: int) -> list[Frame]:
    out: list[Frame] = []
    FrameDecoder(out.append, **limits).feed(data)
    return out


def one_frame(parts: list[Any]) -> Frame:
    (frame,) = frames_of(b"".join(bytes(p) for p in parts))
    return frame


def request_frame(inputs: dict[str, Any], **kw: Any) -> bytes:
    return b"".join(bytes(p) for p in tp.encode_request(7, "m", inputs, **kw))


def decode_request(frame: Frame) -> tuple[tp.RequestMeta, dict[str, np.ndarray]]:
    meta = tp.decode_request_meta(frame.meta)
    assert meta.payload_bytes == frame.payload_bytes
    arrays = raw.split_payload(frame.data, frame.payload_at, meta.slots, "input", ProtocolError)
    return meta, {s.name: a for s, a in zip(meta.slots, arrays, strict=True)}


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.tolist() == want.tolist()
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


# ---- round trips -----------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(EXAMPLES))
def test_request_round_trips_every_datatype(datatype: str) -> None:
    array = EXAMPLES[datatype]
    frame = one_frame(
        tp.encode_request(
            42, "model", {"x": array}, version="3", outputs=["a", "b"], timeout_us=1500, flags=tp.FLAG_TIMING
        )
    )
    assert (frame.kind, frame.flags, frame.request_id) == (tp.REQUEST, tp.FLAG_TIMING, 42)
    meta, arrays = decode_request(frame)
    assert (meta.model, meta.version, meta.timeout_us, meta.outputs) == ("model", "3", 1500, ("a", "b"))
    assert meta.inputs[0].datatype == datatype
    assert_same(arrays["x"], array)


@pytest.mark.parametrize("datatype", list(EXAMPLES))
def test_response_round_trips_every_datatype(datatype: str) -> None:
    array = EXAMPLES[datatype]
    frame = one_frame(tp.encode_response(9, "model", 4, [("y", array), ("z", np.int64(5))]))
    assert (frame.kind, frame.flags, frame.request_id) == (tp.RESPONSE, 0, 9)
    desc, outputs, timing = tp.ResponseDecoder().decode(frame)
    assert (desc.model, desc.version, timing) == ("model", 4, {})
    assert list(outputs) == ["y", "z"]
    assert_same(outputs["y"], array)
    assert_same(outputs["z"], np.array(5, dtype=np.int64))


def test_several_inputs_keep_their_order_and_bytes() -> None:
    inputs = {"b": EXAMPLES["BYTES"], "a": EXAMPLES["FP32"], "c": EXAMPLES["BOOL"]}
    meta, arrays = decode_request(one_frame(tp.encode_request(1, "m", inputs)))
    assert [d.name for d in meta.inputs] == ["b", "a", "c"]
    for name, want in inputs.items():
        assert_same(arrays[name], want)


def test_scalars_empty_tensors_and_non_contiguous_arrays() -> None:
    big = np.arange(4096, dtype=np.float64).reshape(64, 64)  # over the copy threshold: sent as a view
    inputs = {
        "scalar": np.float32(2.5),
        "empty": np.zeros((0, 3), dtype=np.int32),
        "strided": np.arange(20, dtype=np.int16).reshape(4, 5)[:, ::2],
        "big": big,
        "list": [[1.0, 2.0]],
    }
    _, arrays = decode_request(one_frame(tp.encode_request(1, "m", inputs)))
    assert_same(arrays["scalar"], np.array(2.5, dtype=np.float32))
    assert_same(arrays["empty"], inputs["empty"])
    assert_same(arrays["strided"], np.ascontiguousarray(inputs["strided"]))
    assert_same(arrays["big"], big)
    assert_same(arrays["list"], np.array([[1.0, 2.0]]))


def test_big_endian_and_string_arrays_are_sent_in_wire_form() -> None:
    inputs = {"be": np.array([1, 2, 3], dtype=">i4"), "s": np.array(["x", "yz"]), "b": np.array([b"q"])}
    meta, arrays = decode_request(one_frame(tp.encode_request(1, "m", inputs)))
    assert [d.datatype for d in meta.inputs] == ["INT32", "BYTES", "BYTES"]
    assert_same(arrays["be"], np.array([1, 2, 3], dtype=np.int32))
    assert arrays["s"].tolist() == [b"x", b"yz"]
    assert arrays["b"].tolist() == [b"q"]


def test_arrays_are_views_of_the_received_bytes() -> None:
    frame = one_frame(tp.encode_request(1, "m", {"x": EXAMPLES["FP32"]}))
    _, arrays = decode_request(frame)
    assert not arrays["x"].flags.writeable
    assert arrays["x"].base is not None


def test_timing_round_trips_and_unknown_extra_fields_are_ignored() -> None:
    values = [11, 22, 33, 44, 55, 3]
    frame = one_frame(tp.encode_response(2, "m", 1, [("y", EXAMPLES["FP32"])], values))
    assert frame.flags == tp.FLAG_TIMING
    _, _, timing = tp.ResponseDecoder().decode(frame)
    assert timing == dict(zip(tp.TIMING_FIELDS, values, strict=True))
    longer = one_frame(tp.encode_response(2, "m", 1, [("y", EXAMPLES["FP32"])], [*values, 99]))
    assert tp.ResponseDecoder().decode(longer)[2] == timing


def test_error_frame_round_trips() -> None:
    (frame,) = frames_of(tp.encode_error(5, 404, "unknown model 'x'"))
    assert (frame.kind, frame.request_id, frame.payload_bytes) == (tp.ERROR, 5, 0)
    assert tp.decode_error(frame.meta) == tp.ErrorInfo(404, "unknown model 'x'")


def test_long_error_messages_are_cut() -> None:
    (frame,) = frames_of(tp.encode_error(5, 500, "x" * 10_000))
    assert len(tp.decode_error(frame.meta).message) == 4096


# ---- cached encoders and decoders ----------------------------------------------------------------


def test_request_encoder_writes_what_encode_request_writes() -> None:
    enc = tp.RequestEncoder()
    cases: list[tuple[dict[str, Any], tuple[str, ...], int, int]] = [
        ({"x": EXAMPLES["FP32"]}, (), 0, 0),
        ({"x": EXAMPLES["FP32"][:1]}, (), 0, 0),  # same dtype, new shape
        ({"x": EXAMPLES["FP32"]}, ("y",), 10, tp.FLAG_TIMING),
        ({"x": EXAMPLES["BYTES"]}, (), 0, 0),
        ({"x": np.array([[b"longer one", b"", b""]], dtype=object)}, (), 0, 0),  # same shape, new size
    ]
    for rid, (inputs, outputs, timeout_us, flags) in enumerate(cases * 2, start=1):
        got = enc.encode(rid, "m", inputs, "2", outputs, timeout_us, flags)
        want = tp.encode_request(
            rid, "m", inputs, version="2", outputs=outputs, timeout_us=timeout_us, flags=flags
        )
        assert b"".join(bytes(p) for p in got) == b"".join(bytes(p) for p in want)


def test_response_encoder_writes_what_encode_response_writes() -> None:
    """Its short way for small plain arrays and its general way alike (strided, Fortran-order,
    big-endian, BYTES and non-array outputs take the general one)."""
    enc = tp.ResponseEncoder()
    outs = [("p", EXAMPLES["FP32"]), ("l", EXAMPLES["INT64"])]
    grid = np.arange(24, dtype=np.float32).reshape(4, 6)
    others = [
        [("s", grid[:, ::2])],  # strided: no simple buffer
        [("f", np.asfortranarray(grid))],
        [("b", grid.astype(">f4"))],  # big-endian: converted
        [("t", EXAMPLES["BYTES"])],
        [("v", [1.5, 2.5])],  # not an array
        [("p", EXAMPLES["FP32"] + 1)],  # same signature, other values
    ]
    cases = [(outs, None), (outs, [1, 2, 3, 4, 5, 6]), (outs[:1], None), *((o, None) for o in others)]
    for rid, (outputs, timing) in enumerate(cases * 2):
        got = enc.encode(rid, "m", 3, outputs, timing)
        want = tp.encode_response(rid, "m", 3, outputs, timing)
        assert b"".join(bytes(p) for p in got) == b"".join(bytes(p) for p in want)


def test_response_decoder_cache_ignores_timing_values() -> None:
    dec = tp.ResponseDecoder()
    outs = [("p", EXAMPLES["FP32"])]
    for t in ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], None):
        _, outputs, timing = dec.decode(one_frame(tp.encode_response(1, "m", 1, outs, t)))
        assert timing == ({} if t is None else dict(zip(tp.TIMING_FIELDS, t, strict=True)))
        assert_same(outputs["p"], EXAMPLES["FP32"])


# ---- framing -------------------------------------------------------------------------------------


def stream() -> tuple[bytes, list[int]]:
    parts = [
        request_frame({"x": EXAMPLES["FP32"]}),
        tp.encode_error(3, 400, "no"),
        request_frame({"s": EXAMPLES["BYTES"], "b": EXAMPLES["BOOL"]}),
    ]
    return b"".join(parts), [7, 3, 7]


@pytest.mark.parametrize("size", [1, 2, 5, 23, 24, 25, 100, 10_000])
def test_any_chunking_gives_the_same_frames(size: int) -> None:
    data, ids = stream()
    whole = frames_of(data)
    got: list[Frame] = []
    dec = FrameDecoder(got.append)
    for at in range(0, len(data), size):
        dec.feed(data[at : at + size])
    assert [f.request_id for f in got] == ids
    assert [(f.kind, f.meta, bytes(f.payload)) for f in got] == [
        (f.kind, f.meta, bytes(f.payload)) for f in whole
    ]
    assert dec.buffered_bytes == 0
    assert dec.frames == 3


def test_pause_holds_frames_until_resume() -> None:
    data, ids = stream()
    got: list[Frame] = []

    def on_frame(frame: Frame) -> None:
        got.append(frame)
        dec.pause()

    dec = FrameDecoder(on_frame)
    dec.feed(data)
    assert len(got) == 1 and dec.buffered_bytes == len(data) - len(request_frame({"x": EXAMPLES["FP32"]}))
    dec.feed(b"")  # more input while paused is held too
    assert len(got) == 1
    dec.resume()
    assert len(got) == 2
    dec.resume()
    assert [f.request_id for f in got] == ids
    assert dec.buffered_bytes == 0


def test_a_raising_callback_keeps_the_frames_after_it() -> None:
    data, ids = stream()
    got: list[Frame] = []

    def on_frame(frame: Frame) -> None:
        got.append(frame)
        if len(got) == 1:
            raise RuntimeError("boom")

    dec = FrameDecoder(on_frame)
    with pytest.raises(RuntimeError):
        dec.feed(data)
    dec.feed(b"")
    assert [f.request_id for f in got] == ids


# ---- malformed input: every error names the problem ----------------------------------------------


def header(
    *,
    magic: bytes = b"LRT",
    version: int = tp.VERSION,
    kind: int = tp.REQUEST,
    flags: int = 0,
    reserved: int = 0,
    rid: int = 1,
    meta: int = 0,
    payload: int = 0,
) -> bytes:
    return magic + struct.pack("<BBBHQII", version, kind, flags, reserved, rid, meta, payload)


def fatal(data: bytes, **limits: int) -> ProtocolError:
    dec = FrameDecoder(lambda f: None, **limits)
    with pytest.raises(ProtocolError) as info:
        dec.feed(data)
    assert info.value.fatal
    with pytest.raises(ProtocolError):  # stays broken
        dec.feed(b"")
    return info.value


def test_bad_magic_is_fatal() -> None:
    err = fatal(b"XYZ\x01" + bytes(20))
    assert "not a lumenrt frame" in err.message and "b'XYZ\\x01'" in err.message


def test_http_on_the_tcp_port_is_named() -> None:
    err = fatal(b"POST /v2/models/x/infer HTTP/1.1\r\n")
    assert "HTTP client" in err.message


def test_version_mismatch_names_both_versions() -> None:
    err = fatal(header(version=3))
    assert "protocol version 3 is not supported" in err.message and "speaks version 2" in err.message
    assert err.status == 400 and err.reply_version == 2


def test_an_older_version_is_answered_426_in_its_own_version() -> None:
    err = fatal(header(version=1))
    assert err.status == 426 and err.reply_version == 1
    frame = tp.encode_error(0, err.status, err.message, closing=True, version=err.reply_version)
    assert frame[:4] == b"LRT\x01"


def test_auth_frames_round_trip_and_bound_the_key() -> None:
    frame = tp.encode_auth(9, "k" * 20)
    kind, _, rid, meta_len, payload_len, _ = tp.read_header(frame, 0, 1 << 16, 1 << 20)
    assert (kind, rid, payload_len) == (tp.AUTH, 9, 0)
    assert tp.decode_auth(frame[24 : 24 + meta_len]) == b"k" * 20
    ok = tp.encode_auth_ok(9, "app")
    assert tp.decode_auth_ok(ok[24:]) == "app"
    with pytest.raises(tp.ProtocolError, match=r"key length must be 1\.\.4096"):
        tp.decode_auth(struct.pack("<H", 5000) + b"x" * 5000)
    with pytest.raises(tp.ProtocolError, match="ends inside key"):
        tp.decode_auth(struct.pack("<H", 10) + b"x" * 3)
    with pytest.raises(tp.ProtocolError, match=r"API key must be 1\.\.4096 bytes"):
        tp.encode_auth(1, "")


def test_reserved_field_must_be_zero_outside_requests() -> None:
    assert "reserved header field is 5" in fatal(header(kind=tp.RESPONSE, reserved=5)).message


def test_a_request_carries_its_priority_in_the_reserved_field() -> None:
    frames: list[Frame] = []
    parts = tp.encode_request(7, "m", {"x": np.zeros(2, np.float32)}, priority=3)
    FrameDecoder(frames.append).feed(b"".join(bytes(p) for p in parts))
    assert [(f.request_id, f.priority) for f in frames] == [(7, 3)]
    with pytest.raises(ValueError, match=r"priority must be in 0\.\.65535"):
        tp.encode_request(8, "m", {"x": np.zeros(2, np.float32)}, priority=1 << 16)


def test_oversize_frame_is_refused_from_its_header_alone() -> None:
    err = fatal(header(rid=77, meta=10, payload=10_000_000), max_frame_bytes=1 << 20)
    assert (err.status, err.request_id) == (413, 77)
    assert "10000010 bytes" in err.message and str(1 << 20) in err.message


def test_oversize_metadata_is_refused_from_its_header_alone() -> None:
    err = fatal(header(rid=3, meta=70_000), max_meta_bytes=65_536)
    assert (err.status, err.request_id) == (431, 3)
    assert "70000 bytes" in err.message and "65536" in err.message


def test_frames_before_a_broken_one_are_delivered() -> None:
    got: list[Frame] = []
    dec = FrameDecoder(got.append)
    with pytest.raises(ProtocolError):
        dec.feed(tp.encode_error(1, 400, "x") + b"garbage-garbage-garbage-")
    assert [f.request_id for f in got] == [1]


def meta_error(meta: bytes) -> str:
    with pytest.raises(ProtocolError) as info:
        tp.decode_request_meta(meta)
    assert not info.value.fatal and info.value.status == 400
    return info.value.message


def text(s: bytes) -> bytes:
    return bytes([len(s)]) + s


def desc(name: bytes = b"x", code: int = 11, shape: tuple[int, ...] = (2,), size: int = 8) -> bytes:
    return (
        text(name)
        + bytes([code, len(shape)])
        + struct.pack(f"<{len(shape)}Q", *shape)
        + struct.pack("<I", size)
    )


def request_meta(inputs: bytes = desc(), count: int = 1, tail: bytes = b"\x00") -> bytes:
    return text(b"model") + text(b"") + struct.pack("<I", 0) + bytes([count]) + inputs + tail


def test_a_valid_hand_built_request_metadata_decodes() -> None:
    meta = tp.decode_request_meta(request_meta())
    assert meta.inputs == (tp.TensorDesc("x", "FP32", (2,), 8),)


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (b"", "ends inside the length of the model name"),
        (text(b""), "the model name is empty"),
        (b"\x05mod", "ends inside the model name: needs 5 bytes at offset 1, 3 remain"),
        (text(b"\xff\xfe"), "the model name is not valid UTF-8"),
        (text(b"m") + text(b""), "ends inside the timeout"),
        (text(b"m") + text(b"") + bytes(4), "ends inside the input count"),
        (request_meta(inputs=b"", count=1, tail=b""), "ends inside the length of input 0 name"),
        (request_meta(inputs=desc(code=0)), "input 0 'x': datatype code 0 is not valid"),
        (request_meta(inputs=desc(code=99)), "datatype code 99 is not valid (valid: 1=BOOL, 2=UINT8"),
        (request_meta(inputs=text(b"x") + bytes([11, 33])), "rank 33 is over the limit of 32"),
        (request_meta(inputs=text(b"x") + bytes([11, 2]) + bytes(8)), "ends inside input 0 'x' shape"),
        (
            request_meta(inputs=desc(shape=(2**63,), size=0)),
            "dimension 9223372036854775808 is over the int64 range",
        ),
        (request_meta(inputs=desc(size=9)), "9 bytes of data but shape [2] of FP32 needs 8 bytes"),
        (
            request_meta(inputs=desc(code=13, shape=(3,), size=11)),
            "11 bytes of data cannot hold 3 BYTES elements",
        ),
        (request_meta(tail=b""), "ends inside the output count"),
        (request_meta(tail=b"\x01"), "ends inside the length of output name 0"),
        (request_meta(tail=b"\x00zz"), "2 bytes left over"),
    ],
)
def test_malformed_request_metadata_names_the_problem(meta: bytes, expected: str) -> None:
    assert expected in meta_error(meta)


def payload_error(datatype_code: int, shape: tuple[int, ...], data: bytes) -> str:
    meta = tp.decode_request_meta(request_meta(inputs=desc(code=datatype_code, shape=shape, size=len(data))))
    with pytest.raises(ProtocolError) as info:
        raw.split_payload(data, 0, meta.slots, "input", ProtocolError)
    return info.value.message


@pytest.mark.parametrize(
    ("code", "shape", "data", "expected"),
    [
        (13, (2,), struct.pack("<I", 1) + b"a" + struct.pack("<I", 9) + b"bc", "BYTES element 1 claims 9 bytes but only 2 remain"),
        (13, (1,), struct.pack("<I", 1) + b"abcd", "3 bytes left over after 1 BYTES elements"),
        (13, (2,), struct.pack("<I", 2) + b"ab" + b"\x00\x00\x00", "BYTES data ends inside the length of element 1 of 2"),
        (1, (3,), b"\x00\x01\x02", "BOOL data must be bytes 0 or 1"),
        (11, (0, 2**62, 4), b"", "shape [0, 4611686018427387904, 4] is not usable"),
    ],
)  # fmt: skip
def test_malformed_tensor_data_names_the_problem(
    code: int, shape: tuple[int, ...], data: bytes, expected: str
) -> None:
    message = payload_error(code, shape, data)
    assert expected in message
    assert "input 'x'" in message


def test_malformed_response_and_error_metadata() -> None:
    with pytest.raises(ProtocolError, match="timing field count: it is empty"):
        tp.ResponseDecoder().decode(Frame(tp.RESPONSE, 0, 1, b"", b"", 0, 0))
    with pytest.raises(ProtocolError, match="ends inside its 6 timing fields"):
        tp.decode_timing(b"\x06" + bytes(10))
    with pytest.raises(ProtocolError, match="shorter than its 2-byte status"):
        tp.decode_error(b"\x01")
    frame = one_frame(tp.encode_response(1, "m", 1, [("y", EXAMPLES["FP32"])]))
    frame.payload_bytes -= 4
    with pytest.raises(ProtocolError, match="response payload is 44 bytes but its outputs total 48"):
        tp.ResponseDecoder().decode(frame)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: tp.encode_request(1, "", {}), "model name must be 1..255 bytes"),
        (lambda: tp.encode_request(1, "m" * 256, {}), "model name must be 1..255 bytes of UTF-8, got 256"),
        (lambda: tp.encode_request(1, "m", {"x": np.zeros(2, np.complex64)}), "has no KServe V2 datatype"),
        (lambda: tp.encode_request(1, "m", {"x": np.zeros([1] * 33)}), "rank 33 is over the limit of 32"),
        (lambda: tp.encode_request(1, "m", {}, timeout_us=-1), "timeout_us must be in 0.."),
        (lambda: tp.encode_request(1, "m", {f"i{i}": [1] for i in range(256)}), "at most 255 inputs"),
    ],
)
def test_what_cannot_be_sent_is_a_value_error(call: Callable[[], Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(".", r"\.")):
        call()


def test_cached_encoders_join_small_frames_and_keep_large_tensors_as_views() -> None:
    small = tp.RequestEncoder().encode(1, "m", {"x": EXAMPLES["FP32"]}, "", (), 0, 0)
    assert len(small) == 1
    big_array = np.zeros(tp.JOIN_BELOW_BYTES // 4, np.float32)
    big = tp.ResponseEncoder().encode(1, "m", 1, [("y", big_array)])
    assert len(big) == 2 and isinstance(big[1], memoryview)  # no copy of the tensor
    assert b"".join(bytes(p) for p in big) == b"".join(
        bytes(p) for p in tp.encode_response(1, "m", 1, [("y", big_array)])
    )
