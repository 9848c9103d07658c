"""How one request's tensors sit in an arena slot, in both worker pools.

    [header: counts, status, stage times, per tensor offset/nbytes/shape][error text][tensors...]

Ingress writes the inputs (its one copy), or finds them already there when the front end received
the tensor bytes straight into the slot (``received_payload``, ``adopt_inputs``: HTTP bodies);
a worker reads them in place (numpy views, no copy). For
a worker process, ingress also writes the header entries; the worker writes the outputs after the
inputs and records their shapes, stage times and status; the engine copies the outputs out. A
worker thread is handed the views instead and answers with the model's own arrays, so the thread
pool writes no header. The slot is freed when the request's record is released (runtime.py).
Offsets are 64-byte aligned, except inputs received in place: those keep their wire offsets
(aligned to their element size).
"""

import struct
from typing import Any

import numpy as np

from lumenrt.engine.config import ModelConfig
from lumenrt.engine.request import Array
from lumenrt.protocols.dtypes import to_numpy

MAX_TENSORS = 16
MAX_DIMS = 8
HEADER_DTYPE = np.dtype(
    [
        ("n_inputs", "<u4"),
        ("n_outputs", "<u4"),
        ("status", "<u4"),
        ("error_bytes", "<u4"),
        ("dequeued_ns", "<u8"),
        ("compute_start_ns", "<u8"),
        ("compute_end_ns", "<u8"),
        ("batch_rows", "<u8"),
        ("offset", "<u8", (MAX_TENSORS,)),
        ("nbytes", "<u8", (MAX_TENSORS,)),
        ("ndim", "<u4", (MAX_TENSORS,)),
        ("shape", "<i8", (MAX_TENSORS, MAX_DIMS)),
    ]
)
ERROR_AT = (HEADER_DTYPE.itemsize + 63) & ~63
# The same fields read and written with struct, on the path of every request (ingress describing
# the inputs, the worker process its answer, the loop reading it): a few hundred ns a field,
# where ``header`` costs ~1 µs to make and ~1 µs a field (write_outputs of one small output took
# 10 µs through it, 2 µs with struct). ``header`` stays for tests and inspection.
_COUNTS = struct.Struct("<II")  # n_inputs, n_outputs
_HEAD = struct.Struct("<IIII")  # n_inputs, n_outputs, status, error_bytes
_ANSWER = struct.Struct("<I4xQQQQ")  # status, dequeued_ns, compute_start_ns, compute_end_ns, batch_rows
_COMPUTE = struct.Struct("<QQQ")  # compute_start_ns, compute_end_ns, batch_rows
_FIELD_AT: dict[str, int] = {name: HEADER_DTYPE.fields[name][1] for name in HEADER_DTYPE.names or ()}  # type: ignore[index]
_N_OUTPUTS_AT, _STATUS_AT, _ERROR_BYTES_AT, _DEQUEUED_AT, _COMPUTE_AT = (
    _FIELD_AT[f] for f in ("n_outputs", "status", "error_bytes", "dequeued_ns", "compute_start_ns")
)
_OFFSET_AT, _NBYTES_AT, _NDIM_AT, _SHAPE_AT = (_FIELD_AT[f] for f in ("offset", "nbytes", "ndim", "shape"))
_U8, _U4 = struct.Struct("<Q"), struct.Struct("<I")
_SHAPES = [struct.Struct(f"<{n}q") for n in range(MAX_DIMS + 1)]
ERROR_MAX_BYTES = 512
DATA_AT = ERROR_AT + ERROR_MAX_BYTES


class SlotTooSmall(ValueError):
    pass


def _align(n: int) -> int:
    return (n + 63) & ~63


def header(slot: memoryview) -> Any:
    """A 0-d structured view of the slot's header (fields assign in place)."""
    return np.ndarray((), HEADER_DTYPE, buffer=slot)


def slot_bytes_needed(config: ModelConfig, rows: int) -> int | None:
    """Bytes for `rows` rows of every input and output, or None if a shape is variable."""
    total = DATA_AT
    lead = (rows,) if config.max_batch_size > 0 else ()
    for spec in (*config.inputs, *config.outputs):
        if any(d < 0 for d in spec.dims) or spec.datatype == "BYTES":
            return None
        total += _align(int(np.prod(lead + spec.dims, dtype=np.int64)) * to_numpy(spec.datatype).itemsize)
    return total


def payload_bytes(arrays: dict[str, Array]) -> int:
    """The data area ``write_inputs`` needs for these arrays (each tensor 64-byte aligned)."""
    return sum(_align(a.nbytes) for a in arrays.values())


def write_inputs(slot: memoryview, arrays: dict[str, Array], *, describe: bool = True) -> dict[str, Array]:
    """Copy the inputs into the slot (the request's one copy) and return views of them there.
    ``describe``: also write the header entries a reader in another process needs (a worker
    thread gets the views instead, so the thread pool skips them)."""
    if len(arrays) > MAX_TENSORS:
        raise SlotTooSmall(f"more than {MAX_TENSORS} tensors")
    placed: dict[str, Array] = {}
    offsets: list[int] = []
    offset = DATA_AT
    for name, a in arrays.items():
        end = offset + a.nbytes
        if end > len(slot) or a.ndim > MAX_DIMS:
            raise SlotTooSmall(f"request of {end} bytes does not fit an arena slot of {len(slot)} bytes")
        dst: Array = np.ndarray(a.shape, a.dtype, buffer=slot, offset=offset)
        np.copyto(dst, a)  # the one copy
        placed[name] = dst
        offsets.append(offset)
        offset = _align(end)
    if describe:
        _describe_inputs(slot, placed, offsets)
    return placed


def received_payload(slot: memoryview) -> memoryview:
    """Where a front end receives a request's tensor bytes straight off the socket, in wire order
    (``adopt_inputs`` then finds them in place): the slot's data area."""
    return slot[DATA_AT:]


def adopt_inputs(slot: memoryview, arrays: dict[str, Array], *, describe: bool = True) -> bool:
    """The inputs already lie in ``slot`` (received there, ``received_payload``): check that each
    is a contiguous view inside the data area at an offset aligned to its element size, in
    increasing order (outputs go after the last), and describe them like ``write_inputs``. False,
    with nothing written, when they do not (the caller copies them instead)."""
    if len(arrays) > MAX_TENSORS:
        return False
    base = int(np.frombuffer(slot, np.uint8).ctypes.data)
    offsets: list[int] = []
    low = DATA_AT
    for a in arrays.values():
        if a.dtype.hasobject or not a.flags.c_contiguous or a.ndim > MAX_DIMS:
            return False
        offset = int(a.__array_interface__["data"][0]) - base
        if offset < low or offset + a.nbytes > len(slot) or offset % a.dtype.itemsize:
            return False
        offsets.append(offset)
        low = offset + a.nbytes
    if describe:
        _describe_inputs(slot, arrays, offsets)
    return True


def _describe_inputs(slot: memoryview, arrays: dict[str, Array], offsets: list[int]) -> None:
    for i, (a, offset) in enumerate(zip(arrays.values(), offsets, strict=True)):
        _describe(slot, i, a, offset)
    _HEAD.pack_into(slot, 0, len(arrays), 0, 0, 0)


def _describe(slot: memoryview, i: int, a: Array, offset: int) -> None:
    """Tensor ``i``'s entry: where it lies, its size and shape."""
    _U8.pack_into(slot, _OFFSET_AT + 8 * i, offset)
    _U8.pack_into(slot, _NBYTES_AT + 8 * i, a.nbytes)
    _U4.pack_into(slot, _NDIM_AT + 4 * i, a.ndim)
    _SHAPES[a.ndim].pack_into(slot, _SHAPE_AT + 8 * MAX_DIMS * i, *a.shape)


def read_tensors(slot: memoryview, config: ModelConfig, outputs: bool) -> dict[str, Array]:
    """Views (no copy) of the inputs, or of the outputs, in the slot."""
    n_in, n_out = _COUNTS.unpack_from(slot)
    specs, first = (config.outputs, n_in) if outputs else (config.inputs, 0)
    views: dict[str, Array] = {}
    for k, spec in enumerate(specs[: n_out if outputs else n_in]):
        i = first + k
        (ndim,) = _U4.unpack_from(slot, _NDIM_AT + 4 * i)
        shape = _SHAPES[ndim].unpack_from(slot, _SHAPE_AT + 8 * MAX_DIMS * i)
        (offset,) = _U8.unpack_from(slot, _OFFSET_AT + 8 * i)
        views[spec.name] = np.ndarray(shape, to_numpy(spec.datatype), buffer=slot, offset=offset)
    return views


def read_answer(slot: memoryview) -> tuple[int, int, int, int, int]:
    """What a worker process wrote beside its answer: (status, dequeued_ns, compute_start_ns,
    compute_end_ns, batch_rows)."""
    answer: tuple[int, int, int, int, int] = _ANSWER.unpack_from(slot, _STATUS_AT)
    return answer


def write_outputs(slot: memoryview, outputs: dict[str, Array]) -> None:
    """The worker process's answer: each output copied after the inputs, and described."""
    n_in, _ = _COUNTS.unpack_from(slot)
    offset = DATA_AT
    if n_in:
        (last,) = _U8.unpack_from(slot, _OFFSET_AT + 8 * (n_in - 1))
        (size,) = _U8.unpack_from(slot, _NBYTES_AT + 8 * (n_in - 1))
        offset = _align(last + size)
    for k, a in enumerate(outputs.values()):
        i = n_in + k
        end = offset + a.nbytes
        if end > len(slot) or i >= MAX_TENSORS or a.ndim > MAX_DIMS:
            raise SlotTooSmall(f"response of {end} bytes does not fit an arena slot of {len(slot)} bytes")
        _put(slot, offset, a)
        _describe(slot, i, a, offset)
        offset = _align(end)
    _U4.pack_into(slot, _N_OUTPUTS_AT, len(outputs))


def _put(slot: memoryview, offset: int, a: Array) -> None:
    """``a``'s values at ``offset``, in this machine's byte order: its bytes as they are where it
    is C-contiguous and native, else through numpy (strided, byte-swapped, or a dtype the buffer
    protocol does not take)."""
    if a.dtype.isnative and a.flags.c_contiguous and a.size:
        try:
            slot[offset : offset + a.nbytes] = a.data.cast("B")
            return
        except TypeError:
            pass
    np.copyto(np.ndarray(a.shape, a.dtype.newbyteorder("="), buffer=slot, offset=offset), a)


def set_dequeued(slot: memoryview, now_ns: int) -> None:
    _U8.pack_into(slot, _DEQUEUED_AT, now_ns)


def set_compute(slot: memoryview, start_ns: int, end_ns: int, rows: int) -> None:
    _COMPUTE.pack_into(slot, _COMPUTE_AT, start_ns, end_ns, rows)


def set_status(slot: memoryview, code: int) -> None:
    _U4.pack_into(slot, _STATUS_AT, code)


def write_error(slot: memoryview, message: str) -> None:
    data = message.encode()[:ERROR_MAX_BYTES]
    slot[ERROR_AT : ERROR_AT + len(data)] = data
    _U4.pack_into(slot, _ERROR_BYTES_AT, len(data))


def read_error(slot: memoryview) -> str:
    (n,) = _U4.unpack_from(slot, _ERROR_BYTES_AT)
    return bytes(slot[ERROR_AT : ERROR_AT + n]).decode(errors="replace")
