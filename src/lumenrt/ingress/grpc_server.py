"""KServe V2 over gRPC on grpc.aio (``--grpc-server grpcio``): the grpc library's own server, kept beside
lumenrt's HTTP/2 server (``grpc_h2.py``, the default) as a fallback and for A/B measurements.

Every rpc of ``protocols/proto/grpc_service.proto`` is served through ``grpc_service.GrpcServicer``
(the handler table is built from the .proto's service, so a new rpc without a handler fails at
start-up); anything else (CUDA shared memory, trace, streaming) is answered UNIMPLEMENTED by grpc.
The service is registered under Triton's wire name, so clients call ``/inference.GRPCInferenceService/…``.

Invariants
  - Handlers run on the event loop that started the server (the one loop of ``lumenrt serve``,
    uvloop's when installed): they call the service from that thread only, as its counters need.
    Model load and unload block, so they run in the loop's default executor (the service
    serialises them).
  - A failed rpc is answered with the gRPC status of its ServerError (``errors.GRPC_CODES``) and a
    message that names the field; no rpc leaks a Python exception as UNKNOWN.
  - One message is at most ``limits.max_body_bytes`` either way (grpc answers RESOURCE_EXHAUSTED).

Shutdown order (driven by ``ServerApp.shutdown``)
  1. the service stops accepting: ModelInfer is answered UNAVAILABLE from now on;
  2. ``stop_listening``: grpc stops taking new rpcs (its listener closes) and gives those in flight
     ``limits.grace_s`` to finish;
  3. the app waits for the service's in-flight requests;
  4. ``close``: any rpc still running is cancelled (its engine request is cancelled with it) and
     the server is released.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from lumenrt.ingress.errors import GRPC_CODES, as_server_error
from lumenrt.ingress.grpc_service import GROUPS, SERVICE_NAME, GrpcServicer, pb, rpc_methods, snake
from lumenrt.ingress.service import InferenceService
from lumenrt.protocols.errors import ServerError

Handler = Callable[[Any, Any], Awaitable[Any]]


def _status(err: ServerError) -> grpc.StatusCode:
    return grpc.StatusCode[GRPC_CODES.get(err.status, "INTERNAL")]


def _guarded(handler: Handler, service: InferenceService, group: str) -> Handler:
    """``handler`` behind the key check of its endpoint ``group`` (401 -> UNAUTHENTICATED, 403 ->
    PERMISSION_DENIED), with every failure answered as a gRPC status (ServerError's, else INTERNAL)."""

    async def rpc(request: Any, context: Any) -> Any:
        try:
            gate = service.gate
            if gate is not None and not gate.is_open(group):
                key, presented = gate.from_metadata(context.invocation_metadata())
                gate.check(group, key, presented)
            return await handler(request, context)
        except Exception as exc:  # CancelledError is not an Exception: cancellation passes through
            err = as_server_error(exc)
        await context.abort(_status(err), err.message)
        raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises

    return rpc


def generic_handler(service: InferenceService) -> Any:
    """The grpc handler for every rpc of the .proto's service, under :data:`SERVICE_NAME`."""
    servicer = GrpcServicer(service)
    methods: dict[str, Any] = {}
    for method in rpc_methods():
        request_class = getattr(pb, method.input_type.name)
        response_class = getattr(pb, method.output_type.name)
        methods[method.name] = grpc.unary_unary_rpc_method_handler(
            _guarded(getattr(servicer, snake(method.name)), service, GROUPS[method.name]),
            request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)


# ---- the server -----------------------------------------------------------------------------------


class GrpcServer:
    """A running grpc.aio server (the app's FrontEnd)."""

    def __init__(self, server: Any, port: int, grace_s: float) -> None:
        self._server = server
        self.port = port
        self._grace_s = grace_s
        self._stopping: asyncio.Task[None] | None = None

    async def stop_listening(self) -> None:
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._server.stop(self._grace_s))
            await asyncio.sleep(0)  # let the shutdown begin: no new rpcs from here on

    async def close(self) -> None:
        await self._server.stop(None)  # cancels what is still running (the tightest grace wins)
        if self._stopping is not None:
            await self._stopping


async def start_grpc(service: InferenceService, host: str, port: int, credentials: Any = None) -> GrpcServer:
    """Serve ``service`` over gRPC on host:port (port 0: any free port) on the running loop;
    ``credentials``: grpc server credentials for TLS (``ServerTls.grpc_credentials()``)."""
    limit = service.limits.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared listener
        ]
    )
    server.add_generic_rpc_handlers((generic_handler(service),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if credentials is not None:
            bound = server.add_secure_port(address, credentials)
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"gRPC: cannot listen on {address}: {exc}") from None
    await server.start()
    return GrpcServer(server, bound, service.limits.grace_s)
