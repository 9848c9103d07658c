"""What the peer benchmark's modules share: where they live, the peers and models, the drivers each
peer gets, the size of every server, and the progress line on stderr."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# benchmarks/ itself, after this folder (first on sys.path when run.py runs as a script): the modules
# the peer benchmark shares with the other benchmarks there (perf_analyzer.py, triton_peer.py)
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))

PEERS = ("lumenrt", "triton", "mlserver", "fastapi")
MODELS = ("squeezenet", "digits_mlp")
SESSIONS = 2  # ONNX Runtime sessions (workers, instances) per server: one per core of a 2-core machine
INTRA_OP_THREADS = 1
PA_DRIVER = "perf_analyzer"
LOAD_DRIVER = "lumenrt bench"

# (driver, protocol) per peer, in the order they run and appear in the table
DRIVERS: dict[str, tuple[tuple[str, str], ...]] = {
    "lumenrt": ((PA_DRIVER, "http"), (LOAD_DRIVER, "tcp"), (LOAD_DRIVER, "http"), (LOAD_DRIVER, "grpc")),
    "triton": ((PA_DRIVER, "http"), (LOAD_DRIVER, "http")),
    "mlserver": ((LOAD_DRIVER, "http-json"), (LOAD_DRIVER, "grpc")),
    "fastapi": ((LOAD_DRIVER, "http-raw"),),
}


def progress(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)
