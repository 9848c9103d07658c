"""The error a client raises when the server answers a request with an error."""


class InferenceError(Exception):
    """The server refused or failed a request: ``status`` is its HTTP-style status code (400 bad
    input, 404 unknown model, 413 too large, 503 unavailable, 504 timed out, ...) and ``message``
    names the problem."""

    def __init__(self, status: int, message: str, request_id: int = 0) -> None:
        super().__init__(f"[{status}] {message}")
        self.status = status
        self.message = message
        self.request_id = request_id
