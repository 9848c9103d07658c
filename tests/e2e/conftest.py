"""``lumenrt serve`` as a real process on loopback ports, for the real-client e2e tests.

The server is started with port 0 for every front end; the ports are read from its
``listening http=... grpc=... tcp=...`` line, and tests start once it prints ``ready``.
Teardown sends SIGTERM and requires a clean exit (status 0) with no shared memory left.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from lumenrt.bench.serve_process import ServeProcess, start_serve
from lumenrt.native import SHM_PREFIX, leftover_segments

__all__ = ["ServeProcess", "start_serve"]


@pytest.fixture(scope="session")
def served() -> Iterator[ServeProcess]:
    """The built-in models, thread mode, every front end."""
    server = start_serve()
    yield server
    assert server.stop() == 0, "\n".join(server.lines)
    assert leftover_segments(f"{SHM_PREFIX}{server.proc.pid}.") == []


BYTES_MODEL = """
import numpy as np


class Model:
    def load(self):
        pass

    def infer(self, inputs):
        text = inputs["text"]
        scale = inputs["scale"]
        upper = np.array([t.upper() for t in text.reshape(-1)], dtype=object).reshape(text.shape)
        lengths = np.array([len(t) for t in text.reshape(-1)], dtype=np.int32).reshape(text.shape)
        return {"upper": upper, "length": lengths, "scaled": (scale * 2).astype(np.float32)}
"""

BYTES_CONFIG = """
backend: python
max_batch_size: 8
input:
- {name: text, datatype: BYTES, dims: [2]}
- {name: scale, datatype: FP32, dims: [3]}
output:
- {name: upper, datatype: BYTES, dims: [2]}
- {name: length, datatype: INT32, dims: [2]}
- {name: scaled, datatype: FP32, dims: [3]}
"""


def write_text_repository(root: Path) -> Path:
    """A repository with one python model ``text``: BYTES + FP32 in, BYTES + INT32 + FP32 out."""
    model = root / "text"
    (model / "1").mkdir(parents=True)
    (model / "config.yaml").write_text(BYTES_CONFIG)
    (model / "1" / "model.py").write_text(BYTES_MODEL)
    return root


@pytest.fixture(scope="session")
def served_text(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    repo = write_text_repository(tmp_path_factory.mktemp("text-repo"))
    server = start_serve("--repository", str(repo), "--workers", "1")
    yield server
    assert server.stop() == 0, "\n".join(server.lines)
