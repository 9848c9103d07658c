"""TLS on every front end of a real server (ServerThread, loopback), with certificates made at test
time: each client users have connects and infers (tritonclient over HTTPS and gRPC+TLS, lumenrt's
four clients); mTLS lets in the CA's client certificate and nobody else; clients refuse an
expired certificate and one for another host; a plain-text client on the TLS port fails cleanly
and the server goes on; a certificate rotated on disk reaches new connections while a connection
opened before keeps working; TLS 1.1 is refused."""

import asyncio
import contextlib
import functools
import shutil
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from lumenrt.client import AsyncHttpClient, AsyncTcpClient, HttpClient, InferenceError, TcpClient
from lumenrt.client.grpc import AsyncGrpcClient, GrpcClient
from lumenrt.client.tls import client_context
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.tls import TlsError, TlsFiles, server_context
from lumenrt.models.builtin import builtin_examples
from tests.tls_certs import Certs, Pair, make_certs

MODEL = "digits_mlp"
# tritonclient's HTTP stack (geventhttpclient) checks the host name with the deprecated
# ssl.match_hostname; TLS 1.1 itself is deprecated (the test offers it to see it refused)
pytestmark = [
    pytest.mark.filterwarnings("ignore:ssl.match_hostname:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning"),
]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(models=[MODEL], settings=EngineConfig(thread_count=1, pin=False)) as e:
        yield e


@contextlib.contextmanager
def serving(engine: Engine, pair: Pair, client_ca: Path | None = None) -> Iterator[ServerThread]:
    options = ServeOptions(http_port=0, grpc_port=0, tcp_port=0, tls=TlsFiles(pair.cert, pair.key, client_ca))
    with ServerThread(engine, options) as st:
        yield st


@pytest.fixture(scope="module")
def server(engine: Engine, certs: Certs) -> Iterator[ServerThread]:
    with serving(engine, certs.server) as st:
        yield st


def _x() -> np.ndarray:
    return builtin_examples(MODEL, 1)["input"]


# ---- one caller per client: (server, client context) -> the model's output ---------------------


def via_http(st: ServerThread, ctx: ssl.SSLContext) -> Any:
    with HttpClient("127.0.0.1", st.ports["http"], ssl=ctx) as client:
        return client.infer(MODEL, {"input": _x()}).outputs


def via_tcp(st: ServerThread, ctx: ssl.SSLContext) -> Any:
    with TcpClient("127.0.0.1", st.ports["tcp"], ssl=ctx) as client:
        return client.infer(MODEL, {"input": _x()}).outputs


def via_async_tcp(st: ServerThread, ctx: ssl.SSLContext) -> Any:
    async def run() -> Any:
        async with AsyncTcpClient("127.0.0.1", st.ports["tcp"], ssl=ctx) as client:
            return (await client.infer(MODEL, {"input": _x()})).outputs

    return asyncio.run(run())


def via_async_http(st: ServerThread, ctx: ssl.SSLContext) -> Any:
    async def run() -> Any:
        async with AsyncHttpClient("127.0.0.1", st.ports["http"], ssl=ctx) as client:
            return (await client.infer(MODEL, {"input": _x()})).outputs

    return asyncio.run(run())


def _gevent_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> Any:
    import gevent.ssl

    ctx = gevent.ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def via_tritonclient_http(st: ServerThread, ca: Path, pair: Pair | None = None) -> Any:
    factory = functools.partial(_gevent_context, ca, *((pair.cert, pair.key) if pair else ()))
    client = thttp.InferenceServerClient(
        f"127.0.0.1:{st.ports['http']}", ssl=True, ssl_context_factory=factory
    )
    try:
        given = thttp.InferInput("input", [1, 64], "FP32")
        given.set_data_from_numpy(_x())
        return {"probabilities": client.infer(MODEL, [given]).as_numpy("probabilities")}
    finally:
        client.close()


def via_tritonclient_grpc(st: ServerThread, ca: Path, pair: Pair | None = None) -> Any:
    client = tgrpc.InferenceServerClient(
        f"127.0.0.1:{st.ports['grpc']}",
        ssl=True,
        root_certificates=str(ca),
        private_key=str(pair.key) if pair else None,
        certificate_chain=str(pair.cert) if pair else None,
    )
    try:
        given = tgrpc.InferInput("input", [1, 64], "FP32")
        given.set_data_from_numpy(_x())
        return {"probabilities": client.infer(MODEL, [given], client_timeout=20).as_numpy("probabilities")}
    finally:
        client.close()


def via_grpc(st: ServerThread, ctx: ssl.SSLContext) -> Any:
    with GrpcClient("127.0.0.1", st.ports["grpc"], ssl=ctx) as client:
        return client.infer(MODEL, {"input": _x()}).outputs


def via_async_grpc(st: ServerThread, ctx: ssl.SSLContext) -> Any:
    async def run() -> Any:
        async with AsyncGrpcClient("127.0.0.1", st.ports["grpc"], ssl=ctx) as client:
            return (await client.infer(MODEL, {"input": _x()})).outputs

    return asyncio.run(run())


LUMENRT_CLIENTS: dict[str, Callable[[ServerThread, ssl.SSLContext], Any]] = {
    "http": via_http,
    "tcp": via_tcp,
    "async-tcp": via_async_tcp,
    "async-http": via_async_http,
    "grpc": via_grpc,
    "async-grpc": via_async_grpc,
}


@pytest.mark.parametrize("client", LUMENRT_CLIENTS)
def test_lumenrt_clients_infer_over_tls(server: ServerThread, certs: Certs, client: str) -> None:
    outputs = LUMENRT_CLIENTS[client](server, client_context(certs.ca))
    assert np.asarray(outputs["probabilities"]).shape == (1, 10)


@pytest.mark.parametrize("via", [via_tritonclient_http, via_tritonclient_grpc], ids=["http", "grpc"])
def test_tritonclient_infers_over_tls(server: ServerThread, certs: Certs, via: Any) -> None:
    assert via(server, certs.ca)["probabilities"].shape == (1, 10)


def test_large_requests_land_in_their_slots_over_tls(certs: Certs) -> None:
    """A 600 KB body over HTTPS, a 600 KB frame over TCP+TLS and a 600 KB gRPC message over TLS:
    the tensor bytes land in the arena slot (ingress/lent_slot.py, grpc_body.py), as plain text."""
    big = "squeezenet"
    x = builtin_examples(big, 1)["data"]
    with (
        Engine(models=[big], settings=EngineConfig(thread_count=1, pin=False)) as engine,
        serving(engine, certs.server) as st,
    ):
        expected = engine.infer(big, {"data": x}).outputs["prob"]
        rt = engine.runtime(big)
        ctx = client_context(certs.ca)
        with HttpClient("127.0.0.1", st.ports["http"], ssl=ctx) as http:
            np.testing.assert_allclose(
                http.infer(big, {"data": x}).outputs["prob"], expected, rtol=1e-5, atol=1e-6
            )
        with TcpClient("127.0.0.1", st.ports["tcp"], ssl=ctx) as tcp:
            np.testing.assert_allclose(
                tcp.infer(big, {"data": x}).outputs["prob"], expected, rtol=1e-5, atol=1e-6
            )
        assert rt.inputs_in_place == 2
        # the blocking gRPC client sends a large message's frames part by part over TLS
        # (sockets.send_parts). The second message lands; the first does too when this process
        # decoded the signature before (grpc_service's plans are the process's, not the server's)
        with GrpcClient("127.0.0.1", st.ports["grpc"], ssl=ctx) as grpc_client:
            for _ in range(2):
                np.testing.assert_allclose(
                    grpc_client.infer(big, {"data": x}).outputs["prob"], expected, rtol=1e-5, atol=1e-6
                )
        assert rt.inputs_in_place in (3, 4)


def test_a_client_that_does_not_trust_the_ca_refuses_the_server(server: ServerThread, certs: Certs) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        via_tcp(server, client_context(certs.other_ca))
    with pytest.raises(InferenceServerException):
        via_tritonclient_grpc(server, certs.other_ca)


@pytest.mark.parametrize("which", ["expired", "wrong_host"])
def test_clients_refuse_an_expired_or_wrong_host_certificate(
    engine: Engine, certs: Certs, which: str
) -> None:
    pair: Pair = getattr(certs, which)
    reason = "certificate has expired" if which == "expired" else "IP address mismatch"
    with serving(engine, pair) as st:
        for via in (via_http, via_tcp):
            with pytest.raises(ssl.SSLCertVerificationError, match=reason):
                via(st, client_context(certs.ca))
        with pytest.raises(InferenceServerException):
            via_tritonclient_grpc(st, certs.ca)


def test_mtls_admits_the_cas_clients_only(engine: Engine, certs: Certs) -> None:
    with serving(engine, certs.server, client_ca=certs.ca) as st:
        admitted = client_context(certs.ca, certs.client.cert, certs.client.key)
        assert np.asarray(via_tcp(st, admitted)["probabilities"]).shape == (1, 10)
        assert np.asarray(via_http(st, admitted)["probabilities"]).shape == (1, 10)
        assert via_tritonclient_grpc(st, certs.ca, certs.client)["probabilities"].shape == (1, 10)
        assert via_tritonclient_http(st, certs.ca, certs.client)["probabilities"].shape == (1, 10)
        for refused in (
            client_context(certs.ca),
            client_context(certs.ca, certs.stranger.cert, certs.stranger.key),
        ):
            with pytest.raises((ssl.SSLError, ConnectionError, InferenceError, OSError)):
                via_http(st, refused)
        with pytest.raises(InferenceServerException):
            via_tritonclient_grpc(st, certs.ca, certs.stranger)
        assert np.asarray(via_tcp(st, admitted)["probabilities"]).shape == (1, 10)  # still serving


def test_plain_text_on_the_tls_port_fails_and_the_server_goes_on(server: ServerThread, certs: Certs) -> None:
    with (
        HttpClient("127.0.0.1", server.ports["http"], timeout_s=10) as plain,
        pytest.raises((ConnectionError, OSError)),
    ):
        plain.infer(MODEL, {"input": _x()})
    with (
        TcpClient("127.0.0.1", server.ports["tcp"], network_timeout_s=10) as plain,
        pytest.raises((ConnectionError, OSError, InferenceError)),
    ):
        plain.infer(MODEL, {"input": _x()})
    assert np.asarray(via_tcp(server, client_context(certs.ca))["probabilities"]).shape == (1, 10)


def test_tls_1_1_is_refused(server: ServerThread, certs: Certs) -> None:
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(certs.ca)
    with contextlib.suppress(ValueError, ssl.SSLError):  # a local OpenSSL may refuse to go this low
        old.minimum_version = ssl.TLSVersion.TLSv1_1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    if old.maximum_version != ssl.TLSVersion.TLSv1_1:
        pytest.skip("this OpenSSL cannot offer TLS 1.1")
    with (
        socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10) as sock,
        pytest.raises(ssl.SSLError),
    ):
        old.wrap_socket(sock, server_hostname="127.0.0.1")


def _peer_serial(sock: ssl.SSLSocket) -> int:
    from cryptography import x509

    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_a_rotated_certificate_reaches_new_connections_and_old_ones_go_on(
    engine: Engine, certs: Certs, tmp_path: Path
) -> None:
    live = Pair(tmp_path / "live.crt", tmp_path / "live.key", certs.server.serial)
    shutil.copy(certs.server.cert, live.cert)
    shutil.copy(certs.server.key, live.key)
    ctx = client_context(certs.ca)
    with serving(engine, live) as st:
        old = TcpClient("127.0.0.1", st.ports["tcp"], ssl=ctx)
        try:
            old.infer(MODEL, {"input": _x()})
            assert old._sock is not None and _peer_serial(old._sock) == certs.server.serial  # type: ignore[arg-type]
            shutil.copy(certs.server_renewed.cert, live.cert)
            shutil.copy(certs.server_renewed.key, live.key)

            async def reload() -> list[str]:
                return st.app.reload()

            assert st.call(reload()) == ["tls certificates"]
            fresh = TcpClient("127.0.0.1", st.ports["tcp"], ssl=ctx)
            try:
                fresh.infer(MODEL, {"input": _x()})
                assert _peer_serial(fresh._sock) == certs.server_renewed.serial  # type: ignore[arg-type]
            finally:
                fresh.close()
            old.infer(MODEL, {"input": _x()})  # the connection from before goes on
            assert _peer_serial(old._sock) == certs.server.serial  # type: ignore[arg-type]
            assert via_tritonclient_grpc(st, certs.ca)["probabilities"].shape == (1, 10)
        finally:
            old.close()


def test_bad_files_are_named(certs: Certs, tmp_path: Path) -> None:
    with pytest.raises(TlsError, match=r"--tls-cert .*missing\.crt: cannot read"):
        server_context(TlsFiles(tmp_path / "missing.crt", certs.server.key))
    with pytest.raises(TlsError, match="not a PEM certificate chain and its private key"):
        server_context(TlsFiles(certs.server.cert, certs.client.key))
    with pytest.raises(TlsError, match="--tls-client-ca"):
        server_context(TlsFiles(certs.server.cert, certs.server.key, certs.server.key))
