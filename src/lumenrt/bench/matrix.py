"""``lumenrt bench matrix``: the seed's architecture table, reproduced through the real server.

For each configuration (queue_type x allocator_type x worker mode x batch size x lane x
loop_spin_us, 2 workers, spsc 1 as it has one consumer; plus one-worker mpmc rows) it starts
``lumenrt serve`` with it, drives the model over the binary TCP protocol with the load generator
of ``lumenrt bench load`` (this process, separate from the server):

- ``fixed``: open loop at one offered rate for every row (default: half the raw limit), so latency
  is compared at equal work; latency is measured from the intended send time;
- ``saturation``: closed loop with ``--concurrency`` clients (default 8), for throughput;

and stops it. The batch size is the model's ``max_batch_size``, set in a copy of the model's
config (the ONNX file is linked, not copied). In the same run, before the servers, the raw limit:
the model in 2 ONNX Runtime threads in this process (best of batch 1, 4, 8), so each row has a
ratio to it. Writes ``matrix-<stamp>.json`` and every row's load run under ``matrix-<stamp>/``.
"""

import argparse
import itertools
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lumenrt.bench.load_cli import run_plan
from lumenrt.bench.load_inputs import inputs_from_metadata, payload_bytes
from lumenrt.bench.load_run import LoadPlan
from lumenrt.bench.load_targets import fetch_model_info
from lumenrt.bench.results import git_commit, machine_info, utc_stamp, write_json
from lumenrt.bench.serve_process import start_serve

QUEUE_TYPES = ("mpmc", "spsc", "naive", "batched")
ALLOCATORS = ("lumen_arena", "standard")
MODES = ("thread", "process")
LANES = ("queue", "inline", "auto")  # engine/lane.py; default rows: auto, what `lumenrt serve` uses
BATCH_SIZES = (1, 8)
WORKERS = 2


@dataclass(frozen=True)
class Config:
    queue_type: str
    allocator_type: str
    mode: str
    workers: int
    batch_size: int
    lane: str = "auto"
    loop_spin_us: int = 0  # the event loop's polling after each request (ingress/loop_spin.py)

    @property
    def label(self) -> str:
        spin = f"/spin{self.loop_spin_us}" if self.loop_spin_us else ""
        return f"{self.queue_type}/{self.allocator_type}/{self.mode}/w{self.workers}/b{self.batch_size}/{self.lane}{spin}"

    def serve_args(self) -> list[str]:
        return [
            "--queue-type",
            self.queue_type,
            "--allocator",
            self.allocator_type,
            "--mode",
            self.mode,
            "--workers",
            str(self.workers),
            "--lane",
            self.lane,
            "--loop-spin-us",
            str(self.loop_spin_us),
        ]


def configs(args: argparse.Namespace) -> list[Config]:
    """Every served combination. ``standard`` with process workers is no configuration (the engine
    refuses it: process workers always read requests from the shared arena), so it has no row."""
    rows = [
        Config(q, a, m, 1 if q == "spsc" else WORKERS, b, lane, spin)  # spsc has one consumer: one worker
        for q, a, m, b, lane, spin in itertools.product(
            args.queue_types, args.allocators, args.modes, args.batch_sizes, args.lanes, args.loop_spin_us
        )
        if not (a == "standard" and m == "process")
    ]
    if args.single_worker:  # the seed's "one worker: half the throughput", on the default architecture
        rows += [
            Config("mpmc", "lumen_arena", m, 1, max(args.batch_sizes), args.lanes[0], args.loop_spin_us[0])
            for m in args.modes
        ]
    return rows


def repository_with_batch(source: Path, model: str, batch_size: int, dest: Path) -> Path:
    """A repository holding ``model`` from ``source`` with ``max_batch_size: batch_size`` (and
    preferred batch sizes above it dropped); version folders are linked, not copied."""
    src = source / model
    out = dest / f"b{batch_size}"
    target = out / model
    if target.exists():
        return out
    target.mkdir(parents=True)
    config_path = next(p for p in (src / "config.yaml", src / "config.yml") if p.exists())
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    if int(config.get("max_batch_size", 0)) < 1:
        raise ValueError(f"model {model!r} does not batch (max_batch_size 0): the matrix needs one that does")
    config["max_batch_size"] = batch_size
    batching = config.get("dynamic_batching")
    if isinstance(batching, dict) and "preferred_batch_size" in batching:
        kept = [b for b in batching["preferred_batch_size"] if b <= batch_size]
        if kept:
            batching["preferred_batch_size"] = kept
        else:
            del batching["preferred_batch_size"]
    (target / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    for item in src.iterdir():  # the version folders: hard links where they can be, else copies
        if item.is_dir():  # (not symlinks: the repository refuses what resolves outside it)
            shutil.copytree(item.resolve(), target / item.name, copy_function=_link_or_copy)
    return out


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)


def _raw_limit(model: str, duration_s: float) -> dict[str, Any]:
    from lumenrt.bench.engine_load import Phase, best_raw

    row = best_raw("matrix", model, [1, 4, 8], Phase(1.0, duration_s))
    return {
        "throughput_per_s": row.throughput_per_s,
        "threads": WORKERS,
        "batch": row.raw_batch,
        "note": row.note,
    }


def _row(
    config: Config, load: str, summary: dict[str, Any], raw_per_s: float | None, run: str
) -> dict[str, Any]:
    lat = summary.get("latency_us") or {}
    stages = summary.get("stages_us") or {}
    compute = stages.get("compute") if isinstance(stages, dict) else None
    throughput = summary["throughput_per_s"]
    return {
        "queue_type": config.queue_type,
        "allocator_type": config.allocator_type,
        "mode": config.mode,
        "workers": config.workers,
        "batch_size": config.batch_size,
        "lane": config.lane,
        "loop_spin_us": config.loop_spin_us,
        "load": load,
        "throughput_per_s": throughput,
        "ratio_to_raw": round(throughput / raw_per_s, 3) if raw_per_s else None,
        "p50_us": lat.get("p50"),
        "p99_us": lat.get("p99"),
        "p99_9_us": lat.get("p99.9"),
        "max_us": lat.get("max"),
        "compute_mean_us": compute.get("mean") if isinstance(compute, dict) else None,
        "batch_size_mean": stages.get("batch_size_mean") if isinstance(stages, dict) else None,
        "errors": summary["counts"]["errors"],
        "run": run,
    }


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.2f}"


def format_table(doc: dict[str, Any]) -> str:
    raw = doc.get("raw") or {}
    lines = [
        f"architecture matrix, model {doc['model']}: raw limit {raw.get('throughput_per_s') or 0:.1f}/s "
        f"({raw.get('threads')} ONNX Runtime threads); fixed load {doc['fixed_rate_per_s']:.0f}/s open loop, "
        f"saturation {doc['saturation_concurrency']} clients closed loop",
        "| queue | allocator | mode | workers | batch | lane | loop spin µs | load | throughput/s | x raw | p50 ms "
        "| p99 ms | p99.9 ms | compute ms | mean batch | errors |",
        "|---|---|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        ratio = "-" if r["ratio_to_raw"] is None else f"{r['ratio_to_raw']:.2f}"
        lines.append(
            f"| {r['queue_type']} | {r['allocator_type']} | {r['mode']} | {r['workers']} | {r['batch_size']} "
            f"| {r.get('lane', 'queue')} | {r.get('loop_spin_us', 0)} | {r['load']} | {r['throughput_per_s']:.1f} | {ratio} | {_ms(r['p50_us'])} | {_ms(r['p99_us'])} "
            f"| {_ms(r['p99_9_us'])} | {_ms(r['compute_mean_us'])} | {r.get('batch_size_mean') or '-'} "
            f"| {r['errors']} |"
        )
    return "\n".join(lines)


def _progress(msg: str) -> None:
    print(f"[matrix] {msg}", file=sys.stderr, flush=True)


def _measure(
    config: Config,
    repo: Path,
    args: argparse.Namespace,
    runs_dir: Path,
    raw_per_s: float | None,
    fixed_rate: float,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with start_serve(
        "--repository",
        str(repo),
        "--models",
        args.model,
        *config.serve_args(),
    ) as server:
        metadata, model_config = fetch_model_info(server.http_url, args.model, None)
        inputs = inputs_from_metadata(metadata, model_config)
        target = f"tcp://127.0.0.1:{server.ports['tcp']}"
        loads = [
            (
                "fixed",
                LoadPlan(
                    target,
                    args.model,
                    inputs,
                    mode="open",
                    rate_per_s=fixed_rate,
                    warmup_s=args.warmup_s,
                    duration_s=args.duration_s,
                ),
            ),
            (
                "saturation",
                LoadPlan(
                    target,
                    args.model,
                    inputs,
                    mode="closed",
                    concurrency=args.concurrency,
                    warmup_s=args.warmup_s,
                    duration_s=args.duration_s,
                ),
            ),
        ]
        for load, plan in loads:
            outcome = run_plan(
                plan,
                out_dir=runs_dir,
                name=f"{config.label} {load}",
                server={
                    "target": target,
                    "protocol": "tcp",
                    "model": args.model,
                    "version": None,
                    "metadata": metadata,
                    "config": model_config,
                    "label": {**config.__dict__, "load": load},
                },
                load_extra={"inputs": "metadata", "input_bytes": payload_bytes(inputs)},
            )
            row = _row(config, load, outcome.summary, raw_per_s, str(outcome.json_path.relative_to(args.out)))
            rows.append(row)
            _progress(f"{config.label} {load}: {row['throughput_per_s']:.1f}/s p99 {_ms(row['p99_us'])} ms")
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="squeezenet", help="a built-in model that batches (default squeezenet)")
    p.add_argument("--queue-types", nargs="+", default=list(QUEUE_TYPES), choices=QUEUE_TYPES)
    p.add_argument("--allocators", nargs="+", default=list(ALLOCATORS), choices=ALLOCATORS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--batch-sizes", nargs="+", type=int, default=list(BATCH_SIZES), help="max batch sizes (default 1 8)"
    )
    p.add_argument(
        "--lanes",
        nargs="+",
        default=["auto"],
        choices=LANES,
        help="inline lane settings (default auto; 'queue inline' compares them, e.g. with --model digits_mlp)",
    )
    p.add_argument(
        "--loop-spin-us",
        nargs="+",
        type=int,
        default=[0],
        help="the event loop's polling after each request, µs (serve --loop-spin-us; default 0; "
        "'0 200' compares them)",
    )
    p.add_argument(
        "--no-single-worker", dest="single_worker", action="store_false", help="leave out the one-worker rows"
    )
    p.add_argument(
        "--fixed-rate",
        type=float,
        default=None,
        help="offered rate of the fixed-load runs, per second (default: half the raw limit)",
    )
    p.add_argument("--concurrency", type=int, default=8, help="closed-loop clients at saturation (default 8)")
    p.add_argument("--duration-s", type=float, default=5.0, help="measured seconds per run (default 5)")
    p.add_argument("--warmup-s", type=float, default=1.0, help="warm-up seconds per run (default 1)")
    p.add_argument("--raw-duration-s", type=float, default=3.0, help="seconds per raw batch size (default 3)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a short run: mpmc and batched, thread mode, batch 8, 2 s per run",
    )
    p.add_argument("--out", default="results", help="results folder (default results/)")


def run_from_args(args: argparse.Namespace) -> int:
    if args.quick:
        args.queue_types, args.modes, args.batch_sizes = ["mpmc", "batched"], ["thread"], [8]
        args.duration_s, args.warmup_s, args.raw_duration_s = 2.0, 0.5, 1.0
    if any(b < 1 for b in args.batch_sizes):
        print("lumenrt bench matrix: --batch-sizes must be at least 1", file=sys.stderr)
        return 2
    if any(us < 0 for us in args.loop_spin_us):
        print("lumenrt bench matrix: --loop-spin-us must be at least 0", file=sys.stderr)
        return 2
    from lumenrt.models.builtin import ensure_builtin_repository

    source = ensure_builtin_repository()
    if not (source / args.model).is_dir():
        print(f"lumenrt bench matrix: --model {args.model!r} is not a built-in model", file=sys.stderr)
        return 2
    stamp = utc_stamp()
    out = Path(args.out)
    runs_dir = out / f"matrix-{stamp}"
    runs_dir.mkdir(parents=True, exist_ok=True)
    _progress(f"raw limit: {args.model} in {WORKERS} ONNX Runtime threads")
    raw = _raw_limit(args.model, args.raw_duration_s)
    raw_per_s = raw["throughput_per_s"]
    fixed_rate = args.fixed_rate or round((raw_per_s or 100.0) / 2)
    doc: dict[str, Any] = {
        "kind": "matrix",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "commit": git_commit(),
        "model": args.model,
        "protocol": "tcp",
        "raw": raw,
        "fixed_rate_per_s": fixed_rate,
        "saturation_concurrency": args.concurrency,
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "rows": [],
    }
    path = out / f"matrix-{stamp}.json"
    repos = runs_dir / "repositories"
    for config in configs(args):
        repo = repository_with_batch(source, args.model, config.batch_size, repos)
        try:
            doc["rows"] += _measure(config, repo, args, runs_dir, raw_per_s, fixed_rate)
        except (RuntimeError, OSError, ValueError) as exc:  # one failed configuration is a row, not the end
            _progress(f"{config.label}: failed: {exc}")
            doc.setdefault("failed", []).append({"config": config.label, "error": str(exc)[-2000:]})
        write_json(path, doc)  # after every configuration: an interrupted run keeps what it measured
    print(format_table(doc))
    print(f"wrote {path}")
    return 0 if not doc.get("failed") else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lumenrt bench matrix", description=__doc__)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
