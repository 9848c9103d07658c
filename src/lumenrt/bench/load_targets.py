"""Where the load generator sends requests: one class per wire protocol, all with the same shape.

A target URL names the protocol:

    tcp://HOST:PORT             lumenrt's binary TCP protocol (lumenrt.client.AsyncTcpClient)
    http://HOST:PORT            KServe V2 HTTP, Triton's binary tensor extension (the body is
                                encoded once and re-sent, as perf_analyzer does)
    http-json://HOST:PORT       KServe V2 HTTP with JSON tensors
    http-raw://HOST:PORT/PATH   POST the single input's raw bytes to PATH; any 200 is an answer
    grpc://HOST:PORT            KServe V2 gRPC (request serialized once)

``open(n)`` makes ``n`` connections (gRPC: one channel, HTTP/2 multiplexes); ``infer(i)`` sends the
prepared request on connection ``i % n`` and returns the server's stage times (ns; empty when it
sent none). A failed request raises; :func:`error_kind` names the failure for the error counts.
"""

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import numpy as np
import numpy.typing as npt

from lumenrt.client.errors import InferenceError
from lumenrt.client.http import AsyncHttpClient, decode_infer, encode_infer
from lumenrt.client.tcp import AsyncTcpClient

PROTOCOLS = ("tcp", "http", "http-json", "http-raw", "grpc")
_METADATA_TIMEOUT_S = 10.0  # guessed: ample for one loopback GET
_GRPC_SERVICE = "/inference.GRPCInferenceService/"  # Triton's wire name (lumenrt.ingress.grpc_server)
_TIMING_PREFIX = "lumenrt_"


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
    ) -> None:
        self.url, self.model, self.version, self.inputs = url, model, version, dict(inputs)
        self.stages, self.timeout_s = stages, timeout_s
        self._clients: list[AsyncTcpClient] = []

    async def open(self, connections: int) -> None:
        for _ in range(connections):
            client = AsyncTcpClient(self.url.host, self.url.port)
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
    _clients: list[AsyncHttpClient]

    async def open(self, connections: int) -> None:
        self._clients = [
            AsyncHttpClient(self.url.host, self.url.port, max_connections=1) for _ in range(connections)
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
    ) -> None:
        self.protocol = "http" if binary else "http-json"
        self.url = url
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

    def __init__(self, url: TargetUrl, inputs: Mapping[str, Any]) -> None:
        if len(inputs) != 1:
            raise ValueError(f"an http-raw target takes exactly one input; got {sorted(inputs)}")
        (array,) = inputs.values()
        self.url = url
        self.body = np.ascontiguousarray(array).tobytes()
        self.headers = {"Content-Type": "application/octet-stream"}
        self._clients = []

    async def infer(self, index: int) -> dict[str, int]:
        client = self._clients[index % len(self._clients)]
        status, _, body = await client.request("POST", self.url.path, self.body, self.headers)
        if status != 200:
            raise InferenceError(status, body[:200].decode("utf-8", "replace"))
        return {}


class GrpcTarget:
    protocol = "grpc"

    def __init__(
        self,
        url: TargetUrl,
        model: str,
        version: str | None,
        inputs: Mapping[str, Any],
        stages: bool,
        timeout_s: float | None,
    ) -> None:
        from lumenrt.protocols.proto import grpc_service_pb2 as pb  # generated at build time

        self.url = url
        self.timeout_s = timeout_s
        self._pb = pb
        request = pb.ModelInferRequest(model_name=model, model_version=version or "")
        for name, value in inputs.items():
            array = np.ascontiguousarray(value)
            request.inputs.add(name=name, datatype=_datatype(array), shape=list(array.shape))
            request.raw_input_contents.append(_raw_bytes(array))
        if stages:
            request.parameters["lumenrt_timing"].bool_param = True
        self.request_bytes: bytes = request.SerializeToString()
        self._channel: Any = None
        self._call: Any = None

    async def open(self, connections: int) -> None:
        import grpc

        self._channel = grpc.aio.insecure_channel(f"{self.url.host}:{self.url.port}")
        self._call = self._channel.unary_unary(
            _GRPC_SERVICE + "ModelInfer",
            request_serializer=None,  # the request is already bytes
            response_deserializer=self._pb.ModelInferResponse.FromString,
        )

    async def infer(self, index: int) -> dict[str, int]:
        response = await self._call(self.request_bytes, timeout=self.timeout_s)
        return _timing({k: v.int64_param for k, v in response.parameters.items()})

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def _datatype(array: npt.NDArray[Any]) -> str:
    from lumenrt.protocols import dtypes

    return dtypes.from_numpy(array.dtype)


def _raw_bytes(array: npt.NDArray[Any]) -> bytes:
    from lumenrt.protocols.raw import to_raw

    return bytes(to_raw(array)[1])


def make_target(
    url: TargetUrl,
    model: str,
    version: str | None,
    inputs: Mapping[str, Any],
    stages: bool,
    timeout_s: float | None,
) -> Target:
    if url.protocol == "tcp":
        return TcpTarget(url, model, version, inputs, stages, timeout_s)
    if url.protocol in ("http", "http-json"):
        return HttpTarget(url, model, version, inputs, stages, timeout_s, binary=url.protocol == "http")
    if url.protocol == "http-raw":
        return RawHttpTarget(url, inputs)
    return GrpcTarget(url, model, version, inputs, stages, timeout_s)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=_METADATA_TIMEOUT_S) as response:
        return json.loads(response.read())


def fetch_model_info(http_base: str, model: str, version: str | None) -> tuple[Any, Any]:
    """The model's KServe V2 metadata and (Triton-style) config from ``http_base`` (``host:port``);
    each None when the server has no such endpoint. Raises ConnectionError when nothing answers."""
    path = f"http://{http_base}/v2/models/{quote(model, safe='')}"
    if version:
        path += f"/versions/{quote(version, safe='')}"
    try:
        metadata = _get_json(path)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ValueError(
                f"--model {model!r}: the server at {http_base} does not know it ({exc.code})"
            ) from exc
        metadata = None
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"no KServe V2 HTTP server answers at {http_base}: {exc}") from exc
    try:
        config = _get_json(path + "/config")
    except (OSError, ValueError):
        config = None
    return metadata, config
