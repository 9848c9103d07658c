"""The KServe V2 gRPC service's calls, whatever serves them: ``GrpcServicer`` has one method per rpc of
``protocols/proto/grpc_service.proto`` (``ModelInfer`` -> ``model_infer``), each taking the request
message and a context, and the codecs of ModelInfer (``prepare_infer``, ``infer_response``) that
the front ends share. Two front ends call them: lumenrt's own HTTP/2 server (``grpc_h2.py``, the
default) and grpc.aio (``grpc_server.py``).

A context is anything with grpc.aio's ``invocation_metadata()`` (the call's metadata as (key, value)
pairs), ``peer()`` (``ipv4:HOST:PORT`` and the like) and ``time_remaining()`` (seconds to the
client's deadline, None without one).

Invariants
  - ModelInfer answers in raw form: one ``raw_output_contents`` entry per output, as Triton does
    and as tritonclient reads it. Inputs come from ``raw_input_contents`` (one entry per input, in
    order) or, for a request without any, from each input's typed ``contents``.
  - Shared memory: an input with ``shared_memory_region`` is read from its region and takes no
    ``raw_input_contents`` entry (the entries belong to the other inputs, in order). An output
    requested into a region is written there, and its ``raw_output_contents`` entry is empty, as
    Triton answers: clients pair the i-th output with the i-th entry.
  - A failed call raises the ServerError that names the field; the front end answers it with the
    gRPC status of its HTTP status (``errors.GRPC_CODES``).
"""

import asyncio
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import json_format

from lumenrt.engine.request import Array
from lumenrt.ingress.service import InferenceService, InferOutcome, WireInput
from lumenrt.ingress.shared_memory import OutputTarget, SharedMemoryRegistry, enabled, write_shm_output
from lumenrt.protocols import dtypes
from lumenrt.protocols.bounds import check_tensor_count
from lumenrt.protocols.errors import bad_request
from lumenrt.protocols.grpc_infer import (
    RequestParts,
    ResponsePrefix,
    encode_response,
    int64_parameters,
    raw_contents,
    raw_layout,
    response_prefix,
    split_head,
    split_request,
)
from lumenrt.protocols.parameters import (
    SharedMemoryRef,
    grpc_values,
    input_parameters,
    output_parameters,
    refuse_load_parameters,
    request_parameters,
    shared_memory_ref,
)
from lumenrt.protocols.raw import LE_DTYPES, from_raw, to_raw
from lumenrt.protocols.tensors import check_datatype, check_shape

try:
    import lumenrt.protocols.proto.grpc_service_pb2 as pb
except ImportError as exc:  # pragma: no cover - a source tree that was never built
    raise ImportError(
        "lumenrt.protocols.proto.grpc_service_pb2 is generated when the package is built; "
        "rebuild with `pip install --no-build-isolation -e .`"
    ) from exc

SERVICE_NAME = "inference.GRPCInferenceService"  # the wire name Triton's clients call

# InferTensorContents field for each datatype, and the dtype protobuf holds it in.
_CONTENTS: dict[str, tuple[str, np.dtype[Any]]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype(np.int32)),
    "INT16": ("int_contents", np.dtype(np.int32)),
    "INT32": ("int_contents", np.dtype(np.int32)),
    "INT64": ("int64_contents", np.dtype(np.int64)),
    "UINT8": ("uint_contents", np.dtype(np.uint32)),
    "UINT16": ("uint_contents", np.dtype(np.uint32)),
    "UINT32": ("uint_contents", np.dtype(np.uint32)),
    "UINT64": ("uint64_contents", np.dtype(np.uint64)),
    "FP32": ("fp32_contents", np.dtype(np.float32)),
    "FP64": ("fp64_contents", np.dtype(np.float64)),
    "BYTES": ("bytes_contents", np.dtype(np.object_)),
}


def _as_dict(message: Any, value: dict[str, Any]) -> Any:
    """``message`` filled from the JSON-shaped dict the service answers with (Triton's field
    names); keys the .proto does not declare (lumenrt's own extras) are left out."""
    return json_format.ParseDict(value, message, ignore_unknown_fields=True)


# ---- ModelInfer codecs ----------------------------------------------------------------------------


def _from_contents(contents: Any, datatype: str, shape: tuple[int, ...], where: str) -> Array:
    """An array from an input's typed ``contents`` (the field that matches ``datatype``)."""
    entry = _CONTENTS.get(datatype)
    if entry is None:
        raise bad_request(
            f"{where}: {datatype} data has no typed contents field; send it in raw_input_contents"
        )
    field, held = entry
    for other, _ in contents.ListFields():
        if other.name != field:
            raise bad_request(f"{where}: contents.{other.name} given for a {datatype} tensor (use {field})")
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise bad_request(
            f"{where}: contents.{field} has {len(values)} values but shape {list(shape)} needs {count}"
        )
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        for i, item in enumerate(values):
            out[i] = item
        return out.reshape(shape)
    wide = np.fromiter(values, dtype=held, count=count)
    dt = dtypes.to_numpy(datatype)
    if dt != held and count:
        info = np.iinfo(dt)
        if int(wide.min()) < info.min or int(wide.max()) > info.max:
            raise bad_request(f"{where}: contents.{field} has values outside the range of {datatype}")
    return wide.astype(dt, copy=False).reshape(shape)


def _decode_inputs(
    request: Any, max_elements: int, model: str, shm: SharedMemoryRegistry | None = None
) -> list[WireInput]:
    raw = request.raw_input_contents
    inputs = request.inputs
    if not inputs:
        raise bad_request(f"model {model!r}: the request has no inputs")
    check_tensor_count(len(inputs), f"model {model!r}: inputs")
    refs: list[SharedMemoryRef | None] = []
    for i, tensor in enumerate(inputs):
        if tensor.parameters:  # binary_data_size is HTTP's: checked, and without effect here
            where = f"model {model!r}: input {tensor.name!r}: inputs[{i}].parameters"
            values = grpc_values(tensor.parameters)
            input_parameters(values, where)
            refs.append(shared_memory_ref(values, where))
        else:
            refs.append(None)
    in_shm = len(refs) - refs.count(None)
    if raw and len(raw) != len(inputs) - in_shm:
        raise bad_request(
            f"model {model!r}: raw_input_contents has {len(raw)} entries but the request has "
            f"{len(inputs) - in_shm} inputs "
            + (
                "not in shared memory (one entry per such input, in order)"
                if in_shm
                else "(one entry per input, in order)"
            )
        )
    out: list[WireInput] = []
    next_raw = 0
    for i, tensor in enumerate(inputs):
        name = tensor.name
        where = f"model {model!r}: input {name!r}"
        datatype = check_datatype(tensor.datatype, f"{where}: datatype")
        shape = check_shape(tuple(tensor.shape), f"{where}: shape", max_elements)
        ref = refs[i]
        if ref is not None:
            if tensor.HasField("contents"):
                raise bad_request(f"{where}: has contents, but also parameters.shared_memory_region")
            place = f"{where}: inputs[{i}].parameters"
            array = enabled(shm, place).read(ref, datatype, shape, place)
        elif raw:
            if tensor.HasField("contents"):
                raise bad_request(f"{where}: has contents, but the request sends raw_input_contents")
            array = from_raw(raw[next_raw], datatype, shape, where, bad_request)
            next_raw += 1
        else:
            array = _from_contents(tensor.contents, datatype, shape, where)
        out.append(WireInput(name, datatype, shape, array))
    return out


ShmOutputs = dict[str, tuple[OutputTarget, SharedMemoryRef]]


def _requested_outputs(
    request: Any, model: str, shm: SharedMemoryRegistry | None = None
) -> tuple[list[str] | None, ShmOutputs | None]:
    """The outputs asked for (None: all), and those to be written into shared memory."""
    if not request.outputs:
        return None, None
    check_tensor_count(len(request.outputs), f"model {model!r}: outputs")
    names: list[str] = []
    targets: ShmOutputs | None = None
    for i, out in enumerate(request.outputs):
        if out.parameters:  # binary_data is HTTP's: checked, and without effect (gRPC answers raw)
            where = f"model {model!r}: output {out.name!r}: outputs[{i}].parameters"
            values = grpc_values(out.parameters)
            output_parameters(values, where)
            ref = shared_memory_ref(values, where)
            if ref is not None:
                if targets is None:
                    targets = {}
                targets[out.name] = (enabled(shm, where).target(ref, where), ref)
        names.append(out.name)
    return names, targets


# ---- the servicer ---------------------------------------------------------------------------------


class GrpcServicer:
    """One method per rpc (``ModelInfer`` -> ``model_infer``), each taking (request, context)."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service
        self.limits = service.limits

    # ---- health and metadata --------------------------------------------------------------------

    async def server_live(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self.service.live())

    async def server_ready(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.service.ready())

    async def model_ready(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, request.version))

    async def server_metadata(self, request: Any, context: Any) -> Any:
        return _as_dict(pb.ServerMetadataResponse(), self.service.server_metadata())

    async def model_metadata(self, request: Any, context: Any) -> Any:
        meta = self.service.model_metadata(request.name, request.version)
        return _as_dict(pb.ModelMetadataResponse(), meta)

    async def model_config(self, request: Any, context: Any) -> Any:
        config = self.service.model_config(request.name, request.version)
        return pb.ModelConfigResponse(config=_as_dict(pb.ModelConfig(), config))

    async def model_statistics(self, request: Any, context: Any) -> Any:
        stats = self.service.statistics(request.name or None, request.version or None)
        return _as_dict(pb.ModelStatisticsResponse(), stats)

    # ---- model repository -----------------------------------------------------------------------

    async def repository_index(self, request: Any, context: Any) -> Any:
        models = self.service.repository_index(ready_only=request.ready)
        return _as_dict(pb.RepositoryIndexResponse(), {"models": models})

    async def repository_model_load(self, request: Any, context: Any) -> Any:
        name = request.model_name
        refuse_load_parameters(request.parameters, name)
        await asyncio.get_running_loop().run_in_executor(None, self.service.load, name)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(self, request: Any, context: Any) -> Any:
        await asyncio.get_running_loop().run_in_executor(None, self.service.unload, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # ---- inference ------------------------------------------------------------------------------

    async def model_infer(self, request: Any, context: Any) -> Any:
        received_ns = time.monotonic_ns()
        service = self.service
        call = prepare_infer(service, request, context, context.time_remaining(), received_ns)
        outcome = service.infer_inline(  # a small model: answered now when its queue is empty
            call.runtime,
            call.arrays,
            call.outputs,
            timeout_s=call.timeout_s,
            timing=call.timing,
            received_ns=received_ns,
            protocol="grpc",
            request_id=call.request_id,
            priority=call.priority,
        )
        if outcome is None:  # a client that cancels cancels this task: the request is dropped
            outcome = await service.infer(
                call.runtime,
                call.arrays,
                call.outputs,
                timeout_s=call.timeout_s,
                timing=call.timing,
                received_ns=received_ns,
                priority=call.priority,
                protocol="grpc",
                request_id=call.request_id,
            )
        return infer_response(outcome, call)

    # ---- system shared memory -------------------------------------------------------------------

    def _registry(self) -> SharedMemoryRegistry:
        return enabled(self.service.shared_memory)

    async def system_shared_memory_status(self, request: Any, context: Any) -> Any:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._registry().status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    async def system_shared_memory_register(self, request: Any, context: Any) -> Any:
        registry = self._registry()
        if not request.name:
            raise bad_request("name: required (the region's name)")
        client = client_of(self.service, context)
        registry.register(request.name, request.key, request.offset, request.byte_size, client)
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(self, request: Any, context: Any) -> Any:
        self._registry().unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()


# ---- ModelInfer, shared by the front ends ---------------------------------------------------------


@dataclass(slots=True)
class PreparedInfer:
    """A ModelInfer request checked against its model: what the service is asked to run."""

    runtime: Any
    arrays: dict[str, Array]
    outputs: list[str]
    timeout_s: float | None
    timing: bool
    priority: int
    request_id: str | None
    shm_outputs: "ShmOutputs | None"


def prepare_infer(
    service: InferenceService, request: Any, context: Any, remaining_s: float | None, received_ns: int
) -> PreparedInfer:
    """Check ``request`` (rate limits, inputs, outputs, parameters, priority); ServerError names
    what is wrong. ``remaining_s``: the client's gRPC deadline, which caps the timeout parameter."""
    rt = service.runtime(request.model_name, request.model_version)
    if service.limiter is not None:
        service.admit_client(client_of(service, context), rt, "grpc", received_ns)
    model = rt.config.name
    shm = service.shared_memory
    arrays = service.check_inputs(rt, _decode_inputs(request, service.limits.max_elements, model, shm))
    requested, shm_outputs = _requested_outputs(request, model, shm)
    outputs = service.check_outputs(rt, requested)
    params = request_parameters(grpc_values(request.parameters)) if request.parameters else _NO_PARAMETERS
    timeout_s = params.timeout_s
    if remaining_s is not None and (timeout_s is None or remaining_s < timeout_s):
        timeout_s = max(remaining_s, 0.0)
    service.check_priority(rt, params.priority, "parameters.priority")
    return PreparedInfer(
        rt, arrays, outputs, timeout_s, params.timing, params.priority, request.id or None, shm_outputs
    )


_NO_PARAMETERS = request_parameters({})


# ---- ModelInfer from its bytes: a plan per signature (lumenrt's HTTP/2 front end) ------------------

PLAN_CACHE_ENTRIES = 256  # signatures remembered, then the cache starts over (guessed, as v2_http's)


@dataclass(frozen=True, slots=True)
class _Plan:
    """A request signature (``grpc_infer.split_request``'s key) decoded and checked once: a later
    request with the same key only has its raw contents cut into arrays."""

    model_name: str
    model_version: str
    inputs: tuple[tuple[str, str, Any, tuple[int, ...], int], ...]  # name, datatype, dtype, shape, bytes
    outputs: list[str] | None
    timeout_s: float | None
    timing: bool
    priority: int


_plans: dict[tuple[bytes, int], _Plan] = {}
# the signature last found in ``_plans`` (key, max_elements, plan): a request whose bytes start with
# that key is cut without walking its fields (a client repeating one call)
_last: tuple[bytes, int, _Plan] | None = None


def _plan_of(request: Any, max_elements: int) -> _Plan | None:
    """The plan of a request that decoded cleanly, if its form allows one: every input raw, fixed-size
    and without parameters (shared memory is looked up per request), outputs without parameters."""
    raw = request.raw_input_contents
    if len(raw) != len(request.inputs) or any(t.parameters for t in request.inputs):
        return None
    if any(o.parameters for o in request.outputs):
        return None
    inputs = []
    for tensor in request.inputs:
        dt = LE_DTYPES.get(tensor.datatype)
        if dt is None:  # BYTES: its length prefixes are checked per request
            return None
        shape = tuple(tensor.shape)
        inputs.append((tensor.name, tensor.datatype, dt, shape, dt.itemsize * math.prod(shape)))
    params = request_parameters(grpc_values(request.parameters)) if request.parameters else _NO_PARAMETERS
    outputs = [o.name for o in request.outputs] if request.outputs else None
    return _Plan(
        request.model_name, request.model_version, tuple(inputs), outputs, params.timeout_s, params.timing,
        params.priority,
    )  # fmt: skip


def prepare_infer_bytes(
    service: InferenceService, message: bytes, context: Any, remaining_s: float | None, received_ns: int
) -> PreparedInfer:
    """``prepare_infer`` from the serialized request, through the plan of its signature when there is
    one (the same checks, made once per signature); DecodeError if it does not parse."""
    global _last
    limit = service.limits.max_elements
    last = _last
    parts: RequestParts | None = None
    plan: _Plan | None = None
    if last is not None and last[1] == limit and message.startswith(last[0]):  # the signature before
        raw = raw_contents(message, len(last[0]), len(last[2].inputs))
        if raw is not None:
            parts, plan = RequestParts(last[0], None, raw), last[2]
    if parts is None:
        parts = split_request(message)
        plan = _plans.get((parts.key, limit)) if parts is not None else None
        if plan is not None and parts is not None and parts.request_id is None:
            _last = (parts.key, limit, plan)
    if plan is not None and parts is not None and len(parts.raw) == len(plan.inputs):
        wire: list[WireInput] = []
        for (name, datatype, dt, shape, nbytes), data in zip(plan.inputs, parts.raw, strict=True):
            if len(data) != nbytes:
                break  # the wrong size: the full decode below names it
            wire.append(WireInput(name, datatype, shape, np.frombuffer(data, dt).reshape(shape)))
        else:
            return _from_plan(service, plan, wire, parts.request_id, context, remaining_s, received_ns)
    request = pb.ModelInferRequest.FromString(message)
    call = prepare_infer(service, request, context, remaining_s, received_ns)
    if parts is not None and (parts.key, limit) not in _plans:
        new = _plan_of(request, limit)
        if new is not None:
            if len(_plans) >= PLAN_CACHE_ENTRIES:
                _plans.clear()
            _plans[(parts.key, limit)] = new
            if parts.request_id is None:
                _last = (parts.key, limit, new)
    return call


def _from_plan(
    service: InferenceService,
    plan: _Plan,
    wire: list[WireInput],
    request_id: str | None,
    context: Any,
    remaining_s: float | None,
    received_ns: int,
) -> PreparedInfer:
    """``prepare_infer`` for a request of a known signature, its inputs cut out already."""
    rt = service.runtime(plan.model_name, plan.model_version)
    if service.limiter is not None:
        service.admit_client(client_of(service, context), rt, "grpc", received_ns)
    arrays = service.check_inputs(rt, wire)
    outputs = service.check_outputs(rt, plan.outputs)
    timeout_s = plan.timeout_s
    if remaining_s is not None and (timeout_s is None or remaining_s < timeout_s):
        timeout_s = max(remaining_s, 0.0)
    service.check_priority(rt, plan.priority, "parameters.priority")
    return PreparedInfer(rt, arrays, outputs, timeout_s, plan.timing, plan.priority, request_id, None)


def receive_plan(
    service: InferenceService, head: bytes, length: int
) -> tuple[_Plan, str | None, int, list[tuple[bytes, int]]] | None:
    """For a ModelInfer message of ``length`` octets arriving in pieces, ``head`` its first octets:
    its plan when every field before its raw contents is a known signature and the signature's
    raw contents make up the rest of the message exactly (grpc_body.py), with its id, where its raw
    contents begin and their layout (``raw_layout``); else None."""
    cut = split_head(head)
    if cut is None:
        return None
    key, request_id, at = cut
    plan = _plans.get((key, service.limits.max_elements))
    if plan is None:
        return None
    layout, total = raw_layout(at, [nbytes for *_, nbytes in plan.inputs])
    if total != length:
        return None
    return plan, request_id, at, layout


def prepare_infer_slot(
    service: InferenceService,
    plan: _Plan,
    payload: memoryview,
    offsets: list[int],
    request_id: str | None,
    context: Any,
    remaining_s: float | None,
    received_ns: int,
) -> PreparedInfer:
    """``prepare_infer`` for a message received into a slot (grpc_body.py): its inputs are views of
    ``payload`` at ``offsets``, where the engine adopts them."""
    wire = [
        WireInput(name, datatype, shape, np.frombuffer(payload[at : at + nbytes], dt).reshape(shape))
        for (name, datatype, dt, shape, nbytes), at in zip(plan.inputs, offsets, strict=True)
    ]
    return _from_plan(service, plan, wire, request_id, context, remaining_s, received_ns)


# the fixed part of answers by (model, version, outputs' names, datatypes and shapes); bounded like _plans
_prefixes: dict[tuple[Any, ...], ResponsePrefix] = {}


def infer_response_bytes(outcome: InferOutcome, call: PreparedInfer) -> list[bytes | memoryview]:
    """The serialized ModelInferResponse for ``outcome`` as parts (what ``infer_response`` would
    serialize), written by hand from a prefix made once per signature. Encode before the outputs
    are released: the parts may be views of them."""
    if call.shm_outputs is not None:
        return [infer_response(outcome, call).SerializeToString()]
    described: list[tuple[str, str, tuple[int, ...]]] = []
    raw: list[bytes | memoryview] = []
    for name, array in outcome.outputs:
        datatype, data = to_raw(array)
        described.append((name, datatype, array.shape))
        raw.append(data)
    version = str(outcome.version)
    key = (outcome.model, version, *described)
    prefix = _prefixes.get(key)
    if prefix is None:
        if len(_prefixes) >= PLAN_CACHE_ENTRIES:
            _prefixes.clear()
        prefix = _prefixes[key] = response_prefix(outcome.model, version, described)
    params = int64_parameters(outcome.parameters) if outcome.parameters else b""
    return encode_response(prefix, call.request_id, params, raw)


def infer_response(outcome: InferOutcome, call: PreparedInfer) -> Any:
    """The ModelInferResponse for ``outcome`` (encode before the outputs are released)."""
    response = pb.ModelInferResponse(model_name=outcome.model, model_version=str(outcome.version))
    if call.request_id:
        response.id = call.request_id
    add_output = response.outputs.add  # add() fills in place; a list of messages would be copied
    raw = response.raw_output_contents
    shm_outputs = call.shm_outputs
    for name, array in outcome.outputs:
        target = shm_outputs.get(name) if shm_outputs is not None else None
        if target is not None:  # written into the client's region: an empty entry (invariants)
            datatype, _ = write_shm_output(name, array, *target)
            add_output(name=name, datatype=datatype, shape=array.shape)
            raw.append(b"")
            continue
        datatype, data = to_raw(array)
        add_output(name=name, datatype=datatype, shape=array.shape)
        raw.append(data if type(data) is bytes else bytes(data))  # protobuf holds bytes: one copy
    for key, value in outcome.parameters.items():
        response.parameters[key].int64_param = value
    return response


def client_of(service: InferenceService, context: Any) -> str:
    """Who sent a call, for the rate limits: its API key's name, else its address."""
    gate = service.gate
    if gate is not None:
        key, _ = gate.from_metadata(context.invocation_metadata())
        if key is not None:
            return key.name
    peer = str(context.peer() or "unknown")  # ipv4:127.0.0.1:5000, ipv6:[::1]:5000, unix:...
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


# rpc -> its endpoint group (ingress/auth.py); an rpc missing here fails at start-up
GROUPS = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelConfig": "metadata",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "ModelInfer": "inference",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
}


def snake(name: str) -> str:
    """An rpc's servicer method: ``ModelInfer`` -> ``model_infer``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def rpc_methods() -> list[Any]:
    """The .proto service's method descriptors (every rpc must have a handler and a group)."""
    methods = list(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods)
    for method in methods:
        if method.name not in GROUPS:
            raise RuntimeError(f"gRPC rpc {method.name} has no endpoint group (grpc_service.GROUPS)")
    return methods


__all__ = [
    "GROUPS",
    "SERVICE_NAME",
    "GrpcServicer",
    "PreparedInfer",
    "client_of",
    "infer_response",
    "infer_response_bytes",
    "pb",
    "prepare_infer",
    "prepare_infer_bytes",
    "rpc_methods",
    "snake",
]
