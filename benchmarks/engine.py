"""Engine benchmark: the engine against raw ONNX Runtime sessions, in process (no server).

    .venv/bin/python benchmarks/engine.py [--quick] [--json] [--scenario NAME ...] [--duration-s S]
        [--warmup-s S] [--concurrency C] [--spin-us US] [--rounds N] [--out results]

Measures, in one run on this machine, with the built-in models (nothing downloaded):

* ``squeezenet``: throughput (inferences = rows per second), p50 and p99 of the engine with 2
  thread workers (mpmc / lumen_arena, the model's own dynamic batching) under a closed loop of C
  concurrent ``infer_async`` requests of one image each, against the raw baseline: 2 threads, each
  with its own ``InferenceSession`` (same session options as the engine's: intra-op 1, spinning
  off) calling ``session.run`` back to back. The raw loop runs at batch 1 and at the batch size the
  engine mostly ran; the better of the two is the baseline (fair to it), and its row says which.
  ``--rounds N`` (default 3) measures the pair N times, engine first in odd rounds and raw first
  in even ones; the ratio quoted is the median of the rounds' own ratios. On the shared 2-CPU VM
  the raw loop alone moved by 5-15% between phases of one run, as much as the engine's overhead
  (its event loop's CPU a request: ~250 us, ~100 us of it the copy into the arena, beside ~8 ms
  of compute an image), so one pair cannot tell them apart.
* ``digits-overhead``: digits_mlp at batch 1, one synchronous client: engine p50/p99 minus raw
  ``session.run`` p50/p99 on the same input, raw measured right before the engine in the same
  process; thread and process worker mode (a mode the engine does not implement yet is a
  "skipped" row).
* ``matrix``: the seed's architecture table, queue_type x allocator_type on squeezenet at full load
  (same closed loop as above): throughput, p99, mean compute time of a batch; spsc with one worker
  (it has a single consumer), the others with two; a ``raw`` row gives each its ratio.

The benchmark reports; it does not judge: there are no speed thresholds. A row that fails is
reported as an error row and makes the exit status non-zero; the other rows still run. Prints a
table (or one JSON object per row with --json) and writes ``<out>/engine-<stamp>.json`` (machine,
commit, configuration, every row). The raw loop and the rows come from ``lumenrt.bench.engine_load``
(``lumenrt bench matrix`` measures its raw limit with the same code).
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from lumenrt.bench.engine_load import (
    RAW,
    WORKERS,
    EngineCounters,
    Phase,
    Row,
    best_raw,
    closed_loop_async,
    closed_loop_threads,
    error_row,
    guarded,
    load_builtin,
    measure_raw,
    measured,
)
from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import ALLOCATOR_TYPES, DEFAULT_SPIN_US, QUEUE_TYPES, EngineConfig
from lumenrt.models.builtin import builtin_examples

SQUEEZENET = "squeezenet"
DIGITS = "digits_mlp"
SCENARIOS = ("squeezenet", "digits-overhead", "matrix")
# Guessed, then checked: 2 workers x squeezenet's preferred batch of 4; with 8 in flight every
# batch ran 4 rows in the --quick runs here (mean batch 4.0). 16 in flight was tried (commit
# a3e8cf4, one run): batches of 5-7 rows, which ONNX Runtime runs slower per row here (8.0 vs
# 7.0 ms), so 0.913 of raw against 0.922 at 8 in the run before.
DEFAULT_CONCURRENCY = 8
# Full run: 15 measured phases (squeezenet 3, digits 4, matrix 8; the matrix reuses the squeezenet
# raw row) of 8 s + 1 s warm-up, plus engine and session loads (~0.3 s each, measured with
# --quick): about 2.5 minutes, estimated from those figures.
# 8 s gives ~2,000 SqueezeNet requests per phase at the ~280 inferences/s measured here, so a p99
# rests on ~20 samples above it.
DEFAULT_DURATION_S = 8.0
DEFAULT_WARMUP_S = 1.0
# --quick: about 15-20 s in all (same phases, 0.7 s + 0.2 s each, plus loads); for tests only.
QUICK_DURATION_S = 0.7
QUICK_WARMUP_S = 0.2


# ---------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True, slots=True)
class Settings:
    phase: Phase
    concurrency: int
    scenarios: tuple[str, ...]
    spin_us: int = DEFAULT_SPIN_US
    rounds: int = 1  # squeezenet: engine/raw pairs measured, the order alternating


@dataclass(slots=True)
class Context:
    """What the scenarios share during one run."""

    settings: Settings
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> EngineConfig.to_dict()
    raw_squeezenet: Row | None = None  # the baseline of the squeezenet scenario, reused by the matrix


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _with_counters(row: Row, counters: EngineCounters) -> Row:
    row.mean_compute_us = counters.mean_compute_us
    row.mean_batch_rows = counters.mean_batch_rows
    row.batch_rows = dict(counters.batch_rows)
    return row


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else round(numerator / denominator, 3)


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 1)


# ---------------------------------------------------------------------------------------------
# Engine rows


def engine_config(
    queue_type: str = "mpmc",
    allocator_type: str = "lumen_arena",
    mode: str = "thread",
    spin_us: int = DEFAULT_SPIN_US,
) -> EngineConfig:
    # spsc serves one worker (a single consumer): EngineConfig refuses it with more than one
    return EngineConfig(
        queue_type=queue_type,
        allocator_type=allocator_type,
        worker_mode=mode,
        thread_count=1 if queue_type == "spsc" else WORKERS,
        spin_us=spin_us,
    )


def measure_engine_async(ctx: Context, scenario: str, model: str, cfg: EngineConfig) -> Row:
    """The engine under ``concurrency`` closed-loop async clients sending one row each."""
    ctx.configs[cfg.label] = cfg.to_dict()
    inputs = builtin_examples(model, 1)
    with Engine(settings=cfg, models=[model]) as engine:
        samples, counters = closed_loop_async(
            engine,
            model,
            inputs,
            rows_per_request=1,
            concurrency=ctx.settings.concurrency,
            phase=ctx.settings.phase,
        )
    row = measured(Row(scenario, model, cfg.label, clients=ctx.settings.concurrency), samples)
    return _with_counters(row, counters)


def _typical_batch(row: Row | None, model: str) -> int:
    """The batch size in which the engine ran the most rows; without a measurement, the model's
    largest preferred batch size (else its max_batch_size)."""
    if row is not None and row.batch_rows:
        return EngineCounters(batch_rows=row.batch_rows).typical_batch_rows or 1
    config = load_builtin(model).config
    db = config.dynamic_batching
    preferred = tuple(db.preferred_batch_size) if db is not None else ()
    return max(preferred) if preferred else max(config.max_batch_size, 1)


# ---------------------------------------------------------------------------------------------
# Scenarios


def run_squeezenet(ctx: Context) -> list[Row]:
    """Per round, the engine and the raw loop at batch 1 and at the batch the engine mostly ran
    (the engine's batch of the round before, when the raw loop goes first); each engine row's
    ratio is to its own round's raw row."""
    scenario, cfg = "squeezenet", engine_config(spin_us=ctx.settings.spin_us)
    rows: list[Row] = []
    raws: list[Row] = []
    batch = _typical_batch(None, SQUEEZENET)
    for round_no in range(1, ctx.settings.rounds + 1):
        engine_first = round_no % 2 == 1
        eng: Row | None = None
        raw: Row | None = None
        for step in ("engine", "raw") if engine_first else ("raw", "engine"):
            if step == "engine":
                eng = guarded(
                    scenario,
                    SQUEEZENET,
                    cfg.label,
                    partial(measure_engine_async, ctx, scenario, SQUEEZENET, cfg),
                )
                batch = _typical_batch(eng if eng.status == "ok" else None, SQUEEZENET)
            else:
                raw = best_raw(scenario, SQUEEZENET, (1, batch), ctx.settings.phase)
        assert eng is not None and raw is not None
        if ctx.settings.rounds > 1:
            for row in (raw, eng):
                row.note = f"round {round_no}" + (f"; {row.note}" if row.note else "")
        if raw.status == "ok":
            raws.append(raw)
            raw.ratio_to_raw = 1.0
            eng.ratio_to_raw = _ratio(eng.throughput_per_s, raw.throughput_per_s)
        rows += [raw, eng]
    if raws:  # the matrix's baseline: the round of the median raw throughput
        ctx.raw_squeezenet = sorted(raws, key=lambda r: r.throughput_per_s or 0.0)[(len(raws) - 1) // 2]
    return rows


def _digits_pair(ctx: Context, mode: str) -> list[Row]:
    """Raw session.run, then the engine (already loaded, workers idle), one synchronous client."""
    scenario, phase = "digits-overhead", ctx.settings.phase
    cfg = engine_config(mode=mode, spin_us=ctx.settings.spin_us)
    ctx.configs[cfg.label] = cfg.to_dict()
    try:
        engine = Engine(settings=cfg, models=[DIGITS])
    except NotImplementedError as exc:
        row = Row(scenario, DIGITS, cfg.label, status=f"skipped: {exc}", note=f"{mode} mode")
        _progress(f"  {scenario:<16} {DIGITS:<11} {cfg.label:<32} {row.status}")
        return [row]
    with engine:
        raw = guarded(scenario, DIGITS, RAW, partial(measure_raw, scenario, DIGITS, 1, 1, phase))
        raw.note = f"right before the {mode}-mode engine"
        raw.ratio_to_raw = 1.0 if raw.status == "ok" else None
        inputs = builtin_examples(DIGITS, 1)
        call = partial(engine.infer, DIGITS, inputs)

        def measure() -> Row:
            holder: list[EngineCounters] = []
            samples = closed_loop_threads(
                [call], 1, phase, at_measure=lambda: holder.append(EngineCounters.of(engine, DIGITS))
            )
            row = measured(Row(scenario, DIGITS, cfg.label, clients=1), samples)
            return _with_counters(row, EngineCounters.of(engine, DIGITS).minus(holder[0]))

        eng = guarded(scenario, DIGITS, cfg.label, measure)
    eng.overhead_p50_us = _minus(eng.p50_us, raw.p50_us)
    eng.overhead_p99_us = _minus(eng.p99_us, raw.p99_us)
    eng.ratio_to_raw = _ratio(eng.throughput_per_s, raw.throughput_per_s)
    eng.note = f"{mode} mode, sync engine.infer, one client"
    return [raw, eng]


def run_digits(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    for mode in ("thread", "process"):
        try:
            rows += _digits_pair(ctx, mode)
        except Exception as exc:  # construction failed otherwise than NotImplementedError
            rows.append(error_row("digits-overhead", DIGITS, engine_config(mode=mode).label, exc))
    return rows


def run_matrix(ctx: Context) -> list[Row]:
    scenario = "matrix"
    rows: list[Row] = []
    for queue_type in QUEUE_TYPES:
        for allocator_type in ALLOCATOR_TYPES:
            cfg = engine_config(queue_type, allocator_type, spin_us=ctx.settings.spin_us)
            row = guarded(
                scenario, SQUEEZENET, cfg.label, partial(measure_engine_async, ctx, scenario, SQUEEZENET, cfg)
            )
            if queue_type == "spsc":
                row.note = "1 worker: spsc has a single consumer"
            rows.append(row)
    if ctx.raw_squeezenet is not None:
        raw = replace(
            ctx.raw_squeezenet, scenario=scenario, note="same measurement as the squeezenet scenario"
        )
    else:
        first = rows[0] if rows[0].status == "ok" else None  # mpmc/lumen_arena
        raw = best_raw(scenario, SQUEEZENET, (1, _typical_batch(first, SQUEEZENET)), ctx.settings.phase)
        raw.ratio_to_raw = 1.0 if raw.status == "ok" else None
    for row in rows:
        row.ratio_to_raw = _ratio(row.throughput_per_s, raw.throughput_per_s)
    return [raw, *rows]


RUNNERS: dict[str, Callable[[Context], list[Row]]] = {
    "squeezenet": run_squeezenet,
    "digits-overhead": run_digits,
    "matrix": run_matrix,
}


# ---------------------------------------------------------------------------------------------
# Ratios and output


def _find(rows: Sequence[Row], scenario: str, config: str) -> Row | None:
    return next((r for r in rows if r.scenario == scenario and r.config == config), None)


def compute_ratios(rows: Sequence[Row]) -> dict[str, float | str | None]:
    """The figures the issue asks for, from rows of this run."""
    ratios: dict[str, float | str | None] = {}
    label = engine_config().label  # without the squeezenet scenario, the matrix's row of the same engine
    rounds = [r.ratio_to_raw for r in rows if r.scenario == "squeezenet" and r.config == label]
    known = [x for x in rounds if x is not None]
    if known:  # the median of the rounds' own ratios
        ratios["squeezenet_engine_over_raw_throughput"] = round(statistics.median(known), 3)
        ratios["squeezenet_engine_over_raw_by_round"] = ", ".join(f"{x:.3f}" for x in known)
    else:
        eng = _find(rows, "matrix", label)
        ratios["squeezenet_engine_over_raw_throughput"] = None if eng is None else eng.ratio_to_raw
    for mode in ("thread", "process"):
        row = _find(rows, "digits-overhead", engine_config(mode=mode).label)
        for q in ("p50", "p99"):
            key = f"digits_overhead_{q}_{mode}_us"
            if row is None or row.status != "ok":
                ratios[key] = None if row is None else row.status
            else:
                ratios[key] = row.overhead_p50_us if q == "p50" else row.overhead_p99_us
    return ratios


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _extra(row: Row) -> str:
    parts: list[str] = []
    if row.raw_batch is not None:
        parts.append(f"batch {row.raw_batch}")
    if row.mean_batch_rows is not None:
        parts.append(f"mean batch {row.mean_batch_rows}")
    if row.clients is not None:
        parts.append(f"clients {row.clients}")
    if row.n:
        parts.append(f"n={row.n}")
    if row.note:
        parts.append(row.note)
    if row.status != "ok":
        parts.append(row.status.upper() if row.status.startswith("error") else row.status)
    return "; ".join(parts)


def format_table(rows: Sequence[Row], ratios: dict[str, float | str | None], notes: Sequence[str]) -> str:
    header = (
        f"{'scenario':<16} {'model':<11} {'config':<30} {'inf/s':>9} {'p50 us':>9} {'p99 us':>9} "
        f"{'ovh p50':>8} {'ovh p99':>8} {'x raw':>6} {'compute us':>10}  extra"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.scenario:<16} {r.model:<11} {r.config:<30} {_fmt(r.throughput_per_s, 0):>9} "
            f"{_fmt(r.p50_us):>9} {_fmt(r.p99_us):>9} {_fmt(r.overhead_p50_us):>8} "
            f"{_fmt(r.overhead_p99_us):>8} {_fmt(r.ratio_to_raw, 2):>6} {_fmt(r.mean_compute_us):>10}  {_extra(r)}"
        )
    sq = ratios.get("squeezenet_engine_over_raw_throughput")
    lines += [
        "",
        "ratios (this run):",
        f"  {'squeezenet engine/raw throughput':<40} {'-' if sq is None else sq}"
        + (
            f" (median of rounds: {ratios['squeezenet_engine_over_raw_by_round']})"
            if "squeezenet_engine_over_raw_by_round" in ratios
            else ""
        ),
    ]
    for q in ("p50", "p99"):
        thread = ratios.get(f"digits_overhead_{q}_thread_us")
        process = ratios.get(f"digits_overhead_{q}_process_us")
        lines.append(f"  {f'digits overhead {q} thread/process (us)':<40} {_show(thread)} / {_show(process)}")
    lines += ["", "notes:", *(f"  - {note}" for note in notes)]
    return "\n".join(lines)


def _show(value: float | str | None) -> str:
    return "-" if value is None else str(value)


NOTES: tuple[str, ...] = (
    "inf/s = inferences (rows) per second over the measured phase; latencies per request (raw: per "
    "session.run call, of raw_batch rows) from submit to result in the client, numpy percentiles.",
    "engine rows: closed loop of `clients` asyncio tasks sending one row each (digits: one synchronous "
    "client); raw rows: threads each with its own InferenceSession (intra-op 1, spinning off), unpinned.",
    "ovh = engine percentile - raw percentile measured right before it, same input, same process.",
    "x raw = throughput / the raw row's; compute us = mean compute time of the batch a request ran in.",
    "spsc rows run 1 worker (a single consumer); the others 2.",
)


def _json_row(row: Row) -> str:
    return json.dumps(asdict(row))


# ---------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"short phases ({QUICK_DURATION_S} s + {QUICK_WARMUP_S} s warm-up; ~20 s in all), for tests",
    )
    parser.add_argument(
        "--duration-s",
        type=float,
        default=None,
        metavar="S",
        help=f"measured seconds per phase (default {DEFAULT_DURATION_S}: the full run takes ~2-3 minutes)",
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        metavar="S",
        help=f"warm-up seconds before each measured phase (default {DEFAULT_WARMUP_S})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        metavar="C",
        help=f"squeezenet and matrix: requests in flight (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="run only this scenario (repeatable; default all)",
    )
    parser.add_argument(
        "--spin-us",
        type=int,
        default=DEFAULT_SPIN_US,
        metavar="US",
        help=f"engine.spin_us for every engine row: how long idle workers and waiting callers poll "
        f"before sleeping (default {DEFAULT_SPIN_US}; 0 sleeps at once)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        metavar="N",
        help="squeezenet: engine/raw pairs, the order alternating; the ratio is their median "
        "(default 3; 1 with --quick)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print only one JSON object per row on stdout (no table)"
    )
    parser.add_argument(
        "--out", default="results", metavar="DIR", help="directory for the result file (default results/)"
    )


def _settings(args: argparse.Namespace) -> Settings | str:
    """The settings from the arguments, or what is wrong with them."""
    duration_s = (
        args.duration_s
        if args.duration_s is not None
        else (QUICK_DURATION_S if args.quick else DEFAULT_DURATION_S)
    )
    warmup_s = (
        args.warmup_s if args.warmup_s is not None else (QUICK_WARMUP_S if args.quick else DEFAULT_WARMUP_S)
    )
    if not duration_s > 0:
        return "--duration-s must be > 0"
    if not warmup_s >= 0:
        return "--warmup-s must be >= 0"
    if args.concurrency < 1:
        return "--concurrency must be >= 1"
    chosen = tuple(s for s in SCENARIOS if args.scenario is None or s in args.scenario)
    if args.spin_us < 0:
        raise SystemExit(f"--spin-us must be >= 0, got {args.spin_us}")
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        return "--rounds must be >= 1"
    return Settings(
        Phase(warmup_s=warmup_s, duration_s=duration_s), args.concurrency, chosen, args.spin_us, rounds
    )


def run_benchmark(ctx: Context, *, emit_json: bool) -> list[Row]:
    rows: list[Row] = []
    for name in ctx.settings.scenarios:
        _progress(f"[{name}]")
        produced = RUNNERS[name](ctx)
        rows += produced
        if emit_json:  # a scenario's rows together: ratios are filled once its raw row is known
            for row in produced:
                print(_json_row(row), flush=True)
    return rows


def run_from_args(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if isinstance(settings, str):
        _progress(settings)
        return 2
    ctx = Context(settings)
    started = time.monotonic()
    rows = run_benchmark(ctx, emit_json=args.json)
    elapsed = time.monotonic() - started
    ratios = compute_ratios(rows)
    if not args.json:
        print(format_table(rows, ratios, NOTES))
    payload: dict[str, Any] = {
        "benchmark": "engine",
        "machine": machine_info(),
        "commit": git_commit(),
        "config": {
            "duration_s": settings.phase.duration_s,
            "warmup_s": settings.phase.warmup_s,
            "concurrency": settings.concurrency,
            "rounds": settings.rounds,
            "workers": WORKERS,
            "raw_threads": WORKERS,
            "scenarios": list(settings.scenarios),
            "argv": sys.argv,
            "elapsed_s": round(elapsed, 1),
        },
        "configs": ctx.configs,
        "rows": [asdict(r) for r in rows],
        "ratios": ratios,
        "notes": list(NOTES),
    }
    path = write_result(Path(args.out), "engine", payload)
    _progress(f"result file: {path}")
    failed = [r for r in rows if r.status.startswith("error")]
    for r in failed:
        _progress(f"ERROR {r.scenario} {r.model} {r.config}: {r.status}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="benchmarks/engine.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
