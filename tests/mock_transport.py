"""A mock asyncio transport for the front ends' connection tests (tests/unit/test_connection.py,
tests/integration/test_http_flow_control.py): no socket, the client's reads are explicit."""

import asyncio
from typing import Any, cast

from lumenrt.ingress.connection import Connection


class MockTransport:
    """Holds what is written until the client reads it: ``pause_writing`` once over ``high``
    bytes, ``resume_writing`` when reads bring it to ``low`` or under, and ``connection_lost``
    only once a closed transport's buffer is empty (or at once on ``abort``), as asyncio's do."""

    def __init__(self, loop: asyncio.AbstractEventLoop, high: int, low: int = 0) -> None:
        self.loop = loop
        self.conn: Connection | None = None
        self.high, self.low = high, low
        self.most = 0  # the most it ever held
        self.buffer = bytearray()
        self.received = bytearray()  # what the client has read
        self.reading = True
        self.closing = False
        self.aborted = False
        self.eof_written = False
        self.write_paused = False
        self._lost = False

    def attach(self, conn: Connection) -> None:
        self.conn = conn
        conn.connection_made(cast(asyncio.Transport, self))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: Any) -> None:
        assert not self.closing and not self.eof_written, "write after close or write_eof"
        self.buffer += bytes(data)
        self.most = max(self.most, len(self.buffer))
        if not self.write_paused and len(self.buffer) > self.high:
            self.write_paused = True
            assert self.conn is not None
            self.conn.pause_writing()

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def get_write_buffer_size(self) -> int:
        return len(self.buffer)

    def client_reads(self, n: int | None = None) -> None:
        n = len(self.buffer) if n is None else n
        self.received += self.buffer[:n]
        del self.buffer[:n]
        if self.write_paused and len(self.buffer) <= self.low:
            self.write_paused = False
            assert self.conn is not None
            self.conn.resume_writing()
        self._maybe_lost()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading and not self.closing

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def close(self) -> None:
        self.closing = True
        self._maybe_lost()

    def abort(self) -> None:
        self.aborted = True
        self.buffer.clear()
        self.close()

    def _maybe_lost(self) -> None:
        if self.closing and not self.buffer and not self._lost:
            self._lost = True
            assert self.conn is not None
            self.loop.call_soon(self.conn.connection_lost, None)
