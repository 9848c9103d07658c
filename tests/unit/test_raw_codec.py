"""The one raw tensor codec (``lumenrt.protocols.raw``) that HTTP, gRPC, the TCP protocol and the
clients share: every datatype round-trips, and broken bytes get the same message on every
protocol, raised as that protocol's error."""

import struct
from collections.abc import Callable

import numpy as np
import pytest

from lumenrt.protocols import dtypes, raw
from lumenrt.protocols.errors import ServerError, bad_request
from lumenrt.protocols.tcp import ProtocolError

EXAMPLES = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.arange(6, dtype=np.uint8).reshape(2, 3),
    "UINT16": np.array([0, 65535], dtype=np.uint16),
    "UINT32": np.array([1, 2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([2**64 - 1], dtype=np.uint64),
    "INT8": np.array([-128, 127], dtype=np.int8),
    "INT16": np.array([-1, 2], dtype=np.int16),
    "INT32": np.array([[-1], [5]], dtype=np.int32),
    "INT64": np.array([-(2**63)], dtype=np.int64),
    "FP16": np.array([0.5, -2.0], dtype=np.float16),
    "FP32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "FP64": np.array([np.pi], dtype=np.float64),
    "BYTES": np.array([b"", b"ab", "ü".encode()], dtype=object),
}

# Each protocol's error type: HTTP and gRPC answer a 400 ServerError, the TCP protocol a ProtocolError.
ERROR_TYPES: dict[str, Callable[[str], Exception]] = {"http-grpc": bad_request, "tcp": ProtocolError}


@pytest.fixture(params=sorted(ERROR_TYPES))
def error(request: pytest.FixtureRequest) -> Callable[[str], Exception]:
    return ERROR_TYPES[str(request.param)]


def message_of(exc: BaseException) -> str:
    assert isinstance(exc, (ServerError, ProtocolError)) and exc.status == 400
    return exc.message


def test_examples_cover_every_datatype() -> None:
    assert sorted(EXAMPLES) == sorted(dtypes.DATATYPES)


@pytest.mark.parametrize("datatype", sorted(EXAMPLES))
def test_every_datatype_round_trips(datatype: str, error: Callable[[str], Exception]) -> None:
    array = EXAMPLES[datatype]
    got_datatype, data = raw.to_raw(array)
    assert got_datatype == datatype
    back = raw.from_raw(data, datatype, array.shape, "x", error)
    assert back.shape == array.shape and back.tolist() == array.tolist()
    if datatype != "BYTES":
        assert back.dtype == array.dtype


def test_payload_of_several_tensors_splits_into_views(error: Callable[[str], Exception]) -> None:
    arrays = [EXAMPLES["FP32"], EXAMPLES["BYTES"], EXAMPLES["BOOL"]]
    parts = [raw.to_raw(a) for a in arrays]
    payload = b"prefix" + b"".join(bytes(data) for _, data in parts)
    slots = raw.payload_slots(
        (f"t{i}", datatype, a.shape, len(bytes(data)))
        for i, (a, (datatype, data)) in enumerate(zip(arrays, parts, strict=True))
    )
    got = raw.split_payload(payload, len(b"prefix"), slots, "input", error)
    assert [g.tolist() for g in got] == [a.tolist() for a in arrays]
    assert got[0].base is not None and not got[0].flags.writeable  # a view of the payload, no copy


def test_small_arrays_are_copied_and_large_contiguous_ones_viewed() -> None:
    small = np.zeros(raw.SMALL_COPY_BYTES // 4, np.float32)
    large = np.zeros(raw.SMALL_COPY_BYTES // 4 + 1, np.float32)
    assert isinstance(raw.to_raw(small)[1], bytes)
    view = raw.to_raw(large)[1]
    assert isinstance(view, memoryview) and view.nbytes == large.nbytes
    strided = np.zeros((4, 2048), np.float32)[:, ::2]
    assert raw.to_raw(strided)[1] == np.ascontiguousarray(strided).tobytes()


def test_big_endian_and_str_arrays_are_converted() -> None:
    big = np.array([1.5, -2.0], dtype=">f4")
    assert raw.to_raw(big) == ("FP32", struct.pack("<2f", 1.5, -2.0))
    assert raw.to_raw(np.array(["ab", "c"])) == (
        "BYTES",
        struct.pack("<I", 2) + b"ab" + struct.pack("<I", 1) + b"c",
    )


def test_dtype_without_a_v2_datatype_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="has no KServe V2 datatype"):
        raw.to_raw(np.zeros(2, np.complex64))


BROKEN = [
    ("FP32", (2,), bytes(7), "x: 7 bytes of data but shape [2] of FP32 needs 8 bytes"),
    ("BOOL", (3,), b"\x00\x01\x02", "x: BOOL data must be bytes 0 or 1"),
    ("FP32", (0, 2**62, 4), b"", "x: shape [0, 4611686018427387904, 4] is not usable"),
    ("BYTES", (3,), bytes(11), "x: 11 bytes of data cannot hold 3 BYTES elements (4-byte length each)"),
    ("BYTES", (2,), struct.pack("<I", 1) + b"a" + struct.pack("<I", 9) + b"bc", "x: BYTES element 1 claims 9 bytes but only 2 remain"),
    ("BYTES", (2,), struct.pack("<I", 2) + b"ab" + b"\x00\x00\x00", "x: BYTES data ends inside the length of element 1 of 2"),
    ("BYTES", (1,), struct.pack("<I", 1) + b"abcd", "x: 3 bytes left over after 1 BYTES elements"),
    ("FP99", (1,), bytes(4), "x: datatype 'FP99' is not a V2 datatype"),
]  # fmt: skip


@pytest.mark.parametrize(("datatype", "shape", "data", "expected"), BROKEN)
def test_broken_bytes_get_one_message_on_every_protocol(
    datatype: str, shape: tuple[int, ...], data: bytes, expected: str, error: Callable[[str], Exception]
) -> None:
    with pytest.raises((ServerError, ProtocolError)) as info:
        raw.from_raw(data, datatype, shape, "x", error)
    assert type(info.value) is type(error("probe"))
    assert message_of(info.value).startswith(expected)


def test_check_size_bounds_claimed_sizes(error: Callable[[str], Exception]) -> None:
    raw.check_size("FP32", (2, 3), 24, "x", error)
    raw.check_size("BYTES", (2,), 8, "x", error)
    with pytest.raises((ServerError, ProtocolError), match="needs 24 bytes"):
        raw.check_size("FP32", (2, 3), 25, "x", error)
    with pytest.raises((ServerError, ProtocolError), match="cannot hold 3 BYTES elements"):
        raw.check_size("BYTES", (3,), 11, "x", error)
