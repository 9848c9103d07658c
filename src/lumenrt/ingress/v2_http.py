"""KServe V2 inference bodies over HTTP: decoding requests, encoding responses (no sockets).

Request bodies come in three forms:
  - JSON only: ``{"inputs": [{"name", "datatype", "shape", "data"}], "outputs": [...], ...}``;
    ``data`` flat or nested, row-major.
  - JSON header + binary (Triton's binary tensor extension): the first
    ``Inference-Header-Content-Length`` bytes are the JSON; inputs with a ``binary_data_size``
    parameter take their raw bytes, in input order, from what follows.
  - Raw single input (``Inference-Header-Content-Length: 0``): the whole body is the raw tensor of
    a model's only input; its shape is the config's dims, with the batch dimension (if any) taken
    from the byte count. Every output is then returned as binary.

Inputs and requested outputs may name a registered shared-memory region instead (Triton's system
shared-memory extension, ``ingress/shared_memory.py``): such an input is copied out of its region
(never viewed in place: the client may shrink it), such an output is written there and its answer
entry carries no data.

Outputs are binary when the request output says ``"binary_data": true``, or, for outputs it does
not list, when the request parameter ``binary_data_output`` is true.

Every check names the field at fault (``inputs[1].shape``) and happens before anything is
allocated in proportion to a size the client claims.
"""

import json
import math
from dataclasses import dataclass, field
from typing import Any

from lumenrt.engine.config import ModelConfig
from lumenrt.ingress.service import InferOutcome, WireInput
from lumenrt.ingress.shared_memory import OutputTarget, SharedMemoryRegistry, enabled, write_shm_output
from lumenrt.protocols import dtypes
from lumenrt.protocols.bounds import DEFAULT_MAX_JSON_DEPTH, check_json_depth, check_tensor_count
from lumenrt.protocols.compact_json import compact_json
from lumenrt.protocols.errors import ServerError, bad_request
from lumenrt.protocols.parameters import (
    SharedMemoryRef,
    input_parameters,
    output_parameters,
    request_parameters,
    shared_memory_ref,
)
from lumenrt.protocols.raw import TensorSlot, from_raw, payload_slots, split_payload, to_raw
from lumenrt.protocols.tensors import check_datatype, check_shape, from_json, to_json_data


@dataclass(slots=True)
class ParsedInfer:
    """A decoded infer request; ``outputs`` maps requested output name -> binary (None: not said)."""

    inputs: list[WireInput]
    request_id: str | None = None
    outputs: dict[str, bool | None] = field(default_factory=dict)
    binary_output: bool = False  # request parameter binary_data_output
    timeout_s: float | None = None
    timing: bool = False
    raw: bool = False  # raw single-input form: every output binary
    priority: int = 0  # request parameter priority (0: the model's default level)
    # requested outputs to be written into shared memory: name -> (their bytes there, the parameters)
    shm_outputs: dict[str, tuple[OutputTarget, SharedMemoryRef]] | None = None


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _params(value: Any, where: str) -> dict[str, Any]:
    """A ``parameters`` object; absent or null is empty, anything else must be an object."""
    return {} if value is None else _obj(value, where)


@dataclass(frozen=True, slots=True)
class _Plan:
    """A JSON header of the binary form whose inputs are all binary, decoded and checked once:
    clients send the same header bytes for every request of one signature, so a request with
    those bytes only needs its binary part cut into arrays."""

    request_id: str | None
    binary_output: bool
    timeout_s: float | None
    timing: bool
    priority: int
    inputs: tuple[tuple[str, str, tuple[int, ...], int], ...]  # name, datatype, shape, bytes
    slots: tuple[TensorSlot, ...]  # where each input lies in the binary part
    outputs: tuple[tuple[str, bool | None], ...]
    binary_bytes: int  # sum of the inputs' bytes


# Decoded headers by their bytes and the max_elements they were checked against. Bounded: at most
# PLAN_CACHE_ENTRIES keys of at most PLAN_CACHE_MAX_BYTES (the cache is emptied when full).
PLAN_CACHE_ENTRIES = 1024
PLAN_CACHE_MAX_BYTES = 1024
_plans: dict[tuple[bytes, int], _Plan] = {}


def _from_plan(plan: _Plan, body: bytes | memoryview, at: int) -> ParsedInfer:
    if at + plan.binary_bytes != len(body):
        raise bad_request(
            f"the inputs take {plan.binary_bytes} bytes of binary data but the body has {len(body) - at}"
        )
    arrays = split_payload(body, at, plan.slots, "input", bad_request)
    inputs = [
        WireInput(name, datatype, shape, array)
        for (name, datatype, shape, _), array in zip(plan.inputs, arrays, strict=True)
    ]
    return ParsedInfer(
        inputs,
        plan.request_id,
        dict(plan.outputs),
        plan.binary_output,
        plan.timeout_s,
        plan.timing,
        priority=plan.priority,
    )


def _plan_of(parsed: ParsedInfer, sizes: list[int]) -> _Plan:
    inputs = tuple((w.name, w.datatype, w.shape, n) for w, n in zip(parsed.inputs, sizes, strict=True))
    return _Plan(
        parsed.request_id,
        parsed.binary_output,
        parsed.timeout_s,
        parsed.timing,
        parsed.priority,
        inputs,
        payload_slots(inputs),  # each size was checked against its shape by from_raw
        tuple(parsed.outputs.items()),
        sum(sizes),
    )


def parse_infer_request(
    body: bytes,
    header_length: int | None,
    max_elements: int,
    payload: memoryview | None = None,
    shm: SharedMemoryRegistry | None = None,
) -> ParsedInfer:
    """Decode a JSON (``header_length`` None) or JSON+binary infer body. ``payload``: the binary
    part, received apart from the JSON header (into an arena slot: the arrays are views of it);
    ``body`` is then the header alone. ``shm``: the registered shared-memory regions (None: the
    extension is off)."""
    key: tuple[bytes, int] | None = None
    if header_length is not None and 0 < header_length <= min(PLAN_CACHE_MAX_BYTES, len(body)):
        key = (body[:header_length], max_elements)
        plan = _plans.get(key)
        if plan is not None:
            try:
                if payload is not None:
                    return _from_plan(plan, payload, 0)
                return _from_plan(plan, body, header_length)
            except ServerError:
                pass  # the binary part is wrong: the full decode below names the field as ever
    parsed, sizes = _parse(body, header_length, max_elements, payload, shm)
    # every input binary, no output in shared memory (a region is looked up per request): reusable
    if key is not None and len(sizes) == len(parsed.inputs) and parsed.shm_outputs is None:
        if len(_plans) >= PLAN_CACHE_ENTRIES:
            _plans.clear()
        _plans[key] = _plan_of(parsed, sizes)
    return parsed


def _parse(
    body: bytes,
    header_length: int | None,
    max_elements: int,
    payload: memoryview | None = None,
    shm: SharedMemoryRegistry | None = None,
) -> tuple[ParsedInfer, list[int]]:
    """The full decode; also the byte sizes of the binary inputs, in order."""
    sizes: list[int] = []
    if header_length is None:
        header_length = len(body)
    elif header_length > len(body):
        raise bad_request(
            f"Inference-Header-Content-Length is {header_length} but the body has only {len(body)} bytes"
        )
    header = memoryview(body)[:header_length].tobytes() if header_length != len(body) else body
    # the binary part: after the header in the body, or received apart (its own buffer)
    view, at = (memoryview(body), header_length) if payload is None else (payload, 0)
    check_json_depth(header, DEFAULT_MAX_JSON_DEPTH)
    try:
        doc = json.loads(header)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    doc = _obj(doc, "request")
    params = _params(doc.get("parameters"), "parameters")
    out = ParsedInfer(inputs=[])
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise bad_request(f"id must be a string, got {rid!r}")
    out.request_id = rid
    checked = request_parameters(params)
    out.binary_output = checked.binary_data_output
    out.timing = checked.timing
    out.timeout_s = checked.timeout_s
    out.priority = checked.priority

    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise bad_request("inputs must be a non-empty list of tensors")
    check_tensor_count(len(inputs), "inputs")
    for i, raw in enumerate(inputs):
        where = f"inputs[{i}]"
        entry = _obj(raw, where)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"{where}.name must be a non-empty string")
        where = f"inputs[{i}] ({name!r})"
        datatype = check_datatype(entry.get("datatype"), f"{where}.datatype")
        shape = check_shape(entry.get("shape"), f"{where}.shape", max_elements)
        iparams = _params(entry.get("parameters"), f"inputs[{i}].parameters")
        size = input_parameters(iparams, f"inputs[{i}].parameters")
        ref = shared_memory_ref(iparams, f"inputs[{i}].parameters")
        if ref is not None:
            if "data" in entry:
                raise bad_request(f"{where}: has both data and parameters.shared_memory_region")
            place = f"inputs[{i}].parameters"
            array = enabled(shm, place).read(ref, datatype, shape, place)
        elif size is not None:
            if "data" in entry:
                raise bad_request(f"{where}: has both data and parameters.binary_data_size")
            if at + size > len(view):
                raise bad_request(
                    f"{where}: binary_data_size {size} but only {len(view) - at} bytes of binary data remain"
                )
            array = from_raw(view[at : at + size], datatype, shape, where, bad_request)
            at += size
            sizes.append(size)
        elif "data" in entry:
            array = from_json(entry["data"], datatype, shape, where)
        else:
            raise bad_request(f"{where}: no data (give data, or parameters.binary_data_size)")
        out.inputs.append(WireInput(name, datatype, shape, array))
    if at != len(view):
        raise bad_request(f"{len(view) - at} bytes of binary data left over after the last input")

    outputs = doc.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise bad_request("outputs must be a list")
        check_tensor_count(len(outputs), "outputs")
        for i, raw in enumerate(outputs):
            entry = _obj(raw, f"outputs[{i}]")
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                raise bad_request(f"outputs[{i}].name must be a non-empty string")
            oparams = _params(entry.get("parameters"), f"outputs[{i}].parameters")
            out.outputs[name] = output_parameters(oparams, f"outputs[{i}].parameters")
            ref = shared_memory_ref(oparams, f"outputs[{i}].parameters")
            if ref is not None:
                place = f"outputs[{i}].parameters"
                if out.shm_outputs is None:
                    out.shm_outputs = {}
                out.shm_outputs[name] = (enabled(shm, place).target(ref, place), ref)
    return out, sizes


def parse_raw_request(body: bytes | memoryview, config: ModelConfig) -> ParsedInfer:
    """The raw single-input form: the body is the one input's raw tensor (a view of an arena slot
    when it was received into one)."""
    if len(config.inputs) != 1:
        raise bad_request(
            f"model {config.name!r}: a raw binary body needs a model with one input; it has "
            f"{len(config.inputs)} (send a JSON header with Inference-Header-Content-Length)"
        )
    spec = config.inputs[0]
    where = f"raw input {spec.name!r}"
    if spec.datatype == "BYTES" or any(d < 0 for d in spec.dims):
        raise bad_request(f"{where}: a raw body needs fixed dims and a fixed-size datatype")
    row_bytes = (dtypes.element_size_bytes(spec.datatype) or 1) * math.prod(spec.dims)
    if config.max_batch_size > 0:
        if row_bytes == 0 or len(body) % row_bytes or not len(body):
            raise bad_request(f"{where}: {len(body)} bytes is not a whole number of {row_bytes}-byte rows")
        shape: tuple[int, ...] = (len(body) // row_bytes, *spec.dims)
    else:
        shape = spec.dims
    array = from_raw(body, spec.datatype, shape, where, bad_request)
    return ParsedInfer([WireInput(spec.name, spec.datatype, shape, array)], raw=True, binary_output=True)


# Response headers of all-binary answers of fixed-size datatypes, by (model, version, id, outputs'
# names, dtypes and shapes): the same for every answer of one signature, whether the request asked
# for binary outputs by default or named each one binary. Kept without the answer's parameters
# (the stage times a client asked for differ every time), which are put in before the outputs.
# Bounded like _plans.
_headers: dict[tuple[Any, ...], bytes] = {}
_OUTPUTS_KEY = b',"outputs":['  # where parameters go; never inside a string (its quotes are escaped)


def encode_infer_response(outcome: InferOutcome, parsed: ParsedInfer) -> tuple[bytes, list[Any]]:
    """The response's JSON header and the binary output chunks that follow it (maybe none)."""
    if (
        parsed.shm_outputs is None
        and (parsed.raw or _all_binary(outcome, parsed))
        and all(array.dtype.kind not in "OSU" for _, array in outcome.outputs)  # sizes vary
    ):
        key = (
            outcome.model,
            outcome.version,
            parsed.request_id,
            tuple((name, array.dtype.str, array.shape) for name, array in outcome.outputs),
        )
        header = _headers.get(key)
        if header is None:
            if outcome.parameters:
                plain = InferOutcome(outcome.model, outcome.version, outcome.outputs, outcome.times)
                header, chunks = _encode(plain, parsed)
            else:
                header, chunks = _encode(outcome, parsed)
            if len(header) <= PLAN_CACHE_MAX_BYTES:  # a long client-chosen id is not kept
                if len(_headers) >= PLAN_CACHE_ENTRIES:
                    _headers.clear()
                _headers[key] = header
        else:
            chunks = [to_raw(array)[1] for _, array in outcome.outputs]
        if outcome.parameters:
            at = header.index(_OUTPUTS_KEY)
            params = compact_json(outcome.parameters)
            header = b"".join((header[:at], b',"parameters":', params, header[at:]))
        return header, chunks
    return _encode(outcome, parsed)


def _all_binary(outcome: InferOutcome, parsed: ParsedInfer) -> bool:
    """Every output goes out binary: by the request's default (``binary_data_output``), or output
    by output as a client that names its outputs asks (tritonclient's ``InferRequestedOutput(name,
    binary_data=True)``); the header is then the same for every answer of one signature."""
    wanted, default = parsed.outputs, parsed.binary_output
    if not wanted:
        return default
    for name, _ in outcome.outputs:
        binary = wanted.get(name)
        if not (default if binary is None else binary):
            return False
    return True


def _encode(outcome: InferOutcome, parsed: ParsedInfer) -> tuple[bytes, list[Any]]:
    outputs: list[dict[str, Any]] = []
    chunks: list[Any] = []
    shm_outputs = parsed.shm_outputs or {}
    for name, array in outcome.outputs:
        target = shm_outputs.get(name)
        if target is not None:
            datatype, _ = write_shm_output(name, array, *target)
            outputs.append({"name": name, "datatype": datatype, "shape": list(array.shape)})
            continue
        wanted = parsed.outputs.get(name)
        binary = parsed.binary_output if wanted is None else wanted
        entry: dict[str, Any]
        if binary or parsed.raw:
            datatype, data = to_raw(array)
            size = len(data) if isinstance(data, bytes) else data.nbytes
            entry = {"name": name, "datatype": datatype, "shape": list(array.shape)}
            entry["parameters"] = {"binary_data_size": size}
            chunks.append(data)
        else:
            entry = {"name": name, "datatype": dtypes.from_numpy(array.dtype), "shape": list(array.shape)}
            entry["data"] = to_json_data(array)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": outcome.model, "model_version": str(outcome.version)}
    if parsed.request_id is not None:
        doc["id"] = parsed.request_id
    if outcome.parameters:
        doc["parameters"] = outcome.parameters
    doc["outputs"] = outputs
    return compact_json(doc), chunks
