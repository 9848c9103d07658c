"""Tensor codecs shared by every front end: V2 JSON data, raw little-endian bytes, BYTES.

Raw form (the binary tensor extension, gRPC ``raw_input_contents``, the TCP protocol): row-major,
little-endian, no padding; BOOL is one byte 0/1; a BYTES element is a 4-byte little-endian
unsigned length followed by that many bytes.

Every check happens before anything is allocated in proportion to a size the client claims: the
shape is checked against ``max_elements`` and its byte size against the bytes actually received,
and only then is an array made (a zero-copy view for fixed-size types).
"""

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from lumenrt.engine.request import Array
from lumenrt.protocols import dtypes
from lumenrt.server.errors import ServerError, bad_request

DEFAULT_MAX_ELEMENTS = 1 << 26  # elements in one tensor (64 Mi; 256 MiB of FP32)
_LEN = struct.Struct("<I")


def check_datatype(datatype: Any, where: str) -> str:
    if not isinstance(datatype, str) or not dtypes.is_valid(datatype):
        raise bad_request(
            f"{where}: datatype {datatype!r} is not a V2 datatype (valid: {', '.join(dtypes.DATATYPES)})"
        )
    return datatype


def check_shape(shape: Any, where: str, max_elements: int = DEFAULT_MAX_ELEMENTS) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints whose product is at most ``max_elements``."""
    if not isinstance(shape, (list, tuple)):
        raise bad_request(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    dims: list[int] = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise bad_request(f"{where}: shape must be a list of non-negative integers, got {list(shape)!r}")
        dims.append(d)
    count = math.prod(dims)
    if count > max_elements:
        raise ServerError(
            400, f"{where}: shape {dims} has {count} elements, over the limit of {max_elements} per tensor"
        )
    return tuple(dims)


def raw_size_bytes(datatype: str, shape: tuple[int, ...]) -> int | None:
    """Bytes of a fixed-size tensor in raw form; None for BYTES (variable)."""
    size = dtypes.element_size_bytes(datatype)
    return None if size is None else size * math.prod(shape)


# ---- raw bytes -> array ---------------------------------------------------------------------------


def from_raw(buf: bytes | bytearray | memoryview, datatype: str, shape: tuple[int, ...], where: str) -> Array:
    """An array over ``buf`` (no copy for fixed-size types: the array keeps ``buf`` alive)."""
    if datatype == "BYTES":
        return _bytes_from_raw(memoryview(buf), shape, where)
    want = raw_size_bytes(datatype, shape)
    if len(buf) != want:
        raise bad_request(
            f"{where}: {len(buf)} bytes of data but shape {list(shape)} of {datatype} needs {want} bytes"
        )
    dt = dtypes.to_numpy(datatype).newbyteorder("<")
    array: Array = np.frombuffer(buf, dtype=dt).reshape(shape)
    if datatype == "BOOL" and len(buf) and int(np.frombuffer(buf, dtype=np.uint8).max()) > 1:
        raise bad_request(f"{where}: BOOL data must be bytes 0 or 1")
    if not dt.isnative:
        array = array.astype(dt.newbyteorder("="))
    return array


def _bytes_from_raw(view: memoryview, shape: tuple[int, ...], where: str) -> Array:
    count = math.prod(shape)
    if count * 4 > len(view):  # each element takes at least its 4-byte length
        raise bad_request(
            f"{where}: {len(view)} bytes of data cannot hold {count} BYTES elements (4-byte length each)"
        )
    out = np.empty(count, dtype=object)
    at = 0
    end = len(view)
    for i in range(count):
        if at + 4 > end:
            raise bad_request(f"{where}: BYTES data ends inside the length of element {i} of {count}")
        (n,) = _LEN.unpack_from(view, at)
        at += 4
        if at + n > end:
            raise bad_request(f"{where}: BYTES element {i} claims {n} bytes but only {end - at} remain")
        out[i] = bytes(view[at : at + n])
        at += n
    if at != end:
        raise bad_request(f"{where}: {end - at} bytes left over after {count} BYTES elements")
    return out.reshape(shape)


# ---- array -> raw bytes ---------------------------------------------------------------------------


def to_raw(array: Array) -> bytes | memoryview:
    """The raw form of ``array`` (a view when it is already contiguous little-endian)."""
    if array.dtype.kind in "OSU":
        return bytes_to_raw(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    contiguous = np.ascontiguousarray(array)
    return contiguous.data.cast("B")


def bytes_to_raw(array: Array) -> bytes:
    parts: list[bytes] = []
    for item in array.reshape(-1):
        b = _as_bytes(item)
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    return str(item).encode()


# ---- V2 JSON data <-> array -----------------------------------------------------------------------


def from_json(data: Any, datatype: str, shape: tuple[int, ...], where: str) -> Array:
    """An array from a V2 JSON ``data`` field, flat or nested, checked against ``shape``."""
    count = math.prod(shape)
    if not isinstance(data, list):
        data = [data]
    flat = _flatten(data, where)
    if len(flat) != count:
        raise bad_request(f"{where}: {len(flat)} data elements but shape {list(shape)} needs {count}")
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        for i, item in enumerate(flat):
            if isinstance(item, str):
                out[i] = item.encode()
            else:
                raise bad_request(f"{where}: BYTES data element {i} must be a string, got {item!r}")
        return out.reshape(shape)
    dt = dtypes.to_numpy(datatype)
    for i, item in enumerate(flat):
        ok = isinstance(item, bool) if datatype == "BOOL" else _is_number(item, dt.kind)
        if not ok:
            raise bad_request(f"{where}: data element {i} ({item!r}) is not a valid {datatype}")
    try:
        array = np.array(flat, dtype=dt)
    except (OverflowError, ValueError) as exc:
        raise bad_request(f"{where}: data does not fit {datatype}: {exc}") from None
    return array.reshape(shape)


def _is_number(item: Any, kind: str) -> bool:
    if isinstance(item, bool):
        return False
    if kind == "f":
        return isinstance(item, (int, float))
    return isinstance(item, int)


def _flatten(data: Sequence[Any], where: str) -> list[Any]:
    if not any(isinstance(x, list) for x in data):
        return list(data)
    out: list[Any] = []
    stack: list[Any] = [iter(data)]
    depth_limit = 64
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= depth_limit:
                    raise bad_request(f"{where}: data nested deeper than {depth_limit} levels")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def to_json_data(array: Array) -> list[Any]:
    """A flat list for a V2 JSON ``data`` field (BYTES as UTF-8 text; invalid bytes replaced)."""
    if array.dtype.kind in "OSU":
        return [_as_bytes(x).decode("utf-8", "replace") for x in array.reshape(-1)]
    values: list[Any] = array.reshape(-1).tolist()
    return values
