"""lumenrt against Triton, MLServer and a plain FastAPI endpoint: one command, one result file.

    .venv/bin/python benchmarks/peers/run.py [--out results] [--quick] [--concurrency 1,2,4,8]
        [--duration-s 10] [--warmup-s 2] [--peers lumenrt,triton,mlserver,fastapi]
        [--models squeezenet,digits_mlp]

What it does, in order:
  1. Installs each peer's own virtual environment when it is missing or its pins changed (a marker
     file ``<venv>/.lumenrt-peer-pins.json`` records them): ``.venv-triton`` (nvidia-pytriton 0.7.0,
     the Makefile's ``triton-peer`` pins), ``.venv-mlserver`` (mlserver 1.7.1) and ``.venv-fastapi``
     (fastapi + uvicorn[standard]); each with the ONNX Runtime of ``.venv``. The first time that
     installs about 1 GB and takes 1-3 minutes; afterwards a second.
  2. Exports SqueezeNet and digits_mlp from lumenrt's built-in repository (``<runs>/models``) and
     writes one example input per model (``<runs>/inputs/<model>.npz``, batch 1, and the same bytes
     as perf_analyzer --input-data JSON in ``<model>.perf_analyzer-input``): every peer serves the
     same files and every driver sends the same bytes.
  3. For each peer and model, ONE SERVER AT A TIME on 127.0.0.1 free ports, two ONNX Runtime
     sessions (``intra_op_num_threads=1``) per server as lumenrt's two workers: starts it, waits until
     it answers, drives it at each concurrency (closed loop, same duration and warm-up everywhere),
     stops it (SIGTERM, SIGKILL to its process group after a bound). Drivers:
       lumenrt   ``lumenrt serve --workers 2``: perf_analyzer (HTTP), ``lumenrt bench load`` tcp + http
       triton    ``triton_peer.py`` (PyTriton, dynamic batching as lumenrt's config): perf_analyzer
                 (HTTP), ``lumenrt bench load`` http
       mlserver  ``mlserver start`` with ``mlserver_onnx.py``, ``parallel_workers: 2``: ``lumenrt bench
                 load`` http-json (its REST API takes no binary tensors) and grpc (raw contents)
       fastapi   ``fastapi_app.py`` under ``uvicorn --workers 2``: ``lumenrt bench load`` http-raw
  4. Writes ``<out>/peers-<UTC stamp>.json`` (format: docs/bench-results.md, ``peers``), keeps every
     run's own files under ``<out>/peers-<start stamp>/`` and prints a markdown table.

How long: about 15-20 minutes for the full run with the defaults (64 measured runs of ~13 s each plus
perf_analyzer's extra windows and eight server starts); ``--quick`` (concurrency 1 and 4, 3 s runs)
about 3 minutes. Nothing else should run on the machine meanwhile: servers and drivers share its cores.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRITON_PEER_SCRIPT = ROOT / "src" / "lumenrt" / "bench" / "triton_peer.py"

PEERS = ("lumenrt", "triton", "mlserver", "fastapi")
MODELS = ("squeezenet", "digits_mlp")
DEFAULT_CONCURRENCY = (1, 2, 4, 8)
QUICK_CONCURRENCY = (1, 4)
SESSIONS = 2  # ONNX Runtime sessions (workers, instances) per server: one per core of a 2-core machine
INTRA_OP_THREADS = 1
BEST_THROUGHPUT_CONCURRENCY = 4
PA_DRIVER = "perf_analyzer"
LOAD_DRIVER = "lumenrt bench"
MARKER_NAME = ".lumenrt-peer-pins.json"

# (driver, protocol) per peer, in the order they run and appear in the table
DRIVERS: dict[str, tuple[tuple[str, str], ...]] = {
    "lumenrt": ((PA_DRIVER, "http"), (LOAD_DRIVER, "tcp"), (LOAD_DRIVER, "http")),
    "triton": ((PA_DRIVER, "http"), (LOAD_DRIVER, "http")),
    "mlserver": ((LOAD_DRIVER, "http-json"), (LOAD_DRIVER, "grpc")),
    "fastapi": ((LOAD_DRIVER, "http-raw"),),
}

START_TIMEOUT_S = 300.0  # a server's start, models loaded (Triton's first start is the slowest)
STOP_GRACE_S = 30.0  # SIGTERM, then SIGKILL to the process group
LOAD_SLACK_S = 90.0  # a load run's time limit beyond warm-up + duration


def _progress(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Peer virtual environments


@dataclass(frozen=True)
class VenvSpec:
    peer: str
    path: Path
    pins: tuple[str, ...]
    dists: tuple[str, ...]  # distributions whose versions the result file records


def _dist_version(dist: str) -> str:
    return importlib.metadata.version(dist)


def venv_specs(root: Path = ROOT) -> dict[str, VenvSpec]:
    """Each non-lumenrt peer's venv and pins; ONNX Runtime (and numpy where it can) as in ``.venv``."""
    ort, numpy = _dist_version("onnxruntime"), _dist_version("numpy")
    return {
        # The Makefile's triton-peer recipe with numpy pinned (nvidia-pytriton needs numpy<2)
        "triton": VenvSpec(
            "triton",
            root / ".venv-triton",
            ("nvidia-pytriton==0.7.0", "numpy==1.26.4", f"onnxruntime=={ort}"),
            ("nvidia-pytriton", "numpy", "onnxruntime"),
        ),
        # uvloop<0.22: mlserver 1.7.1's inference workers call asyncio.get_event_loop() before any
        # loop exists, which uvloop 0.22+ turns into a RuntimeError (the workers die at start)
        "mlserver": VenvSpec(
            "mlserver",
            root / ".venv-mlserver",
            ("mlserver==1.7.1", "uvloop==0.21.0", f"numpy=={numpy}", f"onnxruntime=={ort}"),
            ("mlserver", "uvloop", "numpy", "onnxruntime"),
        ),
        # uvloop and httptools as in .venv (lumenrt's HTTP front end uses the same two)
        "fastapi": VenvSpec(
            "fastapi",
            root / ".venv-fastapi",
            (
                "fastapi==0.165.0",
                "uvicorn[standard]==0.54.0",
                f"uvloop=={_dist_version('uvloop')}",
                f"httptools=={_dist_version('httptools')}",
                f"numpy=={numpy}",
                f"onnxruntime=={ort}",
            ),
            ("fastapi", "uvicorn", "uvloop", "httptools", "numpy", "onnxruntime"),
        ),
    }


def venv_python(spec: VenvSpec) -> Path:
    return spec.path / "bin" / "python"


def marker_text(pins: Sequence[str]) -> str:
    return json.dumps({"pins": sorted(pins)}, indent=1) + "\n"


def venv_is_current(spec: VenvSpec) -> bool:
    marker = spec.path / MARKER_NAME
    if not venv_python(spec).exists() or not marker.is_file():
        return False
    return marker.read_text(encoding="utf-8") == marker_text(spec.pins)


def _base_python() -> str:
    """The interpreter ``.venv`` was made from (a venv made from a venv would chain to it)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_venv(spec: VenvSpec) -> None:
    """Create ``spec.path`` if missing and install its pins unless the marker says they are in."""
    if venv_is_current(spec):
        return
    if not venv_python(spec).exists():
        _progress(f"creating {spec.path.name}")
        subprocess.run([_base_python(), "-m", "venv", str(spec.path)], check=True)
    _progress(f"installing into {spec.path.name}: {' '.join(spec.pins)}")
    pip = [str(venv_python(spec)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *spec.pins], check=True)
    (spec.path / MARKER_NAME).write_text(marker_text(spec.pins), encoding="utf-8")


def venv_versions(spec: VenvSpec) -> dict[str, str]:
    """Installed versions of ``spec.dists`` inside the venv."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps({d: m.version(d) for d in sys.argv[1:]}))"
    )
    proc = subprocess.run(
        [str(venv_python(spec)), "-c", code, *spec.dists], capture_output=True, text=True, check=True
    )
    versions: dict[str, str] = json.loads(proc.stdout)
    return versions


# ---------------------------------------------------------------------------------------------------
# Models and inputs


@dataclass(frozen=True)
class ModelSpec:
    name: str
    onnx_path: Path  # the exported copy every peer serves
    sha256: str
    max_batch: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    instances: int  # the model config's instance_group count, else SESSIONS (Triton gets the same)
    inputs: tuple[dict[str, Any], ...]  # lumenrt config entries: name, datatype, dims
    outputs: tuple[dict[str, Any], ...]
    npz_path: Path  # example input, batch 1, one array per input name
    pa_json_path: Path  # the same bytes as perf_analyzer --input-data JSON


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def perf_analyzer_input(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """perf_analyzer's ``--input-data`` JSON for one request of batch 1: each tensor's raw bytes."""
    entry = {
        name: {"b64": base64.b64encode(np.ascontiguousarray(a[0]).tobytes()).decode("ascii")}
        for name, a in arrays.items()
    }
    return {"data": [entry]}


def export_model(name: str, repo: Path, runs_dir: Path) -> ModelSpec:
    """Copy ``name``'s model.onnx out of the built-in repository and write its example inputs."""
    from lumenrt.models.builtin import builtin_examples

    config = yaml.safe_load((repo / name / "config.yaml").read_text(encoding="utf-8"))
    onnx_path = runs_dir / "models" / name / "model.onnx"
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo / name / "1" / "model.onnx", onnx_path)
    arrays = {k: np.ascontiguousarray(v) for k, v in builtin_examples(name, 1).items()}
    npz_path = runs_dir / "inputs" / f"{name}.npz"
    npz_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(npz_path, **arrays)
    # JSON without the .json suffix: the dashboard takes every *.json under results/ for a result file
    pa_json_path = runs_dir / "inputs" / f"{name}.perf_analyzer-input"
    pa_json_path.write_text(json.dumps(perf_analyzer_input(arrays)), encoding="utf-8")
    batching = config.get("dynamic_batching") or {}
    return ModelSpec(
        name=name,
        onnx_path=onnx_path,
        sha256=_sha256(onnx_path),
        max_batch=int(config.get("max_batch_size", 0)),
        preferred_batch_sizes=tuple(int(b) for b in batching.get("preferred_batch_size", ())),
        max_queue_delay_us=int(batching.get("max_queue_delay_us", 0)),
        instances=int((config.get("instance_group") or {}).get("count") or SESSIONS),
        inputs=tuple(config["input"]),
        outputs=tuple(config["output"]),
        npz_path=npz_path,
        pa_json_path=pa_json_path,
    )


# ---------------------------------------------------------------------------------------------------
# Servers


@dataclass
class Server:
    """A running peer: its targets per protocol (load generator URLs) and what it reported."""

    targets: dict[str, str]
    metadata_url: str | None  # KServe V2 HTTP base for the load generator's metadata look-up
    info: dict[str, Any] = field(default_factory=dict)  # server metadata (GET /v2), where it has one


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """Status and body of GET ``url``; (0, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (OSError, ValueError):
        return 0, b""


def http_post_ok(url: str, body: bytes, timeout_s: float = 10.0) -> bool:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status) == 200
    except (OSError, ValueError):
        return False


def server_metadata(http_base: str) -> dict[str, Any]:
    """KServe V2 server metadata (``GET /v2``): name, version, extensions; {} if none."""
    status, body = http_get(f"{http_base}/v2")
    if status != 200:
        return {}
    with contextlib.suppress(ValueError):
        data = json.loads(body)
        if isinstance(data, dict):
            return data
    return {}


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def spawn(cmd: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start ``cmd`` in its own process group (so its children can be killed with it), output to a log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )


def wait_ready(proc: subprocess.Popen[bytes], is_ready: Callable[[], bool], log_path: Path, what: str,
               timeout_s: float = START_TIMEOUT_S) -> float:  # fmt: skip
    """Poll ``is_ready`` until true; the seconds it took. RuntimeError (with the log's tail) if the
    process exits first or the time runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode} before it was ready:\n{_log_tail(log_path)}")
        if is_ready():
            return time.monotonic() - t0
        time.sleep(0.25)
    raise RuntimeError(f"{what} not ready after {timeout_s:.0f} s:\n{_log_tail(log_path)}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL to the whole process group (stragglers too)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    return proc.returncode


@contextlib.contextmanager
def managed(cmd: Sequence[str], log_path: Path, what: str, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    proc = spawn(cmd, log_path, env, cwd)
    try:
        yield proc
    finally:
        code = stop_process(proc)
        _progress(f"{what} stopped (exit {code})")


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
            targets={"http": http, "tcp": f"tcp://127.0.0.1:{server.ports['tcp']}"},
            metadata_url=http,
            info=server_metadata(http),
        )
    finally:
        code = _stop_lumenrt(server)
        (ctx.logs_dir / f"lumenrt-{model.name}.log").write_text("\n".join(server.lines) + "\n")
        _progress(f"lumenrt serve stopped (exit {code})")


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
        took_s = wait_ready(proc, lambda: "READY" in _log_tail(log, 200), log, "the Triton peer")
        _progress(f"triton serving {model.name} after {took_s:.1f} s")
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
            _progress(f"mlserver serving {model.name} after {took_s:.1f} s")
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
        _progress(f"fastapi serving {model.name} after {took_s:.1f} s")
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
        "lumenrt bench load over tcp and http",
        "triton": f"Triton via PyTriton 0.7.0 (src/lumenrt/bench/triton_peer.py, .venv-triton): {SESSIONS} "
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


# ---------------------------------------------------------------------------------------------------
# Drivers


@dataclass(frozen=True)
class LoadSettings:
    duration_s: float
    warmup_s: float
    timeout_s: float
    processes: int
    pa_window_ms: int
    pa_stability_pct: float
    pa_max_trials: int


def load_command(target: str, model: str, concurrency: int, settings: LoadSettings, input_file: Path,
                 out_dir: Path, name: str, metadata_url: str | None) -> list[str]:  # fmt: skip
    cmd = [
        sys.executable, "-m", "lumenrt.cli", "bench", "load",
        "--target", target, "--model", model, "--concurrency", str(concurrency),
        "--duration-s", f"{settings.duration_s:g}", "--warmup-s", f"{settings.warmup_s:g}",
        "--timeout-s", f"{settings.timeout_s:g}", "--processes", str(settings.processes),
        "--input-file", str(input_file), "--no-stages", "--name", name, "--out", str(out_dir), "--json",
    ]  # fmt: skip
    if metadata_url is not None:
        cmd += ["--metadata-url", metadata_url]
    return cmd


def parse_load_json(stdout: str) -> dict[str, Any]:
    """The summary JSON ``lumenrt bench load --json`` printed (the first ``{`` on to the end)."""
    start = stdout.find("{")
    if start < 0:
        raise ValueError("no JSON summary on stdout")
    summary: dict[str, Any] = json.loads(stdout[start:])
    return summary


def drive_load(target: str, model: ModelSpec, concurrency: int, settings: LoadSettings, out_dir: Path,
               name: str, metadata_url: str | None) -> dict[str, Any]:  # fmt: skip
    """One ``lumenrt bench load`` run as a subprocess; its summary (``load`` format)."""
    cmd = load_command(target, model.name, concurrency, settings, model.npz_path, out_dir, name, metadata_url)
    limit_s = settings.warmup_s + settings.duration_s + LOAD_SLACK_S
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"lumenrt bench load ran past {limit_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"lumenrt bench load exited {proc.returncode}: {tail}")
    return parse_load_json(proc.stdout)


def drive_perf_analyzer(http_base: str, model: ModelSpec, concurrency: int,
                        settings: LoadSettings) -> dict[str, float]:  # fmt: skip
    from lumenrt.bench.perf_analyzer import run_perf_analyzer

    return run_perf_analyzer(
        model.name,
        http_base,
        "http",
        concurrency=concurrency,
        measurement_ms=settings.pa_window_ms,
        input_data=str(model.pa_json_path),
        stability_percentage=settings.pa_stability_pct,
        max_trials=settings.pa_max_trials,
    )


# ---------------------------------------------------------------------------------------------------
# Rows and the table (pure)

ROW_KEYS = ("peer", "model", "concurrency", "driver", "protocol", "throughput_per_s",
            "p50_us", "p90_us", "p95_us", "p99_us", "errors")  # fmt: skip


def row_from_summary(peer: str, model: str, protocol: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """A ``peers`` row from a ``lumenrt bench load`` summary."""
    latency = summary["latency_us"]
    return {
        "peer": peer,
        "model": model,
        "concurrency": int(summary["load"]["concurrency"]),
        "driver": LOAD_DRIVER,
        "protocol": protocol,
        "throughput_per_s": round(float(summary["throughput_per_s"]), 1),
        "p50_us": _us(latency.get("p50")),
        "p90_us": _us(latency.get("p90")),
        "p95_us": _us(latency.get("p95")),
        "p99_us": _us(latency.get("p99")),
        "errors": int(summary["counts"]["errors"]),
    }


def row_from_perf_analyzer(peer: str, model: str, figures: Mapping[str, float]) -> dict[str, Any]:
    """A ``peers`` row from :func:`lumenrt.bench.perf_analyzer.run_perf_analyzer` figures (HTTP); a run
    that ends has no errors (perf_analyzer fails on any)."""
    return {
        "peer": peer,
        "model": model,
        "concurrency": int(figures["concurrency"]),
        "driver": PA_DRIVER,
        "protocol": "http",
        "throughput_per_s": round(float(figures["throughput_infer_per_s"]), 1),
        "p50_us": _us(figures.get("p50_us")),
        "p90_us": _us(figures.get("p90_us")),
        "p95_us": _us(figures.get("p95_us")),
        "p99_us": _us(figures.get("p99_us")),
        "errors": 0,
    }


def _us(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)


def series_label(row: Mapping[str, Any]) -> str:
    """A table column group: peer and protocol, ``(pa)`` when perf_analyzer drove it."""
    pa = " (pa)" if row["driver"] == PA_DRIVER else ""
    return f"{row['peer']} {row['protocol']}{pa}"


def _series(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    order = {p: i for i, p in enumerate(PEERS)}
    seen: dict[str, tuple[int, int]] = {}
    for i, row in enumerate(rows):
        seen.setdefault(series_label(row), (order.get(str(row["peer"]), len(order)), i))
    return sorted(seen, key=lambda label: seen[label])


def best_marks(rows: Sequence[Mapping[str, Any]], best_at: int = BEST_THROUGHPUT_CONCURRENCY
               ) -> tuple[set[tuple[str, str]], set[tuple[str, int, str]]]:  # fmt: skip
    """Which cells to mark: (model, series) with the best throughput at concurrency ``best_at``, and
    (model, concurrency, series) with the lowest p99 at each concurrency. Ties mark every one."""
    best_tp: set[tuple[str, str]] = set()
    low_p99: set[tuple[str, int, str]] = set()
    for model in {str(r["model"]) for r in rows}:
        at = [
            r for r in rows if r["model"] == model and r["concurrency"] == best_at and r["throughput_per_s"]
        ]
        if at:
            top = max(float(r["throughput_per_s"]) for r in at)
            best_tp |= {(model, series_label(r)) for r in at if float(r["throughput_per_s"]) == top}
        for c in {int(r["concurrency"]) for r in rows if r["model"] == model}:
            group = [r for r in rows if r["model"] == model and r["concurrency"] == c and r["p99_us"]]
            if group:
                low = min(float(r["p99_us"]) for r in group)
                low_p99 |= {(model, c, series_label(r)) for r in group if float(r["p99_us"]) == low}
    return best_tp, low_p99


def markdown_table(rows: Sequence[Mapping[str, Any]], best_at: int = BEST_THROUGHPUT_CONCURRENCY) -> str:
    """model, concurrency, then per peer/protocol throughput/s and p99 ms; **bold**: the best
    throughput at concurrency ``best_at`` (per model) and the lowest p99 at each concurrency."""
    series = _series(rows)
    best_tp, low_p99 = best_marks(rows, best_at)
    header = ["model", "concurrency"]
    for label in series:
        header += [f"{label} /s", f"{label} p99 ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (2 * len(series))]
    cells = {(r["model"], int(r["concurrency"]), series_label(r)): r for r in rows}
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    for model in models:
        for c in sorted({int(r["concurrency"]) for r in rows if r["model"] == model}):
            line = [model, str(c)]
            for label in series:
                row = cells.get((model, c, label))
                line += _cells(row, c == best_at and (model, label) in best_tp, (model, c, label) in low_p99)
            lines.append("| " + " | ".join(line) + " |")
    lines += [
        "",
        f"**bold**: best throughput at concurrency {best_at} (per model); lowest p99 at each concurrency. "
        "(pa): driven by perf_analyzer; otherwise by lumenrt bench load. Throughput in requests/s (batch 1).",
    ]
    return "\n".join(lines)


def _cells(row: Mapping[str, Any] | None, best_tp: bool, low_p99: bool) -> list[str]:
    if row is None:
        return ["-", "-"]
    tp = f"{float(row['throughput_per_s']):,.1f}" if row["throughput_per_s"] is not None else "-"
    p99 = f"{float(row['p99_us']) / 1000:.2f}" if row["p99_us"] is not None else "-"
    if row.get("errors"):
        tp += f" ({row['errors']} err)"
    return [f"**{tp}**" if best_tp else tp, f"**{p99}**" if low_p99 else p99]


# ---------------------------------------------------------------------------------------------------
# The run


def _run_label(peer: str, driver: str, protocol: str, model: str, concurrency: int) -> str:
    via = "pa" if driver == PA_DRIVER else "load"
    return f"{peer} {via} {protocol} {model} c{concurrency}"


def drive_server(peer: str, server: Server, model: ModelSpec, concurrency: Sequence[int],
                 settings: LoadSettings, out_dir: Path, notes: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """Every driver of ``peer`` at every concurrency against a running server; failures go to notes."""
    rows: list[dict[str, Any]] = []
    for driver, protocol in DRIVERS[peer]:
        for c in concurrency:
            label = _run_label(peer, driver, protocol, model.name, c)
            _progress(label)
            try:
                if driver == PA_DRIVER:
                    figures = drive_perf_analyzer(server.targets[protocol], model, c, settings)
                    rows.append(row_from_perf_analyzer(peer, model.name, figures))
                else:
                    summary = drive_load(server.targets[protocol], model, c, settings, out_dir, label,
                                         server.metadata_url)  # fmt: skip
                    rows.append(row_from_summary(peer, model.name, protocol, summary))
            except Exception as exc:  # one failed run must not lose the others
                first = str(exc).strip().splitlines()
                notes.append(f"{label}: {first[0][:300] if first else type(exc).__name__}")
                _progress(f"FAILED {notes[-1]}")
    return rows


def _peer_versions(peer: str, ctx: RunContext) -> dict[str, str]:
    if peer == "lumenrt":
        return {d: _dist_version(d) for d in ("lumenrt", "onnxruntime", "numpy")}
    return venv_versions(ctx.venvs[peer])


def _peer_version(peer: str, packages: Mapping[str, str], info: Mapping[str, Any]) -> str:
    """The peer's own version: what its server reports (GET /v2) where it does, else its package's."""
    if info.get("version"):
        return str(info["version"])
    main = {"lumenrt": "lumenrt", "triton": "nvidia-pytriton", "mlserver": "mlserver", "fastapi": "fastapi"}
    return packages.get(main[peer], "?")


def run_peer(peer: str, models: Sequence[ModelSpec], concurrency: Sequence[int], settings: LoadSettings,
             ctx: RunContext, notes: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Serve each model behind ``peer`` in turn (one server at a time) and drive it."""
    rows: list[dict[str, Any]] = []
    packages = _peer_versions(peer, ctx)
    info: dict[str, Any] = {}
    for model in models:
        _progress(f"starting {peer} for {model.name}")
        try:
            with SERVE[peer](model, ctx) as server:
                info = info or server.info
                rows += drive_server(peer, server, model, concurrency, settings, ctx.runs_dir, notes)
        except RuntimeError as exc:
            notes.append(f"{peer} {model.name}: {str(exc).splitlines()[0][:300]}")
            _progress(f"FAILED {notes[-1]}\n{exc}")
    extra = {"server": info} if info else {}
    entry = {"version": _peer_version(peer, packages, info), "how": peer_how(peer, [m.name for m in models]),
             "packages": packages, **extra}  # fmt: skip
    if peer == "triton":
        entry["note"] = "version: Triton Inference Server core bundled with nvidia-pytriton"
    return rows, entry


def _csv_list(text: str, allowed: Sequence[str] | None = None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(allowed or ['values'])}: {text!r}"
        )
    return items


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in _csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers: {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"concurrency must be positive: {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/peers/run.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The result file's format: docs/bench-results.md (peers).",
    )
    p.add_argument("--out", default="results", help="results folder (default results/)")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: concurrency 1 and 4, 3 s runs, 1 s warm-up"
    )
    p.add_argument("--concurrency", type=_int_list, default=None, help="comma list (default 1,2,4,8)")
    p.add_argument("--duration-s", type=float, default=None, help="measured seconds per run (default 10)")
    p.add_argument("--warmup-s", type=float, default=None, help="warm-up seconds per run (default 2)")
    p.add_argument("--peers", type=lambda s: _csv_list(s, PEERS), default=list(PEERS),
                   help=f"comma list (default {','.join(PEERS)})")  # fmt: skip
    p.add_argument("--models", type=lambda s: _csv_list(s, MODELS), default=list(MODELS),
                   help=f"comma list (default {','.join(MODELS)})")  # fmt: skip
    p.add_argument("--load-processes", type=int, default=1, help="lumenrt bench load --processes (default 1)")
    p.add_argument(
        "--timeout-s", type=float, default=30.0, help="per-request limit of the load runs (default 30)"
    )
    p.add_argument(
        "--no-install", action="store_true", help="fail instead of creating or updating peer venvs"
    )
    return p


def load_settings(args: argparse.Namespace) -> tuple[LoadSettings, list[int]]:
    """Durations and concurrency; perf_analyzer's window is a third of the duration (it reports the
    last three stable windows, so about the same measured time as the load generator)."""
    duration_s = args.duration_s if args.duration_s is not None else (3.0 if args.quick else 10.0)
    warmup_s = args.warmup_s if args.warmup_s is not None else (1.0 if args.quick else 2.0)
    default_c = QUICK_CONCURRENCY if args.quick else DEFAULT_CONCURRENCY
    concurrency = list(args.concurrency or default_c)
    settings = LoadSettings(
        duration_s=duration_s,
        warmup_s=warmup_s,
        timeout_s=args.timeout_s,
        processes=args.load_processes,
        pa_window_ms=max(500, int(duration_s * 1000 / 3)),
        pa_stability_pct=100.0 if args.quick else 25.0,
        pa_max_trials=3 if args.quick else 6,
    )
    return settings, concurrency


def estimate_s(peers: Sequence[str], n_models: int, n_concurrency: int, settings: LoadSettings) -> float:
    """A rough wall time: load runs at warm-up + duration + ~1.5 s start, perf_analyzer at about
    4 windows, plus ~15 s per server start and stop."""
    total = 0.0
    for peer in peers:
        for driver, _protocol in DRIVERS[peer]:
            per_run = 4 * settings.pa_window_ms / 1000 + 2 if driver == PA_DRIVER else (
                settings.warmup_s + settings.duration_s + 1.5)  # fmt: skip
            total += per_run * n_models * n_concurrency
        total += 15 * n_models
    return total


def _duration_text(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def prepare(args: argparse.Namespace, stamp: str) -> tuple[RunContext, list[ModelSpec]]:
    from lumenrt.models.builtin import ensure_builtin_repository

    runs_dir = Path(args.out).resolve() / f"peers-{stamp}"  # absolute: peers run in other folders
    venvs = venv_specs()
    for peer in args.peers:
        if peer == "lumenrt":
            continue
        if args.no_install and not venv_is_current(venvs[peer]):
            raise SystemExit(f"{venvs[peer].path} is missing or out of date (run without --no-install)")
        ensure_venv(venvs[peer])
    repo = ensure_builtin_repository()
    models = [export_model(name, repo, runs_dir) for name in args.models]
    ctx = RunContext(runs_dir=runs_dir, logs_dir=runs_dir / "logs", venvs=venvs)
    ctx.logs_dir.mkdir(parents=True, exist_ok=True)
    return ctx, models


def check_perf_analyzer(peers: Sequence[str], notes: list[str]) -> None:
    from lumenrt.bench.perf_analyzer import perf_analyzer_problem

    if any(d == PA_DRIVER for p in peers for d, _ in DRIVERS[p]):
        problem = perf_analyzer_problem()
        if problem is not None:
            notes.append(f"perf_analyzer unusable, its rows are missing: {problem}")
            _progress(notes[-1])


def main(argv: Sequence[str] | None = None) -> int:
    from lumenrt.bench.results import git_commit, machine_info, utc_stamp, write_result

    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every server's finally block stops it
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(128 + signal.SIGTERM))
    settings, concurrency = load_settings(args)
    stamp = utc_stamp()
    created_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ctx, models = prepare(args, stamp)
    estimate = estimate_s(args.peers, len(models), len(concurrency), settings)
    _progress(f"about {_duration_text(estimate)}: peers {','.join(args.peers)}, models "
              f"{','.join(args.models)}, concurrency {concurrency}, runs of {settings.warmup_s:g}+"
              f"{settings.duration_s:g} s; per-run files in {ctx.runs_dir}")  # fmt: skip
    notes: list[str] = []
    check_perf_analyzer(args.peers, notes)
    rows: list[dict[str, Any]] = []
    peers: dict[str, Any] = {}
    t0 = time.monotonic()
    for peer in args.peers:
        peer_rows, peers[peer] = run_peer(peer, models, concurrency, settings, ctx, notes)
        rows += peer_rows
    payload = {
        "kind": "peers",
        "created_utc": created_utc,
        "machine": machine_info(),
        "commit": git_commit(),
        "peers": peers,
        "rows": rows,
        "config": {
            "concurrency": concurrency,
            "duration_s": settings.duration_s,
            "warmup_s": settings.warmup_s,
            "perf_analyzer": {"window_ms": settings.pa_window_ms, "stability_pct": settings.pa_stability_pct,
                              "max_trials": settings.pa_max_trials},
            "load_processes": settings.processes,
            "sessions_per_server": SESSIONS,
            "intra_op_num_threads": INTRA_OP_THREADS,
            "models": {m.name: {"sha256": m.sha256, "input_file": str(m.npz_path)} for m in models},
            "runs": str(ctx.runs_dir),
            "wall_s": round(time.monotonic() - t0, 1),
        },
        "notes": notes,
    }  # fmt: skip
    path = write_result(args.out, "peers", payload)
    print(markdown_table(rows))
    for note in notes:
        print(f"\nnote: {note}")
    print(f"\nresult file: {path}")
    return 0 if rows and not notes else 1


if __name__ == "__main__":
    sys.exit(main())
