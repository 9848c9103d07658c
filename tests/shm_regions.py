"""A client's POSIX shared-memory object, made as tritonclient.utils.shared_memory makes one
(shm_open + ftruncate + mmap) without its pkg_resources import, for the system shared-memory tests."""

import mmap
import os
from typing import Any

import numpy as np

ROOT = "/dev/shm"


class ClientRegion:
    def __init__(self, key: str, byte_size: int) -> None:
        self.key = key  # "/name", as clients pass it to register
        self.path = os.path.join(ROOT, key.lstrip("/"))
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, byte_size)
            self.map = mmap.mmap(fd, byte_size)
        finally:
            os.close(fd)
        self.byte_size = byte_size

    def write(self, array: Any, offset: int = 0) -> int:
        data = np.ascontiguousarray(array).tobytes()
        self.map[offset : offset + len(data)] = data
        return len(data)

    def read(self, dtype: Any, shape: Any, offset: int = 0) -> Any:
        return np.frombuffer(self.map, dtype, int(np.prod(shape)), offset).reshape(shape).copy()

    def unlink(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)

    def close(self) -> None:
        self.unlink()
        self.map.close()

    def __enter__(self) -> "ClientRegion":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
