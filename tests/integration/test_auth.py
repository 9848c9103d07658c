"""API keys and endpoint groups in a real server (ServerThread, loopback, port 0), through the
clients users have: tritonclient over HTTP and gRPC, lumenrt's TcpClient over the binary protocol.

One test body runs for every (protocol, endpoint group) pair the protocol serves: without a key the
group answers 401 (health: 200, it is open), with a key outside the group 403, with a key inside it
200, with an unknown key 401. Then: Triton's header form, key rotation on open connections, the
TCP protocol's version check, and that no key text reaches an answer, a log line or a metric."""

import asyncio
import json
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from lumenrt.client import InferenceError, TcpClient
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.ingress.auth import Gate, KeySource, key_digest
from lumenrt.models.builtin import builtin_examples
from lumenrt.protocols import tcp

MODEL = "digits_mlp"
APP_KEY = "app-key-0123456789abcdef"  # inference + metadata
OPS_KEY = "ops-key-0123456789abcdef"  # every group
STATS_KEY = "stats-key-0123456789abcd"  # statistics only, stored as its sha256
WRONG_KEY = "not-a-key-0123456789abcd"
KEYS = {"app": APP_KEY, "ops": OPS_KEY, "stats": STATS_KEY}


def keys_doc(*names: str) -> dict[str, object]:
    groups = {"app": ["inference", "metadata"], "ops": ["*"], "stats": ["statistics"]}
    entries: list[dict[str, object]] = []
    for name in names:
        entry: dict[str, object] = {"name": name, "groups": groups[name]}
        if name == "stats":
            entry["sha256"] = key_digest(KEYS[name]).hex()
        else:
            entry["key"] = KEYS[name]
        entries.append(entry)
    return {"keys": entries}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "keys.json"
    path.write_text(json.dumps(keys_doc("app", "ops", "stats")))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def server(keys_file: Path) -> Iterator[ServerThread]:
    settings = EngineConfig(thread_count=1, pin=False)
    with Engine(models=[MODEL], settings=settings) as engine:
        gate = Gate(KeySource(path=keys_file), open_groups=["health"])
        options = ServeOptions(http_port=0, grpc_port=0, tcp_port=0, auth=gate, allow_client_shm=True)
        with ServerThread(engine, options) as st:
            yield st


def _x() -> np.ndarray:
    return builtin_examples(MODEL, 1)["input"]


# ---- one caller per protocol: (server, group, key or None) -> HTTP-style status ----------------


def _http_headers(key: str | None) -> dict[str, str] | None:
    return None if key is None else {"Authorization": f"Bearer {key}"}


def _status_of(exc: InferenceServerException) -> int:
    status = str(exc.status())
    codes = {
        "StatusCode.UNAUTHENTICATED": 401,
        "StatusCode.PERMISSION_DENIED": 403,
        "StatusCode.RESOURCE_EXHAUSTED": 429,
    }
    return codes.get(status) or int(status)


def call_http(st: ServerThread, group: str, key: str | None) -> int:
    client = thttp.InferenceServerClient(f"127.0.0.1:{st.ports['http']}")
    headers = _http_headers(key)
    try:
        if group == "inference":
            given = thttp.InferInput("input", [1, 64], "FP32")
            given.set_data_from_numpy(_x())
            client.infer(MODEL, [given], headers=headers)
        elif group == "health":
            # tritonclient's is_server_ready answers False for any error: ask for the status itself
            return _raw_http(st, "GET", "/v2/health/ready", key)
        elif group == "metadata":
            client.get_model_metadata(MODEL, headers=headers)
        elif group == "model-repository":
            client.get_model_repository_index(headers=headers)
        elif group == "statistics":
            client.get_inference_statistics(MODEL, headers=headers)
        elif group == "metrics":
            return _raw_http(st, "GET", "/metrics", key)
        elif group == "shared-memory":
            client.get_system_shared_memory_status(headers=headers)
        return 200
    except InferenceServerException as exc:
        return _status_of(exc)
    finally:
        client.close()


def _raw_http(
    st: ServerThread, method: str, path: str, key: str | None, headers: dict[str, str] | None = None
) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", st.ports["http"], timeout=10)
    try:
        conn.request(method, path, headers={**(_http_headers(key) or {}), **(headers or {})})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def call_grpc(st: ServerThread, group: str, key: str | None) -> int:
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{st.ports['grpc']}")
    headers = None if key is None else {"authorization": f"Bearer {key}"}
    try:
        if group == "inference":
            given = tgrpc.InferInput("input", [1, 64], "FP32")
            given.set_data_from_numpy(_x())
            client.infer(MODEL, [given], headers=headers)
        elif group == "health":
            client.is_server_ready(headers=headers)
        elif group == "metadata":
            client.get_model_metadata(MODEL, headers=headers)
        elif group == "model-repository":
            client.get_model_repository_index(headers=headers)
        elif group == "statistics":
            client.get_inference_statistics(MODEL, headers=headers)
        elif group == "shared-memory":
            client.get_system_shared_memory_status(headers=headers)
        return 200
    except InferenceServerException as exc:
        return _status_of(exc)
    finally:
        client.close()


def call_tcp(st: ServerThread, group: str, key: str | None) -> int:
    assert group == "inference"
    with TcpClient("127.0.0.1", st.ports["tcp"], api_key=key) as client:
        try:
            client.infer(MODEL, {"input": _x()})
        except InferenceError as exc:
            return exc.status
    return 200


CALLERS: dict[str, Callable[[ServerThread, str, str | None], int]] = {
    "http": call_http,
    "grpc": call_grpc,
    "tcp": call_tcp,
}
GROUPS_SERVED = {
    "http": ["inference", "health", "metadata", "model-repository", "statistics", "metrics", "shared-memory"],
    "grpc": ["inference", "health", "metadata", "model-repository", "statistics", "shared-memory"],
    "tcp": ["inference"],
}
CASES = [(protocol, group) for protocol, groups in GROUPS_SERVED.items() for group in groups]


@pytest.mark.parametrize(("protocol", "group"), CASES, ids=[f"{p}-{g}" for p, g in CASES])
def test_each_group_answers_only_the_keys_it_admits(server: ServerThread, protocol: str, group: str) -> None:
    call = CALLERS[protocol]
    open_group = group == "health"
    assert call(server, group, None) == (200 if open_group else 401)
    assert call(server, group, WRONG_KEY) == (200 if open_group else 401)
    assert call(server, group, OPS_KEY) == 200
    app_may = group in ("inference", "metadata") or open_group
    assert call(server, group, APP_KEY) == (200 if app_may else 403)
    stats_may = group == "statistics" or open_group
    assert call(server, group, STATS_KEY) == (200 if stats_may else 403)


def test_triton_header_form_carries_the_key_on_http_and_grpc(server: ServerThread) -> None:
    assert _raw_http(server, "GET", f"/v2/models/{MODEL}", None, {"x-api-key": APP_KEY}) == 200
    assert _raw_http(server, "GET", f"/v2/models/{MODEL}", None, {"x-api-key": WRONG_KEY}) == 401
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    try:
        assert client.get_model_metadata(MODEL, headers={"x-api-key": APP_KEY}).name == MODEL
    finally:
        client.close()


def test_refusals_say_what_is_missing_and_never_echo_a_key(server: ServerThread) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=10)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/infer", body=b"{}")
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.status == 401
        assert resp.getheader("www-authenticate", "").startswith("Bearer")
        assert "'inference' endpoints need an API key" in body
        conn.request("POST", "/v2/repository/index", headers={"Authorization": f"Bearer {APP_KEY}"})
        resp = conn.getresponse()
        body = resp.read().decode()
        assert resp.status == 403
        assert "'app'" in body and "model-repository" in body
        assert APP_KEY not in body
    finally:
        conn.close()


def test_a_tcp_connection_with_an_unknown_key_is_closed_with_401(server: ServerThread) -> None:
    with (
        TcpClient("127.0.0.1", server.ports["tcp"], api_key=WRONG_KEY) as client,
        pytest.raises(InferenceError) as refused,
    ):
        client.infer(MODEL, {"input": _x()})
    assert refused.value.status == 401
    assert WRONG_KEY not in str(refused.value)


def test_a_version_1_tcp_client_is_refused_in_its_own_version(server: ServerThread) -> None:
    """An old client gets an error frame it can read (version 1 header) saying why, then EOF."""
    head = struct.pack("<IBBHQII", int.from_bytes(b"LRT\x01", "little"), tcp.REQUEST, 0, 0, 7, 0, 0)
    with socket.create_connection(("127.0.0.1", server.ports["tcp"]), timeout=10) as sock:
        sock.sendall(head)
        data = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    _, kind, flags, _, rid, meta_len, _ = struct.unpack_from("<IBBHQII", data)
    assert data[:4] == b"LRT\x01" and kind == tcp.ERROR and flags & tcp.FLAG_CLOSING
    info = tcp.decode_error(data[24 : 24 + meta_len])
    assert info.status == 426 and rid == 0  # the frame's id could not be trusted
    assert "version 1 is not supported" in info.message and "version 2" in info.message


def _reload(st: ServerThread) -> list[str]:
    async def run() -> list[str]:
        return st.app.reload()

    result: list[str] = st.call(run())
    return result


def test_removing_a_key_stops_it_on_connections_already_open(
    server: ServerThread, keys_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    client = TcpClient("127.0.0.1", server.ports["tcp"], api_key=APP_KEY)
    try:
        client.infer(MODEL, {"input": _x()})  # authenticated on this connection
        keys_file.write_text(json.dumps(keys_doc("ops", "stats")))
        assert _reload(server) == ["api keys"]
        with pytest.raises(InferenceError) as refused:
            client.infer(MODEL, {"input": _x()})
        assert refused.value.status == 401
        assert call_http(server, "inference", APP_KEY) == 401
        assert call_http(server, "inference", OPS_KEY) == 200
    finally:
        client.close()
        keys_file.write_text(json.dumps(keys_doc("app", "ops", "stats")))
        _reload(server)
    assert call_tcp(server, "inference", APP_KEY) == 200
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "API keys reloaded" in logged and "app, ops, stats" in logged
    assert all(key not in logged for key in KEYS.values())


def test_a_bad_key_file_keeps_the_keys_in_use(server: ServerThread, keys_file: Path) -> None:
    good = keys_file.read_text()
    try:
        keys_file.write_text('{"keys": [{"name": "app", "key": "short", "groups": ["*"]}]}')
        assert _reload(server) == []
        assert call_tcp(server, "inference", APP_KEY) == 200
    finally:
        keys_file.write_text(good)
        _reload(server)


def test_a_changed_key_file_is_picked_up_without_a_signal(server: ServerThread, keys_file: Path) -> None:
    good = keys_file.read_text()
    try:
        keys_file.write_text(json.dumps(keys_doc("ops")))
        deadline = time.monotonic() + 30
        while call_http(server, "metadata", APP_KEY) != 401:  # the watch reloads within ~2 s
            assert time.monotonic() < deadline, "the changed key file was not reloaded"
            time.sleep(0.1)
    finally:
        keys_file.write_text(good)
        _reload(server)


def test_metrics_count_refusals_by_reason_with_no_key_in_them(server: ServerThread) -> None:
    call_http(server, "statistics", None)
    call_http(server, "statistics", APP_KEY)
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{server.ports['http']}/metrics", headers={"Authorization": f"Bearer {OPS_KEY}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    assert 'lumenrt_auth_refusals_total{reason="unauthenticated"}' in text
    assert 'lumenrt_auth_refusals_total{reason="forbidden"}' in text
    assert all(key not in text for key in KEYS.values())


def test_async_tcp_client_sends_its_key() -> None:
    """AsyncTcpClient authenticates the same way (a server of its own: a fresh loop per client)."""
    from lumenrt.client import AsyncTcpClient

    doc = json.dumps(keys_doc("app"))
    settings = EngineConfig(thread_count=1, pin=False)
    with Engine(models=[MODEL], settings=settings) as engine:
        gate = Gate(KeySource(env_text=doc))
        with ServerThread(engine, ServeOptions(http_port=None, grpc_port=None, tcp_port=0, auth=gate)) as st:

            async def run(key: str | None) -> int:
                async with AsyncTcpClient("127.0.0.1", st.ports["tcp"], api_key=key) as client:
                    try:
                        await client.infer(MODEL, {"input": _x()})
                    except InferenceError as exc:
                        return exc.status
                return 200

            assert asyncio.run(run(APP_KEY)) == 200
            assert asyncio.run(run(None)) == 401
