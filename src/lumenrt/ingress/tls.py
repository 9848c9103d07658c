"""TLS for the three front ends: one certificate and key from files, optional client certificates
(mTLS) against a CA, reloaded without dropping a connection.

    lumenrt serve --tls-cert server.crt --tls-key server.key [--tls-client-ca ca.crt]

HTTP and the TCP protocol run on asyncio's TLS transport (uvloop's) with ``ServerTls.context``;
gRPC on the same transport with ``ServerTls.h2_context``, which offers ALPN ``h2`` as gRPC clients
require (a context of its own, so that HTTP/1.1 clients are never offered HTTP/2), or, with
``--grpc-server grpcio``, on grpc's own TLS with ``ServerTls.grpc_credentials()``. Defaults: TLS 1.2 at least,
Python's server defaults for ciphers (no compression, no renegotiation), a client certificate
required and verified against the CA when one is given.

Invariants
  1. The listening sockets keep one context, ``context`` (gRPC's: ``h2_context``), for ever; its
     SNI callback (which OpenSSL calls for every ClientHello, with or without a server name) hands
     each handshake the newest context, ``current`` (``h2_current``). A reload builds a new context from the files and swaps
     ``current`` (one attribute store, atomic under the GIL): new handshakes get the new
     certificate, established connections keep theirs.
  2. gRPC asks its fetcher for a configuration at each handshake; the fetcher answers the
     reloaded certificates once after each reload (grpc keeps them until the next answer).
  3. Files that fail to load raise TlsError, naming the flag and the file, before anything is
     swapped: a bad rotation keeps the certificates in use.
"""

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIN_VERSION = ssl.TLSVersion.TLSv1_2
H2_ALPN = ("h2",)  # what gRPC clients ask for (RFC 9113 3.2)


class TlsError(ValueError):
    """Certificates that cannot be used; the message names the flag and the file."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path  # PEM: the server's certificate chain
    key: Path  # PEM: its private key
    client_ca: Path | None = None  # PEM: CA(s) a client certificate must chain to (mTLS)

    def paths(self) -> list[tuple[str, Path]]:
        named = [("--tls-cert", self.cert), ("--tls-key", self.key)]
        if self.client_ca is not None:
            named.append(("--tls-client-ca", self.client_ca))
        return named


def _read(flag: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"{flag} {path}: cannot read: {exc.strerror or exc}") from None


def server_context(files: TlsFiles, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
    """A server context from ``files``, offering ``alpn``; TlsError names what is wrong."""
    for flag, path in files.paths():
        _read(flag, path)  # a missing or unreadable file is named as such
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as exc:
        raise TlsError(
            f"--tls-cert {files.cert} / --tls-key {files.key}: not a PEM certificate chain and its "
            f"private key ({exc.__class__.__name__}: {getattr(exc, 'reason', None) or exc})"
        ) from None
    if files.client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=files.client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise TlsError(f"--tls-client-ca {files.client_ca}: not PEM CA certificates ({exc})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


class ServerTls:
    """The front ends' TLS, reloadable (see the module docstring)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._stamp = self._stamps()
        self.current = server_context(files)
        self.context = server_context(files)  # what the listeners hold (invariant 1)
        self.context.sni_callback = self._pick
        self.h2_current = server_context(files, H2_ALPN)
        self.h2_context = server_context(files, H2_ALPN)
        self.h2_context.sni_callback = self._pick_h2
        self._grpc_pending: Any = None  # a reloaded configuration grpc has not fetched yet
        self.reloads = 0

    def _pick(self, conn: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self.current
        if current is not ctx:
            conn.context = current

    def _pick_h2(self, conn: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self.h2_current
        if current is not ctx:
            conn.context = current

    def _stamps(self) -> list[tuple[int, int, int] | None]:
        out: list[tuple[int, int, int] | None] = []
        for _, path in self.files.paths():
            try:
                st = path.stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return out

    def changed(self) -> bool:
        """The files differ from those last loaded (a stat each)."""
        return self._stamps() != self._stamp

    def reload(self) -> None:
        """Load the files again; new handshakes use them. Raises TlsError (nothing changes then)."""
        stamp = self._stamps()
        try:
            fresh = server_context(self.files)
            fresh_h2 = server_context(self.files, H2_ALPN)
            pending = self._grpc_config()
        except TlsError:
            self._stamp = stamp  # not retried by the watch until the files change again
            raise
        self.current = fresh
        self.h2_current = fresh_h2
        self._grpc_pending = pending
        self._stamp = stamp
        self.reloads += 1

    # ---- gRPC -----------------------------------------------------------------------------------

    def _grpc_config(self) -> Any:
        import grpc

        cert = _read("--tls-cert", self.files.cert)
        key = _read("--tls-key", self.files.key)
        ca = _read("--tls-client-ca", self.files.client_ca) if self.files.client_ca is not None else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def _fetch_grpc(self) -> Any:
        pending, self._grpc_pending = self._grpc_pending, None
        return pending  # None: keep what grpc has (invariant 2)

    def grpc_credentials(self) -> Any:
        import grpc

        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(),
            self._fetch_grpc,
            require_client_authentication=self.files.client_ca is not None,
        )
