"""Where the load generator sends requests: one class per wire protocol, all with the same shape.

A target URL names the protocol:

    tcp://HOST:PORT             lumenrt's binary TCP protocol (lumenrt.client.AsyncTcpClient)
    http://HOST:PORT            KServe V2 HTTP, Triton's binary tensor extension (the body is
                                encoded once and re-sent, as perf_analyzer does)
    http-json://HOST:PORT       KServe V2 HTTP with JSON tensors
    http-raw://HOST:PORT/PATH   POST the single input's raw bytes to PATH; any 200 is an answer
    grpc://HOST:PORT            KServe V2 gRPC (lumenrt.client.grpc.AsyncGrpcClient; request
                                serialized once)
    grpcio://HOST:PORT          the same through grpcio's own client (grpc.aio), which costs the
                                load generator several times the CPU a call

``Credentials`` add an API key (TCP AUTH frame, HTTP ``Authorization: Bearer``, gRPC metadata) and
TLS (every target; the server's certificate checked against ``tls_ca``).

``open(n)`` makes ``n`` connections (gRPC: one connection or channel, HTTP/2 multiplexes); ``infer(i)`` sends the
prepared request on connection ``i % n`` and returns the server's stage times (ns; empty when it
sent none). A failed request raises; :func:`error_kind` names the failure for the error counts.
"""

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import numpy as np

from lumenrt.client.errors import InferenceError
from lumenrt.client.grpc import AsyncGrpcClient, GrpcError
from lumenrt.client.http import AsyncHttpClient, decode_infer, encode_infer
from lumenrt.client.tcp import AsyncTcpClient

PROTOCOLS = ("tcp", "http", "http-json", "http-raw", "grpc", "grpcio")
_METADATA_TIMEOUT_S = 10.0  # guessed: ample for one loopback GET
_GRPC_SERVICE = "/inference.GRPCInferenceService/"  # Triton's wire name (lumenrt.ingress.grpc_server)
_TIMING_PREFIX = "lumenrt_"


@dataclass(frozen=True)
class Credentials:
    """What a secured server asks of the load generator (README: Securing a deployment)."""

    api_key: str | None = None
    tls_ca: str | None = None  # TLS: the CA file the server's certificate must chain to
    tls_cert: str | None = None  # mTLS: this client's certificate and key
    tls_key: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None

    def ssl_context(self) -> Any:
        if not self.tls:
            return None
        from lumenrt.client.tls import client_context

        return client_context(self.tls_ca, self.tls_cert, self.tls_key)

    def grpc_metadata(self) -> tuple[tuple[str, str], ...] | None:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key is not None else None


NO_CREDENTIALS = Credentials()


@dataclass(frozen=True)
class TargetUrl:
    protocol: str
    host: str
    port: int
    path: str  # http-raw only

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.host}:{self.port}{self.path}"


def parse_target(url: str) -> TargetUrl:
    """``tcp://127.0.0.1:8003`` and the like; ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in PROTOCOLS:
        raise ValueError(
            f"--target {url!r}: the scheme must be one of {', '.join(PROTOCOLS)} (e.g. tcp://127.0.0.1:8003)"
        )
    if not parts.hostname or parts.port is None:
        raise ValueError(f"--target {url!r}: give a host and a port, e.g. {parts.scheme}://127.0.0.1:8000")
    path = parts.path
    if parts.scheme == "http-raw" and not path:
        raise ValueError(f"--target {url!r}: an http-raw target needs the path to POST to")
    if parts.scheme != "http-raw" and path not in ("", "/"):
        raise ValueError(f"--target {url!r}: only http-raw takes a path")
    return TargetUrl(parts.scheme, parts.hostname, parts.port, path if parts.scheme == "http-raw" else "")


def error_kind(exc: BaseException) -> str:
    """A short name for a failure: the HTTP-style status, ``timeout``, ``connection``, a gRPC code,
    else ``client:<type>`` (a failure of the load generator itself)."""
    if isinstance(exc, GrpcError):
        return exc.code_name
    if isinstance(exc, InferenceError):
        return str(exc.status)
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionError | OSError | asyncio.IncompleteReadError):
        return "connection"
    code = getattr(exc, "code", None)
    if callable(code):  # grpc.aio.AioRpcError
        try:
            return str(code().name)
        except Exception:  # an object with an unrelated code(): not a gRPC error
            pass
    return f"client:{type(exc).__name__}"


def _timing(params: Mapping[str, int]) -> dict[str, int]:
    return {k.removeprefix(_TIMING_PREFIX): int(v) for k, v in params.items() if k.startswith(_TIMING_PREFIX)}


class Target(Protocol):
    protocol: str

    async def open(self, connections: int) -> None: ...

    async def infer(self, index: int) -> dict[str, int]: ...

    async def close(self) -> None: ...


class TcpTarget:
    protocol = "tcp"

    def __init__(
        self,
        url: TargetUrl,
        model: str,
        version: str | None,
        inputs: Mapping[str, Any],
        stages: bool,
        timeout_s: float | None,
        credentials: Credentials = NO_CREDENTIALS,
    ) -> None:
        self.url, self.model, self.version, self.inputs = url, model, version, dict(inputs)
        self.stages, self.timeout_s = stages, timeout_s
        self.credentials = credentials
        self._clients: list[AsyncTcpClient] = []

    async def open(self, connections: int) -> None:
        ctx = self.credentials.ssl_context()
        for _ in range(connections):
            client = AsyncTcpClient(self.url.host, self.url.port, api_key=self.credentials.api_key, ssl=ctx)
            await client.connect()
            self._clients.append(client)

    async def infer(self, index: int) -> dict[str, int]:
        client = self._clients[index % len(self._clients)]
        result = await client.infer(
            self.model, self.inputs, version=self.version, timeout_s=self.timeout_s, timing=self.stages
        )
        return result.timing

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        self._clients.clear()


class _HttpConnections:
    """One single-connection keep-alive client per load slot (HTTP/1.1: one request at a time each)."""

    url: TargetUrl
    credentials: Credentials = NO_CREDENTIALS
    _clients: list[AsyncHttpClient]

    async def open(self, connections: int) -> None:
        ctx, key = self.credentials.ssl_context(), self.credentials.api_key
        self._clients = [
            AsyncHttpClient(self.url.host, self.url.port, max_connections=1, api_key=key, ssl=ctx)
            for _ in range(connections)
        ]

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        self._clients.clear()


class HttpTarget(_HttpConnections):
    """KServe V2 HTTP; ``binary`` picks Triton's binary extension or JSON tensors."""

    def __init__(
        self,
        url: TargetUrl,
        model: str,
        version: str | None,
        inputs: Mapping[str, Any],
        stages: bool,
        timeout_s: float | None,
        binary: bool,
        credentials: Credentials = NO_CREDENTIALS,
    ) -> None:
        self.protocol = "http" if binary else "http-json"
        self.url = url
        self.credentials = credentials
        self.request = encode_infer(model, inputs, None, version, timeout_s, stages, binary, "1")
        self._clients = []

    async def infer(self, index: int) -> dict[str, int]:
        req = self.request
        client = self._clients[index % len(self._clients)]
        status, headers, body = await client.request("POST", req.path, req.body, req.headers)
        return decode_infer(status, headers, body).timing


class RawHttpTarget(_HttpConnections):
    """POST the one input's raw bytes; a plain endpoint (FastAPI peer) answers with raw bytes."""

    protocol = "http-raw"

    def __init__(
        self, url: TargetUrl, inputs: Mapping[str, Any], credentials: Credentials = NO_CREDENTIALS
    ) -> None:
        if len(inputs) != 1:
            raise ValueError(f"an http-raw target takes exactly one input; got {sorted(inputs)}")
        (array,) = inputs.values()
        self.url = url
        self.credentials = credentials
        self.body = np.ascontiguousarray(array).tobytes()
        self.headers = {"Content-Type": "application/octet-stream"}
        self._clients = []

    async def infer(self, index: int) -> dict[str, int]:
        client = self._clients[index % len(self._clients)]
        status, _, body = await client.request("POST", self.url.path, self.body, self.headers)
        if status != 200:
            raise InferenceError(status, body[:200].decode("utf-8", "replace"))
        return {}


class _GrpcRequest:
    """What both gRPC targets send: ModelInfer serialized once, and how its answer's stage times
    are read."""

    def __init__(
        self,
        url: TargetUrl,
        model: str,
        version: str | None,
        inputs: Mapping[str, Any],
        stages: bool,
        timeout_s: float | None,
        credentials: Credentials = NO_CREDENTIALS,
    ) -> None:
        from lumenrt.client.grpc import encode_infer
        from lumenrt.protocols.proto import grpc_service_pb2 as pb  # generated at build time

        self.url = url
        self.credentials = credentials
        self.timeout_s = timeout_s
        self.request_bytes = encode_infer(model, inputs, None, version, None, stages)
        self._response = pb.ModelInferResponse

    @staticmethod
    def _timing_of(response: Any) -> dict[str, int]:
        return _timing({k: v.int64_param for k, v in response.parameters.items()})


class GrpcTarget(_GrpcRequest):
    """KServe V2 gRPC through lumenrt's own client: one HTTP/2 connection, the calls its streams."""

    protocol = "grpc"
    _client: AsyncGrpcClient | None = None

    async def open(self, connections: int) -> None:
        creds = self.credentials
        self._client = AsyncGrpcClient(
            self.url.host, self.url.port, api_key=creds.api_key, ssl=creds.ssl_context()
        )
        try:
            await self._client.connect()
        except ConnectionRefusedError:
            raise  # nothing listens there: said once, as for the other targets
        except OSError:
            pass  # refused in the handshake (a TLS client certificate, say): each call says so

    async def infer(self, index: int) -> dict[str, int]:
        assert self._client is not None
        message = await self._client.call("ModelInfer", self.request_bytes, self.timeout_s)
        return self._timing_of(self._response.FromString(message))  # parsed, as grpcio's client does

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


class GrpcioTarget(_GrpcRequest):
    """KServe V2 gRPC through grpcio's client (grpc.aio): one channel."""

    protocol = "grpcio"
    _channel: Any = None
    _call: Any = None

    async def open(self, connections: int) -> None:
        import grpc

        where = f"{self.url.host}:{self.url.port}"
        creds = self.credentials
        if creds.tls:
            channel_creds = grpc.ssl_channel_credentials(
                _read(creds.tls_ca), _read(creds.tls_key), _read(creds.tls_cert)
            )
            self._channel = grpc.aio.secure_channel(where, channel_creds)
        else:
            self._channel = grpc.aio.insecure_channel(where)
        self._call = self._channel.unary_unary(
            _GRPC_SERVICE + "ModelInfer",
            request_serializer=None,  # the request is already bytes
            response_deserializer=self._response.FromString,
        )

    async def infer(self, index: int) -> dict[str, int]:
        metadata = self.credentials.grpc_metadata()
        response = await self._call(self.request_bytes, timeout=self.timeout_s, metadata=metadata)
        return self._timing_of(response)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def make_target(
    url: TargetUrl,
    model: str,
    version: str | None,
    inputs: Mapping[str, Any],
    stages: bool,
    timeout_s: float | None,
    credentials: Credentials = NO_CREDENTIALS,
) -> Target:
    c = credentials
    if url.protocol == "tcp":
        return TcpTarget(url, model, version, inputs, stages, timeout_s, c)
    if url.protocol in ("http", "http-json"):
        return HttpTarget(url, model, version, inputs, stages, timeout_s, url.protocol == "http", c)
    if url.protocol == "http-raw":
        return RawHttpTarget(url, inputs, c)
    if url.protocol == "grpcio":
        return GrpcioTarget(url, model, version, inputs, stages, timeout_s, c)
    return GrpcTarget(url, model, version, inputs, stages, timeout_s, c)


class MetadataRefused(ValueError):
    """The server wants a key for its model metadata (401/403)."""


def _get_json(url: str, credentials: Credentials = NO_CREDENTIALS) -> Any:
    headers = {"Authorization": f"Bearer {credentials.api_key}"} if credentials.api_key else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(
        request, timeout=_METADATA_TIMEOUT_S, context=credentials.ssl_context()
    ) as response:
        return json.loads(response.read())


def fetch_model_info(
    http_base: str, model: str, version: str | None, credentials: Credentials = NO_CREDENTIALS
) -> tuple[Any, Any]:
    """The model's KServe V2 metadata and (Triton-style) config from ``http_base`` (``host:port``;
    over HTTPS and with the key when ``credentials`` say); each None when the server has no such
    endpoint. Raises ConnectionError when nothing answers."""
    scheme = "https" if credentials.tls else "http"
    path = f"{scheme}://{http_base}/v2/models/{quote(model, safe='')}"
    if version:
        path += f"/versions/{quote(version, safe='')}"
    try:
        metadata = _get_json(path, credentials)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ValueError(
                f"--model {model!r}: the server at {http_base} does not know it ({exc.code})"
            ) from exc
        if exc.code in (401, 403):
            raise MetadataRefused(
                f"the server at {http_base} refused the model metadata ({exc.code}): give a key that may "
                "use the metadata group (--api-key-env VAR), or --input-file"
            ) from exc
        metadata = None
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"no KServe V2 HTTP server answers at {http_base}: {exc}") from exc
    try:
        config = _get_json(path + "/config", credentials)
    except (OSError, ValueError):
        config = None
    return metadata, config
