"""Queue benchmark: the native rings against queue.Queue, multiprocessing.Queue, faster-fifo, pyzmq.

    .venv/bin/python benchmarks/queues.py [--quick] [--scale F] [--json] [--scenario NAME ...]
        [--impl NAME ...] [--gap-us US] [--spin-iters N] [--out results]

Measures, in one run on this machine:

* ``pair``: Python-level cost of one push+pop (put+get) pair in a tight loop, single thread;
  for the rings also the futex syscalls they made (0 shows the busy path makes none).
* ``handoff-{thread,process}-{waiting,busy}``: one-way latency from a producer stamping
  ``perf_counter_ns()`` to the consumer holding the message, with a gap between messages so the
  consumer is really idle; the consumer either blocks in pop()/get() ("waiting", the realistic
  case) or polls ("busy").
* ``throughput-2p2c``: 2 producer processes, 2 consumer processes, items per second.

The benchmark reports; it does not judge: there are no speed thresholds. A row that fails (an impl
that errors or hangs past its bounded wait, or a throughput run that loses or duplicates items)
is reported as an error and makes the exit status non-zero. Prints a table (or one JSON object per
row with --json) and writes ``<out>/queues-<stamp>.json`` (machine, commit, configuration, every
row). faster-fifo and pyzmq come with lumenrt's 'bench' extra; without them their rows are skipped
with a note. The implementations are in ``queue_adapters.py`` beside this file.
"""

import argparse
import importlib
import importlib.util
import json
import math
import multiprocessing
import multiprocessing.queues
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.native import Region
from queue_adapters import (  # beside this file (a script's folder comes first on sys.path)
    BARRIER_TIMEOUT_S,
    END,
    IMPLS,
    PAIR,
    PROCESS,
    RECV_TIMEOUT_S,
    THREAD,
    THROUGHPUT,
    WARMUP_FRACTION,
    Config,
    Impl,
    Transport,
)

I64Array = npt.NDArray[np.int64]


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(slots=True)
class Row:
    """One line of the table / one JSON object."""

    impl: str
    scenario: str
    p50_ns: float | None
    p99_ns: float | None
    ops_per_s: float | None
    n: int
    syscalls: int | None = None
    seconds: float | None = None  # throughput: the measured interval
    wall_s: float | None = None  # the whole row, setup and process start included
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Percentiles:
    p50: float
    p99: float


def _percentiles(values: Sequence[float] | I64Array) -> Percentiles:
    p50, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50.0, 99.0])
    return Percentiles(round(float(p50), 1), round(float(p99), 1))


def _latency_row(impl: str, scenario: str, out: I64Array, n: int, errors: list[str]) -> Row:
    """A handoff row from ``out`` (out[0] = messages received, out[1:] = latencies in ns)."""
    received = int(out[0])
    if received < n and not errors:
        errors.append(f"received {received} of {n} messages")
    if errors:
        return Row(impl, scenario, None, None, None, n=received, error="; ".join(errors))
    samples = out[1 + int(n * WARMUP_FRACTION) : 1 + n]
    pct = _percentiles(samples)
    return Row(impl, scenario, pct.p50, pct.p99, None, n=len(samples))


# ---------------------------------------------------------------------------------------------
# Threads and processes, with bounded waits


def _guarded(errors: list[str], fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(f"{threading.current_thread().name}: {type(exc).__name__}: {exc}")

    return run


def _run_threads(targets: Mapping[str, Callable[[], None]], timeout_s: float) -> list[str]:
    """Run each target in a daemon thread; the errors (a hung thread is left behind, as daemon)."""
    errors: list[str] = []
    threads = [
        threading.Thread(target=_guarded(errors, fn), name=name, daemon=True) for name, fn in targets.items()
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            errors.append(f"{t.name}: still running after {timeout_s:.0f} s")
    return errors


def _join_all(procs: Sequence[BaseProcess], deadline: float) -> list[str]:
    """Join ``procs`` until ``deadline`` (monotonic); kill stragglers; what went wrong."""
    errors: list[str] = []
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            errors.append(f"{p.name}: still running at the deadline, killed")
            p.terminate()
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        elif p.exitcode != 0:
            errors.append(f"{p.name}: exit code {p.exitcode}")
    return errors


# ---------------------------------------------------------------------------------------------
# Producer / consumer bodies (shared by threads and processes)


def _produce_stamps(transport: Transport, ready: threading.Barrier, n: int, gap_s: float) -> None:
    ready.wait(BARRIER_TIMEOUT_S)  # the consumer's end exists now (a zmq PULL is bound)
    tx = transport.sender()
    try:
        send, clock, sleep = tx.send, time.perf_counter_ns, time.sleep
        send(0, 0)  # hello: the consumer starts listening for stamps once it got this
        for i in range(n):
            sleep(gap_s)  # releases the GIL: the consumer is idle (blocked or polling) meanwhile
            send(i, clock())
    finally:
        tx.close()


def _consume_latencies(
    transport: Transport,
    ready: threading.Barrier,
    out: I64Array,
    *,
    busy: bool,
    timeout_s: float | None,
) -> None:
    """After the producer's hello, receive len(out)-1 stamps; out[i] = latency of message i, out[0] = count.

    With ``timeout_s`` (threads) busy polling yields the GIL with sleep(0) and gives up after
    ``timeout_s``; without (processes) it spins bare and the parent kills a hung consumer.
    """
    rx = transport.receiver(timeout_s)
    try:
        ready.wait(BARRIER_TIMEOUT_S)
        recv, poll, clock, sleep = rx.recv, rx.poll, time.perf_counter_ns, time.sleep
        if recv() is None:  # the hello: the connection is up (a zmq connect is asynchronous)
            raise TimeoutError(f"no hello from the producer in {timeout_s} s")
        limit_ns = None if timeout_s is None else int(timeout_s * 1e9)
        for i in range(1, len(out)):
            if not busy:
                t0 = recv()
            elif limit_ns is None:
                while (t0 := poll()) is None:
                    pass
            else:
                deadline = clock() + limit_ns
                while (t0 := poll()) is None:
                    sleep(0)
                    if clock() > deadline:
                        break
            t1 = clock()
            if t0 is None:
                raise TimeoutError(f"nothing received for {timeout_s} s (message {i})")
            if t0 == END:
                raise RuntimeError(f"stream ended before message {i}")
            out[i] = t1 - t0
            out[0] = i
    finally:
        rx.close()


_START, _DONE, _COUNT, _SUM = range(4)  # columns of the throughput stats array


def _produce_ids(transport: Transport, start: threading.Barrier, ids: range, stats: I64Array) -> None:
    tx = transport.sender()
    try:
        start.wait(BARRIER_TIMEOUT_S)
        stats[_START] = time.perf_counter_ns()
        send = tx.send
        for i in ids:
            send(i, i)
        stats[_DONE] = time.perf_counter_ns()
        stats[_COUNT] = len(ids)
        stats[_SUM] = sum(ids)
    finally:
        tx.close()


def _consume_ids(transport: Transport, start: threading.Barrier, stats: I64Array) -> None:
    rx = transport.receiver(None)  # blocks without a timeout: the parent kills it if it hangs
    try:
        start.wait(BARRIER_TIMEOUT_S)
        stats[_START] = time.perf_counter_ns()
        recv = rx.recv
        count = total = 0
        while (v := recv()) != END:
            if v is None:
                raise TimeoutError("receive timed out")
            count += 1
            total += v
        stats[_DONE] = time.perf_counter_ns()
        stats[_COUNT] = count
        stats[_SUM] = total
    finally:
        rx.close()


# ---------------------------------------------------------------------------------------------
# Scenarios (one function each)


def _time_pairs(put: Callable[[int], object], get: Callable[[], object], n: int) -> int:
    clock = time.perf_counter_ns
    t0 = clock()
    for i in range(n):
        put(i)
        get()
    return clock() - t0


def run_pair(impl: Impl, cfg: Config) -> Row:
    """Per-pair cost of push+pop in one thread, over ``pair_batches`` batches of ``pair_batch``."""
    transport = impl.make(cfg)
    try:
        ops = transport.pair_ops()
        _time_pairs(ops.put, ops.get, cfg.pair_batch)  # warm-up
        per_pair = [
            _time_pairs(ops.put, ops.get, cfg.pair_batch) / cfg.pair_batch for _ in range(cfg.pair_batches)
        ]
        syscalls = transport.syscalls()
    finally:
        transport.close()
    pct = _percentiles(per_pair)
    return Row(
        impl.name,
        "pair",
        pct.p50,
        pct.p99,
        round(1e9 / pct.p50) if pct.p50 > 0 else None,
        n=cfg.pair_batch * cfg.pair_batches,
        syscalls=syscalls,
    )


def _handoff_timeout_s(cfg: Config) -> float:
    # guessed: 10x the planned duration (sleep overshoot included) plus the barrier's own timeout
    return BARRIER_TIMEOUT_S + 10 * cfg.handoff_n * (cfg.gap_s + 100e-6)


def run_handoff_thread(impl: Impl, cfg: Config, *, busy: bool) -> Row:
    """One-way latency between a producer thread and a consumer thread of this process."""
    scenario = f"handoff-thread-{'busy' if busy else 'waiting'}"
    n = cfg.handoff_n
    out: I64Array = np.zeros(n + 1, dtype=np.int64)
    ready = threading.Barrier(2)
    transport = impl.make(cfg)
    try:
        errors = _run_threads(
            {
                "consumer": partial(
                    _aborting,
                    ready,
                    partial(_consume_latencies, transport, ready, out, busy=busy, timeout_s=RECV_TIMEOUT_S),
                ),
                "producer": partial(
                    _aborting, ready, partial(_produce_stamps, transport, ready, n, cfg.gap_s)
                ),
            },
            _handoff_timeout_s(cfg),
        )
    finally:
        transport.close()
    return _latency_row(impl.name, scenario, out, n, errors)


def _aborting(barrier: threading.Barrier, fn: Callable[[], None]) -> None:
    """Run ``fn``; if it fails, break ``barrier`` so the other side does not wait for nothing."""
    try:
        fn()
    except BaseException:
        barrier.abort()
        raise


def run_handoff_process(impl: Impl, cfg: Config, *, busy: bool) -> Row:
    """One-way latency between a producer process and a consumer process (both forked)."""
    scenario = f"handoff-process-{'busy' if busy else 'waiting'}"
    ctx = multiprocessing.get_context("fork")
    n = cfg.handoff_n
    region = Region.anonymous(8 * (n + 1))  # MAP_SHARED: the children write, the parent reads
    out: I64Array = np.frombuffer(memoryview(region), dtype=np.int64)
    ready = ctx.Barrier(2)
    transport = impl.make(cfg)
    try:
        procs = [
            ctx.Process(
                target=_aborting,
                args=(ready, partial(_consume_latencies, transport, ready, out, busy=busy, timeout_s=None)),
                name=f"{impl.name}-consumer",
            ),
            ctx.Process(
                target=_aborting,
                args=(ready, partial(_produce_stamps, transport, ready, n, cfg.gap_s)),
                name=f"{impl.name}-producer",
            ),
        ]
        for p in procs:
            p.start()
        errors = _join_all(procs, time.monotonic() + _handoff_timeout_s(cfg))
        row = _latency_row(impl.name, scenario, out.copy(), n, errors)
    finally:
        transport.close()
    return row


def run_throughput(impl: Impl, cfg: Config) -> Row:
    """2 producer processes push ``throughput_per_producer`` ids each; 2 consumer processes pop all.

    Time runs from the start barrier (earliest process through it) to the last consumer done;
    the consumers stop at end of stream (ring closed / one sentinel each), sent once both
    producers have exited. Counts and id sums are checked: a loss or duplicate is an error row.
    """
    ctx = multiprocessing.get_context("fork")
    m = cfg.throughput_per_producer
    region = Region.anonymous(8 * 4 * 4)
    stats: I64Array = np.frombuffer(memoryview(region), dtype=np.int64).reshape(
        4, 4
    )  # 2 producers, 2 consumers
    start = ctx.Barrier(4)
    transport = impl.make(cfg)
    producers = [
        ctx.Process(
            target=_aborting,
            args=(start, partial(_produce_ids, transport, start, range(p * m, (p + 1) * m), stats[p])),
            name=f"{impl.name}-producer{p}",
        )
        for p in range(2)
    ]
    consumers = [
        ctx.Process(
            target=_aborting,
            args=(start, partial(_consume_ids, transport, start, stats[2 + c])),
            name=f"{impl.name}-consumer{c}",
        )
        for c in range(2)
    ]
    # guessed: the run at 20k items/s (slower than any impl here), 10x, plus process start
    deadline = time.monotonic() + BARRIER_TIMEOUT_S + 10 * 2 * m / 20_000
    try:
        for p in (*producers, *consumers):
            p.start()
        errors = _join_all(producers, deadline)
        transport.finish(len(consumers))
        errors += _join_all(consumers, deadline)
    finally:
        transport.close()
    sent, received = int(stats[:2, _COUNT].sum()), int(stats[2:, _COUNT].sum())
    sent_sum, received_sum = int(stats[:2, _SUM].sum()), int(stats[2:, _SUM].sum())
    if not errors and (received != sent or received_sum != sent_sum or sent != 2 * m):
        errors.append(
            f"LOST OR DUPLICATED ITEMS: sent {sent} (id sum {sent_sum}), received {received} (id sum {received_sum})"
        )
    if errors:
        return Row(impl.name, "throughput-2p2c", None, None, None, n=received, error="; ".join(errors))
    seconds = (int(stats[2:, _DONE].max()) - int(stats[:, _START].min())) / 1e9
    return Row(
        impl.name,
        "throughput-2p2c",
        None,
        None,
        round(received / seconds),
        n=received,
        seconds=round(seconds, 4),
    )


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    group: str
    run: Callable[[Impl, Config], Row]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("pair", PAIR, run_pair),
    Scenario("handoff-thread-waiting", THREAD, partial(run_handoff_thread, busy=False)),
    Scenario("handoff-thread-busy", THREAD, partial(run_handoff_thread, busy=True)),
    Scenario("handoff-process-waiting", PROCESS, partial(run_handoff_process, busy=False)),
    Scenario("handoff-process-busy", PROCESS, partial(run_handoff_process, busy=True)),
    Scenario("throughput-2p2c", THROUGHPUT, run_throughput),
)

NOTES: tuple[str, ...] = (
    "pair: one thread, push+pop back to back; ops/s = pairs/s = 1e9/p50; syscalls = ring futex waits+wakes.",
    "handoff: one-way latency perf_counter_ns() at send -> at receive; the producer sleeps a gap "
    "between messages so the consumer is idle; first 5% dropped as warm-up.",
    "handoff-thread-busy polls with time.sleep(0) between tries: it releases the GIL so the producer "
    "thread can run (a bare spin would starve it); handoff-process-busy spins bare.",
    "throughput-2p2c: 2 producer + 2 consumer processes, one item per push/pop; ops/s = items received/s.",
)


# ---------------------------------------------------------------------------------------------
# Ratios


@dataclass(frozen=True, slots=True)
class Ratio:
    key: str
    label: str
    scenario: str
    numerator: str
    denominator: str | None = None  # None: the numerator's p50 in microseconds


RATIOS: tuple[Ratio, ...] = (
    Ratio(
        "pair_queue.Queue_over_mpmc",
        "pair cost: queue.Queue / mpmc (x cheaper)",
        "pair",
        "queue.Queue",
        "mpmc",
    ),
    Ratio(
        "process_waiting_p50_multiprocessing.Queue_over_mpmc",
        "process waiting p50: multiprocessing.Queue / mpmc",
        "handoff-process-waiting",
        "multiprocessing.Queue",
        "mpmc",
    ),
    Ratio(
        "process_waiting_p50_faster-fifo_over_mpmc",
        "process waiting p50: faster-fifo / mpmc",
        "handoff-process-waiting",
        "faster-fifo",
        "mpmc",
    ),
    Ratio("thread_waiting_p50_mpmc_us", "thread waiting p50 mpmc (us)", "handoff-thread-waiting", "mpmc"),
    Ratio(
        "thread_waiting_p50_queue.Queue_us",
        "thread waiting p50 queue.Queue (us)",
        "handoff-thread-waiting",
        "queue.Queue",
    ),
)


def _p50(rows: Sequence[Row], impl: str, scenario: str) -> float | None:
    for r in rows:
        if r.impl == impl and r.scenario == scenario:
            return r.p50_ns
    return None


def compute_ratios(rows: Sequence[Row]) -> dict[str, float | None]:
    ratios: dict[str, float | None] = {}
    for spec in RATIOS:
        num = _p50(rows, spec.numerator, spec.scenario)
        if spec.denominator is None:
            ratios[spec.key] = None if num is None else round(num / 1000, 2)
            continue
        den = _p50(rows, spec.denominator, spec.scenario)
        ratios[spec.key] = None if num is None or not den else round(num / den, 2)
    return ratios


# ---------------------------------------------------------------------------------------------
# Output


def _fmt_us(ns: float | None) -> str:
    if ns is None:
        return "-"
    us = ns / 1000
    return f"{us:.3f}" if us < 10 else f"{us:.1f}"


def _fmt_ops(ops: float | None) -> str:
    return "-" if ops is None or math.isnan(ops) else f"{ops:,.0f}"


def _extra(row: Row) -> str:
    parts = [f"n={row.n}"]
    if row.syscalls is not None:
        parts.append(f"syscalls={row.syscalls}")
    if row.seconds is not None:
        parts.append(f"in {row.seconds:.3f}s")
    if row.error is not None:
        parts.append(f"ERROR: {row.error}")
    return " ".join(parts)


def format_table(rows: Sequence[Row], ratios: Mapping[str, float | None], notes: Sequence[str]) -> str:
    header = f"{'impl':<22} {'scenario':<24} {'p50 us':>9} {'p99 us':>9} {'ops/s':>13}  extra"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.impl:<22} {r.scenario:<24} {_fmt_us(r.p50_ns):>9} {_fmt_us(r.p99_ns):>9} {_fmt_ops(r.ops_per_s):>13}  {_extra(r)}"
        )
    lines += ["", "ratios (this run):"]
    for spec in RATIOS:
        value = ratios.get(spec.key)
        lines.append(f"  {spec.label:<52} {'-' if value is None else value}")
    lines += ["", "notes:", *(f"  - {note}" for note in notes)]
    return "\n".join(lines)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Planning and running


@dataclass(frozen=True, slots=True)
class Task:
    scenario: Scenario
    impl: Impl


@dataclass(frozen=True, slots=True)
class Plan:
    tasks: tuple[Task, ...]
    notes: tuple[str, ...]  # what was left out, and why


def _available(module: str | None) -> bool:
    return module is None or importlib.util.find_spec(module) is not None


def make_plan(scenarios: Sequence[str] | None, impls: Sequence[str] | None) -> Plan:
    chosen_impls = [i for i in IMPLS if impls is None or i.name in impls]
    notes: list[str] = []
    usable: list[Impl] = []
    for impl in chosen_impls:
        if _available(impl.requires):
            usable.append(impl)
        else:
            notes.append(
                f"{impl.name} skipped: module {impl.requires!r} not installed (pip install 'lumenrt[bench]')"
            )
    tasks: list[Task] = []
    for sc in SCENARIOS:
        if scenarios is not None and sc.name not in scenarios:
            continue
        for impl in usable:
            if sc.group in impl.groups:
                tasks.append(Task(sc, impl))
            elif sc.group in impl.not_in:
                notes.append(f"{impl.name} not in {sc.name}: {impl.not_in[sc.group]}")
    return Plan(tuple(tasks), tuple(notes))


def _run_task(task: Task, cfg: Config) -> Row:
    t0 = time.monotonic()
    try:
        row = task.scenario.run(task.impl, cfg)
    except Exception as exc:  # one broken impl must not stop the others
        row = Row(
            task.impl.name, task.scenario.name, None, None, None, n=0, error=f"{type(exc).__name__}: {exc}"
        )
    row.wall_s = round(time.monotonic() - t0, 3)
    return row


def _status(row: Row) -> str:
    if row.error is not None:
        return f"ERROR {row.error}"
    parts = []
    if row.p50_ns is not None and row.p99_ns is not None:
        parts.append(f"p50 {_fmt_us(row.p50_ns)} us, p99 {_fmt_us(row.p99_ns)} us")
    if row.ops_per_s is not None:
        parts.append(f"{_fmt_ops(row.ops_per_s)} ops/s")
    return ", ".join(parts)


def run_benchmark(cfg: Config, plan: Plan, *, emit_json: bool) -> list[Row]:
    rows: list[Row] = []
    total = len(plan.tasks)
    for k, task in enumerate(plan.tasks, 1):
        row = _run_task(task, cfg)
        rows.append(row)
        _progress(f"[{k:2d}/{total}] {row.impl:<22} {row.scenario:<24} {_status(row)} ({row.wall_s:.1f} s)")
        if emit_json:
            print(json.dumps(asdict(row)), flush=True)
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="small counts (~10 s), for tests and development"
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, metavar="FLOAT", help="multiply all counts (default 1.0)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print only one JSON object per row on stdout (no table)"
    )
    parser.add_argument(
        "--out", default="results", metavar="DIR", help="directory for the result file (default results/)"
    )
    parser.add_argument(
        "--gap-us",
        type=float,
        default=200.0,
        metavar="US",
        help="handoff: producer sleep between messages in microseconds (default 200, guessed: well "
        "above the futex wake path, so the consumer is really asleep/idle)",
    )
    parser.add_argument(
        "--spin-iters",
        type=int,
        default=-1,
        metavar="N",
        help="native rings: busy polls of a blocking pop/push before it sleeps on the futex "
        "(default -1: the ring's default); compare e.g. 0 and 256 on your machine",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in SCENARIOS],
        help="run only this scenario (repeatable; default all)",
    )
    parser.add_argument(
        "--impl",
        action="append",
        choices=[i.name for i in IMPLS],
        help="run only this impl (repeatable; default all)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    if not args.scale > 0:
        _progress("--scale must be > 0")
        return 2
    if not args.gap_us >= 0:
        _progress("--gap-us must be >= 0")
        return 2
    cfg = Config.preset(
        quick=args.quick, scale=args.scale, gap_s=args.gap_us / 1e6, spin_iters=args.spin_iters
    )
    plan = make_plan(args.scenario, args.impl)
    for note in plan.notes:
        _progress(f"note: {note}")
    started = time.monotonic()
    rows = run_benchmark(cfg, plan, emit_json=args.json)
    elapsed = time.monotonic() - started
    ratios = compute_ratios(rows)
    notes = (*NOTES, *plan.notes)
    if not args.json:
        print(format_table(rows, ratios, notes))
    payload: dict[str, Any] = {
        "benchmark": "queues",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            **asdict(cfg),
            "warmup_fraction": WARMUP_FRACTION,
            "recv_timeout_s": RECV_TIMEOUT_S,
            "scenarios": list(dict.fromkeys(t.scenario.name for t in plan.tasks)),
            "impls": [i.name for i in IMPLS if any(t.impl is i for t in plan.tasks)],
            "argv": sys.argv,
            "elapsed_s": round(elapsed, 1),
        },
        "rows": [asdict(r) for r in rows],
        "ratios": ratios,
        "notes": list(notes),
    }
    path = write_result(Path(args.out), "queues", payload)
    _progress(f"result file: {path}")
    failed = [r for r in rows if r.error is not None]
    for r in failed:
        _progress(f"ERROR {r.impl} {r.scenario}: {r.error}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/queues.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
