"""One-client round trips under each idle policy of a KVM guest's CPUs, in one run.

    sudo .venv/bin/python benchmarks/cpu_idle.py [--halt-poll-ns 0,200000] [--repeats 3] [--n 3000]
        [--loop-spin-us N]

digits_mlp batch 1 at one client, measured as benchmarks/latency.py measures it: the echo floor,
the HTTP echo floor, lumenrt TCP, lumenrt HTTP binary and FastAPI inline (1 worker). Each value of the guest's
``guest_halt_poll_ns`` (the cpuidle-haltpoll driver: how long an idle vCPU polls before it halts;
placement/cpu_idle.py) gets a block of every row per round, and the values take turns each round.
The value is written to ``/sys/module/haltpoll/parameters/guest_halt_poll_ns``, so this needs root
and the haltpoll driver (anything else is refused before a server starts); the value found there
is put back when the run ends, by an exception or SIGTERM too. Prints per value the medians of
the rounds (p50, p99, the share of round trips over 1.5x the p50, and the timer interrupts a
second while they ran) and the ratios of issue #12's c1 lines, and writes ``cpu-idle-<stamp>.json``.
"""

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from latency import (  # beside this file
    DEFAULT_FASTAPI,
    MODEL,
    WARMUP,
    Measure,
    echo_floors,
    fastapi_measure,
    fastapi_server,
    fastapi_venv,
    http_measure,
    lumenrt_server,
    tcp_measure,
)
from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.models.builtin import builtin_examples, ensure_builtin_repository
from lumenrt.placement.cpu_idle import CpuIdle, read_cpu_idle
from roundtrip import markdown_table, stats

HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


@contextlib.contextmanager
def halt_poll_ns(value: int | None) -> Iterator[None]:
    """``guest_halt_poll_ns`` set to ``value`` inside, the old value back after (None: untouched)."""
    if value is None:
        yield
        return
    old = HALT_POLL.read_text().strip()
    HALT_POLL.write_text(f"{value}\n")
    try:
        yield
    finally:
        HALT_POLL.write_text(f"{old}\n")


def check_settable(idle: CpuIdle) -> str | None:
    """Why ``guest_halt_poll_ns`` cannot be set on a machine whose idle CPUs read ``idle``, or None."""
    if idle.driver != "haltpoll" or idle.guest_halt_poll_ns is None:
        return f"the cpuidle driver is {idle.driver!r}, not haltpoll: there is no guest_halt_poll_ns to set"
    try:
        with HALT_POLL.open("r+"):
            pass
    except OSError as exc:
        return f"{HALT_POLL}: {exc} (run as root)"
    return None


BLOCK_FIGURES = ("p50_us", "p99_us", "over_1.5x_p50", "timer_irq_per_s")


def timer_interrupts() -> int:
    """Local timer interrupts so far, every CPU (``/proc/interrupts``' LOC line; 0 where absent)."""
    try:
        with open("/proc/interrupts") as f:
            for line in f:
                name, _, rest = line.strip().partition(":")
                if name == "LOC":
                    return sum(int(x) for x in rest.split() if x.isdigit())
    except OSError:
        pass
    return 0


def block(measure: Measure, n: int) -> dict[str, float]:
    """``n`` round trips: their percentiles, the share of them over 1.5x their p50 (the c1 line
    p99/p50 <= 1.5 holds exactly when that share is under 1%), and the timer interrupts a second
    meanwhile (on a VM each costs tens of µs; a round trip that one lands in is a slow one)."""
    ticks, start = timer_interrupts(), time.monotonic()
    latencies = measure(n)
    elapsed, ticks = time.monotonic() - start, timer_interrupts() - ticks
    out = stats(latencies)
    limit = 1.5 * out["p50_us"] * 1000
    out["over_1.5x_p50"] = round(sum(1 for x in latencies if x > limit) / len(latencies), 4)
    out["timer_irq_per_s"] = round(ticks / elapsed, 1) if elapsed > 0 else 0.0
    return out


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # the finally blocks put the value back and stop the servers


def ratios(rtt: dict[str, dict[str, float]]) -> dict[str, float]:
    """Issue #12's c1 ratios, and every row's p99/p50 (the echo floor's and FastAPI's show what the
    machine itself gives that line)."""
    fa, echo = rtt["FastAPI inline (1 worker)"]["p50_us"], rtt["echo floor"]["p50_us"]
    tcp, http = rtt["lumenrt TCP"]["p50_us"], rtt["lumenrt HTTP binary"]["p50_us"]
    floor = rtt["HTTP echo floor"]["p50_us"]  # the same client against prebuilt answers
    out = {
        "tcp_p50_over_fastapi": round(tcp / fa, 3),
        "tcp_p50_over_echo": round(tcp / echo, 3),
        "http_p50_over_fastapi": round(http / fa, 3),
        # each server's part of the round trip: above what the client and the loopback take
        "http_over_floor_over_fastapi_over_floor": round((http - floor) / (fa - floor), 3),
    }
    if "lumenrt spin TCP" in rtt:
        out["spin tcp_p50_over_fastapi"] = round(rtt["lumenrt spin TCP"]["p50_us"] / fa, 3)
        out["spin http_p50_over_fastapi"] = round(rtt["lumenrt spin HTTP binary"]["p50_us"] / fa, 3)
    for name, row in rtt.items():
        out[f"{name} p99/p50"] = round(row["p99_us"] / row["p50_us"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--halt-poll-ns",
        default="0,200000",
        help="comma list of guest_halt_poll_ns values to compare (default 0,200000: halting at once, "
        "and the kernel's default)",
    )
    p.add_argument("--n", type=int, default=3000, help="requests per row per block (default 3000)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; figures are their medians (default 3)")
    p.add_argument(
        "--loop-spin-us",
        type=int,
        default=0,
        help="also measure a server given --loop-spin-us N (its event loop polls instead of the "
        "CPU: rows 'lumenrt spin TCP' and 'lumenrt spin HTTP binary'; default 0, none)",
    )
    p.add_argument("--fastapi-python", type=Path, default=DEFAULT_FASTAPI)
    p.add_argument("--out", type=Path, default=Path("results"))
    args = p.parse_args(argv)
    try:
        values = [int(v) for v in args.halt_poll_ns.split(",") if v]
    except ValueError:
        p.error(f"--halt-poll-ns: comma list of integers, got {args.halt_poll_ns!r}")
    if not values or any(v < 0 for v in values):
        p.error("--halt-poll-ns: one value at least, none negative")
    found = read_cpu_idle()
    why = check_settable(found)
    if why is not None:
        print(f"cpu_idle.py: {why}", file=sys.stderr)
        return 2
    if args.fastapi_python == DEFAULT_FASTAPI:
        fastapi_venv()
    signal.signal(signal.SIGTERM, _sigterm)
    inputs = builtin_examples(MODEL, 1)
    model_path = ensure_builtin_repository() / MODEL / "1" / "model.onnx"
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(lumenrt_server(None))
        api_port = stack.enter_context(fastapi_server(args.fastapi_python, model_path, 1))[0]
        rows: dict[str, Measure] = echo_floors(stack, server, inputs)
        targets = [
            ("lumenrt TCP", tcp_measure, server.ports["tcp"]),
            ("lumenrt HTTP binary", http_measure, server.ports["http"]),
            ("FastAPI inline (1 worker)", fastapi_measure, api_port),
        ]
        if args.loop_spin_us:
            spin = stack.enter_context(lumenrt_server(None, extra=("--loop-spin-us", str(args.loop_spin_us))))
            targets += [
                ("lumenrt spin TCP", tcp_measure, spin.ports["tcp"]),
                ("lumenrt spin HTTP binary", http_measure, spin.ports["http"]),
            ]
        for label, make, port in targets:
            measure, close = make(port, inputs)
            rows[label] = measure
            stack.callback(close)
        rounds: dict[int, dict[str, list[dict[str, float]]]] = {v: {r: [] for r in rows} for v in values}
        for _ in range(args.repeats):
            for value in values:
                with halt_poll_ns(value):
                    for measure in rows.values():
                        measure(WARMUP)
                    for name, measure in rows.items():
                        rounds[value][name].append(block(measure, args.n))
    result: dict[str, Any] = {
        "model": MODEL,
        "n": args.n,
        "repeats": args.repeats,
        "loop_spin_us": args.loop_spin_us,
        "found": found.as_dict(),
        "settings": {},
    }
    for value, by_row in rounds.items():
        rtt = {
            name: {
                **{k: float(np.median([g[k] for g in got])) for k in BLOCK_FIGURES},
                "rounds_p50_us": [g["p50_us"] for g in got],  # type: ignore[dict-item]
            }
            for name, got in by_row.items()
        }
        got_ratios = ratios(rtt)
        result["settings"][str(value)] = {"round_trips": rtt, "ratios": got_ratios}
        title = f"guest_halt_poll_ns={value}: c1 round trips (us; medians of rounds)"
        print(markdown_table(title, rtt, (*BLOCK_FIGURES, "rounds_p50_us")))
        print(json.dumps(got_ratios, indent=1))
    head = {"kind": "cpu-idle", "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = write_result(
        args.out, "cpu-idle", {**head, "machine": machine_info(), "commit": git_commit(), **result}
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
