"""HPACK, HTTP/2's header compression (RFC 7541): the decoder every HTTP/2 endpoint needs, and the
small stateless encoder lumenrt's gRPC server and client use. No I/O.

Decoding (``HpackDecoder``)
  - Integers (5.1), string literals plain or Huffman-coded (5.2, Appendix B), the static table
    (Appendix A) and the dynamic table with its size updates and eviction (4.1-4.4), and the four
    field representations (6.1-6.3).
  - Claimed sizes are checked before anything is kept: a string longer than the rest of the
    block, an index outside the tables, a table size update above the size we allowed
    (``max_table_size``, our SETTINGS_HEADER_TABLE_SIZE) or anywhere but at the block's start are
    ``HpackError`` (the connection's COMPRESSION_ERROR). A header list whose size (names, values
    and 32 octets a field, RFC 7540 6.5.2) passes ``max_list_bytes`` is ``HeaderListTooLarge``:
    the table stays in step, so only that stream is refused.
  - A block that only refers to the tables (no literal added to the dynamic table, no size update)
    decodes the same way until the dynamic table changes. gRPC clients send such blocks for every
    call after the first (their own encoder indexes the path, the authority and the rest), so these
    are remembered by their bytes (``CACHE_BLOCKS`` of them, each at most ``CACHE_BLOCK_BYTES``) and
    the cache is emptied whenever the table changes: a repeated call costs one dict lookup instead
    of a decode.

Encoding (``encode_block``)
  Each field is a literal without indexing (6.2.2), its name taken from the static table where it
  is there, its value not Huffman-coded; ``:status 200`` and the like that are whole in the static
  table are indexed (6.1). The encoder never adds to the peer's dynamic table, so a block's bytes
  depend only on its fields: the gRPC front end builds its response blocks once and reuses them.

The Huffman code is canonical (codes of one length are consecutive, in symbol order), so the code
lengths of Appendix B are all it takes to rebuild it; the decoder walks it four bits at a time
through a table made at import.
"""

from collections.abc import Iterable

# ---- tables of RFC 7541 -----------------------------------------------------------------------------

# Appendix A: the static table, 1-based (index 0 unused)
STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = (
    (b"", b""),
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
)
STATIC_COUNT = len(STATIC_TABLE) - 1  # 61

# Appendix B, as code length -> the symbols of that length (256: EOS). The code is canonical, so
# this is the whole of it (``_canonical_codes``).
_CODE_LENGTHS: dict[int, tuple[int, ...]] = {
    5: (48, 49, 50, 97, 99, 101, 105, 111, 115, 116),
    6: (32, 37, 45, 46, 47, 51, 52, 53, 54, 55, 56, 57, 61, 65, 95, 98, 100, 102, 103, 104, 108, 109, 110,
        112, 114, 117),
    7: (58, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 89, 106,
        107, 113, 118, 119, 120, 121, 122),
    8: (38, 42, 44, 59, 88, 90),
    10: (33, 34, 40, 41, 63),
    11: (39, 43, 124),
    12: (35, 62),
    13: (0, 36, 64, 91, 93, 126),
    14: (94, 125),
    15: (60, 96, 123),
    19: (92, 195, 208),
    20: (128, 130, 131, 162, 184, 194, 224, 226),
    21: (153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230),
    22: (129, 132, 133, 134, 136, 146, 154, 156, 160, 163, 164, 169, 170, 173, 178, 181, 185, 186, 187,
         189, 190, 196, 198, 228, 232, 233),
    23: (1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166, 168, 174,
         175, 180, 182, 183, 188, 191, 197, 231, 239),
    24: (9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237),
    25: (199, 207, 234, 235),
    26: (192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255),
    27: (203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252, 253, 254),
    28: (2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27, 28, 29, 30, 31,
         127, 220, 249),
    30: (10, 13, 22, 256),
}  # fmt: skip
EOS = 256
ENTRY_OVERHEAD = 32  # octets each entry adds to a table's size (4.1), and each field to a list's
DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 7540 6.5.2)
CACHE_BLOCKS = 64  # header blocks remembered per decoder (guessed: a client's few distinct calls)
# ... each at most this long (a gRPC call's block is 100-300 octets: held per connection, the cache
# stays under 64 x 1 KiB of blocks plus their fields, not 64 x the 64 KiB a block may be)
CACHE_BLOCK_BYTES = 1024


class HpackError(ValueError):
    """A header block that cannot be decoded: the connection's COMPRESSION_ERROR (RFC 7540 4.3)."""


class HeaderListTooLarge(ValueError):
    """The decoded header list is over ``max_list_bytes``; the decoder is still in step."""


def _canonical_codes() -> list[tuple[int, int]]:
    """(code, length) per symbol 0..256, assigned canonically from the lengths."""
    codes: list[tuple[int, int]] = [(0, 0)] * 257
    code, prev = 0, 0
    first = True
    for length in sorted(_CODE_LENGTHS):
        for symbol in _CODE_LENGTHS[length]:
            if not first:
                code = (code + 1) << (length - prev)
            first, prev = False, length
            codes[symbol] = (code, length)
    return codes


HUFFMAN_CODES = _canonical_codes()


def _decode_machine() -> tuple[list[int], list[int], list[bool]]:
    """The Huffman decoder as a 4-bit state machine over the code's tree. Its states are the
    tree's inner nodes (0: the root). ``step[state * 16 + nibble]`` is the next state, or -1 where
    the nibble completes EOS (an error: 5.2); ``emit[...]`` the symbol completed on the way (-1:
    none; with codes of 5 bits or more, a nibble completes at most one); ``accepting[state]``:
    the bits since the last symbol may end a string (padding: fewer than 8 bits, all ones)."""
    children: list[list[int]] = [[-1, -1]]  # inner node -> [child on 0, child on 1]; leaf: -2 - symbol
    for symbol, (code, length) in enumerate(HUFFMAN_CODES):
        node = 0
        for i in range(length - 1, -1, -1):
            bit = (code >> i) & 1
            if i == 0:
                children[node][bit] = -2 - symbol
            else:
                if children[node][bit] == -1:
                    children[node][bit] = len(children)
                    children.append([-1, -1])
                node = children[node][bit]
    ones_depth = [-1] * len(children)  # depth of a node reached from the root by ones only
    node, depth = 0, 0
    while node >= 0:
        ones_depth[node] = depth
        node, depth = children[node][1], depth + 1
    step = [0] * (len(children) * 16)
    emit = [-1] * (len(children) * 16)
    for state in range(len(children)):
        for nibble in range(16):
            node, out = state, -1
            for i in (3, 2, 1, 0):
                nxt = children[node][(nibble >> i) & 1]
                if nxt <= -2:  # a leaf: a symbol is complete, back to the root
                    symbol = -2 - nxt
                    if symbol == EOS:
                        node = -1
                        break
                    out, node = symbol, 0
                else:
                    node = nxt
            step[state * 16 + nibble] = node
            emit[state * 16 + nibble] = out
    accepting = [0 <= d < 8 for d in ones_depth]
    return step, emit, accepting


_STEP, _EMIT, _ACCEPTING = _decode_machine()


def huffman_decode(data: bytes | memoryview) -> bytes:
    """A Huffman-coded string literal (5.2); HpackError if it is not a valid one."""
    state = 0
    out = bytearray()
    step, emit = _STEP, _EMIT
    for byte in bytes(data):
        at = state * 16 + (byte >> 4)
        state = step[at]
        if state < 0:
            raise HpackError("a Huffman-coded string contains EOS")
        if emit[at] >= 0:
            out.append(emit[at])
        at = state * 16 + (byte & 15)
        state = step[at]
        if state < 0:
            raise HpackError("a Huffman-coded string contains EOS")
        if emit[at] >= 0:
            out.append(emit[at])
    if not _ACCEPTING[state]:
        raise HpackError("a Huffman-coded string ends in padding that is not a prefix of EOS")
    return bytes(out)


def huffman_encode(data: bytes) -> bytes:
    """``data`` Huffman-coded, padded with ones (for the tests and the client; the encoder below
    sends values plain)."""
    acc, bits = 0, 0
    out = bytearray()
    for byte in data:
        code, length = HUFFMAN_CODES[byte]
        acc = (acc << length) | code
        bits += length
        while bits >= 8:
            bits -= 8
            out.append((acc >> bits) & 0xFF)
        acc &= (1 << bits) - 1
    if bits:
        out.append(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) & 0xFF)
    return bytes(out)


# ---- integers and strings ---------------------------------------------------------------------------

_MAX_INT_OCTETS = 5  # continuation octets after the prefix: enough for 2**28 (guessed, as nghttp2's bound)


def encode_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """``value`` with an N-bit prefix (5.1); ``first``: the bits above the prefix in octet one."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _decode_int(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    limit = (1 << prefix_bits) - 1
    value = block[at] & limit
    at += 1
    if value < limit:
        return value, at
    shift = 0
    end = len(block)
    for _ in range(_MAX_INT_OCTETS):
        if at >= end:
            raise HpackError("an integer runs past the end of the header block")
        octet = block[at]
        at += 1
        value += (octet & 0x7F) << shift
        shift += 7
        if not octet & 0x80:
            return value, at
    raise HpackError("an integer in the header block is too long")


def _decode_string(block: bytes, at: int) -> tuple[bytes, int]:
    if at >= len(block):
        raise HpackError("a string literal runs past the end of the header block")
    huffman = block[at] & 0x80
    length, at = _decode_int(block, at, 7)
    end = at + length
    if end > len(block):  # checked before anything is kept
        raise HpackError(f"a string literal claims {length} octets; the block has {len(block) - at} left")
    raw = block[at:end]
    return (huffman_decode(raw) if huffman else raw), end


# ---- the decoder ------------------------------------------------------------------------------------


class HpackDecoder:
    """One direction of one connection's header compression (the peer's encoder's mirror)."""

    __slots__ = ("_cache", "_dynamic", "_size", "max_list_bytes", "max_table_size", "shared", "table_size")

    def __init__(self, max_table_size: int = DEFAULT_TABLE_SIZE, max_list_bytes: int = 64 << 10) -> None:
        self.max_table_size = max_table_size  # the most we allow (our SETTINGS_HEADER_TABLE_SIZE)
        self.table_size = max_table_size  # the size the peer's encoder chose, <= max_table_size
        self.max_list_bytes = max_list_bytes
        self._dynamic: list[tuple[bytes, bytes]] = []  # newest first (index 62 is [0])
        self._size = 0
        self._cache: dict[bytes, list[tuple[bytes, bytes]]] = {}
        # the last list ``decode`` returned is the cache's: the same object comes back for the same
        # block until the table changes (a caller may key what it derives on its identity)
        self.shared = False

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The fields of one whole header block (HEADERS plus its CONTINUATIONs), in order. The
        list may be shared with later calls for the same bytes: do not change it."""
        cached = self._cache.get(block)
        self.shared = cached is not None
        if cached is not None:
            return cached
        fields: list[tuple[bytes, bytes]] = []
        changed = False
        list_bytes = 0
        too_large = False
        at, end = 0, len(block)
        while at < end:
            octet = block[at]
            if octet & 0x80:  # 6.1 indexed field
                index, at = _decode_int(block, at, 7)
                field = self._entry(index)
            elif octet & 0x40:  # 6.2.1 literal, added to the table
                name, at = self._name(block, at, 6)
                value, at = _decode_string(block, at)
                field = (name, value)
                self._add(field)
                changed = True
            elif octet & 0x20:  # 6.3 dynamic table size update
                if fields:
                    raise HpackError("a dynamic table size update after a header field")
                size, at = _decode_int(block, at, 5)
                if size > self.max_table_size:
                    raise HpackError(
                        f"a dynamic table size update to {size} octets; the limit is {self.max_table_size}"
                    )
                self.table_size = size
                self._evict(0)
                changed = True
                continue
            else:  # 6.2.2 without indexing, 6.2.3 never indexed (4-bit prefix either way)
                name, at = self._name(block, at, 4)
                value, at = _decode_string(block, at)
                field = (name, value)
            list_bytes += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            if list_bytes > self.max_list_bytes:
                too_large = True  # go on decoding: the dynamic table must stay in step
                fields.clear()
                continue
            if not too_large:
                fields.append(field)
        if changed:
            self._cache.clear()
        if too_large:
            raise HeaderListTooLarge(f"the header list is over {self.max_list_bytes} octets")
        if not changed and len(block) <= CACHE_BLOCK_BYTES:
            if len(self._cache) >= CACHE_BLOCKS:
                self._cache.clear()
            self._cache[bytes(block)] = fields
            self.shared = True
        return fields

    def _name(self, block: bytes, at: int, prefix_bits: int) -> tuple[bytes, int]:
        index, at = _decode_int(block, at, prefix_bits)
        if index:
            return self._entry(index)[0], at
        return _decode_string(block, at)

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= STATIC_COUNT:
            return STATIC_TABLE[index]
        at = index - STATIC_COUNT - 1
        if index == 0 or at >= len(self._dynamic):
            raise HpackError(
                f"header index {index} is outside the tables ({STATIC_COUNT + len(self._dynamic)})"
            )
        return self._dynamic[at]

    def _add(self, field: tuple[bytes, bytes]) -> None:
        size = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        if size > self.table_size:  # 4.4: an entry larger than the table empties it
            self._dynamic.clear()
            self._size = 0
            return
        self._evict(size)
        self._dynamic.insert(0, field)
        self._size += size

    def _evict(self, room: int) -> None:
        dynamic = self._dynamic
        while dynamic and self._size + room > self.table_size:
            name, value = dynamic.pop()
            self._size -= len(name) + len(value) + ENTRY_OVERHEAD


# ---- the encoder ------------------------------------------------------------------------------------

_STATIC_FIELD = {field: i for i, field in enumerate(STATIC_TABLE) if i and field[1]}
_STATIC_NAME: dict[bytes, int] = {}
for _i, (_name, _) in enumerate(STATIC_TABLE):
    if _i:
        _STATIC_NAME.setdefault(_name, _i)


def encode_block(fields: Iterable[tuple[bytes, bytes]], table_size_update: int | None = None) -> bytes:
    """A header block for ``fields`` (names lower-case), with no dynamic table (see the top).
    ``table_size_update``: a dynamic table size update put first (6.3), owed after the peer
    lowered its SETTINGS_HEADER_TABLE_SIZE."""
    out = bytearray()
    if table_size_update is not None:
        out += encode_int(table_size_update, 5, 0x20)
    for name, value in fields:
        index = _STATIC_FIELD.get((name, value))
        if index is not None:
            out += encode_int(index, 7, 0x80)
            continue
        name_index = _STATIC_NAME.get(name, 0)
        out += encode_int(name_index, 4, 0x00)
        if not name_index:
            out += encode_int(len(name), 7) + name
        out += encode_int(len(value), 7) + value
    return bytes(out)
