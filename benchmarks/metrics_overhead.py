"""What serving metrics (and the access log) costs: the same load with them on and off, one run.

    .venv/bin/python benchmarks/metrics_overhead.py [--seconds 10] [--rounds 3] [--out results/]

Two rows, closed loop with ``lumenrt bench load`` at ``--concurrency`` (default 4): digits_mlp over
TCP and SqueezeNet over HTTP. Each row runs against ``lumenrt serve`` in these configurations:

- **off**: ``--no-metrics`` and no access log;
- **metrics**: metrics on, and this script scrapes ``GET /metrics`` every ``--scrape-s`` (default
  1 s, Prometheus's usual interval is 15 s: a busier scraper than most) while the load runs;
- **metrics+access_log** (unless ``--no-access-log``): as metrics, plus ``--access-log`` to a file.

The counting itself (each worker's bucket lists, the service's per-protocol counters) is kept
whatever the flags, since Triton-shaped statistics read it too: "off" removes the scrapes and the
exposition, not the counting. ``--baseline-python P`` adds a **baseline** configuration: the
server of another install (e.g. a venv holding the commit before the metrics), so the counting's
own cost shows as baseline against off. ``--same-server`` measures one server (metrics on) with and
without the scrapes, so that nothing but the scrapes differs between the two rows.

The servers are started once and kept (one per configuration; an idle server sleeps); the rows and
configurations are measured in interleaved rounds, and each figure is the median over the rounds.
Ratios (configuration / off) come from the same run; the issue's bar is at most 3% less
throughput and at most 5% more p50. Writes ``metrics-overhead-<stamp>.json`` with the machine, the
commit and the configuration.
"""

import argparse
import contextlib
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import ServeProcess, start_serve
from roundtrip import bench_load, load_figures  # beside this file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROWS = (("digits_mlp", "tcp"), ("squeezenet", "http"))
WARMUP_S = 1.0


class Scraper:
    """GET /metrics every ``interval_s`` in a thread, as Prometheus would, until stopped."""

    def __init__(self, http_port: int, interval_s: float) -> None:
        self._url = f"http://127.0.0.1:{http_port}/metrics"
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.scrapes = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                with urllib.request.urlopen(self._url, timeout=10) as resp:
                    resp.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1


def load(
    server: ServeProcess, model: str, protocol: str, concurrency: int, seconds: float, out: Path
) -> dict[str, float]:
    """One closed-loop ``lumenrt bench load`` run in its own process; throughput, p50, p99."""
    target = f"{protocol}://127.0.0.1:{server.ports[protocol]}"
    args = ["--target", target, "--model", model, "--metadata-url", server.http_url,
            "--concurrency", str(concurrency), "--duration-s", str(seconds),
            "--warmup-s", str(WARMUP_S), "--no-stages", "--out", str(out)]  # fmt: skip
    return load_figures(bench_load(*args))


@contextlib.contextmanager
def servers(
    configs: dict[str, list[str]], commands: dict[str, list[str]]
) -> Iterator[dict[str, ServeProcess]]:
    started: dict[str, ServeProcess] = {}
    try:
        for name, flags in configs.items():
            started[name] = start_serve(
                "--models", "digits_mlp", "squeezenet", *flags, cwd=str(ROOT), command=commands.get(name)
            )
        yield started
    finally:
        for server in started.values():
            server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per load run (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--concurrency", type=int, default=4, help="closed-loop clients (default 4)")
    ap.add_argument("--scrape-s", type=float, default=1.0, help="seconds between scrapes (default 1)")
    ap.add_argument("--no-access-log", action="store_true", help="leave out the metrics+access_log rows")
    ap.add_argument("--out", type=Path, default=ROOT / "results", help="folder for the result file")
    ap.add_argument(
        "--same-server",
        action="store_true",
        help="one server with metrics on: 'off' is it unscraped, 'metrics' scraped (no process effects)",
    )
    ap.add_argument(
        "--baseline-python", help="add a 'baseline' row: lumenrt serve from this interpreter's install"
    )
    args = ap.parse_args(argv)
    for flag in ("seconds", "rounds", "concurrency", "scrape_s"):
        if getattr(args, flag) <= 0:
            ap.error(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")

    with tempfile.TemporaryDirectory(prefix="lumenrt-metrics-overhead-") as tmp:
        scratch = Path(tmp)
        configs: dict[str, list[str]] = {"off": ["--no-metrics"], "metrics": []}
        if args.same_server:  # one server with metrics on, measured unscraped ("off") and scraped
            configs = {"off": [], "metrics": []}
        if not args.no_access_log and not args.same_server:
            configs["metrics+access_log"] = ["--access-log", str(scratch / "access.jsonl")]
        commands: dict[str, list[str]] = {}
        if args.baseline_python:
            configs["baseline"] = []
            commands["baseline"] = [args.baseline_python, "-m", "lumenrt.cli"]
        runs: dict[str, dict[str, list[dict[str, float]]]] = {
            f"{model}/{protocol}": {name: [] for name in configs} for model, protocol in ROWS
        }
        scrapes: dict[str, int] = dict.fromkeys(configs, 0)
        with servers({"metrics": []} if args.same_server else configs, commands) as started:
            if args.same_server:
                started = {"off": started["metrics"], "metrics": started["metrics"]}
            for r in range(args.rounds):
                for model, protocol in ROWS:
                    for name, server in started.items():
                        scraping = (
                            Scraper(server.ports["http"], args.scrape_s)
                            if name not in ("off", "baseline")
                            else contextlib.nullcontext()
                        )
                        with scraping as scraper:
                            got = load(server, model, protocol, args.concurrency, args.seconds, scratch)
                        if isinstance(scraper, Scraper):
                            scrapes[name] += scraper.scrapes
                            if scraper.failures:
                                raise RuntimeError(f"{name}: {scraper.failures} scrapes failed")
                        runs[f"{model}/{protocol}"][name].append(got)
                        print(
                            f"round {r + 1}/{args.rounds} {model:<10} {protocol:<4} {name:<18} "
                            f"{got['throughput_per_s']:9.1f}/s  p50 {got['p50_us']:8.1f} us  "
                            f"p99 {got['p99_us']:8.1f} us",
                            flush=True,
                        )

    results: dict[str, Any] = {}
    print(f"\n{'row':<16} {'config':<18} {'req/s':>9} {'p50 us':>9} {'p99 us':>9} {'tput x':>7} {'p50 x':>7}")
    for row, by_config in runs.items():
        medians = {
            name: {
                key: float(np.median([g[key] for g in got]))
                for key in ("throughput_per_s", "p50_us", "p99_us")
            }
            for name, got in by_config.items()
        }
        off = medians["off"]
        results[row] = {}
        for name, med in medians.items():
            ratios = {
                "throughput_ratio": round(med["throughput_per_s"] / off["throughput_per_s"], 4),
                "p50_ratio": round(med["p50_us"] / off["p50_us"], 4),
                "p99_ratio": round(med["p99_us"] / off["p99_us"], 4),
            }
            results[row][name] = {
                **{k: round(v, 1) for k, v in med.items()},
                **ratios,
                "rounds": by_config[name],
                "errors": sum(int(g["errors"]) for g in by_config[name]),
            }
            print(
                f"{row:<16} {name:<18} {med['throughput_per_s']:9.1f} {med['p50_us']:9.1f} "
                f"{med['p99_us']:9.1f} {ratios['throughput_ratio']:7.3f} {ratios['p50_ratio']:7.3f}"
            )
    payload = {
        "benchmark": "metrics_overhead",
        "machine": machine_info(),
        "commit": git_commit(ROOT),
        "config": {
            "rows": [f"{m}/{p}" for m, p in ROWS],
            "configs": configs,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "warmup_s": WARMUP_S,
            "rounds": args.rounds,
            "scrape_s": args.scrape_s,
        },
        "scrapes": scrapes,
        "results": results,
        "bar": {"throughput_ratio_min": 0.97, "p50_ratio_max": 1.05},
    }
    path = write_result(args.out, "metrics-overhead", payload)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
