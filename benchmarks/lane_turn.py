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
import sys
from pathlib import Path

from serve_ab import ROOT, Variant, compare  # beside this file

MODEL = "digits_mlp"


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
    variants = [Variant(f"lane_turn_us {b}", {"lane_turn_us": b}) for b in args.budgets]
    return compare(variants, args, model=MODEL, kind="lane-turn", title=MODEL)


if __name__ == "__main__":
    sys.exit(main())
