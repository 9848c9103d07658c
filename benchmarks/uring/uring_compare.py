"""io_uring against uvloop under an idle crowd plus load (issue 18): a measured prototype.

Two frame responders answer every lumenrt TCP request frame with one canned response frame
carrying its id: ``uring_echo.c`` (liburing: a multishot accept, and per connection a multishot
recv from one provided-buffer ring that all connections share) and ``uvloop_echo.py`` (the event
loop ``lumenrt serve`` runs on). Neither runs a model, so what differs is the event loop alone.
In interleaved rounds (uring, uvloop | uvloop, uring | ...), each gets a fresh process and:
  1. the same open-loop load as ``connections.py`` (``density_load``), without a crowd;
  2. N idle TCP connections (``idle_crowd.py``, each used once), and its RSS before and after;
  3. the same load again beside them, then a closed-loop run (concurrency 8) for throughput;
  4. one more request on every idle connection (dropped: those that do not answer).
Figures are medians over the rounds. ``compare`` is called by ``connections.py``.

Building needs a C compiler and liburing (Debian: ``apt-get install liburing-dev``); where it
cannot be built, or ``io_uring_setup`` is refused (EPERM: ``kernel.io_uring_disabled`` or a seccomp
filter; ENOSYS: a kernel without io_uring), the result says so instead of figures.
"""

import contextlib
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

# modules of benchmarks/ (connections.py puts that folder on sys.path)
from density_load import MODEL, Load, memory_kib, run
from idle_crowd import IdleCrowd, tcp_request
from lumenrt.protocols.tcp import encode_response

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "uring_echo.c"
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]
START_TIMEOUT_S = 30.0
SERVERS = ("io_uring", "uvloop")
THROUGHPUT_CONCURRENCY = 8  # the closed-loop run (the load generator, one Python process, is its limit)


def build(build_dir: Path) -> tuple[Path | None, str]:
    """Compile uring_echo.c into ``build_dir``: (the binary, "") or (None, why not)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) on PATH"
    build_dir.mkdir(parents=True, exist_ok=True)
    out = build_dir / "uring_echo"
    proc = subprocess.run(
        [cc, *CFLAGS, "-o", str(out), str(SOURCE), "-luring"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        if "liburing.h" in proc.stderr or "-luring" in proc.stderr or "cannot find -luring" in proc.stderr:
            return None, "liburing is not installed (Debian: apt-get install liburing-dev)"
        return None, f"uring_echo.c did not build: {proc.stderr.strip()[-500:]}"
    return out, ""


def canned_response() -> bytes:
    """A digits_mlp-shaped response frame (ten FP32 scores), id 0 (the responders patch it)."""
    scores = np.zeros((1, 10), np.float32)
    return b"".join(bytes(p) for p in encode_response(0, MODEL, 1, [("scores", scores)]))


@contextlib.contextmanager
def responder(cmd: list[str]) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Start a responder that prints its port; stop it (SIGTERM) on the way out."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        if not select.select([proc.stdout], [], [], START_TIMEOUT_S)[0]:
            raise RuntimeError(f"{cmd[0]} printed no port within {START_TIMEOUT_S:g} s")
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            proc.wait(10)
            raise RuntimeError(proc.stderr.read().strip() or f"{cmd[0]} exited with status {proc.returncode}")
        yield proc, int(line)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _one_round(cmd: list[str], n: int, load: Load, inputs: Mapping[str, Any]) -> dict[str, Any]:
    with responder(cmd) as (proc, port):
        target = f"tcp://127.0.0.1:{port}"
        without = run(target, inputs, load, stages=False)
        before = memory_kib(proc.pid)
        request = {"tcp": tcp_request(MODEL, inputs)}
        with IdleCrowd("127.0.0.1", {"tcp": port}, request) as crowd:
            opened = crowd.open("tcp", n)
            after = memory_kib(proc.pid)
            beside = run(target, inputs, load, stages=False)
            closed_loop = replace(load, rate_per_s=None, concurrency=THROUGHPUT_CONCURRENCY)
            throughput = run(target, inputs, closed_loop, stages=False)
            checked = crowd.check()["tcp"]
    return {
        "opened": opened,
        "rss_kib_before": before,
        "rss_kib_with_crowd": after,
        "kib_per_connection": round((after["VmRSS"] - before["VmRSS"]) / max(opened["opened"], 1), 3),
        "without_crowd": without,
        "with_crowd": beside,
        "closed_loop": throughput,
        "dropped": checked["dropped"],
        "check": checked,
    }


def _median(rows: list[dict[str, Any]], *path: str) -> float:
    values = []
    for row in rows:
        value: Any = row
        for key in path:
            value = value[key]
        values.append(float(value))
    return float(statistics.median(values))


def compare(
    n: int, load: Load, rounds: int, inputs: Mapping[str, Any], progress: Any = print
) -> dict[str, Any]:
    """Both responders, ``rounds`` interleaved rounds each; the figures, or why there are none."""
    work = Path(tempfile.mkdtemp(prefix="lumenrt-uring-"))
    try:
        binary, why = build(work)
        if binary is None:
            return {"result": "skipped", "reason": why}
        response = work / "response.bin"
        response.write_bytes(canned_response())
        cmds = {
            "io_uring": [str(binary), str(response)],
            "uvloop": [sys.executable, str(HERE / "uvloop_echo.py"), str(response)],
        }
        try:  # io_uring may be refused here: say so rather than fail
            with responder(cmds["io_uring"]):
                pass
        except RuntimeError as exc:
            return {"result": "io_uring not available", "reason": str(exc)}
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in SERVERS}
        for r in range(rounds):
            for name in SERVERS if r % 2 == 0 else tuple(reversed(SERVERS)):
                progress(f"io_uring comparison: round {r + 1}/{rounds}, {name}")
                rows[name].append(_one_round(cmds[name], n, load, inputs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary: dict[str, Any] = {}
    for name, got in rows.items():
        summary[name] = {
            "kib_per_connection": _median(got, "kib_per_connection"),
            "p99_us_without_crowd": _median(got, "without_crowd", "latency_us", "p99"),
            "p99_us_with_crowd": _median(got, "with_crowd", "latency_us", "p99"),
            "p50_us_with_crowd": _median(got, "with_crowd", "latency_us", "p50"),
            "closed_loop_per_s": _median(got, "closed_loop", "throughput_per_s"),
            "closed_loop_p99_us": _median(got, "closed_loop", "latency_us", "p99"),
            "dropped": sum(row["dropped"] for row in got),
        }
    uring, loop = summary["io_uring"], summary["uvloop"]
    summary["ratios_io_uring_over_uvloop"] = {
        "p99_with_crowd": round(uring["p99_us_with_crowd"] / loop["p99_us_with_crowd"], 3),
        "closed_loop_throughput": round(uring["closed_loop_per_s"] / loop["closed_loop_per_s"], 3),
        "kib_per_connection": round(uring["kib_per_connection"] / max(loop["kib_per_connection"], 1e-9), 3),
    }
    return {
        "result": "measured",
        "connections": n,
        "rounds": rounds,
        "summary": summary,
        "rounds_detail": rows,
    }
