"""Worker threads against worker processes, through the server (and against another install).

    .venv/bin/python benchmarks/worker_modes.py [--modes thread process] [--targets tcp http]
        [--concurrency 1 8] [--rounds 5] [--load-s 5] [--model digits_mlp]
        [--baseline-python OTHER/bin/python] [--out results/]

What a request pays to reach a worker and come back in each worker mode: ``engine.worker_mode``
thread or process, with ``engine.lane`` "queue" so that every request goes to a worker (a small
model would otherwise run inline on the event loop, and the mode would not matter). Each round
starts a fresh ``lumenrt serve`` per mode (serve_ab.py); with ``--baseline-python`` the same modes
from that install follow in each round (e.g. a venv of an earlier commit), driven by this
install's load generator. Figures: throughput, p50, p99 and CPU µs per request of the server (all
its processes) and of the load generator, medians over the rounds, each row against the first
variant. Prints a table, writes ``worker-modes-<stamp>.json``.
"""

import argparse
import sys
from pathlib import Path

from serve_ab import ROOT, Variant, compare  # beside this file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", choices=("thread", "process"), default=["thread", "process"])
    p.add_argument("--targets", nargs="+", choices=("http", "tcp"), default=["tcp", "http"])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--load-s", type=float, default=5.0, help="measured seconds per load run")
    p.add_argument("--model", default="digits_mlp", help="a built-in model")
    p.add_argument("--baseline-python", type=Path, help="another install's interpreter: its server too")
    p.add_argument("--out", type=Path, default=ROOT / "results")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.load_s <= 0 or min(args.concurrency) < 1:
        p.error("--rounds, --load-s and every --concurrency must be > 0")
    if args.baseline_python is not None and not args.baseline_python.exists():
        p.error(f"--baseline-python: no interpreter at {args.baseline_python}")
    installs = {"": None, **({"baseline ": str(args.baseline_python)} if args.baseline_python else {})}
    variants = [
        Variant(f"{prefix}{mode}", {"worker_mode": mode, "lane": "queue"}, python)
        for mode in args.modes
        for prefix, python in installs.items()
    ]
    return compare(variants, args, model=args.model, kind="worker-modes", title=f"{args.model}, lane queue")


if __name__ == "__main__":
    sys.exit(main())
