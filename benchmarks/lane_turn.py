"""The inline lane's budget per event-loop turn (engine.lane_turn_us), A/B through the server.

    .venv/bin/python benchmarks/lane_turn.py [--budgets 0 1000] [--targets http tcp]
        [--concurrency 8] [--rounds 5] [--load-s 5] [--out results/]

digits_mlp (a lane model: its batch-1 compute is below a worker hand-off). For each budget,
``lumenrt serve --config <file with engine.lane_turn_us>`` takes its turn (``--rounds`` rounds, a
fresh server each turn, budgets in the order given); each turn drives every target at every
concurrency with ``lumenrt bench load`` (closed loop) and reads where the CPU went: the server's
CPU per request (all its threads) and the load generator's (its own ``load_cpu``), both sharing
this machine's CPUs. 0 is one request a turn (the rule before the budget): the rest of a turn's
requests go to the workers. Figures are the medians over the rounds, with each budget's
throughput against the first budget's. Prints a table, writes ``lane-turn-<stamp>.json``.
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import start_serve
from roundtrip import bench_load_cpu, markdown_table  # beside this file

ROOT = Path(__file__).resolve().parent.parent
MODEL = "digits_mlp"
WARMUP_S = 1.0


def drive(server: Any, target: str, concurrency: int, seconds: float, out: Path) -> dict[str, float]:
    """One closed-loop run: throughput, p50, p99, and CPU µs per request of server and load."""
    url = f"http://{server.http_url}" if target == "http" else f"tcp://127.0.0.1:{server.ports['tcp']}"
    args = ["--target", url, "--model", MODEL, "--metadata-url", f"http://{server.http_url}",
            "--concurrency", str(concurrency), "--duration-s", str(seconds),
            "--warmup-s", str(WARMUP_S), "--no-stages", "--out", str(out)]  # fmt: skip
    return bench_load_cpu(*args, server_pid=server.proc.pid, seconds=seconds, warmup_s=WARMUP_S)


def turn(
    budget: int, targets: list[str], concurrency: list[int], seconds: float, tmp: Path
) -> dict[str, Any]:
    config = tmp / f"lane-turn-{budget}.json"
    config.write_text(json.dumps({"engine": {"lane_turn_us": budget}}))
    with start_serve("--config", str(config), "--models", MODEL, cwd=str(ROOT)) as server:
        return {f"{t} c{c}": drive(server, t, c, seconds, tmp) for t in targets for c in concurrency}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", type=int, nargs="+", default=[0, 1000], help="lane_turn_us values (µs)")
    p.add_argument("--targets", nargs="+", choices=("http", "tcp"), default=["http", "tcp"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[8])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--load-s", type=float, default=5.0, help="measured seconds per load run")
    p.add_argument("--out", type=Path, default=ROOT / "results")
    args = p.parse_args(argv)
    if any(b < 0 for b in args.budgets) or args.rounds < 1 or args.load_s <= 0 or min(args.concurrency) < 1:
        p.error("--budgets must be >= 0; --rounds, --load-s and every --concurrency > 0")
    runs: dict[int, list[dict[str, Any]]] = {b: [] for b in args.budgets}
    with tempfile.TemporaryDirectory(prefix="lumenrt-lane-turn-") as tmp:
        for r in range(args.rounds):
            for b in args.budgets:
                rows = turn(b, args.targets, args.concurrency, args.load_s, Path(tmp))
                runs[b].append(rows)
                cells = "  ".join(
                    f"{name} {g['throughput_per_s']:,.0f}/s ({g['server_cpu_us']:.0f}+{g['client_cpu_us']:.0f} µs)"
                    for name, g in rows.items()
                )
                print(f"round {r + 1}/{args.rounds} lane_turn_us {b:<6} {cells}", flush=True)
    first = args.budgets[0]
    table: dict[str, dict[str, Any]] = {}
    for b in args.budgets:
        for name in runs[b][0]:
            med = {k: statistics.median(rows[name][k] for rows in runs[b]) for k in runs[b][0][name]}
            base = statistics.median(rows[name]["throughput_per_s"] for rows in runs[first])
            table[f"{name}, lane_turn_us {b}"] = {
                "throughput_per_s": round(med["throughput_per_s"], 1),
                f"x {first}": round(med["throughput_per_s"] / base, 3) if base else None,
                "wins": sum(
                    rows[name]["throughput_per_s"] > other[name]["throughput_per_s"]
                    for rows, other in zip(runs[b], runs[first], strict=True)
                ),
                "p50_us": med["p50_us"],
                "p99_us": med["p99_us"],
                "server_cpu_us": round(med["server_cpu_us"], 1),
                "client_cpu_us": round(med["client_cpu_us"], 1),
            }
    cols = ("throughput_per_s", f"x {first}", "wins", "p50_us", "p99_us", "server_cpu_us", "client_cpu_us")
    print(markdown_table(f"digits_mlp, medians of {args.rounds} rounds (wins: rounds above lane_turn_us {first})",
                         table, cols))  # fmt: skip
    doc = {
        "kind": "lane-turn",
        "machine": machine_info(),
        "commit": git_commit(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": table,
        "rounds": {str(b): rows for b, rows in runs.items()},
    }
    print(f"wrote {write_result(args.out, 'lane-turn', doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
