"""The error a request is answered with, on every protocol: a status and a message naming the field.

Codecs here raise it for what they cannot decode (``bad_request``: 400); the front ends in
``lumenrt.ingress`` answer it as it is, on HTTP with ``status``, on gRPC with the code that
``lumenrt.ingress.errors.GRPC_CODES`` maps it to, on the TCP protocol in an error frame. Engine
errors are turned into it by ``lumenrt.ingress.errors.as_server_error``.
"""


class ServerError(Exception):
    """A request answered with an error: ``status`` is the HTTP status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bad_request(message: str) -> ServerError:
    return ServerError(400, message)
