"""Closed-loop load for the engine benchmark (``benchmarks/engine.py``) and the raw limit of ``lumenrt
bench matrix``: a fixed number of requests kept in flight, against the engine or against raw ONNX
Runtime sessions, each request timed in the client from submit to result.

Phases (the same for every loop, so that engine and raw figures compare):
  1. warm-up: requests run unrecorded until ``warmup_s`` has passed (sessions allocate their
     buffers, the batcher's queues settle);
  2. measured: every request *submitted* in ``[start, start + duration_s)`` is recorded with its
     latency (``time.perf_counter_ns()`` around the call or the ``await``) and its rows; none is
     submitted after the end;
  3. throughput = rows recorded / (last recorded completion - start): the requests still in flight
     at the end count with the time they really took.

Two kinds of client:
  * threads (:func:`closed_loop_threads`): each thread calls its own zero-argument callable in a
    loop (``session.run`` for the raw baseline, ``engine.infer`` for a synchronous client);
  * asyncio (:func:`closed_loop_async`): ``concurrency`` tasks on one event loop, each awaiting
    ``engine.infer_async`` in a loop.

A client that is still waiting long after the end (a request never answered) turns the phase into
a ``TimeoutError`` instead of hanging the benchmark; its daemon thread is left behind.

The raw limit (:func:`best_raw`): the model in ``WORKERS`` threads, each with its own ONNX Runtime
session configured like an engine worker's, at several batch sizes, best of them. ``lumenrt bench
matrix`` gives every row a ratio to it; so do the scripts in a checkout's ``benchmarks/``
(``engine.py``, whose rows are :class:`Row`, ``serve.py``, ``latency.py``).
"""

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from lumenrt.backends.onnxruntime_backend import create_session
from lumenrt.engine.engine import Engine, placements_for
from lumenrt.engine.repository import LoadedModel, ModelRepository
from lumenrt.engine.server_config import usable_cores
from lumenrt.models.builtin import builtin_examples, ensure_builtin_repository

RAW = "raw"  # the config label of a raw-session row
WORKERS = 2  # the setup: 2 workers (one per core of this 2-core machine), 2 raw threads
# Guessed: far above any single request here (a SqueezeNet batch of 8 takes ~25 ms on this machine),
# short enough that a lost request fails the row instead of stalling the run.
STALL_GUARD_S = 30.0


@dataclass(frozen=True, slots=True)
class Phase:
    """The warm-up and measured intervals of one closed-loop run."""

    warmup_s: float
    duration_s: float


@dataclass(slots=True)
class Samples:
    """What one measured phase recorded."""

    latencies_ns: list[int] = field(default_factory=list)  # one per request, submit -> result
    rows: int = 0  # inferences (batch rows) completed by the recorded requests
    start_ns: int = 0  # perf_counter_ns at the start of the measured phase
    end_ns: int = 0  # perf_counter_ns of the last recorded completion

    @property
    def seconds(self) -> float:
        return max(self.end_ns - self.start_ns, 1) / 1e9

    @property
    def throughput_per_s(self) -> float:
        return self.rows / self.seconds

    def merge(self, other: "Samples") -> None:
        self.latencies_ns.extend(other.latencies_ns)
        self.rows += other.rows
        self.end_ns = max(self.end_ns, other.end_ns)


@dataclass(frozen=True, slots=True)
class Percentiles:
    p50_us: float
    p99_us: float


def percentiles_us(latencies_ns: Sequence[int]) -> Percentiles:
    """p50 and p99 in microseconds (numpy's default linear interpolation) over every sample."""
    p50, p99 = np.percentile(np.asarray(latencies_ns, dtype=np.float64), [50.0, 99.0]) / 1000.0
    return Percentiles(round(float(p50), 1), round(float(p99), 1))


# ---------------------------------------------------------------------------------------------
# Engine counters over the measured phase


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """The cumulative counters of ``engine.statistics(model)`` that the benchmark reports. A
    counter a runtime does not publish (process mode, so far: infer_ns, batch_rows) stays None /
    empty rather than reading as zero."""

    requests: int = 0
    batches: int = 0
    infer_ns: int | None = 0  # compute start -> end, added once per request (see mean_compute_us)
    batch_rows: Mapping[int, int] = field(default_factory=dict)  # rows -> batches of that size

    @staticmethod
    def of(engine: Engine, model: str) -> "EngineCounters":
        requests = batches = 0
        infer_ns: int | None = 0
        rows: dict[int, int] = {}
        for stats in engine.statistics(model):  # one entry per loaded version
            requests += int(stats.get("requests", 0))
            batches += int(stats.get("batches", 0))
            infer = stats.get("infer_ns")
            infer_ns = None if infer is None or infer_ns is None else infer_ns + int(infer)
            for size, n in stats.get("batch_rows", {}).items():
                rows[int(size)] = rows.get(int(size), 0) + int(n)
        return EngineCounters(requests, batches, infer_ns, rows)

    def minus(self, before: "EngineCounters") -> "EngineCounters":
        rows = {k: n - before.batch_rows.get(k, 0) for k, n in self.batch_rows.items()}
        infer_ns = (
            None if self.infer_ns is None or before.infer_ns is None else self.infer_ns - before.infer_ns
        )
        return EngineCounters(
            self.requests - before.requests,
            self.batches - before.batches,
            infer_ns,
            {k: n for k, n in sorted(rows.items()) if n > 0},
        )

    @property
    def mean_compute_us(self) -> float | None:
        """Mean compute time of the batch a request ran in (request-weighted).

        The worker adds a batch's compute time once per request in it (worker.py ``_execute``),
        so ``infer_ns / batches`` would count a batch of 8 eight times; ``infer_ns / requests``
        is the mean, over requests, of the compute time of their batch."""
        if self.requests == 0 or self.infer_ns is None:
            return None
        return round(self.infer_ns / self.requests / 1000.0, 1)

    @property
    def typical_batch_rows(self) -> int | None:
        """The batch size in which the most rows ran (None: no batch)."""
        if not self.batch_rows:
            return None
        return max(self.batch_rows, key=lambda size: size * self.batch_rows[size])

    @property
    def mean_batch_rows(self) -> float | None:
        if self.batches == 0 or not self.batch_rows:
            return None
        return round(sum(size * n for size, n in self.batch_rows.items()) / self.batches, 2)


# ---------------------------------------------------------------------------------------------
# Threads


def _thread_client(
    call: Callable[[], object], rows_per_call: int, measure_ns: int, end_ns: int, out: Samples
) -> None:
    clock = time.perf_counter_ns
    while clock() < measure_ns:  # warm-up: unrecorded
        call()
    latencies = out.latencies_ns
    last = measure_ns
    while (t0 := clock()) < end_ns:
        call()
        last = clock()
        latencies.append(last - t0)
    out.rows = len(latencies) * rows_per_call
    out.end_ns = last


def closed_loop_threads(
    calls: Sequence[Callable[[], object]],
    rows_per_call: int,
    phase: Phase,
    *,
    at_measure: Callable[[], None] | None = None,
) -> Samples:
    """One thread per callable, each calling it back to back through both phases. ``at_measure``
    runs in this (otherwise idle) thread when the measured phase starts, e.g. to snapshot counters."""
    start_ns = time.perf_counter_ns()
    measure_ns = start_ns + int(phase.warmup_s * 1e9)
    end_ns = measure_ns + int(phase.duration_s * 1e9)
    outs = [Samples(start_ns=measure_ns) for _ in calls]
    errors: list[str] = []

    def guarded(call: Callable[[], object], out: Samples) -> None:
        try:
            _thread_client(call, rows_per_call, measure_ns, end_ns, out)
        except BaseException as exc:
            errors.append(f"{threading.current_thread().name}: {type(exc).__name__}: {exc}")

    threads = [
        threading.Thread(target=guarded, args=(call, out), name=f"bench-client{i}", daemon=True)
        for i, (call, out) in enumerate(zip(calls, outs, strict=True))
    ]
    for t in threads:
        t.start()
    if at_measure is not None:
        time.sleep(max(0.0, (measure_ns - time.perf_counter_ns()) / 1e9))
        at_measure()
    deadline = time.monotonic() + phase.warmup_s + phase.duration_s + STALL_GUARD_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        raise TimeoutError(f"{', '.join(stuck)} still waiting {STALL_GUARD_S:.0f} s after the end")
    if errors:
        raise RuntimeError("; ".join(errors))
    total = Samples(start_ns=measure_ns, end_ns=measure_ns)
    for out in outs:
        total.merge(out)
    return total


# ---------------------------------------------------------------------------------------------
# asyncio


async def _async_client(
    engine: Engine,
    model: str,
    inputs: Mapping[str, Any],
    rows: int,
    measure_ns: int,
    end_ns: int,
    out: Samples,
) -> None:
    clock, infer = time.perf_counter_ns, engine.infer_async
    while clock() < measure_ns:
        await infer(model, inputs)
    latencies = out.latencies_ns
    while (t0 := clock()) < end_ns:
        await infer(model, inputs)
        t1 = clock()
        latencies.append(t1 - t0)
        out.rows += rows
        out.end_ns = max(out.end_ns, t1)


async def _async_phase(
    engine: Engine, model: str, inputs: Mapping[str, Any], rows: int, concurrency: int, phase: Phase
) -> tuple[Samples, EngineCounters]:
    start_ns = time.perf_counter_ns()
    measure_ns = start_ns + int(phase.warmup_s * 1e9)
    end_ns = measure_ns + int(phase.duration_s * 1e9)
    out = Samples(start_ns=measure_ns, end_ns=measure_ns)
    clients = [
        asyncio.create_task(_async_client(engine, model, inputs, rows, measure_ns, end_ns, out))
        for _ in range(concurrency)
    ]
    await asyncio.sleep(max(0.0, (measure_ns - time.perf_counter_ns()) / 1e9))
    before = EngineCounters.of(engine, model)
    await asyncio.gather(*clients)
    return out, EngineCounters.of(engine, model).minus(before)


def closed_loop_async(
    engine: Engine,
    model: str,
    inputs: Mapping[str, Any],
    *,
    rows_per_request: int,
    concurrency: int,
    phase: Phase,
) -> tuple[Samples, EngineCounters]:
    """``concurrency`` asyncio tasks on a fresh event loop in this thread, each awaiting
    ``engine.infer_async(model, inputs)`` back to back; the samples and the engine's counters over
    the measured phase (counters snapshot when it starts, approximately: the loop's clock)."""
    limit_s = phase.warmup_s + phase.duration_s + STALL_GUARD_S
    coro = _async_phase(engine, model, inputs, rows_per_request, concurrency, phase)
    try:
        return asyncio.run(asyncio.wait_for(coro, limit_s))
    except TimeoutError:
        raise TimeoutError(f"async clients still waiting {STALL_GUARD_S:.0f} s after the end") from None


# ---------------------------------------------------------------------------------------------
# Raw baseline: ONNX Runtime sessions configured exactly like the engine's


def load_builtin(model: str) -> LoadedModel:
    """The latest version of a built-in model, config filled from the model file (as the engine)."""
    return ModelRepository(ensure_builtin_repository()).load(model)[-1]


def raw_calls(lm: LoadedModel, threads: int, batch: int, workers: int) -> list[Callable[[], object]]:
    """One ``session.run`` callable per thread, each on its own session, configured exactly like
    an engine worker's: the placement of engine worker i (``placements_for`` over ``workers``
    engine workers: intra-op threads = cores // workers, here 1) and the backend's ``create_session``
    (spinning off, the model's own options). The raw threads are not pinned."""
    feed = builtin_examples(lm.config.name, batch)
    outputs = [spec.name for spec in lm.config.outputs]
    placements = placements_for(workers, usable_cores())
    calls: list[Callable[[], object]] = []
    for i in range(threads):
        session = create_session(lm.model_path, lm.config, placements[i % len(placements)])
        calls.append(partial(session.run, outputs, feed))
    return calls


# ---------------------------------------------------------------------------------------------
# Rows, and the raw limit: the best raw loop over several batch sizes


@dataclass(slots=True)
class Row:
    """One line of the engine benchmark's table / one JSON object (a raw row: ``config`` "raw")."""

    scenario: str
    model: str
    config: str  # "raw" for the baseline loop, else EngineConfig.label
    throughput_per_s: float | None = None  # inferences (rows) per second
    p50_us: float | None = None  # per request (raw: per session.run call), submit -> result
    p99_us: float | None = None
    overhead_p50_us: float | None = None  # batch-1 engine rows: engine p50 - raw p50 just before
    overhead_p99_us: float | None = None
    ratio_to_raw: float | None = None  # throughput / the raw row's throughput
    mean_compute_us: float | None = None  # compute time of the batch a request ran in, mean
    mean_batch_rows: float | None = None
    batch_rows: dict[int, int] | None = None  # rows -> batches of that size (measured phase)
    raw_batch: int | None = None  # raw rows: rows per session.run
    clients: int | None = None  # requests in flight (async tasks or threads)
    n: int = 0  # requests (raw: calls) recorded
    seconds: float | None = None  # the measured interval
    wall_s: float | None = None  # the whole row: loading included
    status: str = "ok"  # "ok", "skipped: <why>", "error: <what>"
    note: str | None = None


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _status(row: Row) -> str:
    if row.status != "ok":
        return row.status.upper() if row.status.startswith("error") else row.status
    return f"{_fmt(row.throughput_per_s, 0)} inf/s, p50 {_fmt(row.p50_us)} us, p99 {_fmt(row.p99_us)} us"


def error_row(scenario: str, model: str, config: str, exc: BaseException) -> Row:
    return Row(scenario, model, config, status=f"error: {type(exc).__name__}: {exc}")


def guarded(scenario: str, model: str, config: str, measure: Callable[[], Row]) -> Row:
    """``measure()``, timed, with a progress line on stderr; an exception becomes an error row (the
    run goes on)."""
    t0 = time.monotonic()
    try:
        row = measure()
    except Exception as exc:
        row = error_row(scenario, model, config, exc)
    row.wall_s = round(time.monotonic() - t0, 2)
    _progress(f"  {scenario:<16} {model:<11} {config:<32} {_status(row)} ({row.wall_s:.1f} s)")
    return row


def measured(row: Row, samples: Samples) -> Row:
    """``row`` with the throughput, percentiles and counts of ``samples``."""
    if not samples.latencies_ns:
        raise RuntimeError("no request completed in the measured phase")
    pct = percentiles_us(samples.latencies_ns)
    row.throughput_per_s = round(samples.throughput_per_s, 1)
    row.p50_us, row.p99_us = pct.p50_us, pct.p99_us
    row.n = len(samples.latencies_ns)
    row.seconds = round(samples.seconds, 3)
    return row


def measure_raw(scenario: str, model: str, threads: int, batch: int, phase: Phase) -> Row:
    calls = raw_calls(load_builtin(model), threads, batch, WORKERS)
    samples = closed_loop_threads(calls, batch, phase)
    return measured(Row(scenario, model, RAW, raw_batch=batch, clients=threads), samples)


def best_raw(scenario: str, model: str, batches: Sequence[int], phase: Phase) -> Row:
    """The raw ``WORKERS``-thread loop at each batch size; the row of the highest throughput, naming
    the others in its note."""
    rows = [
        guarded(
            scenario, model, f"{RAW} (batch {b})", partial(measure_raw, scenario, model, WORKERS, b, phase)
        )
        for b in dict.fromkeys(batches)
    ]
    ok = [r for r in rows if r.status == "ok" and r.throughput_per_s is not None]
    if not ok:
        return rows[0]
    best = max(ok, key=lambda r: r.throughput_per_s or 0.0)
    others = ", ".join(f"batch {r.raw_batch}: {r.throughput_per_s:,.0f}/s" for r in ok if r is not best)
    best.note = f"best of batch {', '.join(str(b) for b in dict.fromkeys(batches))}" + (
        f" ({others})" if others else ""
    )
    return best
