"""A small results folder for the dashboard and report tests, written exactly as
docs/bench-results.md defines it: two ``load`` runs (JSON + CSV), a ``matrix`` file with the
load run of every row under ``matrix-<stamp>/``, and a ``peers`` file.

Numbers are deterministic (seeded) and shaped like real ones: log-normal latencies of a few
milliseconds with a short stall, a few 503s, server stages that add up to less than the latency,
and summaries computed from the rows they describe.
"""

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.bench.load_stats import CSV_COLUMNS  # the load generator's own columns

MACHINE = {
    "hostname": "fixture-host",
    "platform": "Linux-6.1-x86_64",
    "cpu_model": "Fixture CPU @ 3.0GHz",
    "nproc": 2,
    "nproc_usable": 2,
    "python": "3.11.7",
    "memory_total_bytes": 8 * 1024**3,
    "load_average": [0.5, 0.4, 0.3],
}
COMMIT = "0123456789abcdef0123456789abcdef01234567"
_STAGE_SHARES = {"queue": 0.15, "batch": 0.05, "compute": 0.65, "return": 0.05}


@dataclass(frozen=True)
class FixtureResults:
    """What ``write_results`` wrote; load runs newest first (as the dashboard lists them)."""

    root: Path
    load_paths: list[Path]
    load_names: list[str]
    matrix_path: Path
    matrix_row_paths: list[Path]
    peers_path: Path


def _iso(stamp: str) -> str:
    """``20261121T100000Z`` -> ``2026-11-21T10:00:00Z``."""
    return f"{stamp[0:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]}Z"


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def write_load_run(
    folder: Path,
    stamp: str,
    name: str,
    *,
    seed: int,
    rows: int = 400,
    duration_s: float = 10.0,
    base_latency_us: float = 4000.0,
    concurrency: int | None = 4,
    rate_per_s: float | None = None,
    stages: bool = True,
    errors: int = 3,
    label: dict[str, Any] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """One ``load-<stamp>.json`` + ``load-<stamp>.csv`` in ``folder``; the JSON path and document."""
    rng = np.random.default_rng(seed)
    intended_s = np.sort(rng.uniform(0.0, duration_s, rows))
    latency_us = base_latency_us * rng.lognormal(0.0, 0.25, rows)
    stall = (intended_s > 0.6 * duration_s) & (intended_s < 0.63 * duration_s)
    latency_us[stall] += 5 * base_latency_us  # a short stall: every request scheduled in it waits
    ok = np.ones(rows, dtype=bool)
    ok[rng.choice(rows, size=errors, replace=False)] = False
    open_loop = rate_per_s is not None
    sent_s = intended_s + (rng.uniform(0, 50e-6, rows) if open_loop else 0.0)

    csv_name = f"load-{stamp}.csv"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / csv_name).open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for i in range(rows):
            lat = float(latency_us[i]) if ok[i] else None
            stage_values = [
                _num(lat * share) if stages and lat is not None else "" for share in _STAGE_SHARES.values()
            ]
            batch = str(1 + i % 4) if stages and ok[i] else ""
            writer.writerow(
                [
                    f"{intended_s[i]:.6f}",
                    f"{sent_s[i]:.6f}",
                    _num(lat),
                    "1" if ok[i] else "0",
                    "" if ok[i] else "503",
                    *stage_values,
                    batch,
                    "0",
                ]
            )

    good = latency_us[ok]
    interval_s = 1.0
    n_intervals = int(np.ceil(duration_s / interval_s))
    bins = np.minimum((intended_s // interval_s).astype(int), n_intervals - 1)
    ok_per = [int(np.sum(ok & (bins == b))) for b in range(n_intervals)]
    err_per = [int(np.sum(~ok & (bins == b))) for b in range(n_intervals)]

    def pct(values: np.ndarray, q: float) -> float | None:
        return round(float(np.percentile(values, q)), 1) if values.size else None

    doc: dict[str, Any] = {
        "kind": "load",
        "name": name,
        "created_utc": _iso(stamp),
        "machine": MACHINE,
        "commit": COMMIT,
        "server": {
            "target": "http://127.0.0.1:8000",
            "protocol": "http",
            "model": "squeezenet",
            "version": None,
            "metadata": None,
            "config": None,
            "label": label or {},
        },
        "load": {
            "mode": "open" if open_loop else "closed",
            "concurrency": None if open_loop else concurrency,
            "rate_per_s": rate_per_s,
            "arrival": "poisson" if open_loop else None,
            "warmup_s": 2.0,
            "duration_s": duration_s,
            "requests": None,
            "processes": 1,
            "timeout_s": 30.0,
            "stages": stages,
            "inputs": "metadata",
            "input_bytes": 602112,
        },
        "counts": {
            "sent": rows,
            "ok": int(ok.sum()),
            "errors": int((~ok).sum()),
            "errors_by_kind": {"503": int((~ok).sum())} if errors else {},
        },
        "elapsed_s": duration_s,
        "throughput_per_s": round(float(ok.sum()) / duration_s, 2),
        "latency_us": {
            "min": round(float(good.min()), 1),
            "mean": round(float(good.mean()), 1),
            "p50": pct(good, 50),
            "p90": pct(good, 90),
            "p95": pct(good, 95),
            "p99": pct(good, 99),
            "p99.9": pct(good, 99.9),
            "max": round(float(good.max()), 1),
        },
        "stages_us": (
            {
                **{
                    stage: {
                        "mean": round(float(good.mean() * share), 1),
                        "p50": pct(good * share, 50),
                        "p99": pct(good * share, 99),
                    }
                    for stage, share in _STAGE_SHARES.items()
                },
                "batch_size_mean": 2.5,
            }
            if stages
            else None
        ),
        "timeseries": {
            "interval_s": interval_s,
            "t_s": [b * interval_s for b in range(n_intervals)],
            "ok": ok_per,
            "errors": err_per,
            "throughput_per_s": [n / interval_s for n in ok_per],
            "p50_us": [pct(latency_us[ok & (bins == b)], 50) for b in range(n_intervals)],
            "p99_us": [pct(latency_us[ok & (bins == b)], 99) for b in range(n_intervals)],
        },
        "csv": csv_name,
    }
    path = folder / f"load-{stamp}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path, doc


def write_matrix(root: Path, stamp: str, *, seed: int) -> tuple[Path, list[Path]]:
    """``matrix-<stamp>.json`` and one load run per row under ``matrix-<stamp>/``."""
    raw_per_s = 292.1
    configs = [("mpmc", "lumen_arena", "thread", 2, 8), ("naive", "malloc", "process", 2, 1)]
    rows: list[dict[str, Any]] = []
    row_paths: list[Path] = []
    for i, (queue, allocator, mode, workers, batch) in enumerate(configs):
        for j, load in enumerate(("fixed", "saturation")):
            minute = 1 + 2 * i + j
            row_stamp = f"{stamp[:11]}{minute:02d}00Z"
            saturated = load == "saturation"
            rate_per_s = 260.0 * (1.0 - 0.3 * i) if saturated else 120.0  # what the row achieves
            path, doc = write_load_run(
                root / f"matrix-{stamp}",
                row_stamp,
                f"matrix {queue}/{allocator}/{mode} {load}",
                seed=seed + 10 * i + j,
                rows=240,
                duration_s=240 / rate_per_s,
                base_latency_us=(9000.0 if saturated else 3500.0) * (1.0 + 0.3 * i),
                concurrency=8 if saturated else None,
                rate_per_s=None if saturated else 120.0,
                errors=0,
                label={"queue_type": queue, "allocator_type": allocator, "mode": mode},
            )
            lat = doc["latency_us"]
            rows.append(
                {
                    "queue_type": queue,
                    "allocator_type": allocator,
                    "mode": mode,
                    "workers": workers,
                    "batch_size": batch,
                    "load": load,
                    "throughput_per_s": doc["throughput_per_s"],
                    "ratio_to_raw": round(doc["throughput_per_s"] / raw_per_s, 3),
                    "p50_us": lat["p50"],
                    "p99_us": lat["p99"],
                    "p99_9_us": lat["p99.9"],
                    "max_us": lat["max"],
                    "compute_mean_us": doc["stages_us"]["compute"]["mean"],
                    "errors": 0,
                    "run": f"matrix-{stamp}/{path.name}",
                }
            )
            row_paths.append(path)
    doc = {
        "kind": "matrix",
        "created_utc": _iso(stamp),
        "machine": MACHINE,
        "commit": COMMIT,
        "model": "squeezenet",
        "raw": {"throughput_per_s": raw_per_s, "threads": 2},
        "fixed_rate_per_s": 120.0,
        "saturation_concurrency": 8,
        "rows": rows,
    }
    path = root / f"matrix-{stamp}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path, row_paths


def write_peers(root: Path, stamp: str) -> Path:
    """``peers-<stamp>.json``: four servers, two models, two concurrencies."""
    speed = {"lumenrt": 1.0, "triton": 0.93, "mlserver": 0.55, "fastapi": 0.4}
    base = {"squeezenet": (280.0, 3600.0), "digits_mlp": (9000.0, 110.0)}
    rows = []
    for model, (throughput, latency) in base.items():
        for concurrency in (1, 4):
            for peer, factor in speed.items():
                scale = concurrency ** (0.6 if model == "squeezenet" else 0.8)
                p50 = latency * concurrency / scale / factor
                rows.append(
                    {
                        "peer": peer,
                        "model": model,
                        "concurrency": concurrency,
                        "driver": "perf_analyzer",
                        "protocol": "http",
                        "throughput_per_s": round(throughput * scale * factor / 2, 1),
                        "p50_us": round(p50, 1),
                        "p90_us": round(p50 * 1.3, 1),
                        "p95_us": round(p50 * 1.5, 1),
                        "p99_us": round(p50 * 2.1, 1),
                        "errors": 0,
                    }
                )
    doc = {
        "kind": "peers",
        "created_utc": _iso(stamp),
        "machine": MACHINE,
        "commit": COMMIT,
        "peers": {peer: {"version": "fixture", "how": "written by tests"} for peer in speed},
        "rows": rows,
    }
    path = root / f"peers-{stamp}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def write_results(root: Path) -> FixtureResults:
    """The whole folder: a closed-loop run with stages, an open-loop run without, a matrix, peers."""
    root.mkdir(parents=True, exist_ok=True)
    older, _ = write_load_run(root, "20261121T100000Z", "http squeezenet c4", seed=1, concurrency=4)
    newer, _ = write_load_run(
        root,
        "20261121T110000Z",
        "http squeezenet r40",
        seed=2,
        rows=360,
        base_latency_us=5200.0,
        concurrency=None,
        rate_per_s=40.0,
        stages=False,
    )
    matrix, matrix_rows = write_matrix(root, "20261121T090000Z", seed=3)
    peers = write_peers(root, "20261121T120000Z")
    return FixtureResults(
        root=root,
        load_paths=[newer, older],
        load_names=["http squeezenet r40", "http squeezenet c4"],
        matrix_path=matrix,
        matrix_row_paths=matrix_rows,
        peers_path=peers,
    )
