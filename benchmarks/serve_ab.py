"""Server configurations against each other, through the server, in interleaved rounds.

A module of the benchmarks in this folder (``lane_turn.py``, ``worker_modes.py``,
``grpc_servers.py``), which import it by plain name:

    variants = [Variant("thread", {"worker_mode": "thread"}), Variant("process", {"worker_mode": "process"})]
    runs = run_rounds(variants, targets=["tcp"], concurrency=[1, 8], rounds=5, load_s=5.0, model="digits_mlp")
    table = summarize(runs, variants[0].label)
    # or all of it, from a script's parsed arguments (targets, concurrency, rounds, load_s, out):
    compare(variants, args, model="digits_mlp", kind="worker-modes", title="digits_mlp, lane queue")

Each round starts a fresh ``lumenrt serve --config <file with the variant's engine and server
sections>`` per variant, in the order given (a variant may name another install's interpreter: its ``lumenrt
serve`` runs, driven by this install's load generator, so every row has the same client), and
drives every target at every concurrency with ``lumenrt bench load`` (closed loop), reading where
the CPU went: the server's CPU per request (all its processes and threads) and the load
generator's. Rounds interleave the variants so they see the same machine; the summary gives
medians over the rounds and, per variant, its throughput against the first and the rounds in
which it beat the first.
"""

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import start_serve
from roundtrip import bench_load_cpu, markdown_table  # beside this file

ROOT = Path(__file__).resolve().parent.parent
WARMUP_S = 1.0
COLUMNS = ("throughput_per_s", "x first", "wins", "p50_us", "p99_us", "server_cpu_us", "client_cpu_us")


@dataclass(frozen=True)
class Variant:
    label: str
    engine: dict[str, Any] = field(default_factory=dict)  # the config file's "engine" section
    python: str | None = None  # another install's interpreter; None: this one
    server: dict[str, Any] = field(default_factory=dict)  # its "server" section (`lumenrt serve` flags)


def drive(
    server: Any, target: str, model: str, concurrency: int, seconds: float, out: Path
) -> dict[str, float]:
    """One closed-loop run: throughput, p50, p99, and CPU µs per request of server and load."""
    url = {
        "http": f"http://{server.http_url}",
        "tcp": f"tcp://127.0.0.1:{server.ports['tcp']}",
        "grpc": f"grpc://{server.grpc_url}",  # lumenrt's gRPC client
        "grpcio": f"grpcio://{server.grpc_url}",  # grpcio's
    }[target]
    args = ["--target", url, "--model", model, "--metadata-url", f"http://{server.http_url}",
            "--concurrency", str(concurrency), "--duration-s", str(seconds),
            "--warmup-s", str(WARMUP_S), "--no-stages", "--out", str(out)]  # fmt: skip
    return bench_load_cpu(*args, server_pid=server.proc.pid, seconds=seconds, warmup_s=WARMUP_S)


def turn(
    variant: Variant,
    model: str,
    targets: Sequence[str],
    concurrency: Sequence[int],
    seconds: float,
    tmp: Path,
) -> dict[str, dict[str, float]]:
    """One fresh server of ``variant``, every target at every concurrency: {"tcp c8": figures}."""
    config = tmp / "config.json"
    config.write_text(json.dumps({"engine": variant.engine, "server": variant.server}))
    command = [variant.python, "-m", "lumenrt.cli"] if variant.python else None
    with start_serve("--config", str(config), "--models", model, command=command, cwd=str(ROOT)) as server:
        return {f"{t} c{c}": drive(server, t, model, c, seconds, tmp) for t in targets for c in concurrency}


def run_rounds(
    variants: Sequence[Variant],
    *,
    targets: Sequence[str],
    concurrency: Sequence[int],
    rounds: int,
    load_s: float,
    model: str,
) -> dict[str, list[dict[str, dict[str, float]]]]:
    """Per variant label, its rounds' figures (``turn``), printing a line per turn."""
    runs: dict[str, list[dict[str, dict[str, float]]]] = {v.label: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="lumenrt-serve-ab-") as tmp:
        for r in range(rounds):
            for v in variants:
                rows = turn(v, model, targets, concurrency, load_s, Path(tmp))
                runs[v.label].append(rows)
                cells = "  ".join(
                    f"{name} {g['throughput_per_s']:,.0f}/s ({g['server_cpu_us']:.0f}+{g['client_cpu_us']:.0f} µs)"
                    for name, g in rows.items()
                )
                print(f"round {r + 1}/{rounds} {v.label:<20} {cells}", flush=True)
    return runs


def summarize(runs: dict[str, list[dict[str, dict[str, float]]]], first: str) -> dict[str, dict[str, Any]]:
    """Medians over the rounds, per "<target c<n>>, <label>" row (``COLUMNS``; "x first" and
    "wins" against the variant labelled ``first``)."""
    table: dict[str, dict[str, Any]] = {}
    for name in runs[first][0]:
        for label, rounds in runs.items():
            med = {k: statistics.median(rows[name][k] for rows in rounds) for k in rounds[0][name]}
            base = statistics.median(rows[name]["throughput_per_s"] for rows in runs[first])
            table[f"{name}, {label}"] = {
                "throughput_per_s": round(med["throughput_per_s"], 1),
                "x first": round(med["throughput_per_s"] / base, 3) if base else None,
                "wins": sum(
                    rows[name]["throughput_per_s"] > other[name]["throughput_per_s"]
                    for rows, other in zip(rounds, runs[first], strict=True)
                ),
                "p50_us": med["p50_us"],
                "p99_us": med["p99_us"],
                "server_cpu_us": round(med["server_cpu_us"], 1),
                "client_cpu_us": round(med["client_cpu_us"], 1),
            }
    return table


def compare(
    variants: Sequence[Variant], args: argparse.Namespace, *, model: str, kind: str, title: str
) -> int:
    """``run_rounds`` with the script's ``args`` (targets, concurrency, rounds, load_s, out), then
    the table printed and written as ``<kind>-<stamp>.json`` in ``args.out``."""
    runs = run_rounds(variants, targets=args.targets, concurrency=args.concurrency, rounds=args.rounds,
                      load_s=args.load_s, model=model)  # fmt: skip
    first = variants[0].label
    table = summarize(runs, first)
    print(markdown_table(f"{title}, medians of {args.rounds} rounds (x first, wins: against {first})",
                         table, COLUMNS))  # fmt: skip
    doc = {
        "kind": kind,
        "machine": machine_info(),
        "commit": git_commit(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": table,
        "rounds": runs,
    }
    print(f"wrote {write_result(args.out, kind, doc)}")
    return 0
