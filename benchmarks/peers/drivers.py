"""Load against a running server: ``lumenrt bench load`` as a subprocess and perf_analyzer, every
driver of a peer at every concurrency, and the ``peers`` result rows made from what they report."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import DRIVERS, LOAD_DRIVER, PA_DRIVER, progress
from models import ModelSpec
from servers import Server

LOAD_SLACK_S = 90.0  # a load run's time limit beyond warm-up + duration


@dataclass(frozen=True)
class LoadSettings:
    duration_s: float
    warmup_s: float
    timeout_s: float
    processes: int
    pa_window_ms: int
    pa_stability_pct: float
    pa_max_trials: int


def load_command(target: str, model: str, concurrency: int, settings: LoadSettings, input_file: Path,
                 out_dir: Path, name: str, metadata_url: str | None) -> list[str]:  # fmt: skip
    cmd = [
        sys.executable, "-m", "lumenrt.cli", "bench", "load",
        "--target", target, "--model", model, "--concurrency", str(concurrency),
        "--duration-s", f"{settings.duration_s:g}", "--warmup-s", f"{settings.warmup_s:g}",
        "--timeout-s", f"{settings.timeout_s:g}", "--processes", str(settings.processes),
        "--input-file", str(input_file), "--no-stages", "--name", name, "--out", str(out_dir), "--json",
    ]  # fmt: skip
    if metadata_url is not None:
        cmd += ["--metadata-url", metadata_url]
    return cmd


def parse_load_json(stdout: str) -> dict[str, Any]:
    """The summary JSON ``lumenrt bench load --json`` printed (the first ``{`` on to the end)."""
    start = stdout.find("{")
    if start < 0:
        raise ValueError("no JSON summary on stdout")
    summary: dict[str, Any] = json.loads(stdout[start:])
    return summary


def drive_load(target: str, model: ModelSpec, concurrency: int, settings: LoadSettings, out_dir: Path,
               name: str, metadata_url: str | None) -> dict[str, Any]:  # fmt: skip
    """One ``lumenrt bench load`` run as a subprocess; its summary (``load`` format)."""
    cmd = load_command(target, model.name, concurrency, settings, model.npz_path, out_dir, name, metadata_url)
    limit_s = settings.warmup_s + settings.duration_s + LOAD_SLACK_S
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"lumenrt bench load ran past {limit_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"lumenrt bench load exited {proc.returncode}: {tail}")
    return parse_load_json(proc.stdout)


def drive_perf_analyzer(http_base: str, model: ModelSpec, concurrency: int,
                        settings: LoadSettings) -> dict[str, float]:  # fmt: skip
    from perf_analyzer import run_perf_analyzer  # benchmarks/perf_analyzer.py (common.py)

    return run_perf_analyzer(
        model.name,
        http_base,
        "http",
        concurrency=concurrency,
        measurement_ms=settings.pa_window_ms,
        input_data=str(model.pa_json_path),
        stability_percentage=settings.pa_stability_pct,
        max_trials=settings.pa_max_trials,
    )


ROW_KEYS = ("peer", "model", "concurrency", "driver", "protocol", "throughput_per_s",
            "p50_us", "p90_us", "p95_us", "p99_us", "errors")  # fmt: skip


def row_from_summary(peer: str, model: str, protocol: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """A ``peers`` row from a ``lumenrt bench load`` summary."""
    latency = summary["latency_us"]
    return {
        "peer": peer,
        "model": model,
        "concurrency": int(summary["load"]["concurrency"]),
        "driver": LOAD_DRIVER,
        "protocol": protocol,
        "throughput_per_s": round(float(summary["throughput_per_s"]), 1),
        "p50_us": _us(latency.get("p50")),
        "p90_us": _us(latency.get("p90")),
        "p95_us": _us(latency.get("p95")),
        "p99_us": _us(latency.get("p99")),
        "errors": int(summary["counts"]["errors"]),
    }


def row_from_perf_analyzer(peer: str, model: str, figures: Mapping[str, float]) -> dict[str, Any]:
    """A ``peers`` row from :func:`perf_analyzer.run_perf_analyzer` figures (HTTP); a run
    that ends has no errors (perf_analyzer fails on any)."""
    return {
        "peer": peer,
        "model": model,
        "concurrency": int(figures["concurrency"]),
        "driver": PA_DRIVER,
        "protocol": "http",
        "throughput_per_s": round(float(figures["throughput_infer_per_s"]), 1),
        "p50_us": _us(figures.get("p50_us")),
        "p90_us": _us(figures.get("p90_us")),
        "p95_us": _us(figures.get("p95_us")),
        "p99_us": _us(figures.get("p99_us")),
        "errors": 0,
    }


def _us(value: Any) -> float | None:
    return None if value is None else round(float(value), 1)


def _run_label(peer: str, driver: str, protocol: str, model: str, concurrency: int) -> str:
    via = "pa" if driver == PA_DRIVER else "load"
    return f"{peer} {via} {protocol} {model} c{concurrency}"


def drive_server(peer: str, server: Server, model: ModelSpec, concurrency: Sequence[int],
                 settings: LoadSettings, out_dir: Path, notes: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """Every driver of ``peer`` at every concurrency against a running server; failures go to notes."""
    rows: list[dict[str, Any]] = []
    for driver, protocol in DRIVERS[peer]:
        for c in concurrency:
            label = _run_label(peer, driver, protocol, model.name, c)
            progress(label)
            try:
                if driver == PA_DRIVER:
                    figures = drive_perf_analyzer(server.targets[protocol], model, c, settings)
                    rows.append(row_from_perf_analyzer(peer, model.name, figures))
                else:
                    summary = drive_load(server.targets[protocol], model, c, settings, out_dir, label,
                                         server.metadata_url)  # fmt: skip
                    rows.append(row_from_summary(peer, model.name, protocol, summary))
            except Exception as exc:  # one failed run must not lose the others
                first = str(exc).strip().splitlines()
                notes.append(f"{label}: {first[0][:300] if first else type(exc).__name__}")
                progress(f"FAILED {notes[-1]}")
    return rows
