"""Run Triton's ``perf_analyzer`` load generator and read its CSV report (for ``serve.py`` and
``peers/``, which import this module by plain name; it imports nothing from lumenrt).

Setup (the ``perf-analyzer`` PyPI package is an empty placeholder; tritonclient wheels from 2.52 on need a
newer glibc or ship no binary; tritonclient 2.51 pins ``numpy<2`` even without extras, so it goes in with
``--no-deps`` -- only its native binary is used here)::

    apt-get install -y libb64-0d
    .venv/bin/pip install --no-deps tritonclient==2.51.0
    .venv/bin/pip install nvidia-cuda-runtime-cu12

The binary lands next to the interpreter (``.venv/bin/perf_analyzer``) and links ``libb64.so.0d`` and
``libcudart.so.12``; the latter comes from ``nvidia-cuda-runtime-cu12``, whose ``lib`` folder must be on
``LD_LIBRARY_PATH`` (:func:`perf_analyzer_env`). No GPU is needed.
"""

import csv
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

BINARY_NAME = "perf_analyzer"
CUDART_SONAME = "libcudart.so.12"

_LOADER_ERROR = re.compile(r"error while loading shared libraries: (\S+?):")
_GLIBC_ERROR = re.compile(r"version `(GLIBC[^']*)' not found")
_AVG_LATENCY = re.compile(r"Avg latency:\s*([0-9.]+)\s*usec")

# perf_analyzer 2.51 CSV columns (``-f``), latencies in microseconds:
#   Concurrency, Inferences/Second, Client Send, Network+Server Send/Recv, Server Queue,
#   Server Compute Input, Server Compute Infer, Server Compute Output, Client Recv,
#   p50 latency, p90 latency, p95 latency, p99 latency
_CSV_FIELDS: dict[str, str] = {
    "concurrency": "Concurrency",
    "throughput_infer_per_s": "Inferences/Second",
    "p50_us": "p50 latency",
    "p90_us": "p90 latency",
    "p95_us": "p95 latency",
    "p99_us": "p99 latency",
    "client_send_us": "Client Send",
    "network_server_send_recv_us": "Network+Server Send/Recv",
    "server_queue_us": "Server Queue",
    "server_compute_input_us": "Server Compute Input",
    "server_compute_infer_us": "Server Compute Infer",
    "server_compute_output_us": "Server Compute Output",
    "client_recv_us": "Client Recv",
}
_REQUIRED = ("concurrency", "throughput_infer_per_s", "p50_us", "p90_us", "p95_us", "p99_us")


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer is unusable, failed, or wrote a report this module cannot read."""


def find_perf_analyzer() -> str | None:
    """Path of the ``perf_analyzer`` binary: next to ``sys.executable`` (the venv's ``bin``), else on PATH."""
    beside = Path(sys.executable).parent / BINARY_NAME  # not resolved: a venv's python is a symlink
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(BINARY_NAME)


def cuda_runtime_lib_dir() -> str | None:
    """The ``lib`` folder of the ``nvidia-cuda-runtime-cu12`` package holding ``libcudart.so.12``, if any."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_runtime")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for location in locations:
        lib = Path(location) / "lib"
        if (lib / CUDART_SONAME).is_file():
            return str(lib)
    return None


def perf_analyzer_env() -> dict[str, str]:
    """A copy of ``os.environ`` with the CUDA runtime's lib folder first on ``LD_LIBRARY_PATH``."""
    env = dict(os.environ)
    lib = cuda_runtime_lib_dir()
    if lib is not None:
        rest = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != lib]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([lib, *rest])
    return env


def _probe(binary: str, flag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, flag], env=perf_analyzer_env(), capture_output=True, text=True, timeout=30, check=False
    )


def perf_analyzer_problem() -> str | None:
    """None if ``perf_analyzer --version`` (or ``--help``) runs, else a human-readable reason it cannot."""
    binary = find_perf_analyzer()
    if binary is None:
        return (
            f"{BINARY_NAME} is not installed (not next to {sys.executable} nor on PATH): "
            "pip install --no-deps tritonclient==2.51.0"
        )
    try:
        proc = _probe(binary, "--version")
        if proc.returncode == 0 and "Perf Analyzer" in proc.stdout + proc.stderr:
            return None
        output = proc.stdout + proc.stderr
        loader = _LOADER_ERROR.search(output)
        glibc = _GLIBC_ERROR.search(output)
        if loader is None and glibc is None:
            # Older builds lack --version; --help prints the usage (and exits non-zero) if the binary loads.
            proc = _probe(binary, "--help")
            output = proc.stdout + proc.stderr
            if "Usage:" in output or "SYNOPSIS" in output:
                return None
            loader = _LOADER_ERROR.search(output)
            glibc = _GLIBC_ERROR.search(output)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{binary} cannot be run: {exc}"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    line = next(
        (ln for ln in lines if "error while loading" in ln or "not found" in ln), lines[-1] if lines else ""
    )
    if loader is not None:
        lib = loader.group(1)
        if lib.startswith("libb64"):
            return f"{binary}: missing {lib} (apt-get install -y libb64-0d): {line}"
        if lib.startswith("libcudart"):
            where = cuda_runtime_lib_dir()
            hint = (
                "pip install nvidia-cuda-runtime-cu12"
                if where is None
                else f"{where} is not on LD_LIBRARY_PATH (use perf_analyzer_env())"
            )
            return f"{binary}: missing {lib} ({hint}): {line}"
        return f"{binary}: missing shared library {lib}: {line}"
    if glibc is not None:
        return f"{binary}: system glibc too old ({glibc.group(1)} needed; use tritonclient==2.51.0): {line}"
    return f"{binary} does not run (exit {proc.returncode}): {line or '<no output>'}"


def _url_for(url: str) -> str:
    """perf_analyzer wants ``host:port`` for both protocols; drop a scheme and trailing slash if given,
    except ``https://``, which turns TLS on for HTTP (with its ``--ssl-https-*`` options)."""
    if url.startswith("https://"):
        return url.rstrip("/")
    return re.sub(r"^[a-z]+://", "", url).rstrip("/")


def parse_perf_analyzer_csv(path: str | Path, concurrency: int | None = None) -> dict[str, float]:
    """Read a ``perf_analyzer -f`` CSV report: the row for ``concurrency`` (else the last row).

    Returns ``concurrency``, ``throughput_infer_per_s`` (column ``Inferences/Second``), ``p50_us``/
    ``p90_us``/``p95_us``/``p99_us`` (columns ``p50 latency`` .. ``p99 latency``, client-side request
    latency in microseconds) and, where the report has them, the average latency breakdown in
    microseconds (``client_send_us``, ``network_server_send_recv_us``, ``server_queue_us``,
    ``server_compute_input_us``, ``server_compute_infer_us``, ``server_compute_output_us``,
    ``client_recv_us``).
    """
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("Concurrency", "").strip()]
    if not rows:
        raise PerfAnalyzerError(f"perf_analyzer report {path} has no data rows")
    row = rows[-1]
    if concurrency is not None:
        row = next((r for r in rows if r["Concurrency"].strip() == str(concurrency)), row)
    result: dict[str, float] = {}
    for key, column in _CSV_FIELDS.items():
        value = row.get(column)
        if value is not None and value.strip():
            result[key] = float(value)
    missing = [_CSV_FIELDS[k] for k in _REQUIRED if k not in result]
    if missing:
        raise PerfAnalyzerError(f"perf_analyzer report {path} lacks columns {missing}; header: {list(row)}")
    return result


def run_perf_analyzer(
    model: str,
    url: str,
    protocol: Literal["http", "grpc"] = "http",
    concurrency: int = 1,
    measurement_ms: int = 5000,
    extra_args: Sequence[str] = (),
    *,
    batch_size: int = 1,
    input_data: str = "zero",
    percentile: int | None = None,
    stability_percentage: float | None = None,
    max_trials: int | None = None,
    timeout_s: float | None = None,
) -> dict[str, float]:
    """Run ``perf_analyzer`` once at a fixed concurrency and return its figures.

    Command: ``perf_analyzer -m MODEL -u HOST:PORT -i PROTOCOL --concurrency-range C:C
    --measurement-interval MS -b BATCH --input-data DATA -f REPORT.csv [--percentile=P] [-s S] [-r R]
    EXTRA...`` (synchronous client; ``-u`` takes ``host:port`` for both protocols).

    Figures come from the CSV report, see :func:`parse_perf_analyzer_csv`: throughput from column
    ``Inferences/Second``, latencies from the CSV's ``p50 latency``/``p90 latency``/``p95 latency``/
    ``p99 latency`` columns (client-side, microseconds). Those columns are written whatever
    ``percentile`` is; ``percentile`` only picks what perf_analyzer stabilises on (``--percentile``;
    default: average latency). ``avg_us`` is added from stdout when perf_analyzer prints it (only when
    stabilising on the average).

    perf_analyzer measures windows of ``measurement_ms`` until the last three agree within
    ``stability_percentage`` (default 10 %) or ``max_trials`` (default 10) windows have passed, in
    which case it fails; so one run lasts at least 3 windows. Raise ``stability_percentage`` (e.g.
    100) for a short run on a noisy machine. Raises :class:`PerfAnalyzerError` on failure.
    """
    if protocol not in ("http", "grpc"):
        raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
    if concurrency < 1 or measurement_ms < 1:
        raise ValueError("concurrency and measurement_ms must be positive")
    binary = find_perf_analyzer()
    if binary is None:
        raise PerfAnalyzerError(perf_analyzer_problem() or f"{BINARY_NAME} not found")
    if timeout_s is None:
        timeout_s = 60.0 + 2.0 * (max_trials or 10) * measurement_ms / 1000.0
    with tempfile.TemporaryDirectory(prefix="lumenrt-pa-") as tmp:
        report = Path(tmp) / "report.csv"
        cmd = [
            binary,
            "-m",
            model,
            "-u",
            _url_for(url),
            "-i",
            protocol,
            "--concurrency-range",
            f"{concurrency}:{concurrency}",
            "--measurement-interval",
            str(measurement_ms),
            "-b",
            str(batch_size),
            "--input-data",
            input_data,
            "-f",
            str(report),
        ]
        if percentile is not None:
            cmd.append(f"--percentile={percentile}")
        if stability_percentage is not None:
            cmd += ["-s", f"{stability_percentage:g}"]
        if max_trials is not None:
            cmd += ["-r", str(max_trials)]
        cmd += list(extra_args)
        try:
            proc = subprocess.run(
                cmd, env=perf_analyzer_env(), capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise PerfAnalyzerError(f"perf_analyzer ran past {timeout_s:.0f} s: {' '.join(cmd)}") from exc
        if proc.returncode != 0 or not report.is_file():
            problem = perf_analyzer_problem()
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise PerfAnalyzerError(
                f"perf_analyzer exited {proc.returncode}: {problem or tail}\ncommand: {' '.join(cmd)}"
            )
        result = parse_perf_analyzer_csv(report, concurrency)
    avg = _AVG_LATENCY.search(proc.stdout)
    if avg is not None:
        result["avg_us"] = float(avg.group(1))
    return result
