"""Bounds on what a request may hold, checked before anything is built for it (no I/O).

``MAX_TENSORS`` bounds the inputs and the outputs one request names on every protocol (the TCP
protocol's u8 counts are under it already). ``check_json_depth`` refuses a JSON document nested
deeper than a limit before ``json.loads`` sees it: Python's parser recurses once per level, so a
body of a million ``[`` would otherwise cost a RecursionError and the CPU to get there. Its fast
path is two ``bytes.count`` calls (C, no allocation); only a body with more brackets than the limit
is scanned level by level, skipping string contents.
"""

import re

from lumenrt.protocols.errors import bad_request

MAX_TENSORS = 1024  # inputs, and outputs, in one request (guessed ample; bounds per-tensor work)
DEFAULT_MAX_JSON_DEPTH = 64  # V2 bodies nest 4-5 levels plus the data's rank (at most 32)

_STRUCTURE = re.compile(rb'[\[\]{}"\\]')


def check_tensor_count(count: int, what: str) -> None:
    if count > MAX_TENSORS:
        raise bad_request(f"{what} has {count} tensors, over the limit of {MAX_TENSORS}")


def check_json_depth(body: bytes | bytearray | memoryview, limit: int, what: str = "request body") -> None:
    """400 if ``body`` (JSON) nests arrays and objects deeper than ``limit``."""
    data = bytes(body) if isinstance(body, memoryview) else body
    if data.count(b"[") + data.count(b"{") <= limit:
        return
    depth = 0
    in_string = escaped = False
    for match in _STRUCTURE.finditer(data):
        char = match.group()
        if in_string:
            if escaped:
                escaped = False
            elif char == b"\\":
                # an escape takes the next character, whatever it is; only structure characters
                # are seen here, so an escaped one is the next match only if adjacent
                escaped = match.end() < len(data) and data[match.end() : match.end() + 1] in b'"\\'
            elif char == b'"':
                in_string = False
            continue
        if char == b'"':
            in_string = True
        elif char in (b"[", b"{"):
            depth += 1
            if depth > limit:
                raise bad_request(f"{what}: JSON nested deeper than the limit of {limit} levels")
        elif char in (b"]", b"}"):
            depth -= 1
