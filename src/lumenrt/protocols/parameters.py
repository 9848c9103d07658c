"""Request parameters the server gives meaning to, checked in one place for HTTP and gRPC.

Each front end hands its parameters over as plain Python values (HTTP: the JSON values; gRPC: the
set member of each ``InferParameter`` oneof, see :func:`grpc_values`) and gets typed values back,
or a 400 (gRPC: INVALID_ARGUMENT) whose message names the parameter by its path:
``parameters.lumenrt_timing: must be a boolean, got "yes"``. A JSON ``null`` counts as absent.

The parameters that mean something here:

  where        name                  type, range                      meaning
  request      timeout               int µs, 0..MAX_TIMEOUT_US        engine deadline (0: none)
  request      lumenrt_timing        bool                             stage times in the answer
  request      binary_data_output    bool (HTTP)                      unlisted outputs as binary
  request      priority              int >= 0                         priority level (0: default)
  request      sequence_id/_start/_end  refused unless at default     no sequence batching here
  input        binary_data_size      int >= 0 (HTTP)                  bytes of this input's data
  input        shared_memory_*       region str, offset, byte_size    the data lies in a registered
                                                                      region (SharedMemoryRef)
  output       binary_data           bool (HTTP)                      this output as binary
  output       classification        refused                          no classification extension
  output       shared_memory_*       region str, offset, byte_size    write the output there

The shared-memory parameters are checked here for their types (``shared_memory_region`` and
``shared_memory_byte_size`` together, ``shared_memory_offset`` optional, 0 by default); whether the
region exists and the bytes fit is the registry's check (``ingress/shared_memory.py``), which also
answers them when the server runs without the extension.

Other names are passed over, as Triton's core passes over what it does not know (they are meant
for a backend). ``priority`` is checked here to be a count, and against the model's
``dynamic_batching.priority_levels`` by the service (1 is served first; 0 is the model's
``default_priority_level``; a model without levels takes 0 or 1). The TCP protocol
carries its timeout as a u32 of µs and its timing as a header flag, so its wire format already
holds them to the same types and range (``MAX_TIMEOUT_US`` is that field's maximum).
"""

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lumenrt.protocols.errors import bad_request
from lumenrt.protocols.tcp import MAX_TIMEOUT_US  # its u32 timeout field: one cap for every front end

TIMING_PARAMETER = "lumenrt_timing"  # request parameter: true -> response carries server stage times
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")
MAX_PRIORITY = 0xFFFF  # the TCP header's priority field (u16): one cap for every front end


@dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """A tensor's bytes in a registered shared-memory region (Triton's system shared memory)."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class RequestParameters:
    """The request-level parameters, checked."""

    timeout_s: float | None = None  # None: no deadline
    timing: bool = False
    binary_data_output: bool = False
    priority: int = 0  # 0: the model's default priority level


def _shown(value: Any) -> str:
    """``value`` as the client wrote it (JSON: strings in double quotes)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def check_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise bad_request(f"{where}: must be a boolean, got {_shown(value)}")
    return value


def check_count(value: Any, where: str) -> int:
    """A non-negative integer (a bool is not one, nor is 3.0)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(f"{where}: must be a non-negative integer, got {_shown(value)}")
    return value


def check_timeout_us(value: Any, where: str) -> float | None:
    """A timeout in integer µs as Triton takes it (0: none) -> seconds, or None for no deadline."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIMEOUT_US:
        raise bad_request(
            f"{where}: must be an integer number of microseconds in 0..{MAX_TIMEOUT_US} "
            f"(0: no timeout), got {_shown(value)}"
        )
    return value / 1e6 if value else None


def _refuse(params: Mapping[str, Any], names: Iterable[str], where: str, why: str) -> None:
    for name in names:
        if params.get(name) is not None:
            raise bad_request(f"{where}.{name}: {why}")


def request_parameters(params: Mapping[str, Any], where: str = "parameters") -> RequestParameters:
    """The request-level ``parameters`` object."""
    if not params:
        return RequestParameters()
    timeout = params.get("timeout")
    timing = params.get(TIMING_PARAMETER)
    binary = params.get("binary_data_output")
    priority = params.get("priority")
    if priority is not None:
        check_count(priority, f"{where}.priority")
        if priority > MAX_PRIORITY:
            raise bad_request(f"{where}.priority: must be at most {MAX_PRIORITY}, got {priority}")
    for name in _SEQUENCE:
        value = params.get(name)
        if value is not None and value not in (0, False, ""):  # the defaults tritonclient may send
            raise bad_request(
                f"{where}.{name}: sequence batching is not supported (stateless models only), "
                f"got {_shown(value)}"
            )
    return RequestParameters(
        timeout_s=None if timeout is None else check_timeout_us(timeout, f"{where}.timeout"),
        timing=False if timing is None else check_bool(timing, f"{where}.{TIMING_PARAMETER}"),
        binary_data_output=False if binary is None else check_bool(binary, f"{where}.binary_data_output"),
        priority=priority or 0,
    )


def input_parameters(params: Mapping[str, Any], where: str) -> int | None:
    """An input's ``parameters``: its ``binary_data_size`` (None: the data is not binary). Its
    shared-memory parameters are :func:`shared_memory_ref`'s."""
    if not params:
        return None
    size = params.get("binary_data_size")
    if size is None:
        return None
    if params.get("shared_memory_region") is not None:
        raise bad_request(f"{where}: has both binary_data_size and shared_memory_region (give one)")
    return check_count(size, f"{where}.binary_data_size")


def shared_memory_ref(params: Mapping[str, Any], where: str) -> SharedMemoryRef | None:
    """A tensor's shared-memory parameters, checked for their types (None: none given)."""
    if not params or all(params.get(name) is None for name in _SHARED_MEMORY):
        return None
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset")
    if region is None:
        raise bad_request(f"{where}.shared_memory_region: required with the other shared_memory_ parameters")
    if not isinstance(region, str) or not region:
        raise bad_request(f"{where}.shared_memory_region: must be a non-empty string, got {_shown(region)}")
    if size is None:
        raise bad_request(f"{where}.shared_memory_byte_size: required with shared_memory_region")
    return SharedMemoryRef(
        region,
        0 if offset is None else check_count(offset, f"{where}.shared_memory_offset"),
        check_count(size, f"{where}.shared_memory_byte_size"),
    )


def output_parameters(params: Mapping[str, Any], where: str) -> bool | None:
    """A requested output's ``parameters``: its ``binary_data`` (None: not said). Its
    shared-memory parameters are :func:`shared_memory_ref`'s."""
    if not params:
        return None
    _refuse(params, ("classification",), where, "the classification extension is not supported")
    binary = params.get("binary_data")
    return None if binary is None else check_bool(binary, f"{where}.binary_data")


def refuse_load_parameters(names: Iterable[str], model: str) -> None:
    """Repository load parameters (a config or files sent with the request) are not supported."""
    given = sorted(names)
    if given:
        raise bad_request(
            f"model {model!r}: load parameters are not supported ({', '.join(given)}); "
            "the model's config and files come from the repository"
        )


def grpc_values(params: Mapping[str, Any]) -> dict[str, Any]:
    """gRPC ``map<string, InferParameter>`` -> name -> the value of its set oneof member (None if
    unset), so that gRPC parameters go through the same checks as JSON ones."""
    out: dict[str, Any] = {}
    for name, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        out[name] = None if kind is None else getattr(param, kind)
    return out
