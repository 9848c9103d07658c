"""KServe V2 (Open Inference Protocol) HTTP clients, with Triton's binary tensor data extension.

    with HttpClient("127.0.0.1", 8000) as client:
        result = client.infer("digits_mlp", {"input": x})              # binary tensors
        result = client.infer("digits_mlp", {"input": x}, binary=False)  # plain JSON

Binary form (the extension): the body is the JSON inference header followed by each input's raw
bytes (little-endian, row-major; BYTES as 4-byte length + bytes per element); the header's
length is in ``Inference-Header-Content-Length`` and each input says its size in
``parameters.binary_data_size``. Outputs are asked for as binary (``binary_data`` per output, or
``binary_data_output`` for all) and come back the same way. JSON form: ``data`` lists.

``timing=True`` sends the request parameter ``lumenrt_timing``; the server's stage times come
back as ``lumenrt_*`` response parameters and land in ``InferResult.timing`` without the prefix.
``timeout_s`` is sent as Triton's ``timeout`` request parameter (microseconds).

Only the standard library (http.client, an asyncio protocol) and numpy.
"""

import asyncio
import contextlib
import http.client
import json
import ssl as ssl_module
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np

from lumenrt.client.errors import InferenceError
from lumenrt.client.result import InferResult
from lumenrt.client.sockets import open_transport, set_nodelay
from lumenrt.protocols import dtypes
from lumenrt.protocols.compact_json import compact_json
from lumenrt.protocols.parameters import TIMING_PARAMETER
from lumenrt.protocols.raw import from_raw, to_raw

HEADER_LENGTH = "Inference-Header-Content-Length"
_TIMING_PREFIX = "lumenrt_"
MAX_HEADER_BYTES = 64 << 10  # a response's status line and headers (async client)
WRITE_APART_BYTES = 64 << 10  # a larger request body is written beside its head, not joined to it
CLOSE_WAIT_S = 5.0  # close: how long to wait for a connection (TLS: its close_notify) to end (guessed)


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One encoded inference request: its path, headers and body."""

    path: str
    headers: dict[str, str]
    body: bytes


def infer_path(model: str, version: str | int | None) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    if version is not None and str(version) != "":
        path += f"/versions/{quote(str(version), safe='')}"
    return path + "/infer"


def encode_infer(
    model: str,
    inputs: Mapping[str, Any],
    outputs: Iterable[str] | None = None,
    version: str | int | None = None,
    timeout_s: float | None = None,
    timing: bool = False,
    binary: bool = True,
    request_id: str = "",
    priority: int = 0,
) -> HttpRequest:
    header: dict[str, Any] = {}
    if request_id:
        header["id"] = request_id
    params: dict[str, Any] = {}
    if timing:
        params[TIMING_PARAMETER] = True
    if timeout_s is not None:
        params["timeout"] = max(1, round(timeout_s * 1e6))
    if priority:
        params["priority"] = priority
    tensors: list[dict[str, Any]] = []
    raws: list[bytes | memoryview] = []
    for name, value in inputs.items():
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        datatype, raw = to_raw(array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            entry["parameters"] = {"binary_data_size": len(raw) if isinstance(raw, bytes) else raw.nbytes}
            raws.append(raw)
        else:
            entry["data"] = _json_data(array, datatype)
        tensors.append(entry)
    header["inputs"] = tensors
    if outputs is not None:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": binary}} for n in outputs]
    else:
        params["binary_data_output"] = binary
    if params:
        header["parameters"] = params
    head = compact_json(header)
    headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
    if binary:
        headers[HEADER_LENGTH] = str(len(head))
        body = b"".join([head, *raws])
    else:
        body = head
    return HttpRequest(infer_path(model, version), headers, body)


def _json_data(array: Any, datatype: str) -> list[Any]:
    flat = array.reshape(-1)
    if datatype == "BYTES":
        return [(x if isinstance(x, bytes) else str(x).encode()).decode("utf-8", "replace") for x in flat]
    data: list[Any] = flat.tolist()
    return data


def decode_infer(status: int, headers: Mapping[str, str], body: bytes) -> InferResult:
    """The result of an inference response; InferenceError for an error status."""
    if status != 200:
        raise InferenceError(status, _error_message(body))
    length_text = headers.get(HEADER_LENGTH.lower())
    head_len = len(body)
    if length_text is not None:
        if not length_text.isdigit() or int(length_text) > len(body):
            raise InferenceError(502, f"bad {HEADER_LENGTH} {length_text!r} for a body of {len(body)} bytes")
        head_len = int(length_text)
    try:
        doc = json.loads(body[:head_len])
        outputs_json = doc.get("outputs", [])
        view = memoryview(body)
        at = head_len
        outputs: dict[str, Any] = {}
        for out in outputs_json:
            name = str(out["name"])
            datatype = str(out["datatype"])
            shape = tuple(int(d) for d in out["shape"])
            if not dtypes.is_valid(datatype):
                raise ValueError(f"output {name!r}: datatype {datatype!r} is not a V2 datatype")
            size = (out.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                size = int(size)
                if at + size > len(body):
                    raise ValueError(f"output {name!r}: {size} bytes of binary data past the body's end")
                outputs[name] = from_raw(
                    view[at : at + size], datatype, shape, f"output {name!r}", ValueError
                )
                at += size
            else:
                outputs[name] = _from_json(out.get("data", []), datatype, shape)
        params = doc.get("parameters") or {}
        timing = {
            k[len(_TIMING_PREFIX) :]: int(v)
            for k, v in params.items()
            if k.startswith(_TIMING_PREFIX) and isinstance(v, int) and not isinstance(v, bool)
        }
        return InferResult(str(doc.get("model_name", "")), str(doc.get("model_version", "")), outputs, timing)
    except (ValueError, KeyError, TypeError) as exc:
        raise InferenceError(502, f"bad inference response from the server: {exc}") from None


def _from_json(data: Any, datatype: str, shape: tuple[int, ...]) -> Any:
    if datatype == "BYTES":
        flat = [
            x.encode() if isinstance(x, str) else bytes(x) for x in np.asarray(data, dtype=object).reshape(-1)
        ]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(shape)
    return np.asarray(data, dtype=dtypes.to_numpy(datatype)).reshape(shape)


def _error_message(body: bytes) -> str:
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and "error" in doc:
            return str(doc["error"])
    except ValueError:
        pass
    return body.decode("utf-8", "replace") or "(no message)"


class HttpClient:
    """A blocking KServe V2 HTTP client over one keep-alive connection (``http.client``)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        timeout_s: float | None = 60.0,
        api_key: str | None = None,
        ssl: "ssl_module.SSLContext | None" = None,
    ) -> None:
        """``timeout_s``: how long a connect, send or receive may block (None: no limit).
        ``api_key``: sent as ``Authorization: Bearer <key>`` with every request. ``ssl``: HTTPS
        with this context (``lumenrt.client.tls.client_context``)."""
        self.host = host
        self.port = port
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        self._conn: http.client.HTTPConnection
        if ssl is not None:
            self._conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=ssl)
        else:
            self._conn = http.client.HTTPConnection(host, port, timeout=timeout_s)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "HttpClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        reused = self._conn.sock is not None
        for attempt in (0, 1):
            try:
                self._conn.request(method, path, body=body, headers={**(headers or {}), **self._auth})
                resp = self._conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self._conn.close()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._conn.close()
                if attempt or not reused:  # retried once: a kept-alive connection the server closed
                    raise
        raise AssertionError("unreachable")

    def get_json(self, path: str) -> Any:
        """GET a V2 JSON endpoint (``/v2``, ``/v2/models/NAME``, ...); InferenceError on error."""
        status, _, body = self._request("GET", path)
        if status != 200:
            raise InferenceError(status, _error_message(body))
        return json.loads(body) if body else None

    def live(self) -> bool:
        return self._request("GET", "/v2/health/live")[0] == 200

    def ready(self) -> bool:
        return self._request("GET", "/v2/health/ready")[0] == 200

    def model_metadata(self, model: str, version: str | int | None = None) -> Any:
        path = f"/v2/models/{quote(model, safe='')}"
        if version is not None:
            path += f"/versions/{quote(str(version), safe='')}"
        return self.get_json(path)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Iterable[str] | None = None,
        version: str | int | None = None,
        timeout_s: float | None = None,
        timing: bool = False,
        binary: bool = True,
        request_id: str = "",
        priority: int = 0,
    ) -> InferResult:
        """``request_id``: sent as the request's ``id`` and echoed in the answer (none by default:
        HTTP/1.1 answers in order, and a request without one has a header the server decodes once
        per signature)."""
        req = encode_infer(model, inputs, outputs, version, timeout_s, timing, binary, request_id, priority)
        status, headers, body = self._request("POST", req.path, req.body, req.headers)
        return decode_infer(status, headers, body)


class _Response(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection of the async client, as a protocol: the response to the
    request in flight is parsed from ``data_received`` as it arrives (no stream reader, one wake-up
    per read). Its head is bounded by ``MAX_HEADER_BYTES`` before anything else is kept, and its
    body by its Content-Length (or its chunks)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, dict[str, str], bytes, bool]] | None = None
        self.lost: BaseException | None = None
        self.closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        try:
            response = _parse_response(self.buffer)
        except ConnectionError as exc:
            self.waiter = None
            waiter.set_exception(exc)
            return
        if response is not None:
            self.waiter = None
            waiter.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = ConnectionError(f"connection lost: {exc or 'closed by the server'}")
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(self.lost)
        self.closed.set()


def _parse_response(buffer: bytearray) -> tuple[int, dict[str, str], bytes, bool] | None:
    """A whole response taken off the front of ``buffer``, or None while it is not all there."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEADER_BYTES:
            raise ConnectionError(f"the server's response head is over {MAX_HEADER_BYTES} bytes")
        return None
    status_line, *header_lines = buffer[:end].decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ConnectionError(f"bad HTTP status line from the server: {status_line!r}")
    headers: dict[str, str] = {}
    for line in header_lines:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    at = end + 4
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunked = _chunked_body(buffer, at)
        if chunked is None:
            return None
        data, at = chunked
    else:
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise ConnectionError(f"bad Content-Length from the server: {length!r}")
        if len(buffer) < at + int(length):
            return None
        data = bytes(buffer[at : at + int(length)])
        at += int(length)
    del buffer[:at]
    keep = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
    return int(parts[1]), headers, data, keep


def _chunked_body(buffer: bytearray, at: int) -> tuple[bytes, int] | None:
    chunks: list[bytes] = []
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        try:
            size = int(bytes(buffer[at:line_end]).split(b";")[0], 16)
        except ValueError:
            raise ConnectionError("bad chunk size from the server") from None
        at = line_end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n", at)  # no trailers expected: the empty line
            return None if trailer_end < 0 else (b"".join(chunks), trailer_end + 2)
        if len(buffer) < at + size + 2:
            return None
        chunks.append(bytes(buffer[at : at + size]))
        at += size + 2


class _Connection:
    """One kept-alive HTTP/1.1 connection of the async client."""

    def __init__(self, transport: asyncio.Transport, protocol: _Response) -> None:
        self.transport = transport
        self.protocol = protocol
        self._heads: dict[tuple[str, str, str, tuple[tuple[str, str], ...], int], bytes] = {}

    async def request(
        self, host: str, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes, bool]:
        protocol = self.protocol
        if protocol.lost is not None:
            raise protocol.lost
        key = (host, method, path, tuple(headers.items()), len(body))
        head = self._heads.get(key)
        if head is None:
            lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
            lines += [f"{k}: {v}" for k, v in headers.items()]
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            if len(self._heads) >= 16:  # a few signatures per connection (guessed)
                self._heads.clear()
            self._heads[key] = head
        waiter: asyncio.Future[tuple[int, dict[str, str], bytes, bool]]
        waiter = protocol.waiter = asyncio.get_running_loop().create_future()
        if len(body) < WRITE_APART_BYTES:
            self.transport.write(head + body)  # one buffer, one send
        else:
            self.transport.writelines([head, body])  # the body is sent as it is, not copied behind a head
        if protocol.buffer:  # the whole answer may be here already (data_received saw no waiter)
            protocol.data_received(b"")
        try:
            return await waiter
        finally:
            protocol.waiter = None

    def close(self) -> None:
        self.transport.close()


class AsyncHttpClient:
    """An asyncio KServe V2 HTTP client: concurrent requests over a small pool of keep-alive
    connections (one request at a time on each, as HTTP/1.1 without pipelining)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        max_connections: int = 16,
        api_key: str | None = None,
        ssl: "ssl_module.SSLContext | None" = None,
    ) -> None:
        """``api_key``: sent as ``Authorization: Bearer <key>`` with every request. ``ssl``:
        HTTPS with this context (``lumenrt.client.tls.client_context``)."""
        self.host = host
        self.port = port
        self._ssl = ssl
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        self.max_connections = max_connections
        self._idle: list[_Connection] = []
        self._slots: asyncio.Semaphore | None = None

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(conn.protocol.closed.wait(), CLOSE_WAIT_S)

    async def __aenter__(self) -> "AsyncHttpClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        async with self._slots:
            for attempt in (0, 1):
                reused = bool(self._idle)
                conn = self._idle.pop() if reused else await self._open()
                try:
                    status, response_headers, data, keep = await conn.request(
                        f"{self.host}:{self.port}",
                        method,
                        path,
                        {**(headers or {}), **self._auth} if self._auth else headers or {},
                        body,
                    )
                except ConnectionError as exc:
                    conn.close()
                    if attempt or not reused:
                        raise ConnectionError(
                            f"HTTP request to {self.host}:{self.port} failed: {exc}"
                        ) from exc
                    continue  # a kept-alive connection the server had closed: once more on a new one
                except BaseException:
                    conn.close()
                    raise
                if keep:
                    self._idle.append(conn)
                else:
                    conn.close()
                return status, response_headers, data
        raise AssertionError("unreachable")

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """One request on a pooled keep-alive connection: (status, headers, body). For callers that
        encode once and send many times (the load generator); ``infer`` is the usual way."""
        return await self._request(method, path, body, headers)

    async def _open(self) -> _Connection:
        transport, protocol = await open_transport(_Response, self.host, self.port, self._ssl, None)
        return _Connection(transport, protocol)

    async def get_json(self, path: str) -> Any:
        status, _, body = await self._request("GET", path)
        if status != 200:
            raise InferenceError(status, _error_message(body))
        return json.loads(body) if body else None

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        outputs: Iterable[str] | None = None,
        version: str | int | None = None,
        timeout_s: float | None = None,
        timing: bool = False,
        binary: bool = True,
        request_id: str = "",
        priority: int = 0,
    ) -> InferResult:
        """``request_id``: sent as the request's ``id`` and echoed in the answer (none by default:
        HTTP/1.1 answers in order, and a request without one has a header the server decodes once
        per signature)."""
        req = encode_infer(model, inputs, outputs, version, timeout_s, timing, binary, request_id, priority)
        status, headers, body = await self._request("POST", req.path, req.body, req.headers)
        return decode_infer(status, headers, body)
