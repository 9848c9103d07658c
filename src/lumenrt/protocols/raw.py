"""The raw tensor codec: numpy arrays <-> their raw bytes, one implementation for every protocol.

Raw form (the V2 HTTP binary tensor extension, gRPC ``raw_input_contents`` and
``raw_output_contents``, the TCP protocol's payload): row-major, little-endian, no padding; BOOL is
one byte 0/1; a BYTES element is a 4-byte little-endian unsigned length followed by that many bytes.

Used by ``lumenrt.ingress.v2_http`` (HTTP bodies), ``lumenrt.ingress.grpc_server``,
``lumenrt.protocols.tcp`` (frames, server and client side) and ``lumenrt.client.http``.

Errors: every check names the field (``where``) and raises ``error(message)``, the caller's
exception type (``bad_request`` for HTTP and gRPC: a 400 ``ServerError``; ``ProtocolError`` for
the TCP protocol), so each protocol keeps its own error type and every protocol says the same
thing about the same bytes.

Bounds: nothing is allocated in proportion to a size the peer claims before that size was checked
against the bytes actually received (a BYTES tensor of n elements takes at least 4n bytes).

Copies: decoding a fixed-size tensor makes none (the array is a read-only view of the received
buffer and keeps it alive); encoding makes at most one (see ``SMALL_COPY_BYTES``).
"""

import math
import struct
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from lumenrt.protocols import dtypes

Array = npt.NDArray[Any]
ErrorType = Callable[[str], Exception]  # builds the caller's exception from a message

# Arrays of at most this many bytes are encoded as a copy (``tobytes``), larger contiguous ones as
# a view. Measured on the 2-core dev VM (numpy 2.4): 40 bytes, tobytes 107 ns vs a memoryview
# 373 ns; 4096 bytes, 285 vs 289 ns; 64 KiB, 2,056 vs 319 ns.
SMALL_COPY_BYTES = 4096

_LEN = struct.Struct("<I")  # a BYTES element's length prefix
_LITTLE = sys.byteorder == "little"

# V2 datatype -> its little-endian numpy dtype (fixed-size datatypes only), and back. On a
# little-endian host a native dtype equals (and hashes as) its little-endian form.
LE_DTYPES: dict[str, np.dtype[Any]] = {
    name: dtypes.to_numpy(name).newbyteorder("<") for name in dtypes.DATATYPES if name != "BYTES"
}
_DATATYPE_OF: dict[np.dtype[Any], str] = {dt: name for name, dt in LE_DTYPES.items()}


class TensorSlot(NamedTuple):
    """Where one tensor lies in a buffer of tensors laid end to end, and how to view it (made once
    per signature by :func:`payload_slots`, then reused for every message of that signature)."""

    name: str
    dtype: np.dtype[Any] | None  # little-endian; None: BYTES
    shape: tuple[int, ...]
    offset: int  # from the first tensor's start
    elements: int
    byte_size: int
    is_bool: bool
    reshape: bool  # the shape is not simply (elements,)


# ---- sizes -----------------------------------------------------------------------------------------


def check_size(datatype: str, shape: tuple[int, ...], byte_size: int, where: str, error: ErrorType) -> None:
    """``byte_size`` bytes can hold ``shape`` of ``datatype``: exactly for a fixed-size datatype,
    at least 4 bytes per element (its length) for BYTES."""
    dt = LE_DTYPES.get(datatype)
    count = math.prod(shape)
    if dt is None:
        if count * 4 > byte_size:
            raise error(_too_few_for_bytes(where, byte_size, count))
    elif byte_size != dt.itemsize * count:
        raise error(_wrong_size(where, byte_size, shape, datatype, dt.itemsize * count))


def _wrong_size(where: str, got: int, shape: tuple[int, ...], datatype: str, want: int) -> str:
    return f"{where}: {got} bytes of data but shape {list(shape)} of {datatype} needs {want} bytes"


def _too_few_for_bytes(where: str, got: int, count: int) -> str:
    return f"{where}: {got} bytes of data cannot hold {count} BYTES elements (4-byte length each)"


# ---- raw bytes -> array ----------------------------------------------------------------------------


def from_raw(
    buf: bytes | bytearray | memoryview, datatype: str, shape: tuple[int, ...], where: str, error: ErrorType
) -> Array:
    """One tensor over ``buf``, which must hold exactly its bytes (no copy for fixed-size types:
    the array keeps ``buf`` alive)."""
    dt = LE_DTYPES.get(datatype)
    if dt is None:
        if datatype == "BYTES":
            return bytes_from_raw(memoryview(buf), shape, where, error)
        raise error(f"{where}: datatype {datatype!r} is not a V2 datatype")
    count = math.prod(shape)
    if len(buf) != dt.itemsize * count:
        raise error(_wrong_size(where, len(buf), shape, datatype, dt.itemsize * count))
    try:
        array: Array = np.frombuffer(buf, dt, count).reshape(shape)
    except ValueError as exc:
        raise error(f"{where}: shape {list(shape)} is not usable: {exc}") from None
    if datatype == "BOOL" and count and int(array.view(np.uint8).max()) > 1:
        raise error(f"{where}: BOOL data must be bytes 0 or 1")
    if not _LITTLE and dt.itemsize > 1:  # pragma: no cover - big-endian hosts
        array = array.astype(dt.newbyteorder("="))
    return array


def payload_slots(tensors: Iterable[tuple[str, str, tuple[int, ...], int]]) -> tuple[TensorSlot, ...]:
    """The slots of tensors (name, datatype, shape, byte size) laid end to end, in order. The byte
    sizes must already have passed :func:`check_size`."""
    slots: list[TensorSlot] = []
    at = 0
    for name, datatype, shape, byte_size in tensors:
        dt = LE_DTYPES.get(datatype)
        count = byte_size // dt.itemsize if dt is not None else math.prod(shape)
        slots.append(TensorSlot(name, dt, shape, at, count, byte_size, datatype == "BOOL", shape != (count,)))
        at += byte_size
    return tuple(slots)


def split_payload(
    data: bytes | bytearray | memoryview, at: int, slots: Sequence[TensorSlot], kind: str, error: ErrorType
) -> list[Array]:
    """The arrays of the tensors starting at ``data[at]`` (which the caller checked holds all the
    slots' bytes), in slot order: views of ``data`` for fixed-size types (no copy). Errors name
    the tensor as ``{kind} {name!r}``."""
    arrays: list[Array] = []
    for s in slots:
        dt = s.dtype
        if dt is None:
            start = at + s.offset
            arrays.append(
                bytes_from_raw(
                    memoryview(data)[start : start + s.byte_size], s.shape, f"{kind} {s.name!r}", error
                )
            )
            continue
        try:
            array: Array = np.frombuffer(data, dt, s.elements, at + s.offset)
            if s.reshape:
                array = array.reshape(s.shape)
        except ValueError as exc:
            raise error(f"{kind} {s.name!r}: shape {list(s.shape)} is not usable: {exc}") from None
        if s.is_bool and s.elements and int(array.view(np.uint8).max()) > 1:
            raise error(f"{kind} {s.name!r}: BOOL data must be bytes 0 or 1")
        if not _LITTLE and dt.itemsize > 1:  # pragma: no cover - big-endian hosts
            array = array.astype(dt.newbyteorder("="))
        arrays.append(array)
    return arrays


def bytes_from_raw(view: memoryview, shape: tuple[int, ...], where: str, error: ErrorType) -> Array:
    """A BYTES tensor (an object array of ``bytes``) from its raw form, which ``view`` holds exactly."""
    count = math.prod(shape)
    end = len(view)
    if count * 4 > end:
        raise error(_too_few_for_bytes(where, end, count))
    out = np.empty(count, dtype=object)  # count <= end / 4: bounded by the bytes received
    at = 0
    for i in range(count):
        if at + 4 > end:
            raise error(f"{where}: BYTES data ends inside the length of element {i} of {count}")
        (n,) = _LEN.unpack_from(view, at)
        at += 4
        if at + n > end:
            raise error(f"{where}: BYTES element {i} claims {n} bytes but only {end - at} remain")
        out[i] = bytes(view[at : at + n])
        at += n
    if at != end:
        raise error(f"{where}: {end - at} bytes left over after {count} BYTES elements")
    try:
        return out.reshape(shape)
    except ValueError as exc:
        raise error(f"{where}: shape {list(shape)} is not usable: {exc}") from None


# ---- array -> raw bytes ----------------------------------------------------------------------------


def to_raw(array: Array) -> tuple[str, bytes | memoryview]:
    """The V2 datatype and raw bytes of ``array``: a view when it is C-contiguous little-endian and
    over ``SMALL_COPY_BYTES``, else one copy. Object, bytes and str arrays travel as BYTES.
    Raises ValueError for a dtype with no V2 datatype."""
    dt = array.dtype
    datatype = _DATATYPE_OF.get(dt)
    if datatype is None:
        if dt.kind in "OSU":
            return "BYTES", bytes_to_raw(array)
        try:
            datatype = dtypes.from_numpy(dt)  # big-endian or otherwise non-native: converted
        except ValueError as exc:
            raise ValueError(f"{exc} (V2 datatypes: {', '.join(dtypes.DATATYPES)})") from None
        array = array.astype(LE_DTYPES[datatype])
    if array.nbytes <= SMALL_COPY_BYTES or not array.flags.c_contiguous:
        return datatype, array.tobytes()
    return datatype, array.data.cast("B")


def bytes_to_raw(array: Array) -> bytes:
    """The raw form of a BYTES tensor: each element's 4-byte length, then its bytes."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        b = item if isinstance(item, bytes) else as_bytes(item)
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def as_bytes(item: Any) -> bytes:
    """One BYTES element as bytes (str as UTF-8; anything else by its ``str``)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return str(item).encode()
