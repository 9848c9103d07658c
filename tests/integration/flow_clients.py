"""Clients for the flow-control tests of both front ends (test_http_flow_control.py,
test_tcp_flow_control.py): one that hardly reads, a sender thread, a sampler of the server side,
and a bounded wait; and a reader of one raw HTTP response (the raw-socket HTTP tests)."""

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from lumenrt.ingress.app import ServerThread

WAIT_S = 60.0  # deadline for a condition to come true (a hang fails the test, it never stalls)


def non_reading_client(st: ServerThread, protocol: str) -> socket.socket:
    """A client with a small receive buffer, so the server's answers back up quickly."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT_S)
    sock.connect(("127.0.0.1", st.ports[protocol]))
    return sock


class Sender(threading.Thread):
    """Sends everything (blocking while the server does not read); an error is kept, not raised."""

    def __init__(self, sock: socket.socket, data: bytes) -> None:
        super().__init__(daemon=True)
        self.sock, self.data = sock, data
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.sock.sendall(self.data)
        except OSError as exc:
            self.error = exc


@dataclass(frozen=True)
class Probe:
    write_paused: bool
    load_paused: bool
    reading: bool
    buffered: int  # transport.get_write_buffer_size()
    high: int  # the transport's high-water mark
    queued: int  # HTTP: parsed requests waiting on the connection (TCP: 0)


def probe(st: ServerThread, client: socket.socket, protocol: str) -> Probe | None:
    """The server side of ``client``'s connection, read on the server's loop (None: gone)."""
    port = client.getsockname()[1]

    async def look() -> Probe | None:
        for conn in st.app.front_ends[protocol].connections:  # type: ignore[attr-defined]
            t = conn.transport
            if t is not None and t.get_extra_info("peername")[1] == port:
                return Probe(
                    conn.write_paused,
                    conn.load_paused,
                    t.is_reading(),
                    t.get_write_buffer_size(),
                    t.get_write_buffer_limits()[1],
                    len(getattr(conn, "_queue", ())),
                )
        return None

    return cast(Probe | None, st.call(look()))


class Sampler(threading.Thread):
    """Calls ``probe()`` until stopped (every 2 ms): the largest write buffer it saw (``buffered``),
    the high-water mark (``high``), and how many probes found the connection."""

    def __init__(self, probe: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.probe = probe
        self.stop_event = threading.Event()
        self.most = 0
        self.high = 0
        self.probes = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            p = self.probe()
            if p is not None:
                self.most = max(self.most, p.buffered)
                self.high = p.high
                self.probes += 1
            self.stop_event.wait(0.002)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(WAIT_S)


def wait_for(what: str, cond: Callable[[], Any]) -> Any:
    """``cond()``'s first true value, polled every 10 ms; AssertionError after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"not within {WAIT_S:g} s: {what}")


def read_response(sock: socket.socket, buf: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response (status, lower-case headers, body); ``buf`` carries bytes read past it."""
    buf = buf if buf is not None else bytearray()
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a whole response: {bytes(buf)!r}")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside a body")
        body += chunk
    del buf[:]
    buf += body[length:]
    return status, headers, bytes(body[:length])
