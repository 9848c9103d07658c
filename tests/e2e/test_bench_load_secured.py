"""``lumenrt bench load`` against a server with TLS and API keys on: with ``--tls-ca`` and
``--api-key-env`` every protocol's requests succeed; without the key each is counted as a 401
(gRPC: UNAUTHENTICATED); an unset key variable is named."""

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lumenrt.cli import main
from tests.e2e.conftest import ServeProcess, start_serve
from tests.tls_certs import Certs, make_certs

KEY = "load-key-0123456789abcdef"


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


def load(
    capsys: pytest.CaptureFixture[str], out: Path, server: ServeProcess, target: str, *args: str
) -> dict[str, Any]:
    port = server.ports[target]
    common = [
        "--model",
        "digits_mlp",
        "--metadata-url",
        server.http_url,
        "--requests",
        "200",
        "--warmup-s",
        "0",
    ]
    assert (
        main(
            [
                "bench",
                "load",
                "--target",
                f"{target}://127.0.0.1:{port}",
                *common,
                *args,
                "--out",
                str(out),
                "--json",
                "--quiet",
            ]
        )
        == 0
    )
    summary: dict[str, Any] = json.loads(capsys.readouterr().out)
    return summary


@pytest.mark.parametrize("target", ["tcp", "http", "grpc"])
def test_load_over_tls_with_the_key_succeeds_and_without_it_is_refused(
    secured: ServeProcess,
    certs: Certs,
    target: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOAD_KEY", KEY)
    with_key = load(capsys, tmp_path, secured, target, "--tls-ca", str(certs.ca), "--api-key-env", "LOAD_KEY")
    assert with_key["counts"]["ok"] == 200 and with_key["counts"]["errors"] == 0
    input_file = tmp_path / "x.npy"
    import numpy as np

    np.save(input_file, np.zeros((1, 64), np.float32))
    without = load(
        capsys, tmp_path, secured, target, "--tls-ca", str(certs.ca), "--input-file", str(input_file)
    )
    assert without["counts"]["ok"] == 0
    assert set(without["counts"]["errors_by_kind"]) == {"UNAUTHENTICATED" if target == "grpc" else "401"}


def test_an_unset_key_variable_is_named(
    secured: ServeProcess, certs: Certs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "load", "--target", f"tcp://127.0.0.1:{secured.ports['tcp']}", "--model", "digits_mlp"]
    status = main([*args, "--api-key-env", "NO_SUCH_VARIABLE_SET", "--out", str(tmp_path), "--quiet"])
    assert status == 2
    assert (
        "--api-key-env NO_SUCH_VARIABLE_SET: that environment variable is not set or empty"
        in capsys.readouterr().err
    )
