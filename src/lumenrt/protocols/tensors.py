"""Tensor descriptions and V2 JSON tensor data, shared by every front end (no I/O).

``check_datatype`` and ``check_shape`` check what a request says about a tensor (HTTP, gRPC, the
TCP protocol); ``from_json`` and ``to_json_data`` are the V2 JSON ``data`` field. The raw form is
:mod:`lumenrt.protocols.raw`.

Every check happens before anything is allocated in proportion to a size the client claims: the
shape is checked against ``max_elements`` before any data is read.
"""

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lumenrt.protocols import dtypes
from lumenrt.protocols.errors import ServerError, bad_request
from lumenrt.protocols.raw import Array, as_bytes

DEFAULT_MAX_ELEMENTS = 1 << 26  # elements in one tensor (64 Mi; 256 MiB of FP32)


def check_datatype(datatype: Any, where: str) -> str:
    if not isinstance(datatype, str) or not dtypes.is_valid(datatype):
        raise bad_request(
            f"{where}: datatype {datatype!r} is not a V2 datatype (valid: {', '.join(dtypes.DATATYPES)})"
        )
    return datatype


def check_shape(shape: Any, where: str, max_elements: int = DEFAULT_MAX_ELEMENTS) -> tuple[int, ...]:
    """A shape as a tuple of non-negative ints whose product is at most ``max_elements``, and none
    of them larger (an empty tensor of dims like 2**40 holds nothing but cannot be made)."""
    if not isinstance(shape, (list, tuple)):
        raise bad_request(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    dims: list[int] = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise bad_request(f"{where}: shape must be a list of non-negative integers, got {list(shape)!r}")
        dims.append(d)
    count = math.prod(dims)
    if count > max_elements or (dims and max(dims) > max_elements):
        raise ServerError(
            400,
            f"{where}: shape {dims} has {count} elements"
            + (f" and a dimension of {max(dims)}" if count <= max_elements else "")
            + f", over the limit of {max_elements} per tensor",
        )
    return tuple(dims)


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
        return [as_bytes(x).decode("utf-8", "replace") for x in array.reshape(-1)]
    values: list[Any] = array.reshape(-1).tolist()
    return values
