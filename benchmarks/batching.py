"""Fixed against adaptive batching (engine.batching), through the server, in one run.

    .venv/bin/python benchmarks/batching.py [--models squeezenet digits_mlp] [--concurrency 4 8]
        [--rounds 2] [--load-s 8] [--out results/]

For each model, ``lumenrt serve --batching fixed`` and ``--batching adaptive`` take turns
(``--rounds`` rounds, a fresh server each turn, so neither inherits the other's warm caches); each
turn drives the model over V2 binary HTTP with ``lumenrt bench load`` (closed loop) at every
``--concurrency``, then reads from the model's statistics the batch sizes it ran and each size's
mean compute time per row (whether batching paid in that turn). SqueezeNet's server runs
``--placement roundrobin`` (a worker per usable CPU, as benchmarks/latency.py: the same compute as
its 2-session raw loop). Figures are the medians over the rounds; the raw 2-session SqueezeNet
loop of the same run is given beside them. Prints a table, writes ``batching-<stamp>.json``.
"""

import argparse
import json
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any

from lumenrt.bench.engine_load import Phase, best_raw
from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import start_serve
from roundtrip import bench_load, load_figures, markdown_table  # beside this file

ROOT = Path(__file__).resolve().parent.parent
MODES = ("fixed", "adaptive")


def drive(http: str, model: str, concurrency: int, seconds: float, out: Path) -> dict[str, float]:
    args = ["--target", f"http://{http}", "--model", model, "--concurrency", str(concurrency),
            "--duration-s", str(seconds), "--warmup-s", "1", "--no-stages", "--out", str(out),
            "--name", f"batching-{model}-c{concurrency}"]  # fmt: skip
    return load_figures(bench_load(*args))


def batch_sizes(http: str, model: str) -> dict[int, tuple[int, float]]:
    """Batch size -> (batches run, mean compute per row in µs), from the model's statistics."""
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as r:
        stats = json.load(r)["model_stats"][0]
    sizes = {}
    for b in stats["batch_stats"]:
        n, ns = b["compute_infer"]["count"], b["compute_infer"]["ns"]
        sizes[b["batch_size"]] = (n, round(ns / n / b["batch_size"] / 1000, 1) if n else 0.0)
    return sizes


def turn(
    model: str, mode: str, concurrency: list[int], seconds: float, out: Path, workers: int
) -> dict[str, Any]:
    if workers:
        extra: tuple[str, ...] = ("--workers", str(workers))
    else:
        extra = ("--placement", "roundrobin") if model == "squeezenet" else ()
    with start_serve("--models", model, "--batching", mode, *extra, cwd=str(ROOT)) as server:
        rows = {c: drive(server.http_url, model, c, seconds, out) for c in concurrency}
        return {"rows": rows, "batch_sizes": batch_sizes(server.http_url, model)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["squeezenet", "digits_mlp"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[4, 8])
    p.add_argument("--rounds", type=int, default=2, help="turns of each mode (default 2)")
    p.add_argument("--load-s", type=float, default=8.0, help="seconds per load run (default 8)")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="workers per model (serve --workers N, placed round-robin); default: SqueezeNet one per "
        "usable CPU, digits_mlp planned. On many CPUs, fewer workers than clients let batches form",
    )
    p.add_argument("--out", type=Path, default=ROOT / "results")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "kind": "batching",
        "machine": machine_info(),
        "commit": git_commit(),
        "rounds": args.rounds,
        "load_s": args.load_s,
        "workers": args.workers,
        "models": {},
    }
    for model in args.models:
        turns: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                turns[mode].append(turn(model, mode, args.concurrency, args.load_s, args.out, args.workers))
        table: dict[str, dict[str, Any]] = {}
        if model == "squeezenet":
            raw = best_raw("batching", "squeezenet", [1], Phase(1.0, args.load_s)).throughput_per_s or 0.0
            table["raw loop (2 sessions, batch 1)"] = {"throughput_per_s": round(raw, 1)}
        for c in args.concurrency:
            for mode in MODES:
                runs = [t["rows"][c] for t in turns[mode]]
                row = {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}
                row["rounds_throughput_per_s"] = [round(r["throughput_per_s"], 1) for r in runs]
                table[f"{mode} c{c}"] = row
            ratio = table[f"adaptive c{c}"]["throughput_per_s"] / table[f"fixed c{c}"]["throughput_per_s"]
            table[f"adaptive c{c}"]["x fixed"] = round(ratio, 2)
        for mode in MODES:
            table[f"{mode}: batches, µs a row (last round)"] = {"sizes": turns[mode][-1]["batch_sizes"]}
        cols = ("throughput_per_s", "x fixed", "p50_us", "p99_us", "rounds_throughput_per_s", "sizes")
        print(markdown_table(f"{model}, V2 binary HTTP, closed loop", table, cols))
        result["models"][model] = {"table": table, "turns": turns}
    path = write_result(args.out, "batching", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
