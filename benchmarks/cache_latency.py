"""The response cache's hit path against a miss: digits_mlp, batch 1, c1 round trips over TCP.

    .venv/bin/python benchmarks/cache_latency.py [--n 2000] [--rounds 5] [--out results/]

One ``lumenrt serve`` (``--cache-size-bytes`` 64 MiB; measured over TCP) serves two copies of digits_mlp
from a temporary repository: ``digits_cached`` enables ``response_cache`` and ``digits_plain``
does not. Four rows, measured in interleaved blocks of ``--n`` requests, ``--rounds`` rounds:

- **hit**: the same input every time (after one warm-up request stored it);
- **miss**: a fresh input every request (never sent before), so each one pays the key, the lookup,
  the model and the store;
- **off**: the same input to the model without the cache (the path without any cache work);
- **off_fresh**: a fresh input every request to the model without the cache (what a miss costs
  beyond it is the cache's own work: key, lookup, store).

Each figure is the median over the rounds of that round's p50 (p99); the ratios are from the same
run. Writes ``cache-latency-<stamp>.json`` with the machine, the commit and the configuration.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import start_serve
from lumenrt.client.tcp import TcpClient
from lumenrt.models.builtin import ensure_builtin_repository

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHED, PLAIN = "digits_cached", "digits_plain"
CACHE_SIZE_BYTES = 64 << 20  # guessed: far above what the miss rows store (~100 bytes an entry)
WARMUP = 300


def make_repository(root: Path) -> Path:
    source = ensure_builtin_repository() / "digits_mlp"
    for name in (CACHED, PLAIN):
        shutil.copytree(source, root / name)
    config = root / CACHED / "config.yaml"
    config.write_text(config.read_text() + "response_cache: {enable: true}\n")
    return root


def timed(client: TcpClient, model: str, inputs: Iterator[np.ndarray], n: int) -> list[int]:
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        x = next(inputs)
        t0 = clock()
        client.infer(model, {"input": x})
        out.append(clock() - t0)
    return out


def same(x: np.ndarray) -> Iterator[np.ndarray]:
    while True:
        yield x


def fresh(seed: int) -> Iterator[np.ndarray]:
    """Inputs never sent before: a counter written into the first element keeps them distinct."""
    base = np.random.default_rng(seed).random((1, 64), dtype=np.float32)
    i = 0
    while True:
        i += 1
        x = base.copy()
        x[0, 0] = float(i)
        yield x


def percentiles(latencies_ns: list[int]) -> tuple[float, float]:
    a = np.asarray(latencies_ns, dtype=np.float64) / 1000.0
    p50, p99 = np.percentile(a, [50, 99])
    return float(p50), float(p99)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="requests per block (default 2000)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the rows (default 5)")
    ap.add_argument("--out", type=Path, default=ROOT / "results", help="folder for the result file")
    args = ap.parse_args(argv)
    if args.n < 1 or args.rounds < 1:
        ap.error("--n and --rounds must be >= 1")

    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    misses, plain_fresh = fresh(1), fresh(2)
    rows: dict[str, Callable[[TcpClient, int], list[int]]] = {
        "hit": lambda c, n: timed(c, CACHED, same(x), n),
        "miss": lambda c, n: timed(c, CACHED, misses, n),
        "off": lambda c, n: timed(c, PLAIN, same(x), n),
        "off_fresh": lambda c, n: timed(c, PLAIN, plain_fresh, n),
    }
    p50s: dict[str, list[float]] = {k: [] for k in rows}
    p99s: dict[str, list[float]] = {k: [] for k in rows}
    serve_args = ["--repository", "", "--cache-size-bytes", str(CACHE_SIZE_BYTES)]
    with tempfile.TemporaryDirectory(prefix="lumenrt-cache-bench-") as tmp:
        serve_args[1] = str(make_repository(Path(tmp)))
        with (
            start_serve(*serve_args, cwd=str(ROOT)) as server,
            TcpClient("127.0.0.1", server.ports["tcp"]) as client,
        ):
            for row in rows.values():
                row(client, WARMUP)
            for _ in range(args.rounds):
                for name, row in rows.items():
                    p50, p99 = percentiles(row(client, args.n))
                    p50s[name].append(p50)
                    p99s[name].append(p99)

    table = {
        name: {
            "p50_us": round(float(np.median(p50s[name])), 2),
            "p99_us": round(float(np.median(p99s[name])), 2),
        }
        for name in rows
    }
    ratios = {
        "hit_over_miss_p50": round(table["hit"]["p50_us"] / table["miss"]["p50_us"], 3),
        "hit_over_miss_p99": round(table["hit"]["p99_us"] / table["miss"]["p99_us"], 3),
        "miss_over_off_fresh_p50": round(table["miss"]["p50_us"] / table["off_fresh"]["p50_us"], 3),
    }
    print(f"digits_mlp c1 over TCP, median of {args.rounds} rounds of {args.n} requests")
    print(f"{'row':9} {'p50 us':>9} {'p99 us':>9}")
    for name, figures in table.items():
        print(f"{name:9} {figures['p50_us']:9.1f} {figures['p99_us']:9.1f}")
    print(json.dumps(ratios))
    payload: dict[str, Any] = {
        "benchmark": "cache_latency",
        "machine": machine_info(),
        "commit": git_commit(ROOT),
        "config": {
            "model": "digits_mlp",
            "protocol": "tcp",
            "concurrency": 1,
            "n": args.n,
            "rounds": args.rounds,
            "warmup": WARMUP,
            "cache_size_bytes": CACHE_SIZE_BYTES,
            "python": sys.version.split()[0],
        },
        "rows": table,
        "rounds_p50_us": p50s,
        "rounds_p99_us": p99s,
        "ratios": ratios,
    }
    path = write_result(args.out, "cache-latency", payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
