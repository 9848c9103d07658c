"""benchmarks/roundtrip.py's echo servers: the HTTP echo answers a keep-alive ``http.client`` with the
prebuilt bytes once a request's headers and body are in, whatever way the reads split it."""

import http.client

from tests.benchmark_modules import import_benchmark_module

roundtrip = import_benchmark_module("roundtrip")

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: 5\r\n\r\nhello"


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_http_echo_answers_each_request_once_whole() -> None:
    echo = roundtrip._HttpEcho(ANSWER)
    echo.transport = _Transport()
    request = b"POST /v2/x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody"
    for piece in (request[:10], request[10:-2], request[-2:]):  # one request over three reads
        echo.data_received(piece)
    assert echo.transport.written == [ANSWER]
    echo.data_received(request + request.replace(b"Content-Length: 4", b"content-length:0")[:-4])
    assert echo.transport.written == [ANSWER] * 3  # two in one read; a body of none
    assert echo.buffer == b""


def test_http_echo_server_serves_http_client_on_one_connection() -> None:
    child = roundtrip._Child(roundtrip._echo_server_main, (0, ANSWER), "test-http-echo")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", child.port, timeout=10)
        for _ in range(3):
            conn.request(
                "POST", "/v2/models/m/infer", b"\x00" * 300, {"Content-Type": "application/octet-stream"}
            )
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, b"hello")
        conn.close()
    finally:
        child.stop()
