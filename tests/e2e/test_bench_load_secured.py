"""``lumenrt bench load`` against a server with TLS and API keys on: with ``--tls-ca`` and
``--api-key-env`` every protocol's requests succeed; without the key each is counted as a 401
(gRPC: UNAUTHENTICATED); an unset key variable is named. Against a server that asks for client
certificates (mTLS), ``--tls-cert``/``--tls-key`` from its CA get in and one from another CA does not."""

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.cli import main
from tests.e2e.conftest import ServeProcess, start_serve
from tests.tls_certs import Certs, Pair, make_certs

KEY = "load-key-0123456789abcdef"
REQUESTS = 200


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secured(certs: Certs) -> Iterator[ServeProcess]:
    env = dict(os.environ)
    env["LUMENRT_API_KEYS"] = json.dumps({"keys": [{"name": "load", "key": KEY, "groups": ["*"]}]})
    tls = ["--tls-cert", str(certs.server.cert), "--tls-key", str(certs.server.key)]
    server = start_serve("--models", "digits_mlp", *tls, env=env)
    yield server
    assert server.stop() == 0, "\n".join(server.lines)


@pytest.fixture(scope="module")
def mutual(certs: Certs) -> Iterator[ServeProcess]:
    tls = ["--tls-cert", str(certs.server.cert), "--tls-key", str(certs.server.key)]
    server = start_serve("--models", "digits_mlp", *tls, "--tls-client-ca", str(certs.ca))
    yield server
    assert server.stop() == 0, "\n".join(server.lines)


@pytest.fixture
def input_file(tmp_path: Path) -> Path:
    """digits_mlp's input, for runs that cannot read the model's metadata."""
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((1, 64), np.float32))
    return path


def load(
    capsys: pytest.CaptureFixture[str], out: Path, server: ServeProcess, target: str, *args: str
) -> dict[str, Any]:
    """One bounded run of ``REQUESTS`` requests; its summary."""
    port = server.ports["http" if target == "http-json" else target]
    argv = ["bench", "load", "--target", f"{target}://127.0.0.1:{port}", "--model", "digits_mlp",
            "--metadata-url", server.http_url, "--requests", str(REQUESTS), "--warmup-s", "0",
            *args, "--out", str(out), "--json", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    summary: dict[str, Any] = json.loads(capsys.readouterr().out)
    return summary


def client_cert(pair: Pair) -> list[str]:
    return ["--tls-cert", str(pair.cert), "--tls-key", str(pair.key)]


@pytest.mark.parametrize("target", ["tcp", "http", "http-json", "grpc"])
def test_load_over_tls_with_the_key_succeeds_and_without_it_is_refused(
    secured: ServeProcess,
    certs: Certs,
    target: str,
    tmp_path: Path,
    input_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOAD_KEY", KEY)
    ca = ["--tls-ca", str(certs.ca)]
    with_key = load(capsys, tmp_path, secured, target, *ca, "--api-key-env", "LOAD_KEY")
    assert with_key["counts"]["ok"] == REQUESTS and with_key["counts"]["errors"] == 0
    without = load(capsys, tmp_path, secured, target, *ca, "--input-file", str(input_file))
    assert without["counts"]["ok"] == 0
    assert without["counts"]["errors_by_kind"] == {"UNAUTHENTICATED" if target == "grpc" else "401": REQUESTS}


@pytest.mark.parametrize("target", ["tcp", "http", "grpc"])
def test_load_with_a_client_certificate_from_the_servers_ca_gets_in_and_a_strangers_does_not(
    mutual: ServeProcess,
    certs: Certs,
    target: str,
    tmp_path: Path,
    input_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ca = ["--tls-ca", str(certs.ca)]
    admitted = load(capsys, tmp_path, mutual, target, *ca, *client_cert(certs.client))
    assert admitted["counts"]["ok"] == REQUESTS and admitted["counts"]["errors"] == 0
    stranger = ["--input-file", str(input_file), *client_cert(certs.stranger)]
    refused = load(capsys, tmp_path, mutual, target, *ca, *stranger)
    assert refused["counts"]["ok"] == 0
    assert refused["counts"]["errors_by_kind"] == {"connection": REQUESTS}


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_an_unset_or_empty_key_variable_is_named(
    secured: ServeProcess,
    value: str | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if value is None:
        monkeypatch.delenv("LOAD_KEY_UNDER_TEST", raising=False)
    else:
        monkeypatch.setenv("LOAD_KEY_UNDER_TEST", value)
    args = ["bench", "load", "--target", f"tcp://127.0.0.1:{secured.ports['tcp']}", "--model", "digits_mlp"]
    status = main([*args, "--api-key-env", "LOAD_KEY_UNDER_TEST", "--out", str(tmp_path), "--quiet"])
    assert status == 2
    assert (
        "--api-key-env LOAD_KEY_UNDER_TEST: that environment variable is not set or empty"
        in capsys.readouterr().err
    )


def test_a_client_certificate_without_its_key_is_named(
    secured: ServeProcess, certs: Certs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "load", "--target", f"tcp://127.0.0.1:{secured.ports['tcp']}", "--model", "digits_mlp"]
    status = main([*args, "--tls-cert", str(certs.client.cert), "--out", str(tmp_path), "--quiet"])
    assert status == 2
    assert "--tls-cert and --tls-key go together: give both" in capsys.readouterr().err
