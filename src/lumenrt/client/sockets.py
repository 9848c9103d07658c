"""Opening a client connection, the same way for every lumenrt client: TCP_NODELAY (a small request
is sent at once, not held for the answer to the last), TLS with the server's name checked, and
the connect bounded by a timeout; and sending a list of buffers without joining them."""

import asyncio
import contextlib
import socket
import ssl as ssl_module
from collections.abc import Callable
from typing import TypeVar

P = TypeVar("P", bound=asyncio.BaseProtocol)

# Buffers handed to one sendmsg at most: Linux's IOV_MAX (UIO_MAXIOV); more fail with EMSGSIZE.
IOV_MAX = 1024


def open_socket(
    host: str,
    port: int,
    connect_timeout_s: float,
    network_timeout_s: float | None,
    ssl: ssl_module.SSLContext | None,
) -> socket.socket:
    """A connected blocking socket (a TLS one with ``ssl``), its sends and receives bounded by
    ``network_timeout_s`` (None: not)."""
    sock = socket.create_connection((host, port), timeout=connect_timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ssl is not None:
        try:
            sock = ssl.wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
    sock.settimeout(network_timeout_s)
    return sock


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on an asyncio transport's socket (a protocol's ``connection_made``)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def open_transport(
    factory: Callable[[], P],
    host: str,
    port: int,
    ssl: ssl_module.SSLContext | None,
    connect_timeout_s: float | None,
) -> tuple[asyncio.Transport, P]:
    """An asyncio connection to host:port with ``factory``'s protocol (TLS with ``ssl``)."""
    loop = asyncio.get_running_loop()
    connecting = loop.create_connection(
        factory, host, port, ssl=ssl, server_hostname=host if ssl is not None else None
    )
    transport, protocol = await asyncio.wait_for(connecting, connect_timeout_s)
    return transport, protocol


def send_parts(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    """Every buffer of ``parts``, in order, none joined to another: on a plain socket one
    ``sendmsg`` (a gather write) per call, resumed after a partial send; on a TLS socket, which has
    no ``sendmsg``, each part through ``sendall``. The socket's timeout bounds each call, as for
    ``sendall``."""
    if isinstance(sock, ssl_module.SSLSocket):
        for part in parts:
            sock.sendall(part)
        return
    views = []
    for part in parts:
        view = memoryview(part)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        if len(view):  # an empty view would make a send of nothing look like no progress
            views.append(view)
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i : i + IOV_MAX])
        while sent:
            size = len(views[i])
            if sent < size:
                views[i] = views[i][sent:]
                break
            sent -= size
            i += 1
