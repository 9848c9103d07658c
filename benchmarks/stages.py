"""Where one synchronous batch-1 request spends its time in the engine, thread and process mode.

    .venv/bin/python benchmarks/stages.py [--requests N] [--warmup N] [--mode thread|process]
        [--spin-us US] [--out results]

One client thread sends digits_mlp requests back to back (after a warm-up) and, from each result's
stage timestamps (CLOCK_MONOTONIC, the engine's own), takes the time of every stage:

  call -> received     the Python call reaching the engine
  ingress              validate, copy the inputs once, push (received -> enqueued)
  handoff to worker    enqueued -> a worker has it (wake-up or poll)
  batch                dequeued -> compute start (batch formed, gathered)
  compute              the model call
  complete             compute end -> completed (outputs split; process mode: copied back)
  return to caller     completed -> the call returns
Prints the median (and p99) per stage for each worker mode, and writes ``<out>/stages-<stamp>.json``
(machine, commit, model, requests, spin_us, every stage's p50 and p99 per mode).
"""

import argparse
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.engine.server_config import DEFAULT_SPIN_US
from lumenrt.models.builtin import builtin_examples

MODEL = "digits_mlp"
STAGES = (
    "call -> received",
    "ingress",
    "handoff to worker",
    "batch",
    "compute",
    "complete",
    "return to caller",
    "total",
)


def measure(mode: str, requests: int, warmup: int, spin_us: int) -> dict[str, dict[str, float]]:
    """Per stage: p50 and p99 in microseconds over ``requests`` requests."""
    samples = np.zeros((requests, len(STAGES)), dtype=np.int64)
    errors: list[BaseException] = []
    with Engine(settings=EngineConfig(worker_mode=mode, spin_us=spin_us), models=[MODEL]) as engine:
        inputs = builtin_examples(MODEL, 1)

        def client() -> None:
            try:
                for _ in range(warmup):
                    engine.infer(MODEL, inputs)
                clock = time.monotonic_ns
                for i in range(requests):
                    t0 = clock()
                    t = engine.infer(MODEL, inputs).times
                    t1 = clock()
                    samples[i] = (
                        t.received_ns - t0,
                        t.enqueued_ns - t.received_ns,
                        t.dequeued_ns - t.enqueued_ns,
                        t.compute_start_ns - t.dequeued_ns,
                        t.compute_end_ns - t.compute_start_ns,
                        t.completed_ns - t.compute_end_ns,
                        t1 - t.completed_ns,
                        t1 - t0,
                    )
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=client, name="bench-stages-client")
        thread.start()
        thread.join()
    if errors:
        raise errors[0]
    p50, p99 = np.percentile(samples / 1000.0, [50, 99], axis=0)
    return {
        name: {"p50_us": round(float(a), 1), "p99_us": round(float(b), 1)}
        for name, a, b in zip(STAGES, p50, p99, strict=True)
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--requests", type=int, default=20000, help="measured requests per mode (default 20000)"
    )
    parser.add_argument("--warmup", type=int, default=2000, help="unrecorded requests first (default 2000)")
    parser.add_argument(
        "--mode",
        action="append",
        choices=("thread", "process"),
        help="worker mode (repeatable; default both)",
    )
    parser.add_argument(
        "--spin-us", type=int, default=DEFAULT_SPIN_US, help=f"engine.spin_us (default {DEFAULT_SPIN_US})"
    )
    parser.add_argument("--out", default="results", metavar="DIR", help="directory for the result file")


def run_from_args(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.warmup < 0 or args.spin_us < 0:
        raise SystemExit("--requests must be >= 1, --warmup and --spin-us >= 0")
    modes = tuple(args.mode or ("thread", "process"))
    results: dict[str, Any] = {}
    for mode in modes:
        results[mode] = measure(mode, args.requests, args.warmup, args.spin_us)
    print(f"{MODEL}, batch 1, one synchronous client, {args.requests} requests, spin_us {args.spin_us}")
    print(f"{'stage':<20}" + "".join(f"{m + ' p50':>14}{m + ' p99':>14}" for m in modes))
    for stage in STAGES:
        cells = "".join(
            f"{results[m][stage]['p50_us']:>14.1f}{results[m][stage]['p99_us']:>14.1f}" for m in modes
        )
        print(f"{stage:<20}{cells}")
    path = write_result(
        args.out,
        "stages",
        {
            "benchmark": "stages",
            "machine": machine_info(),
            "commit": git_commit(),
            "model": MODEL,
            "requests": args.requests,
            "spin_us": args.spin_us,
            "stages_us": results,
        },
    )
    print(f"result file: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/stages.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
