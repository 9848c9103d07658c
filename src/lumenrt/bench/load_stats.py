"""From the load generator's records to the figures it reports: HdrHistogram percentiles, errors by
kind, stage means, throughput and latency per interval, and the per-request CSV.

Percentiles: an HdrHistogram over whole microseconds (1 µs .. 1 h, 3 significant digits), so a
reported value is within 0.1% (+1 µs) of the exact one; ``p<q>`` is the smallest recorded value
with at least round(q/100 * count) answers at or below it (HdrHistogram's rule).
"""

import csv
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from hdrh.histogram import HdrHistogram

from lumenrt.bench.load_run import NO_VALUE, Window

PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p99.9", 99.9))
HIGHEST_US = 3_600_000_000  # one hour: the histogram's range
SIGNIFICANT_DIGITS = 3
CSV_COLUMNS = (
    "intended_s",
    "sent_s",
    "latency_us",
    "ok",
    "error",
    "queue_us",
    "batch_us",
    "compute_us",
    "return_us",
    "batch_size",
    "process",
)
_STAGES = ("queue", "batch", "compute", "return")


def latency_histogram(latencies_us: npt.NDArray[np.float64]) -> HdrHistogram:
    hist = HdrHistogram(1, HIGHEST_US, SIGNIFICANT_DIGITS)
    for value in np.clip(np.rint(latencies_us), 1, HIGHEST_US).astype(np.int64).tolist():
        hist.record_value(value)
    return hist


def latency_summary(latencies_us: npt.NDArray[np.float64]) -> dict[str, float] | None:
    """min, mean, p50 .. p99.9, max in µs (None when nothing was answered)."""
    if not len(latencies_us):
        return None
    hist = latency_histogram(latencies_us)
    out = {"min": float(hist.get_min_value()), "mean": round(float(hist.get_mean_value()), 1)}
    for name, q in PERCENTILES:
        out[name] = float(hist.get_value_at_percentile(q))
    out["max"] = float(hist.get_max_value())
    return out


def _stage_summary(values_ns: npt.NDArray[np.int64]) -> dict[str, float] | None:
    present = values_ns[values_ns != NO_VALUE]
    if not len(present):
        return None
    us = present / 1000.0
    return {
        "mean": round(float(us.mean()), 1),
        "p50": round(float(np.percentile(us, 50)), 1),
        "p99": round(float(np.percentile(us, 99)), 1),
    }


def _interval_s(elapsed_s: float) -> float:
    """1 s bins, finer for short runs (about 20 bins, at least 0.1 s)."""
    return 1.0 if elapsed_s >= 20 else max(0.1, round(elapsed_s / 20, 1))


def summarize(columns: dict[str, npt.NDArray[Any]], window: Window) -> dict[str, Any]:
    """Counts, throughput, latency percentiles, stages and per-interval series of one run."""
    intended, done = columns["intended_ns"], columns["done_ns"]
    ok = columns["error"] == ""
    n = len(intended)
    last_done = int(done.max()) if n else window.measure_ns
    end = window.end_ns if window.end_ns is not None else last_done
    elapsed_s = max((max(end, last_done) - window.measure_ns) / 1e9, 1e-9)
    latencies_us = (done[ok] - intended[ok]) / 1000.0
    lag_us = (columns["sent_ns"] - intended) / 1000.0
    errors = Counter(str(e) for e in columns["error"][~ok])
    summary: dict[str, Any] = {
        "counts": {
            "sent": n,
            "ok": int(ok.sum()),
            "errors": int((~ok).sum()),
            "errors_by_kind": dict(sorted(errors.items())),
        },
        "elapsed_s": round(elapsed_s, 3),
        "throughput_per_s": round(float(ok.sum()) / elapsed_s, 1),
        "latency_us": latency_summary(latencies_us),
        "send_lag_us": {
            "p50": round(float(np.percentile(lag_us, 50)), 1),
            "p99": round(float(np.percentile(lag_us, 99)), 1),
        }
        if n
        else None,
    }
    stages = {name: _stage_summary(columns[f"{name}_ns"][ok]) for name in _STAGES}
    if any(v is not None for v in stages.values()):
        sizes = columns["batch_size"][ok]
        sizes = sizes[sizes != NO_VALUE]
        summary["stages_us"] = {
            **stages,
            "batch_size_mean": round(float(sizes.mean()), 2) if len(sizes) else None,
        }
    else:
        summary["stages_us"] = None
    summary["timeseries"] = timeseries(columns, window, elapsed_s)
    return summary


def timeseries(columns: dict[str, npt.NDArray[Any]], window: Window, elapsed_s: float) -> dict[str, Any]:
    """Per interval of the window: answers and errors by completion time, latency p50/p99 by intended
    send time (what a request scheduled then experienced)."""
    interval_s = _interval_s(elapsed_s)
    bins = max(1, int(np.ceil(elapsed_s / interval_s)))
    ok = columns["error"] == ""
    done_bin = np.clip(
        ((columns["done_ns"] - window.measure_ns) / 1e9 // interval_s).astype(np.int64), 0, bins - 1
    )
    sent_bin = np.clip(
        ((columns["intended_ns"] - window.measure_ns) / 1e9 // interval_s).astype(np.int64), 0, bins - 1
    )
    ok_counts = np.bincount(done_bin[ok], minlength=bins)
    err_counts = np.bincount(done_bin[~ok], minlength=bins)
    latency_us = (columns["done_ns"] - columns["intended_ns"]) / 1000.0
    p50: list[float | None] = []
    p99: list[float | None] = []
    for b in range(bins):
        chosen = latency_us[ok & (sent_bin == b)]
        p50.append(round(float(np.percentile(chosen, 50)), 1) if len(chosen) else None)
        p99.append(round(float(np.percentile(chosen, 99)), 1) if len(chosen) else None)
    # the last bin may be partial: rate over the part of it inside the window
    widths = np.full(bins, interval_s)
    widths[-1] = max(elapsed_s - interval_s * (bins - 1), 1e-9)
    return {
        "interval_s": interval_s,
        "t_s": [round(b * interval_s, 3) for b in range(bins)],
        "ok": ok_counts.tolist(),
        "errors": err_counts.tolist(),
        "throughput_per_s": [round(float(c / w), 1) for c, w in zip(ok_counts, widths, strict=True)],
        "p50_us": p50,
        "p99_us": p99,
    }


def _us(values_ns: npt.NDArray[np.int64]) -> list[str]:
    return ["" if v == NO_VALUE else f"{v / 1000:.3f}" for v in values_ns.tolist()]


def write_csv(path: Path, columns: dict[str, npt.NDArray[Any]], window: Window) -> None:
    """One row per request, in intended-send order (docs/bench-results.md)."""
    base = window.measure_ns
    ok = columns["error"] == ""
    intended = [f"{(v - base) / 1e9:.6f}" for v in columns["intended_ns"].tolist()]
    sent = [f"{(v - base) / 1e9:.6f}" for v in columns["sent_ns"].tolist()]
    latency = [
        f"{(d - i) / 1000:.3f}" if good else ""
        for d, i, good in zip(
            columns["done_ns"].tolist(), columns["intended_ns"].tolist(), ok.tolist(), strict=True
        )
    ]
    stages = [_us(columns[f"{name}_ns"]) for name in _STAGES]
    sizes = ["" if v == NO_VALUE else str(v) for v in columns["batch_size"].tolist()]
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        writer.writerows(
            zip(
                intended,
                sent,
                latency,
                (int(x) for x in ok.tolist()),
                columns["error"].tolist(),
                *stages,
                sizes,
                columns["process"].tolist(),
                strict=True,
            )
        )
    tmp.replace(path)
