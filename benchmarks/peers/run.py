"""lumenrt against Triton, MLServer and a plain FastAPI endpoint: one command, one result file.

    .venv/bin/python benchmarks/peers/run.py [--out results] [--quick] [--concurrency 1,2,4,8]
        [--duration-s 10] [--warmup-s 2] [--peers lumenrt,triton,mlserver,fastapi]
        [--models squeezenet,digits_mlp]

What it does, in order:
  1. Installs each peer's own virtual environment when it is missing or its pins changed (a marker
     file ``<venv>/.lumenrt-peer-pins.json`` records them): ``.venv-triton`` (nvidia-pytriton 0.7.0,
     the Makefile's ``triton-peer`` pins), ``.venv-mlserver`` (mlserver 1.7.1) and ``.venv-fastapi``
     (fastapi + uvicorn[standard]); each with the ONNX Runtime of ``.venv``. The first time that
     installs about 1 GB and takes 1-3 minutes; afterwards a second.
  2. Exports SqueezeNet and digits_mlp from lumenrt's built-in repository (``<runs>/models``) and
     writes one example input per model (``<runs>/inputs/<model>.npz``, batch 1, and the same bytes
     as perf_analyzer --input-data JSON in ``<model>.perf_analyzer-input``): every peer serves the
     same files and every driver sends the same bytes.
  3. For each peer and model, ONE SERVER AT A TIME on 127.0.0.1 free ports, two ONNX Runtime
     sessions (``intra_op_num_threads=1``) per server as lumenrt's two workers: starts it, waits until
     it answers, drives it at each concurrency (closed loop, same duration and warm-up everywhere),
     stops it (SIGTERM, SIGKILL to its process group after a bound). Drivers:
       lumenrt   ``lumenrt serve --workers 2``: perf_analyzer (HTTP), ``lumenrt bench load`` tcp, http, grpc
       triton    ``../triton_peer.py`` (PyTriton, dynamic batching as lumenrt's config): perf_analyzer
                 (HTTP), ``lumenrt bench load`` http
       mlserver  ``mlserver start`` with ``mlserver_onnx.py``, ``parallel_workers: 2``: ``lumenrt bench
                 load`` http-json (its REST API takes no binary tensors) and grpc (raw contents)
       fastapi   ``fastapi_app.py`` under ``uvicorn --workers 2``: ``lumenrt bench load`` http-raw
  4. Writes ``<out>/peers-<UTC stamp>.json`` (format: docs/bench-results.md, ``peers``), keeps every
     run's own files under ``<out>/peers-<start stamp>/`` and prints a markdown table.

How long: about 15-20 minutes for the full run with the defaults (64 measured runs of ~13 s each plus
perf_analyzer's extra windows and eight server starts); ``--quick`` (concurrency 1 and 4, 3 s runs)
about 3 minutes. Nothing else should run on the machine meanwhile: servers and drivers share its cores.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# the modules beside this file: its folder comes first on sys.path when it runs as a script
from common import DRIVERS, INTRA_OP_THREADS, MODELS, PA_DRIVER, PEERS, SESSIONS, progress
from drivers import LoadSettings, drive_server
from models import ModelSpec, export_model
from servers import SERVE, RunContext, peer_how
from table import markdown_table
from venvs import dist_version, ensure_venv, venv_is_current, venv_specs, venv_versions

DEFAULT_CONCURRENCY = (1, 2, 4, 8)
QUICK_CONCURRENCY = (1, 4)


def _peer_versions(peer: str, ctx: RunContext) -> dict[str, str]:
    if peer == "lumenrt":
        return {d: dist_version(d) for d in ("lumenrt", "onnxruntime", "numpy")}
    return venv_versions(ctx.venvs[peer])


def _peer_version(peer: str, packages: Mapping[str, str], info: Mapping[str, Any]) -> str:
    """The peer's own version: what its server reports (GET /v2) where it does, else its package's."""
    if info.get("version"):
        return str(info["version"])
    main = {"lumenrt": "lumenrt", "triton": "nvidia-pytriton", "mlserver": "mlserver", "fastapi": "fastapi"}
    return packages.get(main[peer], "?")


def run_peer(peer: str, models: Sequence[ModelSpec], concurrency: Sequence[int], settings: LoadSettings,
             ctx: RunContext, notes: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Serve each model behind ``peer`` in turn (one server at a time) and drive it."""
    rows: list[dict[str, Any]] = []
    packages = _peer_versions(peer, ctx)
    info: dict[str, Any] = {}
    for model in models:
        progress(f"starting {peer} for {model.name}")
        try:
            with SERVE[peer](model, ctx) as server:
                info = info or server.info
                rows += drive_server(peer, server, model, concurrency, settings, ctx.runs_dir, notes)
        except RuntimeError as exc:
            notes.append(f"{peer} {model.name}: {str(exc).splitlines()[0][:300]}")
            progress(f"FAILED {notes[-1]}\n{exc}")
    extra = {"server": info} if info else {}
    entry = {"version": _peer_version(peer, packages, info), "how": peer_how(peer, [m.name for m in models]),
             "packages": packages, **extra}  # fmt: skip
    if peer == "triton":
        entry["note"] = "version: Triton Inference Server core bundled with nvidia-pytriton"
    return rows, entry


def _csv_list(text: str, allowed: Sequence[str] | None = None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(allowed or ['values'])}: {text!r}"
        )
    return items


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in _csv_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers: {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"concurrency must be positive: {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/peers/run.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The result file's format: docs/bench-results.md (peers).",
    )
    p.add_argument("--out", default="results", help="results folder (default results/)")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: concurrency 1 and 4, 3 s runs, 1 s warm-up"
    )
    p.add_argument("--concurrency", type=_int_list, default=None, help="comma list (default 1,2,4,8)")
    p.add_argument("--duration-s", type=float, default=None, help="measured seconds per run (default 10)")
    p.add_argument("--warmup-s", type=float, default=None, help="warm-up seconds per run (default 2)")
    p.add_argument("--peers", type=lambda s: _csv_list(s, PEERS), default=list(PEERS),
                   help=f"comma list (default {','.join(PEERS)})")  # fmt: skip
    p.add_argument("--models", type=lambda s: _csv_list(s, MODELS), default=list(MODELS),
                   help=f"comma list (default {','.join(MODELS)})")  # fmt: skip
    p.add_argument("--load-processes", type=int, default=1, help="lumenrt bench load --processes (default 1)")
    p.add_argument(
        "--timeout-s", type=float, default=30.0, help="per-request limit of the load runs (default 30)"
    )
    p.add_argument(
        "--no-install", action="store_true", help="fail instead of creating or updating peer venvs"
    )
    return p


def load_settings(args: argparse.Namespace) -> tuple[LoadSettings, list[int]]:
    """Durations and concurrency; perf_analyzer's window is a third of the duration (it reports the
    last three stable windows, so about the same measured time as the load generator)."""
    duration_s = args.duration_s if args.duration_s is not None else (3.0 if args.quick else 10.0)
    warmup_s = args.warmup_s if args.warmup_s is not None else (1.0 if args.quick else 2.0)
    default_c = QUICK_CONCURRENCY if args.quick else DEFAULT_CONCURRENCY
    concurrency = list(args.concurrency or default_c)
    settings = LoadSettings(
        duration_s=duration_s,
        warmup_s=warmup_s,
        timeout_s=args.timeout_s,
        processes=args.load_processes,
        pa_window_ms=max(500, int(duration_s * 1000 / 3)),
        pa_stability_pct=100.0 if args.quick else 25.0,
        pa_max_trials=3 if args.quick else 10,
    )
    return settings, concurrency


def estimate_s(peers: Sequence[str], n_models: int, n_concurrency: int, settings: LoadSettings) -> float:
    """A rough wall time: load runs at warm-up + duration + ~1.5 s start, perf_analyzer at about
    4 windows, plus ~15 s per server start and stop."""
    total = 0.0
    for peer in peers:
        for driver, _protocol in DRIVERS[peer]:
            per_run = 4 * settings.pa_window_ms / 1000 + 2 if driver == PA_DRIVER else (
                settings.warmup_s + settings.duration_s + 1.5)  # fmt: skip
            total += per_run * n_models * n_concurrency
        total += 15 * n_models
    return total


def _duration_text(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def prepare(args: argparse.Namespace, stamp: str) -> tuple[RunContext, list[ModelSpec]]:
    from lumenrt.models.builtin import ensure_builtin_repository

    runs_dir = Path(args.out).resolve() / f"peers-{stamp}"  # absolute: peers run in other folders
    venvs = venv_specs()
    for peer in args.peers:
        if peer == "lumenrt":
            continue
        if args.no_install and not venv_is_current(venvs[peer]):
            raise SystemExit(f"{venvs[peer].path} is missing or out of date (run without --no-install)")
        ensure_venv(venvs[peer])
    repo = ensure_builtin_repository()
    models = [export_model(name, repo, runs_dir) for name in args.models]
    ctx = RunContext(runs_dir=runs_dir, logs_dir=runs_dir / "logs", venvs=venvs)
    ctx.logs_dir.mkdir(parents=True, exist_ok=True)
    return ctx, models


def check_perf_analyzer(peers: Sequence[str], notes: list[str]) -> None:
    from perf_analyzer import perf_analyzer_problem  # benchmarks/perf_analyzer.py (common.py)

    if any(d == PA_DRIVER for p in peers for d, _ in DRIVERS[p]):
        problem = perf_analyzer_problem()
        if problem is not None:
            notes.append(f"perf_analyzer unusable, its rows are missing: {problem}")
            progress(notes[-1])


def main(argv: Sequence[str] | None = None) -> int:
    from lumenrt.bench.results import git_commit, machine_info, utc_stamp, write_result

    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every server's finally block stops it
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(128 + signal.SIGTERM))
    settings, concurrency = load_settings(args)
    stamp = utc_stamp()
    created_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ctx, models = prepare(args, stamp)
    estimate = estimate_s(args.peers, len(models), len(concurrency), settings)
    progress(f"about {_duration_text(estimate)}: peers {','.join(args.peers)}, models "
              f"{','.join(args.models)}, concurrency {concurrency}, runs of {settings.warmup_s:g}+"
              f"{settings.duration_s:g} s; per-run files in {ctx.runs_dir}")  # fmt: skip
    notes: list[str] = []
    check_perf_analyzer(args.peers, notes)
    rows: list[dict[str, Any]] = []
    peers: dict[str, Any] = {}
    t0 = time.monotonic()
    for peer in args.peers:
        peer_rows, peers[peer] = run_peer(peer, models, concurrency, settings, ctx, notes)
        rows += peer_rows
    payload = {
        "kind": "peers",
        "created_utc": created_utc,
        "machine": machine_info(),
        "commit": git_commit(),
        "peers": peers,
        "rows": rows,
        "config": {
            "concurrency": concurrency,
            "duration_s": settings.duration_s,
            "warmup_s": settings.warmup_s,
            "perf_analyzer": {"window_ms": settings.pa_window_ms, "stability_pct": settings.pa_stability_pct,
                              "max_trials": settings.pa_max_trials},
            "load_processes": settings.processes,
            "sessions_per_server": SESSIONS,
            "intra_op_num_threads": INTRA_OP_THREADS,
            "models": {m.name: {"sha256": m.sha256, "input_file": str(m.npz_path)} for m in models},
            "runs": str(ctx.runs_dir),
            "wall_s": round(time.monotonic() - t0, 1),
        },
        "notes": notes,
    }  # fmt: skip
    path = write_result(args.out, "peers", payload)
    print(markdown_table(rows))
    for note in notes:
        print(f"\nnote: {note}")
    print(f"\nresult file: {path}")
    return 0 if rows and not notes else 1


if __name__ == "__main__":
    sys.exit(main())
