"""The errors a request is answered with, and their status on each protocol.

Every front end (HTTP, gRPC, the binary TCP protocol) answers a failed request with one
:class:`~lumenrt.protocols.errors.ServerError`: an HTTP status and a message that names the problem
(the field, the model, the limit). Engine errors carry their own status; anything else unexpected is
a 500.
"""

from lumenrt.engine.config import ConfigError
from lumenrt.engine.repository import ModelNotFound
from lumenrt.engine.request import EngineError
from lumenrt.protocols.errors import ServerError


def not_found(message: str) -> ServerError:
    return ServerError(404, message)


def unavailable(message: str) -> ServerError:
    return ServerError(503, message)


def as_server_error(exc: BaseException) -> ServerError:
    """The ServerError to answer ``exc`` with."""
    if isinstance(exc, ServerError):
        return exc
    if isinstance(exc, ModelNotFound):
        return ServerError(404, str(exc))
    if isinstance(exc, EngineError):
        return ServerError(exc.status, str(exc))
    if isinstance(exc, ConfigError):
        return ServerError(400, str(exc))
    return ServerError(500, f"internal error: {type(exc).__name__}: {exc}")


# HTTP status -> gRPC status code name (grpc.StatusCode member), as Triton maps them.
GRPC_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "RESOURCE_EXHAUSTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

# HTTP reason phrases for the statuses this server sends.
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    417: "Expectation Failed",
    426: "Upgrade Required",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    499: "Client Closed Request",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}
