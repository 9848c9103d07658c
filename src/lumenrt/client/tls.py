"""The client side of TLS: a context that checks the server's certificate and name.

    from lumenrt.client import TcpClient
    from lumenrt.client.tls import client_context

    TcpClient("server.example", 8003, ssl=client_context("ca.crt"), api_key=key)

``ca``: the CA file the server's certificate must chain to (None: the system's CAs); ``cert`` and
``key``: this client's certificate and private key, for a server that asks for one (mTLS).
"""

import ssl
from pathlib import Path

MIN_VERSION = ssl.TLSVersion.TLSv1_2


def client_context(
    ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None
) -> ssl.SSLContext:
    """A TLS 1.2+ client context that verifies the server's chain and host name."""
    ctx = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    ctx.minimum_version = MIN_VERSION
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
    elif key is not None:
        raise ValueError("client_context: a key without its certificate (give cert too)")
    return ctx
