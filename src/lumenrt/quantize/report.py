"""What ``lumenrt quantize`` reports: sizes, latency and throughput at batch 1 and at the preferred
batch, and agreement on held-out samples, FP32 against INT8; as a table and as JSON (with the
machine, the commit and the settings, like every result file)."""

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lumenrt.quantize.agreement import Agreement
from lumenrt.quantize.quantizer import Settings
from lumenrt.quantize.timing import ROUNDS, Timing

KIND = "lumenrt-quantize"
MODELS = ("fp32", "int8")


def build_report(
    *,
    model: str,
    paths: Mapping[str, Path],
    settings: Settings,
    preprocess: str,
    calibration: tuple[str, int] | None,
    agreement: Agreement,
    timings: Mapping[int, Mapping[str, Timing]],
    threads: int,
    seconds: float,
    quantize_s: float,
) -> dict[str, Any]:
    """The report's JSON form. ``paths`` and each of ``timings`` (by batch) are keyed fp32, int8."""
    from lumenrt.bench.results import git_commit, machine_info

    sizes = {name: paths[name].stat().st_size for name in MODELS}
    return {
        "kind": KIND,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": model,
        "files": {name: str(paths[name]) for name in MODELS},
        "settings": {**settings.to_json(), "preprocess": preprocess},
        "calibration": None if calibration is None else {"source": calibration[0], "samples": calibration[1]},
        "quantize_s": round(quantize_s, 3),
        "size_bytes": {**sizes, "ratio": round(sizes["int8"] / sizes["fp32"], 3)},
        "performance": {
            "threads": threads,
            "seconds_per_measurement": seconds,
            "turns": ROUNDS,
            "batches": {
                str(batch): {
                    **{name: by_model[name].to_json() for name in MODELS},
                    "speedup": round(by_model["int8"].per_s / by_model["fp32"].per_s, 3),
                }
                for batch, by_model in timings.items()
            },
        },
        "agreement": agreement.to_json(),
        "machine": machine_info(),
        "commit": git_commit(),
    }


def format_table(report: Mapping[str, Any]) -> str:
    settings = report["settings"]
    calibration = report["calibration"]
    perf = report["performance"]
    lines = [
        f"lumenrt quantize: {report['model']} -> {report['files']['int8']} ({report['quantize_s']:.1f} s)",
        f"  {_settings_label(settings)}; pre-processing: {settings['preprocess']}",
        "  calibration: "
        + (
            "none (dynamic)"
            if calibration is None
            else f"{calibration['source']}, {calibration['samples']} samples"
        ),
        f"  measured: {perf['threads']} intra-op thread(s), {perf['seconds_per_measurement']:g} s per model "
        f"and batch, FP32 and INT8 in {perf['turns']} alternating turns",
        "",
        f"  {'':<20}{'FP32':>12}{'INT8':>12}{'INT8/FP32':>11}",
    ]
    sizes = report["size_bytes"]
    lines.append(_row("size (bytes)", sizes["fp32"], sizes["int8"], "{:,}"))
    for batch, by_model in perf["batches"].items():
        fp32, int8 = by_model["fp32"], by_model["int8"]
        lines.append(_row(f"batch {batch} p50 (µs)", fp32["p50_us"], int8["p50_us"], "{:,.1f}"))
        lines.append(_row(f"batch {batch} p99 (µs)", fp32["p99_us"], int8["p99_us"], "{:,.1f}"))
        lines.append(_row(f"batch {batch} samples/s", fp32["per_s"], int8["per_s"], "{:,.1f}"))
    agreement = report["agreement"]
    lines += [
        "",
        f"  held out: {agreement['held_out']}, {agreement['samples']} samples, output {agreement['output']!r}",
        "  "
        + (
            "top-1 agreement: n/a (one value per sample)"
            if agreement["top1_agreement"] is None
            else f"top-1 agreement {agreement['top1_agreement']:.2%}"
        )
        + f", max abs error {agreement['max_abs_error']:.4g}, mean abs error {agreement['mean_abs_error']:.3g}",
    ]
    accuracy = agreement["accuracy"]
    if accuracy is not None:
        points = (accuracy["int8"] - accuracy["fp32"]) * 100
        lines.append(
            f"  accuracy vs labels: FP32 {accuracy['fp32']:.2%}, INT8 {accuracy['int8']:.2%} ({points:+.2f} points)"
        )
    return "\n".join(lines)


def write_report(path: Path, report: dict[str, Any]) -> None:
    from lumenrt.bench.results import write_json

    write_json(path, report)


def _settings_label(settings: Mapping[str, Any]) -> str:
    return Settings(
        settings["method"], settings["per_channel"], settings["reduce_range"], settings["symbolic_shapes"]
    ).label


def _row(label: str, fp32: float, int8: float, fmt: str) -> str:
    ratio = int8 / fp32 if fp32 else float("nan")
    return f"  {label:<20}{fmt.format(fp32):>12}{fmt.format(int8):>12}{ratio:>11.2f}"
