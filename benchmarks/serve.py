"""Serving benchmark: ``lumenrt serve`` against Triton, and its round trip against a TCP echo.

    .venv/bin/python benchmarks/serve.py [--quick] [--json] [--peers lumenrt triton]
        [--protocols http grpc] [--concurrency 1 2 4 8] [--serve-args '--mode process'] [--out results]

Needs tritonclient's perf_analyzer (``make install``) and, for the Triton rows, ``.venv-triton``
(``make bench-serve`` creates it, then runs this script). One run, this machine, each server in its
own process and the load from others:
  1. raw: SqueezeNet through 2 raw ONNX Runtime threads (one session each), the ceiling;
  2. lumenrt: ``lumenrt serve`` (built-in models), perf_analyzer on SqueezeNet at each
     concurrency over HTTP and gRPC; then digits_mlp batch-1 round trips at concurrency 1 over the
     TCP protocol (alternating blocks with a loopback echo of the same byte counts, the floor),
     HTTP binary (lumenrt.client.HttpClient) and gRPC (tritonclient.grpc);
  3. triton: Triton 2.51 through PyTriton (``triton_peer.py`` under ``.venv-triton``) serving the
     same SqueezeNet file with ONNX Runtime sessions and dynamic batching, the same perf_analyzer
     matrix.
Servers run one at a time, so none steals the other's cores. Prints the tables and the ratios the
serving issue asks for, and writes ``<out>/serve-<stamp>.json`` (machine, commit, configuration,
every row). Beside this file: ``perf_analyzer.py`` (runs it, reads its CSV), ``triton_peer.py`` (the
Triton peer) and ``roundtrip.py`` (the TCP round trip and the echo floor).
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import ServeProcess, start_serve
from perf_analyzer import PerfAnalyzerError, perf_analyzer_problem, run_perf_analyzer  # beside this file

SQUEEZENET = "squeezenet"
DIGITS = "digits_mlp"
DEFAULT_CONCURRENCY = (1, 2, 4, 8)
PROTOCOLS = ("http", "grpc")
TRITON_VENV = Path(".venv-triton")
PEER_SCRIPT = Path(__file__).with_name("triton_peer.py")


@dataclass(slots=True)
class PaRow:
    server: str
    protocol: str
    concurrency: int
    throughput_per_s: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    error: str = ""


def _progress(msg: str) -> None:
    print(f"[bench serve] {msg}", file=sys.stderr, flush=True)


def _perf_matrix(server: str, urls: dict[str, str], args: argparse.Namespace) -> list[PaRow]:
    rows: list[PaRow] = []
    for protocol in args.protocols:
        for c in args.concurrency:
            _progress(f"{server} {protocol} concurrency {c}")
            row = PaRow(server, protocol, c)
            try:
                r = run_perf_analyzer(
                    SQUEEZENET,
                    urls[protocol],
                    protocol,
                    concurrency=c,
                    measurement_ms=args.measurement_ms,
                    input_data="random",
                    stability_percentage=args.stability,
                    max_trials=args.max_trials,
                )
                row.throughput_per_s = round(r["throughput_infer_per_s"], 1)
                row.p50_us, row.p99_us = r["p50_us"], r["p99_us"]
            except PerfAnalyzerError as exc:
                row.error = str(exc).splitlines()[0][:300]
            rows.append(row)
    return rows


def _latency_stats(latencies_ns: Sequence[int]) -> dict[str, float]:
    a = np.asarray(latencies_ns, dtype=np.float64) / 1000.0
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"n": float(len(a)), "p50_us": round(float(p50), 1), "p90_us": round(float(p90), 1),
            "p99_us": round(float(p99), 1)}  # fmt: skip


def _timed(call: Callable[[], object], n: int, warmup: int) -> list[int]:
    for _ in range(warmup):
        call()
    out: list[int] = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        call()
        out.append(time.perf_counter_ns() - t0)
    return out


def _round_trips(server: ServeProcess, n: int) -> dict[str, Any]:
    """digits_mlp batch 1, concurrency 1: TCP (with the echo floor), HTTP binary, gRPC."""
    from lumenrt.client import HttpClient
    from lumenrt.models.builtin import builtin_examples
    from roundtrip import serve_vs_echo

    inputs = builtin_examples(DIGITS, 1)
    out: dict[str, Any] = {}
    _progress("digits_mlp round trips: TCP vs echo floor")
    out["tcp_vs_echo"] = serve_vs_echo("127.0.0.1", server.ports["tcp"], DIGITS, inputs, n)
    _progress("digits_mlp round trips: HTTP binary")
    with HttpClient("127.0.0.1", server.ports["http"]) as http:
        out["http_binary"] = _latency_stats(_timed(lambda: http.infer(DIGITS, inputs), n, 200))
    _progress("digits_mlp round trips: gRPC (tritonclient.grpc)")
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = inputs["input"]
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out["grpc"] = _latency_stats(_timed(lambda: client.infer(DIGITS, [inp]), n, 200))
    finally:
        client.close()
    return out


def _raw_row(duration_s: float) -> dict[str, Any]:
    from lumenrt.bench.engine_load import Phase, best_raw

    _progress("raw: 2 ONNX Runtime threads on SqueezeNet")
    row = best_raw("serve", SQUEEZENET, [1, 4, 8], Phase(1.0, duration_s))
    return {"throughput_per_s": row.throughput_per_s, "note": row.note, "batch": row.raw_batch}


def _start_triton(args: argparse.Namespace) -> tuple["subprocess.Popen[str]", dict[str, str]]:
    from lumenrt.models.builtin import ensure_builtin_repository

    python = Path(args.triton_python)
    if not python.exists():
        raise RuntimeError(
            f"{python} not found: create it with `make triton-peer` (a separate venv with nvidia-pytriton)"
        )
    model = ensure_builtin_repository() / SQUEEZENET / "1" / "model.onnx"
    http_port, grpc_port = args.triton_ports
    proc = subprocess.Popen(
        [
            str(python),
            str(PEER_SCRIPT),
            "--model-path",
            str(model),
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--sessions",
            "2",
            "--max-queue-delay-us",
            str(args.triton_delay_us),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # fmt: skip  (own process group: tritonserver and its stubs go with it if it must be killed)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("READY"):
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(300) or proc.poll() is not None:
        _stop(proc)
        raise RuntimeError("the Triton peer did not start:\n" + "\n".join(lines[-30:]))
    return proc, {"http": f"127.0.0.1:{http_port}", "grpc": f"127.0.0.1:{grpc_port}"}


def _stop(proc: "subprocess.Popen[str]") -> None:
    """SIGTERM (PyTriton stops Triton cleanly in ~5 s), then SIGKILL to the whole process group."""
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _find(rows: Sequence[PaRow], server: str, protocol: str, c: int) -> PaRow | None:
    return next((r for r in rows if (r.server, r.protocol, r.concurrency) == (server, protocol, c)), None)


def compute_checks(
    rows: Sequence[PaRow], raw: dict[str, Any] | None, trips: dict[str, Any] | None
) -> dict[str, Any]:
    """The issue's acceptance figures: ratios and whether each holds (None: not measured)."""
    checks: dict[str, Any] = {}
    for protocol in PROTOCOLS:
        for c in (4, 8):
            ours, theirs = _find(rows, "lumenrt", protocol, c), _find(rows, "triton", protocol, c)
            if ours and theirs and ours.throughput_per_s and theirs.throughput_per_s:
                ratio = ours.throughput_per_s / theirs.throughput_per_s
                checks[f"throughput lumenrt/triton {protocol} c{c} (>= 2)"] = (round(ratio, 2), ratio >= 2)
        for c in sorted({r.concurrency for r in rows}):
            ours, theirs = _find(rows, "lumenrt", protocol, c), _find(rows, "triton", protocol, c)
            if ours and theirs and ours.p99_us and theirs.p99_us:
                checks[f"p99 lumenrt < triton {protocol} c{c} (us)"] = (
                    f"{ours.p99_us:.0f} vs {theirs.p99_us:.0f}",
                    ours.p99_us < theirs.p99_us,
                )
    http4 = _find(rows, "lumenrt", "http", 4)
    if http4 and http4.throughput_per_s and raw and raw.get("throughput_per_s"):
        ratio = http4.throughput_per_s / raw["throughput_per_s"]
        checks["lumenrt http c4 / raw 2-session ORT (>= 0.85)"] = (round(ratio, 3), ratio >= 0.85)
    if http4 and http4.p99_us:
        checks["lumenrt http c4 p99 ms (<= 12)"] = (round(http4.p99_us / 1000, 2), http4.p99_us <= 12000)
    if trips and "tcp_vs_echo" in trips:
        r = trips["tcp_vs_echo"]["ratio_p50"]
        checks["digits TCP p50 / echo p50 (<= 1.5)"] = (round(r, 2), r <= 1.5)
    return checks  # fmt: skip


def format_report(rows: Sequence[PaRow], raw: dict[str, Any] | None, trips: dict[str, Any] | None,
                  checks: dict[str, Any]) -> str:  # fmt: skip
    out = ["SqueezeNet, perf_analyzer (batch 1 requests, random data)", ""]
    out.append(f"{'server':<8} {'proto':<5} {'conc':>4} {'infer/s':>9} {'p50 ms':>8} {'p99 ms':>8}  note")
    for r in rows:
        tp = f"{r.throughput_per_s:,.1f}" if r.throughput_per_s else "-"
        p50 = f"{r.p50_us / 1000:.2f}" if r.p50_us else "-"
        p99 = f"{r.p99_us / 1000:.2f}" if r.p99_us else "-"
        out.append(f"{r.server:<8} {r.protocol:<5} {r.concurrency:>4} {tp:>9} {p50:>8} {p99:>8}  {r.error}")
    if raw:
        out += ["", f"raw 2-thread ONNX Runtime: {raw['throughput_per_s']:,.1f}/s ({raw.get('note', '')})"]
    if trips:
        out += [
            "",
            "digits_mlp batch 1, concurrency 1 round trip (us)",
            f"{'path':<22} {'p50':>8} {'p99':>8}",
        ]
        te = trips.get("tcp_vs_echo")
        if te:
            out.append(
                f"{'TCP (lumenrt.client)':<22} {te['tcp']['p50_us']:>8.1f} {te['tcp']['p99_us']:>8.1f}"
            )
            out.append(
                f"{'echo floor (same bytes)':<22} {te['echo']['p50_us']:>8.1f} {te['echo']['p99_us']:>8.1f}"
            )
        for key, label in (("http_binary", "HTTP binary"), ("grpc", "gRPC (tritonclient)")):
            if key in trips:
                out.append(f"{label:<22} {trips[key]['p50_us']:>8.1f} {trips[key]['p99_us']:>8.1f}")
    if checks:
        out += ["", "checks"]
        for name, (value, ok) in checks.items():
            out.append(f"  {'ok  ' if ok else 'MISS'} {name}: {value}")
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, nargs="+", default=list(DEFAULT_CONCURRENCY))
    p.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    p.add_argument("--peers", nargs="+", choices=("lumenrt", "triton"), default=["lumenrt", "triton"],
                   help="servers to measure (default both)")  # fmt: skip
    p.add_argument("--measurement-ms", type=int, default=3000, help="perf_analyzer window (default 3000)")
    p.add_argument("--stability", type=float, default=25.0,
                   help="perf_analyzer -s: windows must agree within this %% (default 25; noisy machine)")  # fmt: skip
    p.add_argument("--max-trials", type=int, default=6, help="perf_analyzer -r (default 6)")
    p.add_argument("--raw-s", type=float, default=6.0, help="raw ONNX Runtime loop duration (default 6 s)")
    p.add_argument("--round-trips", type=int, default=5000, help="digits_mlp round trips per path (0: skip)")
    p.add_argument("--serve-args", default="", help="extra `lumenrt serve` flags, e.g. '--mode process'")
    p.add_argument("--triton-python", default=str(TRITON_VENV / "bin" / "python"),
                   help="interpreter with nvidia-pytriton (default .venv-triton/bin/python)")  # fmt: skip
    p.add_argument("--triton-delay-us", type=int, default=0,
                   help="Triton's max_queue_delay_microseconds (default 0, as lumenrt's built-in squeezenet)")  # fmt: skip
    p.add_argument("--triton-ports", type=int, nargs=2, default=[8010, 8011], metavar=("HTTP", "GRPC"))
    p.add_argument("--quick", action="store_true", help="short windows, concurrency 1 and 4 (a smoke run)")
    p.add_argument("--out", default="results", help="folder for the result file (default results/)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")


def run_from_args(args: argparse.Namespace) -> int:
    if args.quick:
        args.concurrency, args.measurement_ms, args.max_trials = [1, 4], 1000, 3
        args.stability, args.raw_s, args.round_trips = 100.0, 2.0, min(args.round_trips, 1000)
    problem = perf_analyzer_problem()
    if problem is not None:
        print(f"benchmarks/serve.py: {problem}", file=sys.stderr)
        return 2
    raw = _raw_row(args.raw_s)
    rows: list[PaRow] = []
    trips: dict[str, Any] | None = None
    notes: list[str] = []
    if "lumenrt" in args.peers:
        _progress("starting lumenrt serve")
        server = start_serve(*args.serve_args.split())
        try:
            urls = {"http": server.http_url, "grpc": server.grpc_url}
            rows += _perf_matrix("lumenrt", urls, args)
            if args.round_trips > 0:
                trips = _round_trips(server, args.round_trips)
        finally:
            status = server.stop()
            if status != 0:
                notes.append(f"lumenrt serve exited {status}")
    if "triton" in args.peers:
        _progress("starting Triton (PyTriton)")
        try:
            proc, urls = _start_triton(args)
        except RuntimeError as exc:
            notes.append(str(exc).splitlines()[0])
            _progress(str(exc))
        else:
            try:
                rows += _perf_matrix("triton", urls, args)
            finally:
                _stop(proc)
    checks = compute_checks(rows, raw, trips)
    payload = {
        "benchmark": "serve",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {k: v for k, v in vars(args).items() if k != "func"},
        "raw": raw,
        "perf_analyzer": [asdict(r) for r in rows],
        "round_trips": trips,
        "checks": {k: {"value": v, "ok": ok} for k, (v, ok) in checks.items()},
        "notes": notes,
    }
    path = write_result(args.out, "serve", payload)
    if args.json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(format_report(rows, raw, trips, checks))
        for note in notes:
            print(f"note: {note}")
        print(f"\nresult file: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/serve.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
