"""The lumenrt binary TCP protocol, version 2: frame and metadata codecs (no sockets).

Shared by the server front end (``lumenrt.ingress.tcp_server``) and the clients
(``lumenrt.client.tcp``); the wire format is specified in docs/tcp-protocol.md. In short, every
frame is::

    header (24 bytes, little-endian)   magic "LRT", version, kind, flags, reserved u16,
                                       request id u64, metadata length u32, payload length u32
    metadata                           a small struct: model, version, tensor descriptors ...
    payload                            the raw tensor bytes, one tensor after the other

This module imports only numpy and ``lumenrt.protocols`` so that a client process does not load
the engine or the native core. Tensor bytes go through the one raw codec, ``lumenrt.protocols.raw``
(row-major, little-endian, BOOL one byte 0/1, BYTES as 4-byte length + bytes per element), which
raises :class:`ProtocolError` here, so both sides can handle it.

Bounds: nothing here allocates in proportion to a size the peer claims before that size was
checked against a limit or against the bytes actually received. ``FrameDecoder`` keeps at most
one incomplete frame, as the list of chunks received so far (never a buffer of the claimed size).
"""

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from lumenrt.protocols import raw
from lumenrt.protocols.raw import Array, TensorSlot

MAGIC = b"LRT"
VERSION = 2  # 2 added the AUTH frame; a version 1 peer is refused with a version 1 error frame
_MAGIC_VERSION = int.from_bytes(MAGIC + bytes([VERSION]), "little")

# Frame kinds.
REQUEST = 1
RESPONSE = 2
ERROR = 3
AUTH = 4  # client -> server: an API key for the connection (metadata: u16 length + key bytes)
AUTH_OK = 5  # server -> client: the key was accepted (metadata: text, the key's name)
KIND_NAMES = {REQUEST: "request", RESPONSE: "response", ERROR: "error", AUTH: "auth", AUTH_OK: "auth ok"}
MAX_KEY_BYTES = 4096  # an AUTH frame's key

# Flags. Request: TIMING asks for stage times; response: TIMING says they are there; error:
# CLOSING says the sender closes the connection after this frame (framing is broken).
FLAG_TIMING = 0x01
FLAG_CLOSING = 0x02
KNOWN_FLAGS = FLAG_TIMING  # the flags a request may carry

HEADER = struct.Struct("<IBBHQII")  # magic+version, kind, flags, reserved, id, meta bytes, payload bytes
HEADER_BYTES = HEADER.size  # 24
MAX_PAYLOAD_BYTES = (1 << 32) - 1  # the u32 payload length
MAX_RANK = 32  # numpy's dimension limit (numpy 1.x)
MAX_DIM = (1 << 63) - 1  # V2 dims are int64
MAX_NAME_BYTES = 255  # u8 length prefix
MAX_TIMEOUT_US = (1 << 32) - 1

# Server stage times in a response, in this order (u64 each; see docs/tcp-protocol.md).
TIMING_FIELDS = ("queue_ns", "batch_ns", "compute_ns", "return_ns", "engine_ns", "batch_size")

# V2 datatype <-> one-byte code. 0 is never valid; new codes are only ever appended.
DATATYPE_CODES: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
}
_CODE_NAMES = {code: name for name, code in DATATYPE_CODES.items()}

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_TYPE_RANK = struct.Struct("<BB")
_DIMS = [struct.Struct(f"<{n}Q") for n in range(MAX_RANK + 1)]


class ProtocolError(Exception):
    """A frame or its metadata is not valid.

    ``fatal``: framing itself is broken (the byte stream cannot be followed any more), so the
    connection must be closed after answering; otherwise only this frame is refused.
    ``status``: the HTTP-style status to answer with (400, 413, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        fatal: bool = False,
        request_id: int = 0,
        reply_version: int = VERSION,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.fatal = fatal
        self.request_id = request_id
        self.reply_version = reply_version  # the version an error frame about it is written in


# ---- typed wire messages ---------------------------------------------------------------------------


@dataclass(slots=True)
class Frame:
    """One received frame. ``meta`` is a copy (small; it doubles as a cache key); the payload is
    ``data[payload_at : payload_at + payload_bytes]`` of the received chunk ``data``, which the
    frame keeps alive: arrays are made over it without copying."""

    kind: int
    flags: int
    request_id: int
    meta: bytes
    data: bytes | memoryview  # a read-only view of the server's receive buffer (tcp_receiver.py)
    payload_at: int
    payload_bytes: int
    priority: int = 0  # a request's priority level (0: the model's default)

    @property
    def payload(self) -> memoryview:
        return memoryview(self.data)[self.payload_at : self.payload_at + self.payload_bytes]


@dataclass(frozen=True, slots=True)
class TensorDesc:
    """A tensor's descriptor in the metadata; its bytes follow in the payload."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    byte_size: int


@dataclass(frozen=True, slots=True)
class RequestMeta:
    model: str
    version: str  # "" = the latest loaded version
    timeout_us: int  # 0 = no deadline
    inputs: tuple[TensorDesc, ...]
    outputs: tuple[str, ...]  # () = every output
    payload_bytes: int  # the sum of the inputs' byte sizes
    slots: tuple[TensorSlot, ...]


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    model: str
    version: int
    outputs: tuple[TensorDesc, ...]
    payload_bytes: int
    slots: tuple[TensorSlot, ...]


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    status: int
    message: str


# ---- frame header --------------------------------------------------------------------------------


def encode_header(kind: int, flags: int, request_id: int, meta_bytes: int, payload_bytes: int) -> bytes:
    return HEADER.pack(_MAGIC_VERSION, kind, flags, 0, request_id, meta_bytes, payload_bytes)


def _bad_start(head: bytes) -> ProtocolError:
    """Why a header does not start with our magic and version."""
    if head[:3] == MAGIC:
        # an older peer gets the answer in its own version, so that it can read why
        older = 0 < head[3] < VERSION
        return ProtocolError(
            f"lumenrt TCP protocol version {head[3]} is not supported: this end speaks version "
            f"{VERSION} (upgrade lumenrt at the older end)",
            status=426 if older else 400,
            fatal=True,
            reply_version=head[3] if older else VERSION,
        )
    hint = ""
    if head[:4] in (b"GET ", b"POST", b"PUT ", b"HEAD", b"PRI "):
        hint = " (an HTTP client on the TCP protocol port?)"
    return ProtocolError(
        f"not a lumenrt frame: starts with {head[:4]!r}, expected {MAGIC!r}{hint}", fatal=True
    )


def read_header(
    data: bytes | bytearray | memoryview, pos: int, max_meta_bytes: int, max_frame_bytes: int
) -> tuple[int, int, int, int, int, int]:
    """The header at ``data[pos:]`` (24 bytes there): kind, flags, request id, metadata and payload
    lengths, and a request's priority (the u16 after the flags; 0 in other frames), checked against the limits before anything is buffered for them; a fatal
    ProtocolError says what is wrong."""
    magic, kind, flags, reserved, rid, meta_len, payload_len = HEADER.unpack_from(data, pos)
    if magic != _MAGIC_VERSION:
        raise _bad_start(bytes(data[pos : pos + 4]))
    if reserved and kind != REQUEST:  # a request's priority; reserved in every other frame
        raise ProtocolError(f"reserved header field is {reserved}, must be 0", fatal=True)
    if meta_len > max_meta_bytes:
        raise ProtocolError(
            f"frame metadata of {meta_len} bytes is over the limit of {max_meta_bytes}",
            status=431,
            fatal=True,
            request_id=rid,
        )
    if meta_len + payload_len > max_frame_bytes:
        raise ProtocolError(
            f"frame of {meta_len + payload_len} bytes (metadata {meta_len} + payload "
            f"{payload_len}) is over the limit of {max_frame_bytes} bytes",
            status=413,
            fatal=True,
            request_id=rid,
        )
    return kind, flags, rid, meta_len, payload_len, reserved


class FrameDecoder:
    """Splits a byte stream into frames, checking each header before its body is buffered.

    ``feed(chunk)`` calls ``on_frame`` for every frame completed by the chunk, in order, and keeps
    an incomplete tail. A fatal :class:`ProtocolError` is raised once framing breaks (after the
    frames before it were delivered); every later ``feed`` raises it again. ``pause()`` (from
    inside ``on_frame`` too) stops delivery after the current frame, keeping the rest buffered;
    ``resume()`` delivers what is buffered.

    Memory: at most the chunks of one incomplete frame plus one chunk; a frame's claimed size is
    checked against ``max_frame_bytes`` (metadata + payload) and ``max_meta_bytes`` first.
    """

    __slots__ = (
        "_chunks",
        "_error",
        "_have",
        "_need",
        "frames",
        "max_frame_bytes",
        "max_meta_bytes",
        "on_frame",
        "paused",
    )

    def __init__(
        self,
        on_frame: Callable[[Frame], None],
        *,
        max_frame_bytes: int = MAX_PAYLOAD_BYTES,
        max_meta_bytes: int = 1 << 20,
    ) -> None:
        self.on_frame = on_frame
        self.max_frame_bytes = max_frame_bytes
        self.max_meta_bytes = max_meta_bytes
        self.frames = 0  # frames delivered so far
        self.paused = False
        self._chunks: list[bytes] = []  # the incomplete tail, in arrival order
        self._have = 0  # bytes in _chunks
        self._need = HEADER_BYTES  # bytes _chunks must reach before parsing again
        self._error: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame (or of frames held while paused)."""
        return self._have

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._chunks:
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need or self.paused:
                return
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._have = 0
        elif self.paused:
            self._chunks.append(data)
            self._have = len(data)
            return
        self._run(data)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Deliver the frames held while paused (may pause again part way)."""
        self.paused = False
        if self._chunks and self._error is None:
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._have = 0
            self._run(data)

    def _run(self, data: bytes) -> None:
        pos = 0
        end = len(data)
        need = HEADER_BYTES
        while end - pos >= HEADER_BYTES:
            try:
                kind, flags, rid, meta_len, payload_len, priority = read_header(
                    data, pos, self.max_meta_bytes, self.max_frame_bytes
                )
            except ProtocolError as err:
                self._fail(err)
            need = HEADER_BYTES + meta_len + payload_len
            if end - pos < need:
                break
            body = pos + HEADER_BYTES
            pos += need
            need = HEADER_BYTES
            self.frames += 1
            try:
                self.on_frame(
                    Frame(
                        kind,
                        flags,
                        rid,
                        data[body : body + meta_len],
                        data,
                        body + meta_len,
                        payload_len,
                        priority,
                    )
                )
            except BaseException:
                self._keep(data, pos, end, HEADER_BYTES)  # the frames after it stay deliverable
                raise
            if self.paused:
                break
        self._keep(data, pos, end, need)

    def _keep(self, data: bytes, pos: int, end: int, need: int) -> None:
        """Keep ``data[pos:end]``, the start of a frame of ``need`` bytes (or of its header)."""
        if pos < end:
            self._chunks.append(data[pos:] if pos else data)
            self._have = end - pos
        self._need = need

    def _fail(self, err: ProtocolError) -> NoReturn:
        self._error = err
        self._chunks.clear()
        self._have = 0
        raise err


# ---- metadata reader -----------------------------------------------------------------------------


class _Reader:
    """Bounds-checked reads over a metadata block; every short read names what was being read."""

    __slots__ = ("at", "buf", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = buf
        self.at = 0
        self.what = what

    def _need(self, n: int, field: str) -> int:
        at = self.at
        if at + n > len(self.buf):
            raise ProtocolError(
                f"{self.what} metadata ends inside {field}: needs {n} bytes at offset {at}, "
                f"{len(self.buf) - at} remain"
            )
        self.at = at + n
        return at

    def u8(self, field: str) -> int:
        return self.buf[self._need(1, field)]

    def u16(self, field: str) -> int:
        value: int = _U16.unpack_from(self.buf, self._need(2, field))[0]
        return value

    def u32(self, field: str) -> int:
        value: int = _U32.unpack_from(self.buf, self._need(4, field))[0]
        return value

    def u64(self, field: str) -> int:
        value: int = _U64.unpack_from(self.buf, self._need(8, field))[0]
        return value

    def text(self, field: str, *, empty_ok: bool = False) -> str:
        n = self.u8(f"the length of {field}")
        if n == 0 and not empty_ok:
            raise ProtocolError(f"{self.what} metadata: {field} is empty")
        at = self._need(n, field)
        try:
            return self.buf[at : at + n].decode()
        except UnicodeDecodeError:
            raise ProtocolError(f"{self.what} metadata: {field} is not valid UTF-8") from None

    def tensor(self, where: str) -> TensorDesc:
        name = self.text(f"{where} name")
        where = f"{where} {name!r}"
        code = self.u8(f"{where} datatype")
        datatype = _CODE_NAMES.get(code)
        if datatype is None:
            raise ProtocolError(
                f"{self.what} metadata: {where}: datatype code {code} is not valid (valid: "
                + ", ".join(f"{c}={n}" for n, c in DATATYPE_CODES.items())
                + ")"
            )
        rank = self.u8(f"{where} rank")
        if rank > MAX_RANK:
            raise ProtocolError(f"{self.what} metadata: {where}: rank {rank} is over the limit of {MAX_RANK}")
        shape: tuple[int, ...] = _DIMS[rank].unpack_from(self.buf, self._need(8 * rank, f"{where} shape"))
        for d in shape:
            if d > MAX_DIM:
                raise ProtocolError(f"{self.what} metadata: {where}: dimension {d} is over the int64 range")
        byte_size = self.u32(f"{where} byte size")
        raw.check_size(datatype, shape, byte_size, where, ProtocolError)
        return TensorDesc(name, datatype, shape, byte_size)

    def finish(self) -> None:
        left = len(self.buf) - self.at
        if left:
            raise ProtocolError(f"{self.what} metadata has {left} bytes left over at offset {self.at}")


def _write_text(out: list[bytes], text: str, field: str, *, empty_ok: bool = False) -> None:
    encoded = text.encode()
    if len(encoded) > MAX_NAME_BYTES or (not encoded and not empty_ok):
        raise ValueError(f"{field} must be 1..{MAX_NAME_BYTES} bytes of UTF-8, got {len(encoded)} ({text!r})")
    out.append(_U8.pack(len(encoded)))
    out.append(encoded)


def _write_desc(out: list[bytes], name: str, datatype: str, shape: tuple[int, ...], byte_size: int) -> None:
    _write_text(out, name, "tensor name")
    rank = len(shape)
    if rank > MAX_RANK:
        raise ValueError(f"tensor {name!r}: rank {rank} is over the limit of {MAX_RANK}")
    out.append(_TYPE_RANK.pack(DATATYPE_CODES[datatype], rank))
    out.append(_DIMS[rank].pack(*shape))
    out.append(_U32.pack(byte_size))


# ---- tensor bytes (the raw codec: lumenrt.protocols.raw) ------------------------------------------


def _slots(descs: Sequence[TensorDesc]) -> tuple[TensorSlot, ...]:
    """Where each tensor of a payload lies (descriptor byte sizes were checked by ``_Reader``)."""
    return raw.payload_slots((d.name, d.datatype, d.shape, d.byte_size) for d in descs)


# ---- request -------------------------------------------------------------------------------------


def _tensor_parts(
    tensors: Iterable[tuple[str, Any]],
) -> tuple[list[tuple[str, str, tuple[int, ...], int]], list[bytes | memoryview], int]:
    """(name, datatype, shape, byte size) per tensor, their raw bytes, and the bytes in all."""
    sig: list[tuple[str, str, tuple[int, ...], int]] = []
    raws: list[bytes | memoryview] = []
    total = 0
    for name, value in tensors:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        datatype, data = raw.to_raw(array)
        size = len(data) if isinstance(data, bytes) else data.nbytes
        sig.append((name, datatype, array.shape, size))
        raws.append(data)
        total += size
    if total > MAX_PAYLOAD_BYTES:
        raise ValueError(f"{total} bytes of tensor data is over the frame limit of {MAX_PAYLOAD_BYTES}")
    return sig, raws, total


def _request_meta_bytes(
    model: str,
    version: str,
    timeout_us: int,
    sig: Sequence[tuple[str, str, tuple[int, ...], int]],
    outputs: Sequence[str],
) -> bytes:
    if not 0 <= timeout_us <= MAX_TIMEOUT_US:
        raise ValueError(f"timeout_us must be in 0..{MAX_TIMEOUT_US}, got {timeout_us}")
    if len(sig) > 255 or len(outputs) > 255:
        raise ValueError(f"at most 255 inputs and 255 outputs per request, got {len(sig)} and {len(outputs)}")
    meta: list[bytes] = []
    _write_text(meta, model, "model name")
    _write_text(meta, version, "model version", empty_ok=True)
    meta.append(_U32.pack(timeout_us))
    meta.append(_U8.pack(len(sig)))
    for name, datatype, shape, size in sig:
        _write_desc(meta, name, datatype, shape, size)
    meta.append(_U8.pack(len(outputs)))
    for name in outputs:
        _write_text(meta, name, "output name")
    return b"".join(meta)


def encode_request(
    request_id: int,
    model: str,
    inputs: Mapping[str, Any],
    *,
    version: str = "",
    outputs: Iterable[str] = (),
    timeout_us: int = 0,
    flags: int = 0,
    priority: int = 0,
) -> list[bytes | memoryview]:
    """A request frame as buffers to write in order: header and metadata first (one bytes), then
    each input's raw bytes. Raises ValueError for what cannot be sent."""
    sig, raws, total = _tensor_parts(inputs.items())
    body = _request_meta_bytes(model, version, timeout_us, sig, tuple(outputs))
    head = HEADER.pack(_MAGIC_VERSION, REQUEST, flags, _priority(priority), request_id, len(body), total)
    return [head + body, *raws]


def _priority(priority: int) -> int:
    if not 0 <= priority <= 0xFFFF:
        raise ValueError(f"priority must be in 0..65535 (0: the model's default level), got {priority}")
    return priority


JOIN_BELOW_BYTES = 64 << 10  # cached encoders join smaller frames into one buffer (one write)


class RequestEncoder:
    """``encode_request`` with the metadata of repeated request shapes cached (client side). A
    frame under ``JOIN_BELOW_BYTES`` comes back as one joined buffer (a list of one)."""

    CACHE_ENTRIES = 256  # distinct request shapes remembered (guessed ample for one client)

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], bytes] = {}

    def encode(
        self,
        request_id: int,
        model: str,
        inputs: Mapping[str, Any],
        version: str,
        outputs: tuple[str, ...],
        timeout_us: int,
        flags: int,
        priority: int = 0,
    ) -> list[bytes | memoryview]:
        sig, raws, total = _tensor_parts(inputs.items())
        key = (model, version, timeout_us, outputs, *sig)
        body = self._cache.get(key)
        if body is None:
            body = _request_meta_bytes(model, version, timeout_us, sig, outputs)
            if len(self._cache) >= self.CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = body
        head = HEADER.pack(_MAGIC_VERSION, REQUEST, flags, _priority(priority), request_id, len(body), total)
        if total + len(body) < JOIN_BELOW_BYTES:
            return [b"".join([head, body, *raws])]
        return [head + body, *raws]


def decode_request_meta(meta: bytes) -> RequestMeta:
    """Raises a non-fatal ProtocolError naming the field."""
    r = _Reader(meta, "request")
    model = r.text("the model name")
    version = r.text("the model version", empty_ok=True)  # checked by the service
    timeout_us = r.u32("the timeout")
    inputs = tuple(r.tensor(f"input {i}") for i in range(r.u8("the input count")))
    outputs = tuple(r.text(f"output name {i}") for i in range(r.u8("the output count")))
    r.finish()
    return RequestMeta(
        model, version, timeout_us, inputs, outputs, sum(t.byte_size for t in inputs), _slots(inputs)
    )


# ---- response ------------------------------------------------------------------------------------


def _response_desc_bytes(
    model: str, version: int, sig: Sequence[tuple[str, str, tuple[int, ...], int]]
) -> bytes:
    """The response metadata after its timing fields."""
    if len(sig) > 255:
        raise ValueError(f"at most 255 outputs per response, got {len(sig)}")
    meta: list[bytes] = []
    _write_text(meta, model, "model name")
    meta.append(_U64.pack(version))
    meta.append(_U8.pack(len(sig)))
    for name, datatype, shape, size in sig:
        _write_desc(meta, name, datatype, shape, size)
    return b"".join(meta)


def _timing_prefix(timing: Sequence[int] | None) -> bytes:
    if not timing:
        return b"\x00"
    return _U8.pack(len(timing)) + struct.pack(f"<{len(timing)}Q", *timing)


def encode_response(
    request_id: int,
    model: str,
    version: int,
    outputs: Sequence[tuple[str, Array]],
    timing: Sequence[int] | None = None,
) -> list[bytes | memoryview]:
    """A response frame as buffers (header and metadata first); ``timing`` in TIMING_FIELDS order."""
    sig, raws, total = _tensor_parts(outputs)
    body = _timing_prefix(timing) + _response_desc_bytes(model, version, sig)
    flags = FLAG_TIMING if timing else 0
    return [encode_header(RESPONSE, flags, request_id, len(body), total) + body, *raws]


class ResponseEncoder:
    """``encode_response`` with the metadata of repeated output shapes cached (server side). A
    frame under ``JOIN_BELOW_BYTES`` comes back as one joined buffer (a list of one)."""

    CACHE_ENTRIES = 1024  # distinct (model, version, output shapes) remembered (guessed)

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], bytes] = {}

    def encode(
        self,
        request_id: int,
        model: str,
        version: int,
        outputs: Sequence[tuple[str, Array]],
        timing: Sequence[int] | None = None,
    ) -> list[bytes | memoryview]:
        sig, raws, total = _tensor_parts(outputs)
        key = (model, version, *sig)
        desc = self._cache.get(key)
        if desc is None:
            desc = _response_desc_bytes(model, version, sig)
            if len(self._cache) >= self.CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = desc
        if timing:
            prefix = _timing_prefix(timing)
            flags = FLAG_TIMING
        else:
            prefix = b"\x00"
            flags = 0
        meta_bytes = len(prefix) + len(desc)
        head = HEADER.pack(_MAGIC_VERSION, RESPONSE, flags, 0, request_id, meta_bytes, total)
        if total + meta_bytes < JOIN_BELOW_BYTES:
            return [b"".join([head, prefix, desc, *raws])]
        return [head + prefix + desc, *raws]


def decode_response_meta(meta: bytes) -> tuple[ResponseMeta, dict[str, int]]:
    """The response's descriptors and its timing (empty when not sent)."""
    return _decode_response_desc(meta, _timing_bytes(meta)), decode_timing(meta)


def _timing_bytes(meta: bytes) -> int:
    if not meta:
        raise ProtocolError("response metadata ends inside the timing field count: it is empty")
    return 1 + 8 * meta[0]


def decode_timing(meta: bytes) -> dict[str, int]:
    """The stage times at the start of a response's metadata (unknown extra fields ignored)."""
    count = meta[0] if meta else 0
    if not count:
        return {}
    if len(meta) < 1 + 8 * count:
        raise ProtocolError(f"response metadata ends inside its {count} timing fields")
    values = struct.unpack_from(f"<{count}Q", meta, 1)
    return dict(zip(TIMING_FIELDS, values, strict=False))


def _decode_response_desc(meta: bytes, offset: int) -> ResponseMeta:
    r = _Reader(meta, "response")
    r.at = offset
    model = r.text("the model name")
    version = r.u64("the model version")
    outputs = tuple(r.tensor(f"output {i}") for i in range(r.u8("the output count")))
    r.finish()
    return ResponseMeta(model, version, outputs, sum(t.byte_size for t in outputs), _slots(outputs))


class ResponseDecoder:
    """Decodes response frames, caching descriptors by their bytes (a client sees the same few)."""

    CACHE_ENTRIES = 256  # distinct response shapes remembered (guessed ample for one client)

    def __init__(self) -> None:
        self._cache: dict[bytes, ResponseMeta] = {}

    def decode(self, frame: Frame) -> tuple[ResponseMeta, dict[str, Array], dict[str, int]]:
        meta = frame.meta
        skip = _timing_bytes(meta)
        # The timing values are not part of the key. A key starting with byte 0 is a whole
        # metadata block without timing; any other starts at the model name's length (>= 1).
        key = meta if skip == 1 else meta[skip:]
        desc = self._cache.get(key)
        if desc is None:
            desc = _decode_response_desc(key, 1 if skip == 1 else 0)
            if len(self._cache) >= self.CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = desc
        if desc.payload_bytes != frame.payload_bytes:
            raise ProtocolError(
                f"response payload is {frame.payload_bytes} bytes but its outputs total {desc.payload_bytes}"
            )
        arrays = raw.split_payload(frame.data, frame.payload_at, desc.slots, "output", ProtocolError)
        outputs = {s.name: a for s, a in zip(desc.slots, arrays, strict=True)}
        return desc, outputs, decode_timing(meta) if skip > 1 else {}


# ---- error ---------------------------------------------------------------------------------------

_MAX_MESSAGE_BYTES = 4096  # longer error messages are cut (guessed: far above any real message)


def encode_error(
    request_id: int, status: int, message: str, *, closing: bool = False, version: int = VERSION
) -> bytes:
    """``closing``: the connection ends after this frame (flag CLOSING). ``version``: the header's
    (an older peer is told in its own version why it is refused)."""
    text = message.encode(errors="replace")[:_MAX_MESSAGE_BYTES]
    body = _U16.pack(status) + text
    magic = int.from_bytes(MAGIC + bytes([version]), "little")
    flags = FLAG_CLOSING if closing else 0
    return HEADER.pack(magic, ERROR, flags, 0, request_id, len(body), 0) + body


def decode_error(meta: bytes) -> ErrorInfo:
    if len(meta) < 2:
        raise ProtocolError(f"error metadata of {len(meta)} bytes is shorter than its 2-byte status")
    (status,) = _U16.unpack_from(meta, 0)
    return ErrorInfo(status, meta[2:].decode(errors="replace"))


# ---- authentication ------------------------------------------------------------------------------


def encode_auth(request_id: int, key: str | bytes) -> bytes:
    """The AUTH frame that gives a connection its API key (before or between requests)."""
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if not 0 < len(raw) <= MAX_KEY_BYTES:
        raise ProtocolError(f"API key must be 1..{MAX_KEY_BYTES} bytes, got {len(raw)}")
    body = _U16.pack(len(raw)) + raw
    return encode_header(AUTH, 0, request_id, len(body), 0) + body


def decode_auth(meta: bytes) -> bytes:
    reader = _Reader(meta, "auth frame")
    length = reader.u16("key length")
    if not 0 < length <= MAX_KEY_BYTES:
        raise ProtocolError(f"auth frame: key length must be 1..{MAX_KEY_BYTES}, got {length}")
    at = reader._need(length, "key")
    key = bytes(meta[at : at + length])
    reader.finish()
    return key


def encode_auth_ok(request_id: int, name: str) -> bytes:
    out: list[bytes] = []
    _write_text(out, name, "key name", empty_ok=True)
    body = b"".join(out)
    return encode_header(AUTH_OK, 0, request_id, len(body), 0) + body


def decode_auth_ok(meta: bytes) -> str:
    reader = _Reader(meta, "auth ok frame")
    name = reader.text("key name", empty_ok=True)
    reader.finish()
    return name
