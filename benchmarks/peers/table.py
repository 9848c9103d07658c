"""The markdown table of the ``peers`` rows: a column pair per peer and protocol, the best throughput
and the lowest p99 in bold (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common import PA_DRIVER, PEERS

BEST_THROUGHPUT_CONCURRENCY = 4


def series_label(row: Mapping[str, Any]) -> str:
    """A table column group: peer and protocol, ``(pa)`` when perf_analyzer drove it."""
    pa = " (pa)" if row["driver"] == PA_DRIVER else ""
    return f"{row['peer']} {row['protocol']}{pa}"


def _series(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    order = {p: i for i, p in enumerate(PEERS)}
    seen: dict[str, tuple[int, int]] = {}
    for i, row in enumerate(rows):
        seen.setdefault(series_label(row), (order.get(str(row["peer"]), len(order)), i))
    return sorted(seen, key=lambda label: seen[label])


def best_marks(rows: Sequence[Mapping[str, Any]], best_at: int = BEST_THROUGHPUT_CONCURRENCY
               ) -> tuple[set[tuple[str, str]], set[tuple[str, int, str]]]:  # fmt: skip
    """Which cells to mark: (model, series) with the best throughput at concurrency ``best_at``, and
    (model, concurrency, series) with the lowest p99 at each concurrency. Ties mark every one."""
    best_tp: set[tuple[str, str]] = set()
    low_p99: set[tuple[str, int, str]] = set()
    for model in {str(r["model"]) for r in rows}:
        at = [
            r for r in rows if r["model"] == model and r["concurrency"] == best_at and r["throughput_per_s"]
        ]
        if at:
            top = max(float(r["throughput_per_s"]) for r in at)
            best_tp |= {(model, series_label(r)) for r in at if float(r["throughput_per_s"]) == top}
        for c in {int(r["concurrency"]) for r in rows if r["model"] == model}:
            group = [r for r in rows if r["model"] == model and r["concurrency"] == c and r["p99_us"]]
            if group:
                low = min(float(r["p99_us"]) for r in group)
                low_p99 |= {(model, c, series_label(r)) for r in group if float(r["p99_us"]) == low}
    return best_tp, low_p99


def markdown_table(rows: Sequence[Mapping[str, Any]], best_at: int = BEST_THROUGHPUT_CONCURRENCY) -> str:
    """model, concurrency, then per peer/protocol throughput/s and p99 ms; **bold**: the best
    throughput at concurrency ``best_at`` (per model) and the lowest p99 at each concurrency."""
    series = _series(rows)
    best_tp, low_p99 = best_marks(rows, best_at)
    header = ["model", "concurrency"]
    for label in series:
        header += [f"{label} /s", f"{label} p99 ms"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (2 * len(series))]
    cells = {(r["model"], int(r["concurrency"]), series_label(r)): r for r in rows}
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    for model in models:
        for c in sorted({int(r["concurrency"]) for r in rows if r["model"] == model}):
            line = [model, str(c)]
            for label in series:
                row = cells.get((model, c, label))
                line += _cells(row, c == best_at and (model, label) in best_tp, (model, c, label) in low_p99)
            lines.append("| " + " | ".join(line) + " |")
    lines += [
        "",
        f"**bold**: best throughput at concurrency {best_at} (per model); lowest p99 at each concurrency. "
        "(pa): driven by perf_analyzer; otherwise by lumenrt bench load. Throughput in requests/s (batch 1).",
    ]
    return "\n".join(lines)


def _cells(row: Mapping[str, Any] | None, best_tp: bool, low_p99: bool) -> list[str]:
    if row is None:
        return ["-", "-"]
    tp = f"{float(row['throughput_per_s']):,.1f}" if row["throughput_per_s"] is not None else "-"
    p99 = f"{float(row['p99_us']) / 1000:.2f}" if row["p99_us"] is not None else "-"
    if row.get("errors"):
        tp += f" ({row['errors']} err)"
    return [f"**{tp}**" if best_tp else tp, f"**{p99}**" if low_p99 else p99]
