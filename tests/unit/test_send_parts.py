"""client/sockets.py's send_parts: a list of buffers arrives whole and in order, unjoined, past
partial sends and past IOV_MAX buffers a call."""

import socket
import threading
from typing import Any

import numpy as np

from lumenrt.client.sockets import IOV_MAX, send_parts


def _received_by_peer(parts: list[Any], recv_buffer: int = 4096) -> bytes:
    a, b = socket.socketpair()
    got = bytearray()
    total = sum(memoryview(p).nbytes for p in parts)

    def read() -> None:
        while len(got) < total:
            chunk = b.recv(recv_buffer)
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        a.settimeout(30)
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # partial sends, many of them
        send_parts(a, parts)
        reader.join(30)
    finally:
        a.close()
        b.close()
    return bytes(got)


def test_more_buffers_than_one_call_takes_arrive_in_order() -> None:
    parts: list[Any] = [bytes([i % 251]) * (1 + i % 7) for i in range(3 * IOV_MAX + 5)]
    parts.insert(10, b"")  # an empty buffer is skipped, not a stall
    assert _received_by_peer(parts) == b"".join(parts)


def test_large_views_of_other_item_sizes_are_sent_as_their_bytes() -> None:
    floats = np.arange(300_000, dtype=np.float32)  # 1.2 MB, itemsize 4
    head = b"\x00\x00\x09frame-head"
    got = _received_by_peer([head, memoryview(floats), memoryview(floats.tobytes())[7:]])
    assert got == head + floats.tobytes() + floats.tobytes()[7:]


def test_each_call_hands_sendmsg_at_most_iov_max_buffers() -> None:
    calls: list[int] = []

    class Recorder:
        def sendmsg(self, views: list[memoryview]) -> int:
            calls.append(len(views))
            return len(views[0]) + len(views[1]) // 2 if len(views) > 1 else len(views[0])  # partial

    send_parts(Recorder(), [b"ab"] * (IOV_MAX + 3))  # type: ignore[arg-type]
    assert max(calls) == IOV_MAX
    assert len(calls) > 2  # it went on after each partial send until every buffer was out
