"""Large HTTP bodies (or gRPC messages): what receiving the tensor bytes straight into the arena slot
saves.

    .venv/bin/python benchmarks/http_body.py --baseline-python /path/to/other/venv/bin/python
        [--protocol http|grpc] [--seconds 8] [--rounds 3] [--concurrency 1 4 8] [--mode thread]
        [--out results/]

Two ``lumenrt serve --models squeezenet`` processes, started once and kept: this checkout's and
another install's (``--baseline-python``, e.g. a venv holding the commit before a change).
``lumenrt bench load`` (closed loop, V2 binary over HTTP, or with ``--protocol grpc`` ModelInfer
through lumenrt's gRPC client, SqueezeNet's 600 KB input) drives each
concurrency against both in interleaved rounds; each figure is the median over the rounds:
throughput, p50, p99, and the CPU time per request of the server's event-loop thread (the main
thread: where the body is received, parsed and copied) and of the whole server process. The
server's ``inputs_in_place`` statistic says how many requests were adopted where they were
received (0 for an install without it). Writes ``http-body-<stamp>.json`` (``grpc-body-`` for gRPC).
"""

import argparse
import json
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import ServeProcess, start_serve
from roundtrip import cpu_s  # beside this file
from security_overhead import load

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "squeezenet"
KEYS = ("throughput_per_s", "p50_us", "p99_us", "loop_cpu_us", "server_cpu_us")


def in_place(server: ServeProcess) -> int:
    url = f"http://127.0.0.1:{server.ports['http']}/v2/models/{MODEL}/stats"
    with urllib.request.urlopen(url, timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]
    return int(stats.get("lumenrt", {}).get("inputs_in_place", 0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-python", required=True, help="a python whose lumenrt is the baseline")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per load run (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8], help="default: 1 4 8")
    ap.add_argument("--mode", choices=["thread", "process"], default="thread", help="worker mode of both")
    ap.add_argument(
        "--protocol", choices=["http", "grpc"], default="http", help="the front end (default http)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results", help="folder for the result file")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.rounds <= 0 or min(args.concurrency) <= 0:
        ap.error("--seconds, --rounds and every --concurrency must be > 0")
    commands = {
        "this": [sys.executable, "-m", "lumenrt.cli"],
        "baseline": [args.baseline_python, "-m", "lumenrt.cli"],
    }
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    started: dict[str, ServeProcess] = {}
    adopted: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="lumenrt-http-body-") as tmp:
        try:
            for name, command in commands.items():
                # cwd: the baseline must not import this checkout's sources
                started[name] = start_serve("--models", MODEL, "--mode", args.mode, command=command, cwd=tmp)
            for r in range(args.rounds):
                for c in args.concurrency:
                    for name, server in started.items():
                        pid = server.proc.pid
                        before = cpu_s(pid, pid)
                        got = load(server, MODEL, args.protocol, c, args.seconds, Path(tmp), [])
                        requests = got["throughput_per_s"] * (args.seconds + 1.0)  # warm-up included
                        got["loop_cpu_us"] = (cpu_s(pid, pid) - before) / requests * 1e6
                        runs.setdefault(f"c{c}", {}).setdefault(name, []).append(got)
                        print(
                            f"round {r + 1}/{args.rounds} c{c:<3} {name:<8} {got['throughput_per_s']:7.1f}/s  "
                            f"p50 {got['p50_us']:8.1f} us  p99 {got['p99_us']:8.1f} us  cpu/request: "
                            f"loop {got['loop_cpu_us']:7.1f} us, server {got['server_cpu_us']:7.1f} us",
                            flush=True,
                        )
            adopted = {name: in_place(server) for name, server in started.items()}
        finally:
            for server in started.values():
                server.stop()

    results: dict[str, Any] = {}
    print(
        f"\n{'row':<5} {'install':<9} {'req/s':>8} {'p50 us':>9} {'p99 us':>9} {'loop us':>8} {'srv us':>8} {'tput x':>7}"
    )
    for row, by_install in runs.items():
        med = {n: {k: float(np.median([g[k] for g in got])) for k in KEYS} for n, got in by_install.items()}
        base = med["baseline"]
        results[row] = {n: {k: round(v, 1) for k, v in m.items()} for n, m in med.items()}
        for n, m in med.items():
            ratio = m["throughput_per_s"] / base["throughput_per_s"]
            results[row][n]["throughput_ratio"] = round(ratio, 4)
            results[row][n]["loop_cpu_ratio"] = round(m["loop_cpu_us"] / base["loop_cpu_us"], 4)
            print(
                f"{row:<5} {n:<9} {m['throughput_per_s']:8.1f} {m['p50_us']:9.1f} {m['p99_us']:9.1f} "
                f"{m['loop_cpu_us']:8.1f} {m['server_cpu_us']:8.1f} {ratio:7.3f}"
            )
    print(f"requests adopted where they were received (inputs_in_place): {adopted}")
    kind = f"{args.protocol}-body"
    doc = {
        "kind": kind,
        "machine": machine_info(),
        "commit": git_commit(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "inputs_in_place": adopted,
        "results": results,
        "rounds": runs,
    }
    path = write_result(args.out, kind, doc)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
