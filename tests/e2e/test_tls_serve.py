"""``lumenrt serve`` with TLS and API keys on, as a real process: tritonclient (HTTPS, gRPC+TLS),
lumenrt's clients and perf_analyzer with its SSL options get in with the right credentials and
nothing but the open groups answers without them.

perf_analyzer sends headers over HTTP only (its ``-H`` is ignored for gRPC), so over gRPC its
credential is a client certificate: the second server requires one (mTLS) and leaves the
inference group open to key-less clients that passed that check."""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tgrpc

from lumenrt.client import HttpClient, InferenceError, TcpClient
from lumenrt.client.tls import client_context
from lumenrt.models.builtin import builtin_examples
from tests.benchmark_modules import import_benchmark_module
from tests.e2e.conftest import ServeProcess, start_serve
from tests.tls_certs import Certs, make_certs

MODEL = "digits_mlp"
KEY = "e2e-tls-key-0123456789abcdef"

perf_analyzer = import_benchmark_module("perf_analyzer")  # benchmarks/perf_analyzer.py
PROBLEM = perf_analyzer.perf_analyzer_problem()
needs_perf_analyzer = pytest.mark.skipif(
    PROBLEM is not None, reason=f"perf_analyzer cannot run here: {PROBLEM}"
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LUMENRT_API_KEYS"}
    env["LUMENRT_API_KEYS"] = json.dumps({"keys": [{"name": "bench", "key": KEY, "groups": ["*"]}]})
    return env


@pytest.fixture(scope="module")
def secured(certs: Certs) -> Iterator[ServeProcess]:
    tls = ["--tls-cert", str(certs.server.cert), "--tls-key", str(certs.server.key)]
    server = start_serve("--models", MODEL, *tls, env=_env())
    yield server
    assert server.stop() == 0, "\n".join(server.lines)
    assert KEY not in "\n".join(server.lines)


def _x() -> np.ndarray:
    return builtin_examples(MODEL, 1)["input"]


def test_the_server_says_it_speaks_tls(secured: ServeProcess) -> None:
    assert any(line.startswith("lumenrt serve: listening") and "(TLS)" in line for line in secured.lines)


def test_clients_with_the_key_get_in_over_tls_and_without_it_do_not(
    secured: ServeProcess, certs: Certs
) -> None:
    ctx = client_context(certs.ca)
    with TcpClient("127.0.0.1", secured.ports["tcp"], ssl=ctx, api_key=KEY) as tc:
        assert tc.infer(MODEL, {"input": _x()}).outputs["probabilities"].shape == (1, 10)
    with HttpClient("127.0.0.1", secured.ports["http"], ssl=ctx, api_key=KEY) as hc:
        assert hc.infer(MODEL, {"input": _x()}).outputs["probabilities"].shape == (1, 10)
    with HttpClient("127.0.0.1", secured.ports["http"], ssl=ctx) as hc:
        assert hc.ready()  # health is open
        with pytest.raises(InferenceError) as refused:
            hc.infer(MODEL, {"input": _x()})
        assert refused.value.status == 401
    grpc = tgrpc.InferenceServerClient(secured.grpc_url, ssl=True, root_certificates=str(certs.ca))
    try:
        given = tgrpc.InferInput("input", [1, 64], "FP32")
        given.set_data_from_numpy(_x())
        headers = {"authorization": f"Bearer {KEY}"}
        assert grpc.infer(MODEL, [given], headers=headers).as_numpy("probabilities").shape == (1, 10)
        with pytest.raises(Exception, match=r"UNAUTHENTICATED|API key"):
            grpc.infer(MODEL, [given])
        assert grpc.is_server_ready()
    finally:
        grpc.close()


@needs_perf_analyzer
def test_perf_analyzer_over_https_with_the_key(secured: ServeProcess, certs: Certs) -> None:
    ssl_args = [
        "--ssl-https-verify-peer",
        "1",
        "--ssl-https-verify-host",
        "2",
        "--ssl-https-ca-certificates-file",
        str(certs.ca),
    ]
    result = perf_analyzer.run_perf_analyzer(
        MODEL,
        f"https://{secured.http_url}",
        "http",
        measurement_ms=500,
        extra_args=[*ssl_args, "-H", f"Authorization: Bearer {KEY}"],
        stability_percentage=100,
        max_trials=10,  # 3 windows within 2x, of up to 10: CI stalls now and then
    )
    assert result["throughput_infer_per_s"] > 0
    with pytest.raises(RuntimeError):  # the right CA but no key: every request is refused
        perf_analyzer.run_perf_analyzer(
            MODEL,
            f"https://{secured.http_url}",
            "http",
            measurement_ms=500,
            extra_args=ssl_args,
            max_trials=1,
        )


@needs_perf_analyzer
def test_perf_analyzer_over_grpc_tls_with_a_client_certificate(certs: Certs, tmp_path: Path) -> None:
    tls = ["--tls-cert", str(certs.server.cert), "--tls-key", str(certs.server.key)]
    open_groups = [
        "--open-groups",
        "health",
        "inference",
        "metadata",
        "statistics",
    ]  # what perf_analyzer calls
    mtls = [*tls, "--tls-client-ca", str(certs.ca), *open_groups]
    with start_serve("--models", MODEL, *mtls, env=_env()) as server:
        ssl_args = ["--ssl-grpc-use-ssl", "true", "--ssl-grpc-root-certifications-file", str(certs.ca)]
        client_cert = [
            "--ssl-grpc-private-key-file",
            str(certs.client.key),
            "--ssl-grpc-certificate-chain-file",
            str(certs.client.cert),
        ]
        result = perf_analyzer.run_perf_analyzer(
            MODEL,
            server.grpc_url,
            "grpc",
            measurement_ms=500,
            extra_args=[*ssl_args, *client_cert],
            stability_percentage=100,
            max_trials=10,  # 3 windows within 2x, of up to 10: CI stalls now and then
        )
        assert result["throughput_infer_per_s"] > 0
        with pytest.raises(RuntimeError):  # no client certificate: the handshake is refused
            perf_analyzer.run_perf_analyzer(
                MODEL, server.grpc_url, "grpc", measurement_ms=500, extra_args=ssl_args, max_trials=1
            )
