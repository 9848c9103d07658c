"""KServe V2 datatype names and their numpy dtypes.

The wire contract (Open Inference Protocol) names tensor types BOOL, UINT8..UINT64, INT8..INT64,
FP16, FP32, FP64 and BYTES. BYTES tensors hold variable-length byte strings: numpy object arrays
here, with no fixed element size. BF16 is a KServe name too, but numpy has no such dtype, so it is
not offered. Triton's model-config spelling (``TYPE_FP32``, ``TYPE_STRING`` for BYTES) is accepted
by :func:`normalize` so that a Triton config reads unchanged.
"""

from typing import Any

import numpy as np
import numpy.typing as npt

_TO_NUMPY: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

DATATYPES: tuple[str, ...] = tuple(_TO_NUMPY)

# (numpy kind, item size) -> name; byte order is not part of the key (the codecs own endianness)
_FROM_NUMPY: dict[tuple[str, int], str] = {
    (dt.kind, dt.itemsize): name for name, dt in _TO_NUMPY.items() if name != "BYTES"
}
_BYTES_KINDS = frozenset("OSU")  # object, bytes_, str_ arrays all travel as BYTES

_TRITON_ALIASES = {"TYPE_STRING": "BYTES"}


def is_valid(name: str) -> bool:
    """True for a KServe V2 datatype name offered here (exact, upper case)."""
    return name in _TO_NUMPY


def normalize(name: str) -> str:
    """The KServe V2 name for ``name``, which may also be in Triton's form (``TYPE_FP32``).
    Raises ValueError listing the valid names."""
    if name in _TO_NUMPY:
        return name
    if name in _TRITON_ALIASES:
        return _TRITON_ALIASES[name]
    if name.startswith("TYPE_") and name[5:] in _TO_NUMPY:
        return name[5:]
    raise ValueError(f"unknown datatype {name!r} (valid: {', '.join(DATATYPES)})")


def to_numpy(name: str) -> np.dtype[Any]:
    """The numpy dtype of a KServe V2 datatype (np.object_ for BYTES)."""
    try:
        return _TO_NUMPY[name]
    except KeyError:
        raise ValueError(f"unknown datatype {name!r} (valid: {', '.join(DATATYPES)})") from None


def from_numpy(dtype: npt.DTypeLike) -> str:
    """The KServe V2 name of a numpy dtype; object, bytes and str dtypes are BYTES."""
    dt = np.dtype(dtype)
    if dt.kind in _BYTES_KINDS:
        return "BYTES"
    try:
        return _FROM_NUMPY[(dt.kind, dt.itemsize)]
    except KeyError:
        raise ValueError(f"numpy dtype {dt} has no KServe V2 datatype") from None


def element_size_bytes(name: str) -> int | None:
    """Bytes per element of a fixed-size datatype; None for BYTES (variable length)."""
    dt = to_numpy(name)
    return None if dt.kind == "O" else dt.itemsize
