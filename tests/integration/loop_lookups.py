"""Counts ``asyncio.get_running_loop()`` calls made by the server while requests are served.

On CPython 3.11 each one is a getpid() system call (asyncio's fork check), so the request path
keeps its loop instead of asking (InferenceService.loop, Engine.submit_callback's ``loop``); a
call from the test's own thread is not counted."""

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def loop_lookups() -> Iterator[list[int]]:
    """While open, ``found[0]`` counts the calls made on any thread but this one."""
    original = asyncio.get_running_loop
    here = threading.get_ident()
    found = [0]

    def counted() -> Any:
        if threading.get_ident() != here:
            found[0] += 1
        return original()

    asyncio.get_running_loop = counted
    try:
        yield found
    finally:
        asyncio.get_running_loop = original
