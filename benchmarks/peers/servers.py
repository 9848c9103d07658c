"""Each peer behind a server on 127.0.0.1, one context manager per peer (lumenrt, Triton via PyTriton,
MLServer, FastAPI): their commands and settings files, and how each was served for the result file."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import HERE, INTRA_OP_THREADS, ROOT, SESSIONS, progress
from models import ModelSpec
from processes import (
    STOP_GRACE_S,
    free_port,
    http_get,
    http_post_ok,
    log_tail,
    managed,
    server_metadata,
    wait_ready,
)
from venvs import VenvSpec, venv_python

TRITON_PEER_SCRIPT = ROOT / "benchmarks" / "triton_peer.py"


@dataclass
class Server:
    """A running peer: its targets per protocol (load generator URLs) and what it reported."""

    targets: dict[str, str]
    metadata_url: str | None  # KServe V2 HTTP base for the load generator's metadata look-up
    info: dict[str, Any] = field(default_factory=dict)  # server metadata (GET /v2), where it has one


@dataclass(frozen=True)
class RunContext:
    runs_dir: Path
    logs_dir: Path
    venvs: dict[str, VenvSpec]


@contextlib.contextmanager
def serve_lumenrt(model: ModelSpec, ctx: RunContext) -> Iterator[Server]:
    from lumenrt.bench.serve_process import start_serve

    server = start_serve("--workers", str(SESSIONS), "--models", model.name)
    try:
        http = f"http://127.0.0.1:{server.ports['http']}"
        yield Server(
            targets={
                "http": http,
                "tcp": f"tcp://127.0.0.1:{server.ports['tcp']}",
                "grpc": f"grpc://127.0.0.1:{server.ports['grpc']}",
            },
            metadata_url=http,
            info=server_metadata(http),
        )
    finally:
        code = _stop_lumenrt(server)
        (ctx.logs_dir / f"lumenrt-{model.name}.log").write_text("\n".join(server.lines) + "\n")
        progress(f"lumenrt serve stopped (exit {code})")


def _stop_lumenrt(server: Any) -> int | None:
    try:
        return int(server.stop(STOP_GRACE_S))
    except subprocess.TimeoutExpired:
        return None


def triton_command(python: Path, model: ModelSpec, http_port: int, grpc_port: int, log: Path) -> list[str]:
    return [
        str(python), str(TRITON_PEER_SCRIPT),
        "--model-path", str(model.onnx_path), "--model-name", model.name,
        "--http-port", str(http_port), "--grpc-port", str(grpc_port),
        "--sessions", str(model.instances), "--intra-op-threads", str(INTRA_OP_THREADS),
        "--max-batch", str(model.max_batch),
        "--preferred-batch-sizes", *(str(b) for b in model.preferred_batch_sizes),
        "--max-queue-delay-us", str(model.max_queue_delay_us),
        "--triton-log-file", str(log),
    ]  # fmt: skip


@contextlib.contextmanager
def serve_triton(model: ModelSpec, ctx: RunContext) -> Iterator[Server]:
    http_port, grpc_port = free_port(), free_port()
    log = ctx.logs_dir / f"triton-{model.name}.log"
    cmd = triton_command(venv_python(ctx.venvs["triton"]), model, http_port, grpc_port,
                         ctx.logs_dir / f"triton-{model.name}.tritonserver.log")  # fmt: skip
    with managed(cmd, log, "triton") as proc:
        took_s = wait_ready(proc, lambda: "READY" in log_tail(log, 200), log, "the Triton peer")
        progress(f"triton serving {model.name} after {took_s:.1f} s")
        http = f"http://127.0.0.1:{http_port}"
        yield Server(targets={"http": http}, metadata_url=http, info=server_metadata(http))


def mlserver_settings(http_port: int, grpc_port: int, metrics_port: int) -> dict[str, Any]:
    return {
        "debug": False,
        "parallel_workers": SESSIONS,
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_endpoint": None,  # no metrics server
        "metrics_port": metrics_port,
        "load_models_at_startup": True,
    }


def _v2_tensor(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": entry["name"], "datatype": entry["datatype"], "shape": [-1, *entry.get("dims", [])]}


def mlserver_model_settings(model: ModelSpec) -> dict[str, Any]:
    """``model-settings.json``: the custom runtime, the ONNX path, the V2 metadata; no adaptive batching."""
    return {
        "name": model.name,
        "implementation": "mlserver_onnx.OnnxRuntimeModel",
        "inputs": [_v2_tensor(t) for t in model.inputs],
        "outputs": [_v2_tensor(t) for t in model.outputs],
        "max_batch_size": 0,
        "parameters": {"uri": str(model.onnx_path), "extra": {"intra_op_threads": INTRA_OP_THREADS}},
    }


@contextlib.contextmanager
def serve_mlserver(model: ModelSpec, ctx: RunContext) -> Iterator[Server]:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = ctx.logs_dir / f"mlserver-{model.name}.log"
    with tempfile.TemporaryDirectory(prefix="peers-mlserver-") as tmp:
        folder = Path(tmp)
        settings = mlserver_settings(http_port, grpc_port, metrics_port)
        (folder / "settings.json").write_text(json.dumps(settings, indent=1), encoding="utf-8")
        (folder / model.name).mkdir()
        (folder / model.name / "model-settings.json").write_text(
            json.dumps(mlserver_model_settings(model), indent=1), encoding="utf-8"
        )
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        cmd = [str(ctx.venvs["mlserver"].path / "bin" / "mlserver"), "start", str(folder)]
        with managed(cmd, log, "mlserver", env=env, cwd=folder) as proc:
            http = f"http://127.0.0.1:{http_port}"
            ready = f"{http}/v2/models/{model.name}/ready"
            took_s = wait_ready(proc, lambda: http_get(ready)[0] == 200, log, "MLServer")
            progress(f"mlserver serving {model.name} after {took_s:.1f} s")
            yield Server(
                targets={"http-json": f"http-json://127.0.0.1:{http_port}",
                         "grpc": f"grpc://127.0.0.1:{grpc_port}"},
                metadata_url=http,
                info=server_metadata(http),
            )  # fmt: skip


def fastapi_command(python: Path, port: int) -> list[str]:
    return [
        str(python), "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(HERE),
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(SESSIONS),
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip


@contextlib.contextmanager
def serve_fastapi(model: ModelSpec, ctx: RunContext) -> Iterator[Server]:
    port = free_port()
    log = ctx.logs_dir / f"fastapi-{model.name}.log"
    env = {
        **os.environ,
        "PEERS_FASTAPI_MODELS": f"{model.name}={model.onnx_path}",
        "PEERS_INTRA_OP_THREADS": str(INTRA_OP_THREADS),
    }
    base = f"http://127.0.0.1:{port}"
    body = b"".join(np.load(model.npz_path)[t["name"]].tobytes() for t in model.inputs)
    with managed(fastapi_command(venv_python(ctx.venvs["fastapi"]), port), log, "fastapi", env=env) as proc:
        took_s = wait_ready(
            proc,
            lambda: (
                http_get(f"{base}/ready")[0] == 200 and http_post_ok(f"{base}/predict/{model.name}", body)
            ),
            log,
            "the FastAPI peer",
        )
        progress(f"fastapi serving {model.name} after {took_s:.1f} s")
        yield Server(
            targets={"http-raw": f"http-raw://127.0.0.1:{port}/predict/{model.name}"}, metadata_url=None
        )


SERVE: dict[str, Callable[[ModelSpec, RunContext], contextlib.AbstractContextManager[Server]]] = {
    "lumenrt": serve_lumenrt,
    "triton": serve_triton,
    "mlserver": serve_mlserver,
    "fastapi": serve_fastapi,
}


def peer_how(peer: str, model_names: Sequence[str]) -> str:
    """How each peer was served and driven, for the result file."""
    models = ", ".join(model_names)
    how = {
        "lumenrt": f"lumenrt serve --workers {SESSIONS} --models <model> (built-in repository: thread workers, "
        f"one ONNX Runtime session each, intra_op_num_threads {INTRA_OP_THREADS}, the configs' dynamic "
        "batching, queue delay 0); driven by perf_analyzer over HTTP (KServe V2 binary) and by "
        "lumenrt bench load over tcp, http and grpc (lumenrt's gRPC client)",
        "triton": f"Triton via PyTriton 0.7.0 (benchmarks/triton_peer.py, .venv-triton): {SESSIONS} "
        f"model instances, one ONNX Runtime session each (intra_op_num_threads {INTRA_OP_THREADS}), dynamic "
        "batching with lumenrt's max batch, preferred sizes and queue delay; driven by perf_analyzer "
        "over HTTP and by lumenrt bench load over http (binary tensors)",
        "mlserver": f"mlserver start with parallel_workers {SESSIONS} and the custom runtime "
        f"benchmarks/peers/mlserver_onnx.py (one ONNX Runtime session per worker, intra_op_num_threads "
        f"{INTRA_OP_THREADS}), no adaptive batching; driven by lumenrt bench load over http-json (MLServer's "
        "REST API parses JSON only: no Triton binary tensor extension) and grpc (raw_input_contents); "
        "perf_analyzer cannot drive it (no model config endpoint)",
        "fastapi": f"benchmarks/peers/fastapi_app.py under uvicorn[standard] --workers {SESSIONS}: POST "
        f"/predict/<model>, raw little-endian input bytes in, first output's raw bytes out, one ONNX "
        f"Runtime session per worker (intra_op_num_threads {INTRA_OP_THREADS}), async handler (one "
        "inference at a time per worker), no batching; driven by lumenrt bench load over http-raw",
    }[peer]
    return f"{how}; models: {models}"
