"""ModelInfer's messages at the wire level, for the gRPC front end's common case (no I/O): a request cut
into the part that is the same for every request of one signature and the parts that change, and
an answer written from a prefix made once per signature. The generated protobuf classes remain
the reference (and the path for everything else); tests check these bytes against them.

Protobuf's encoding (protobuf.dev, "Encoding"): a message is a sequence of fields, each a varint
tag (field number << 3 | wire type) and, for wire type 2, a varint length and that many octets.
ModelInferRequest's top-level fields are all of wire type 2: model_name 1, model_version 2, id 3,
parameters 4 (map entries), inputs 5, outputs 6, raw_input_contents 7. Serializers write fields in
number order, so the raw contents come last; a request that is not laid out so (or has a field
of another wire type) is left to the generated class (``split_request`` gives None).

``split_request`` gives the signature key (every field but id and the raw contents, as sent), the
id, and views of the raw contents: the front end decodes and checks a key's fields once and
afterwards only cuts arrays out of the raw contents. Claimed lengths are checked against the
message before anything is sliced.
"""

from dataclasses import dataclass

_RAW_INPUT = 7
_ID = 3
_RAW_TAG = (_RAW_INPUT << 3) | 2  # its tag octet (length-delimited)
_MAX_FIELDS = 4096  # top-level fields walked before giving up to the generated class (guessed)


@dataclass(slots=True)
class RequestParts:
    key: bytes  # the fields other than id and raw_input_contents, in order, as sent
    request_id: str | None
    raw: list[memoryview]  # raw_input_contents, in order


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    end = len(data)
    while True:
        if at >= end or shift > 63:
            raise ValueError("a varint runs past the message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _short_varint(data: bytes, at: int) -> tuple[int, int]:
    """A varint at ``at`` (ValueError past the end); one octet without a call, the usual case."""
    if at < len(data) and data[at] < 0x80:
        return data[at], at + 1
    return _varint(data, at)


def _delimited_at(message: bytes, at: int) -> tuple[int, int, int] | None:
    """The length-delimited field at ``at``: (tag, where its bytes start, where they stop); None if
    it is another wire type or runs past the message."""
    try:
        tag, at = _short_varint(message, at)
        length, at = _short_varint(message, at)
    except ValueError:
        return None
    stop = at + length
    if tag & 7 != 2 or stop > len(message):
        return None
    return tag, at, stop


def _leading_fields(message: bytes) -> tuple[bytes, str | None, int] | None:
    """Walk the fields before the raw contents: (the signature key, the id, where the walk
    stopped: the first raw field's tag, or the end); None for a field not laid out as expected.
    A raw field is recognised by its tag alone, so it may run past ``message`` (a head)."""
    parts: list[bytes] = []
    request_id: str | None = None
    at, end = 0, len(message)
    for _ in range(_MAX_FIELDS):
        if at >= end or message[at] == _RAW_TAG:
            return b"".join(parts), request_id, at
        found = _delimited_at(message, at)
        if found is None:
            return None
        tag, start, stop = found
        if tag >> 3 == _ID:
            try:
                request_id = message[start:stop].decode("utf-8") or None
            except UnicodeDecodeError:
                return None
        else:
            parts.append(message[at:stop])
        at = stop
    return None


def split_request(message: bytes) -> RequestParts | None:
    """Cut a serialized ModelInferRequest (see the top); None when it is not laid out as expected
    (the caller then parses it with the generated class, which says what is wrong)."""
    leading = _leading_fields(message)
    if leading is None:
        return None
    key, request_id, at = leading
    view = memoryview(message)
    raw: list[memoryview] = []
    for _ in range(_MAX_FIELDS):
        if at >= len(message):
            return RequestParts(key, request_id, raw)
        found = _delimited_at(message, at)
        if found is None or found[0] != _RAW_TAG:
            return None  # a field after the raw contents: not the usual layout
        _, start, at = found
        raw.append(view[start:at])
    return None


def raw_contents(message: bytes, at: int, count: int) -> list[memoryview] | None:
    """The ``count`` raw_input_contents that make up all of ``message`` from ``at`` (a request whose
    leading fields are a known signature's key); None if that is not what follows."""
    view = memoryview(message)
    raw: list[memoryview] = []
    for _ in range(count):
        found = _delimited_at(message, at)
        if found is None or found[0] != _RAW_TAG:
            return None
        _, start, at = found
        raw.append(view[start:at])
    return raw if at == len(message) else None


def split_head(head: bytes) -> tuple[bytes, str | None, int] | None:
    """The start of a ModelInferRequest that arrives over many DATA frames, ``head`` being its
    first bytes: (the signature key, the id, where the raw contents begin), when every field
    before the raw contents is in ``head``; else None."""
    leading = _leading_fields(head)
    if leading is None or leading[2] >= len(head):
        return None
    return leading


def raw_layout(at: int, sizes: list[int]) -> tuple[list[tuple[bytes, int]], int]:
    """Where the raw contents lie in a message whose raw contents begin at ``at`` and hold tensors of
    ``sizes`` octets, each in the fewest octets protobuf writes: each one's tag and length (the
    octets before its bytes) and where its bytes start, and the message's length."""
    out: list[tuple[bytes, int]] = []
    for size in sizes:
        framing = _RAW_KEY + _uvarint(size)
        at += len(framing)
        out.append((framing, at))
        at += size
    return out, at


# ---- the answer -----------------------------------------------------------------------------------


def _key(field: int) -> bytes:
    return _uvarint((field << 3) | 2)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(field: int, payload: bytes) -> bytes:
    return _key(field) + _uvarint(len(payload)) + payload


def _int64(value: int) -> bytes:
    return _uvarint(value & 0xFFFFFFFFFFFFFFFF)  # two's complement, 10 octets when negative


_RAW_OUTPUT = _key(6)
_RAW_KEY = _key(_RAW_INPUT)
_ID_KEY = _key(_ID)


@dataclass(frozen=True, slots=True)
class ResponsePrefix:
    """What is the same in every answer of one signature: model_name and model_version (``head``,
    fields 1 and 2) and the outputs' descriptions (``outputs``, field 5, one entry each)."""

    head: bytes
    outputs: bytes


def response_prefix(
    model: str, version: str, outputs: list[tuple[str, str, tuple[int, ...]]]
) -> ResponsePrefix:
    """The fixed parts of an answer naming ``outputs`` (name, datatype, shape)."""
    head = _delimited(1, model.encode()) if model else b""
    if version:
        head += _delimited(2, version.encode())
    tensors = []
    for name, datatype, shape in outputs:
        tensor = [_delimited(1, name.encode())] if name else []  # proto3 leaves empty strings out
        if datatype:
            tensor.append(_delimited(2, datatype.encode()))
        if shape:
            tensor.append(_delimited(3, b"".join(_int64(d) for d in shape)))  # packed int64
        tensors.append(_delimited(5, b"".join(tensor)))
    return ResponsePrefix(head, b"".join(tensors))


def int64_parameters(values: dict[str, int]) -> bytes:
    """The response's parameters map with ``int64_param`` values (field 4: one entry message each)."""
    out = []
    for key, value in values.items():
        param = _int64(value)
        entry = _delimited(1, key.encode()) + _delimited(2, b"\x10" + param)  # InferParameter.int64_param = 2
        out.append(_delimited(4, entry))
    return b"".join(out)


def encode_response(
    prefix: ResponsePrefix, request_id: str | None, parameters: bytes, raw: list[bytes | memoryview]
) -> list[bytes | memoryview]:
    """An answer's parts, in field number order, as protobuf writes them (join them, or hand them
    to ``writelines``)."""
    out: list[bytes | memoryview] = [prefix.head]
    if request_id:
        out.append(_delimited(_ID, request_id.encode()))
    if parameters:
        out.append(parameters)
    out.append(prefix.outputs)
    for data in raw:
        out.append(_RAW_OUTPUT + _uvarint(len(data)))
        out.append(data)
    return out
