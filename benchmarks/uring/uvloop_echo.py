"""The uvloop side of the io_uring comparison: what ``uring_echo.c`` does, on the event loop
``lumenrt serve`` runs on. For every request frame of the lumenrt TCP protocol (a 24-byte header,
then metadata and payload) it writes back one canned response frame carrying the request's id.

    python benchmarks/uring/uvloop_echo.py RESPONSE_FILE   # prints its port, serves until SIGTERM

Like the C one it keeps no frame bytes: a connection holds a split header (at most 24 bytes) and
how many body bytes are still to come; reads land in uvloop's own buffer (``data_received``).
"""

import asyncio
import signal
import socket
import struct
import sys

HEADER_BYTES = 24
ID = struct.Struct("<Q")  # the request id, at offset 8
SIZES = struct.Struct("<II")  # metadata and payload bytes, at offset 16


class Responder(asyncio.Protocol):
    """One connection; ``response`` is the canned frame, its id patched per answer."""

    __slots__ = ("head", "request_id", "response", "skip", "transport")

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.head = b""  # a header received in part
        self.skip = 0  # body bytes of the current frame still to come
        self.request_id = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        view, at, answers = memoryview(data), 0, []
        while at < len(view):
            if self.skip == 0 and len(self.head) < HEADER_BYTES:
                take = HEADER_BYTES - len(self.head)
                self.head += bytes(view[at : at + take])
                at += take
                if len(self.head) < HEADER_BYTES:
                    break
                self.request_id = self.head[8:16]
                meta, payload = SIZES.unpack_from(self.head, 16)
                self.skip = meta + payload
            else:
                take = min(self.skip, len(view) - at)
                self.skip -= take
                at += take
            if self.skip == 0 and len(self.head) == HEADER_BYTES:  # a whole frame: answer it
                self.head = b""
                answers.append(self.response[:8] + self.request_id + self.response[16:])
        if answers and self.transport is not None:
            self.transport.write(b"".join(answers))


async def serve(response: bytes) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Responder(response), "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: uvloop_echo.py RESPONSE_FILE", file=sys.stderr)
        return 2
    with open(sys.argv[1], "rb") as f:
        response = f.read()
    import uvloop

    from lumenrt.ingress.fd_limit import raise_fd_limit

    raise_fd_limit()  # as lumenrt serve does

    uvloop.run(serve(response))
    return 0


if __name__ == "__main__":
    sys.exit(main())
