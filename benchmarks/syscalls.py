"""System calls per request on the request path, counted by ``strace -c``.

    .venv/bin/python benchmarks/syscalls.py [--model digits_mlp] [--protocols tcp http]
        [--requests 4000] [--serve-args "--lane queue"] [--out results/]

One ``lumenrt serve`` (with ``--serve-args``) is warmed up over each protocol with ``lumenrt bench
load`` (closed loop, concurrency 1, ``--warmup-s`` seconds), then ``strace -c -f`` is attached to
it while ``--requests`` more requests are sent, and each system call's count is divided by them.
Counted: every thread of the server process (the event loop, the worker threads, ORT's pools),
including the idle second while strace attaches and the load generator's connecting (a few calls
against thousands); not counted: worker processes (``--mode process``), which start before strace
attaches, and the load generator. At concurrency 1 the workers sleep between requests, so their
wake-ups (futex) show; the floor of an event-loop server is one ``epoll_pwait``, one ``read`` and
one ``write`` a request. strace must be allowed to attach (Yama ``ptrace_scope`` 0, or root); the
script stops with strace's message when it is not. Needs ``strace`` (Debian: ``apt-get install strace``). Prints a table and writes
``syscalls-<stamp>.json``.
"""

import argparse
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import ServeProcess, start_serve
from roundtrip import bench_load  # beside this file

SHOWN = 0.01  # calls a request below which a system call is left out of the table
ATTACH_S = 1.0  # strace attaches to every thread before the measured requests start


def parse_strace_summary(text: str) -> dict[str, int]:
    """``strace -c`` output: system call -> calls."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or not fields[0][0].isdigit() or fields[-1] == "total":
            continue
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(fields) >= 5 and fields[3].isdigit():
            calls[fields[-1]] = int(fields[3])
    return calls


def count(serve: ServeProcess, target: list[str], requests: int, warmup_s: float) -> dict[str, float]:
    """Calls a request, by system call, over ``requests`` measured requests."""
    bench_load(*target, "--concurrency", "1", "--duration-s", str(warmup_s), "--warmup-s", "0", "--no-stages")
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "strace.txt", Path(tmp) / "strace.err"
        with err.open("w") as err_file:
            tracer = subprocess.Popen(
                ["strace", "-c", "-f", "-p", str(serve.proc.pid), "-o", str(out)],
                stdout=subprocess.DEVNULL,
                stderr=err_file,
            )
            try:
                time.sleep(ATTACH_S)
                if tracer.poll() is not None:
                    raise RuntimeError(f"strace could not attach to the server: {err.read_text().strip()}")
                summary = bench_load(*target, "--concurrency", "1", "--requests", str(requests), "--warmup-s",
                                     "0", "--no-stages")  # fmt: skip
            finally:
                if tracer.poll() is None:
                    tracer.send_signal(signal.SIGINT)
                tracer.wait(30)
        sent = int(summary["counts"]["ok"])
        if sent != requests:
            raise RuntimeError(f"{requests} requests sent, {sent} answered ok: {summary['counts']}")
        calls = parse_strace_summary(out.read_text() if out.exists() else "")
        if not calls:  # e.g. not allowed to trace (ptrace_scope, no CAP_SYS_PTRACE)
            raise RuntimeError(f"strace counted no system calls (exit {tracer.returncode}): "
                               f"{err.read_text().strip()}")  # fmt: skip
    return {name: n / requests for name, n in sorted(calls.items(), key=lambda kv: -kv[1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="digits_mlp")
    ap.add_argument("--protocols", nargs="+", default=["tcp", "http"], choices=["tcp", "http", "grpc"])
    ap.add_argument(
        "--requests", type=int, default=4000, help="measured requests per protocol (default 4000)"
    )
    ap.add_argument("--warmup-s", type=float, default=2.0, help="load before strace attaches (default 2)")
    ap.add_argument("--serve-args", default="", help='extra `lumenrt serve` arguments, e.g. "--lane queue"')
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    if args.requests < 1:
        ap.error("--requests must be at least 1")
    if shutil.which("strace") is None:
        print("syscalls.py needs strace (Debian: apt-get install strace)", file=sys.stderr)
        return 2
    extra = shlex.split(args.serve_args)
    rows: dict[str, dict[str, float]] = {}
    with start_serve("--models", args.model, *extra) as serve:
        meta = ["--metadata-url", f"http://{serve.http_url}"]
        urls = {
            "tcp": f"tcp://127.0.0.1:{serve.ports['tcp']}",
            "http": f"http://{serve.http_url}",
            "grpc": f"grpc://{serve.grpc_url}",
        }
        for proto in args.protocols:
            target = ["--target", urls[proto], "--model", args.model, *meta]
            rows[proto] = count(serve, target, args.requests, args.warmup_s)
    names = sorted({n for row in rows.values() for n, v in row.items() if v >= SHOWN})
    print(f"\nSystem calls a request, {args.model}, concurrency 1, {args.requests} requests"
          f"{' (serve ' + args.serve_args + ')' if args.serve_args else ''}")  # fmt: skip
    print("| system call | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for name in sorted(names, key=lambda n: -max(row.get(n, 0.0) for row in rows.values())):
        print(f"| {name} | " + " | ".join(f"{row.get(name, 0.0):.2f}" for row in rows.values()) + " |")
    payload: dict[str, Any] = {
        "kind": "syscalls",
        "commit": git_commit(),
        "machine": machine_info(),
        "model": args.model,
        "requests": args.requests,
        "serve_args": extra,
        "calls_per_request": rows,
    }
    print(f"wrote {write_result(args.out, 'syscalls', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
