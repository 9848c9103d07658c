"""Plotly figures of result files, shared by the Streamlit app and the static HTML report.

Every builder takes parsed runs (``results``) and returns a ``plotly.graph_objects.Figure``, or None
when the run lacks the data (no timeseries, no stages). Titles and axis labels carry units. Point
counts are bounded (``max_points``), so a long run still draws quickly and keeps the report small.
"""

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from lumenrt.dashboard.results import (
    PERCENTILES,
    STAGES,
    FloatArray,
    LoadRun,
    LoadSamples,
    MatrixRun,
    PeersRun,
)

MAX_SCATTER_POINTS = 20_000
"""Default bound on the points of a latency-over-time scatter (SVG stays responsive below it)."""

_CDF_POINTS = 2_000  # per curve: spread evenly over ranks, plus every point of the top ranks
_HEIGHT_PX = 420
_COLORS = qualitative.Plotly
_STAGE_COLORS = dict(zip(STAGES, ("#636EFA", "#FFA15A", "#00CC96", "#AB63FA"), strict=True))


_LEGEND_BELOW = {"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0}
"""Below the x axis title: above the plot the legend would sit under plotly's mode bar."""
_LEGEND_RIGHT = {"orientation": "v", "yanchor": "top", "y": 1.0, "xanchor": "left", "x": 1.02}
"""Subplot figures keep the legend at the right: below, it would cover the lower panels' axes."""


def _style(fig: go.Figure, title: str, x_title: str | None, y_title: str | None, **layout: Any) -> go.Figure:
    legend = layout.pop("legend", _LEGEND_BELOW)
    fig.update_layout(
        title={"text": title},
        template="plotly_white",
        height=layout.pop("height", _HEIGHT_PX),
        margin={"l": 60, "r": 20, "t": 60, "b": 100 if legend is _LEGEND_BELOW else 50},
        legend=legend,
        **layout,
    )
    if x_title is not None:
        fig.update_xaxes(title_text=x_title)
    if y_title is not None:
        fig.update_yaxes(title_text=y_title)
    return fig


def display_names(runs: Sequence[LoadRun]) -> list[str]:
    """Run names for legends, made unique (a repeated name gets its creation time appended)."""
    counts = Counter(run.name for run in runs)
    names = [run.name if counts[run.name] == 1 else f"{run.name} @ {run.created_utc}" for run in runs]
    seen: Counter[str] = Counter()
    out = []
    for name in names:
        seen[name] += 1
        out.append(name if seen[name] == 1 else f"{name} #{seen[name]}")
    return out


# --- one load run ----------------------------------------------------------------------------------


def downsample_indices(latency_us: FloatArray, max_points: int) -> npt.NDArray[np.intp]:
    """At most ``max_points`` indices into ``latency_us``, in order: every tenth slot goes to the
    slowest requests (so spikes survive), the rest to an even stride over the whole run."""
    n = latency_us.size
    if n <= max_points:
        return np.arange(n, dtype=np.intp)
    slowest = max(1, max_points // 10)
    top = np.argpartition(np.nan_to_num(latency_us, nan=-np.inf), n - slowest)[n - slowest :]
    stride = np.linspace(0, n - 1, max_points - slowest).astype(np.intp)
    return np.unique(np.concatenate([top, stride]))


def latency_over_time(run: LoadRun, samples: LoadSamples, max_points: int = MAX_SCATTER_POINTS) -> go.Figure:
    """Every (or a bounded sample of) ok request's latency at its intended send time: jitter,
    stalls and warm-up drift show as structure; p50/p99 per interval drawn over it."""
    mask = samples.ok & ~np.isnan(samples.latency_us)
    t_s, latency_us = samples.intended_s[mask], samples.latency_us[mask]
    keep = downsample_indices(latency_us, max_points)
    shown = f"{keep.size:,} of {latency_us.size:,} requests" if keep.size < latency_us.size else None
    fig = go.Figure(
        go.Scatter(
            x=t_s[keep],
            y=latency_us[keep],
            mode="markers",
            name="request",
            marker={"size": 3, "opacity": 0.5, "color": _COLORS[0]},
            hovertemplate="t=%{x:.3f} s<br>latency=%{y:,.0f} µs<extra></extra>",
        )
    )
    series = run.timeseries
    if series is not None:
        mid_s = [t + series.interval_s / 2 for t in series.t_s]
        for key, values, color in (("p50", series.p50_us, "#222222"), ("p99", series.p99_us, "#EF553B")):
            if len(values) == len(mid_s):
                fig.add_trace(
                    go.Scatter(
                        x=mid_s, y=values, mode="lines", name=f"{key} per interval", line={"color": color}
                    )
                )
    title = f"Latency over time (µs): {run.name}" + (f" ({shown})" if shown else "")
    return _style(fig, title, "intended send time (s from window start)", "latency (µs)")


def throughput_over_time(run: LoadRun) -> go.Figure | None:
    """ok answers per second, and errors per second, in each interval of the measured window."""
    series = run.timeseries
    if series is None or not series.t_s:
        return None
    fig = go.Figure(
        go.Scatter(
            x=series.t_s,
            y=series.throughput_per_s,
            mode="lines+markers",
            name="ok answers",
            line={"shape": "hv", "color": _COLORS[0]},
            hovertemplate="t=%{x} s<br>%{y:,.1f} requests/s<extra></extra>",
        )
    )
    if len(series.errors) == len(series.t_s) and any(series.errors):
        fig.add_trace(
            go.Bar(
                x=series.t_s,
                y=[e / series.interval_s for e in series.errors],
                name="errors",
                marker={"color": "#EF553B"},
                offset=0,
                width=series.interval_s,
            )
        )
    return _style(
        fig,
        f"Throughput over time (requests/s, per {series.interval_s:g} s): {run.name}",
        "interval start (s from window start)",
        "throughput (requests/s)",
    )


def latency_percentiles(run: LoadRun) -> go.Figure:
    """The run's latency percentiles, p50 to max (HdrHistogram over the ok answers)."""
    keys = [k for k in PERCENTILES if k in run.latency_us]
    values = [run.latency_us[k] for k in keys]
    fig = go.Figure(
        go.Bar(
            x=keys,
            y=values,
            text=[f"{v:,.0f}" for v in values],
            textposition="outside",
            marker={"color": _COLORS[0]},
            hovertemplate="%{x}: %{y:,.0f} µs<extra></extra>",
            showlegend=False,
        )
    )
    return _style(fig, f"Latency percentiles (µs): {run.name}", "percentile", "latency (µs)")


def _cdf_points(latency_us: FloatArray) -> tuple[FloatArray, FloatArray]:
    values = np.sort(latency_us[latency_us > 0])
    n = values.size
    if n == 0:
        return values, values
    if n <= _CDF_POINTS:
        idx = np.arange(n)
    else:  # even over ranks, plus all of the top ranks where the tail lives
        idx = np.unique(
            np.concatenate(
                [np.linspace(0, n - 1, _CDF_POINTS).astype(np.intp), np.arange(n - _CDF_POINTS // 2, n)]
            )
        )
    return values[idx], (idx + 1) / n


def latency_cdf(series: Sequence[tuple[str, FloatArray]]) -> go.Figure:
    """Cumulative fraction of ok requests at or below each latency (log latency axis), one curve
    per (name, latencies); overlaid, so runs compare at every percentile at once."""
    fig = go.Figure()
    for i, (name, latency_us) in enumerate(series):
        x, y = _cdf_points(latency_us)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                name=name,
                line={"color": _COLORS[i % len(_COLORS)], "shape": "hv"},
                hovertemplate="%{x:,.0f} µs: %{y:.4f}<extra>" + name + "</extra>",
            )
        )
    title = "Latency CDF (µs)" + (f": {series[0][0]}" if len(series) == 1 else "")
    fig = _style(fig, title, "latency (µs, log scale)", "fraction of requests at or below")
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 1.02])
    return fig


def stage_means(runs: Sequence[LoadRun]) -> go.Figure | None:
    """Mean time per server-side stage (queue, batch, compute, return), stacked, one bar per run;
    None when no run reported stages."""
    with_stages = [(name, run) for name, run in zip(display_names(runs), runs, strict=True) if run.stages_us]
    if not with_stages:
        return None
    fig = go.Figure()
    for stage in STAGES:
        fig.add_trace(
            go.Bar(
                y=[name for name, _ in with_stages],
                x=[
                    run.stages_us[stage].mean_us if run.stages_us and stage in run.stages_us else 0.0
                    for _, run in with_stages
                ],
                name=stage,
                orientation="h",
                marker={"color": _STAGE_COLORS[stage]},
                hovertemplate=stage + ": %{x:,.0f} µs<extra>%{y}</extra>",
            )
        )
    title = "Mean time per stage (µs)" + (f": {with_stages[0][0]}" if len(with_stages) == 1 else "")
    height = 200 + 60 * len(with_stages)
    return _style(fig, title, "mean time (µs)", None, barmode="stack", height=height)


def stages_over_time(run: LoadRun, samples: LoadSamples) -> go.Figure | None:
    """Mean time per stage in each interval (from the CSV), stacked: shows which stage grows
    when latency does. None when the CSV has no stage columns with values."""
    if not samples.stages_us or samples.intended_s.size == 0:
        return None
    interval_s = run.timeseries.interval_s if run.timeseries else 1.0
    bins = np.floor(samples.intended_s / interval_s).astype(np.intp)
    bins = np.clip(bins, 0, None)
    n_bins = int(bins.max()) + 1
    starts_s = np.arange(n_bins) * interval_s
    fig = go.Figure()
    for stage in STAGES:
        values = samples.stages_us.get(stage)
        if values is None:
            continue
        have = ~np.isnan(values)
        count = np.bincount(bins[have], minlength=n_bins)
        total = np.bincount(bins[have], weights=values[have], minlength=n_bins)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_us = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        fig.add_trace(
            go.Bar(
                x=starts_s,
                y=mean_us,
                name=stage,
                marker={"color": _STAGE_COLORS[stage]},
                offset=0,
                width=interval_s,
                hovertemplate=stage + ": %{y:,.0f} µs at t=%{x} s<extra></extra>",
            )
        )
    return _style(
        fig,
        f"Mean time per stage over time (µs, per {interval_s:g} s): {run.name}",
        "interval start (s from window start)",
        "mean time (µs)",
        barmode="stack",
    )


# --- two or more load runs -------------------------------------------------------------------------


def compare_percentiles(runs: Sequence[LoadRun]) -> go.Figure:
    """Latency percentiles of each run side by side (grouped bars, one colour per run)."""
    fig = go.Figure()
    for i, (name, run) in enumerate(zip(display_names(runs), runs, strict=True)):
        keys = [k for k in PERCENTILES if k in run.latency_us]
        fig.add_trace(
            go.Bar(
                x=keys,
                y=[run.latency_us[k] for k in keys],
                name=name,
                marker={"color": _COLORS[i % len(_COLORS)]},
                hovertemplate="%{x}: %{y:,.0f} µs<extra>" + name + "</extra>",
            )
        )
    fig = _style(fig, "Latency percentiles by run (µs, log scale)", "percentile", "latency (µs)")
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log")
    return fig


def compare_throughput(runs: Sequence[LoadRun]) -> go.Figure:
    """Throughput (ok answers per second over the measured window) of each run side by side."""
    names = display_names(runs)
    fig = go.Figure(
        go.Bar(
            x=names,
            y=[run.throughput_per_s for run in runs],
            text=[f"{run.throughput_per_s:,.1f}" for run in runs],
            textposition="outside",
            marker={"color": [_COLORS[i % len(_COLORS)] for i in range(len(runs))]},
            hovertemplate="%{x}: %{y:,.1f} requests/s<extra></extra>",
            showlegend=False,
        )
    )
    return _style(fig, "Throughput by run (requests/s)", "run", "throughput (requests/s)")


def compare_throughput_over_time(runs: Sequence[LoadRun]) -> go.Figure | None:
    """Each run's throughput per interval, overlaid; None when no run has a timeseries."""
    fig = go.Figure()
    for i, (name, run) in enumerate(zip(display_names(runs), runs, strict=True)):
        if run.timeseries is None:
            continue
        fig.add_trace(
            go.Scatter(
                x=run.timeseries.t_s,
                y=run.timeseries.throughput_per_s,
                mode="lines",
                name=name,
                line={"shape": "hv", "color": _COLORS[i % len(_COLORS)]},
            )
        )
    if not fig.data:
        return None
    return _style(
        fig,
        "Throughput over time by run (requests/s)",
        "interval start (s from window start)",
        "throughput (requests/s)",
    )


# --- tables (rows of text: st.dataframe in the app, <table> in the report) ----------------------------------------------------------------------------------------


def fmt_number(value: float | int | None, digits: int = 0) -> str:
    """``value`` with thousands separators and ``digits`` decimals; "-" when there is none."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def compare_table_rows(runs: Sequence[LoadRun]) -> list[dict[str, str]]:
    """The headline numbers of each run, one row per run, for side-by-side reading."""
    rows = []
    for name, run in zip(display_names(runs), runs, strict=True):
        lat = run.latency_us
        rows.append(
            {
                "run": name,
                "file": run.rel,
                "load": str(run.load.get("mode", "?"))
                + (
                    f" r{run.load['rate_per_s']:g}/s"
                    if run.load.get("rate_per_s")
                    else f" c{run.load.get('concurrency', '?')}"
                ),
                "throughput (req/s)": fmt_number(run.throughput_per_s, 1),
                **{f"{k} (µs)": fmt_number(lat.get(k)) for k in PERCENTILES},
                "errors": str(run.counts.get("errors", "-")),
                "commit": (run.commit or "unknown")[:12],
            }
        )
    return rows


def matrix_table_rows(matrix: MatrixRun) -> list[dict[str, str]]:
    """One row per configuration x load point, with its ratio to the raw in-process limit."""
    return [
        {
            "configuration": row.configuration,
            "load": row.load,
            "throughput (req/s)": fmt_number(row.throughput_per_s, 1),
            "ratio to raw": "-" if row.ratio_to_raw is None else f"{row.ratio_to_raw:.2f}x",
            "p50 (µs)": fmt_number(row.p50_us),
            "p99 (µs)": fmt_number(row.p99_us),
            "p99.9 (µs)": fmt_number(row.p99_9_us),
            "max (µs)": fmt_number(row.max_us),
            "compute mean (µs)": fmt_number(row.compute_mean_us),
            "errors": str(row.errors),
        }
        for row in matrix.rows
    ]


def matrix_bars(matrix: MatrixRun) -> go.Figure:
    """Throughput (with its ratio to raw) and p99 per configuration, grouped by load point; the
    raw in-process ONNX Runtime limit drawn as a line."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        subplot_titles=("throughput (requests/s)", "p99 latency (µs)"),
    )
    loads = sorted({row.load for row in matrix.rows})
    for i, load in enumerate(loads):
        rows = [row for row in matrix.rows if row.load == load]
        color = _COLORS[i % len(_COLORS)]
        x = [row.configuration for row in rows]
        ratios = ["" if r.ratio_to_raw is None else f"{r.ratio_to_raw:.2f}x" for r in rows]
        fig.add_trace(
            go.Bar(
                x=x,
                y=[row.throughput_per_s for row in rows],
                text=ratios,
                textposition="outside",
                name=load,
                legendgroup=load,
                marker={"color": color},
                hovertemplate="%{x}<br>%{y:,.1f} requests/s (%{text} raw)<extra>" + load + "</extra>",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=x,
                y=[row.p99_us for row in rows],
                name=load,
                legendgroup=load,
                showlegend=False,
                marker={"color": color},
                hovertemplate="%{x}<br>p99 %{y:,.0f} µs<extra>" + load + "</extra>",
            ),
            row=2,
            col=1,
        )
    if matrix.raw_throughput_per_s is not None:
        threads = f", {matrix.raw_threads} threads" if matrix.raw_threads else ""
        fig.add_hline(
            y=matrix.raw_throughput_per_s,
            line_dash="dash",
            line_color="#444444",
            annotation_text=f"raw ONNX Runtime {matrix.raw_throughput_per_s:,.1f} req/s{threads}",
            annotation_position="top left",
            row=1,
            col=1,
        )
    fig = _style(
        fig,
        f"Architecture matrix (requests/s, µs): {matrix.model}",
        None,
        None,
        height=720,
        barmode="group",
        legend=_LEGEND_RIGHT,
    )
    fig.update_yaxes(title_text="requests/s", row=1, col=1)
    fig.update_yaxes(title_text="p99 (µs)", row=2, col=1)
    fig.update_xaxes(title_text="configuration (queue/allocator/mode, workers, batch)", row=2, col=1)
    return fig


def peers_table_rows(peers: PeersRun) -> list[dict[str, str]]:
    """One row per peer x model x concurrency."""
    return [
        {
            "peer": row.peer,
            "model": row.model,
            "concurrency": str(row.concurrency),
            "driver": row.driver,
            "protocol": row.protocol,
            "throughput (req/s)": fmt_number(row.throughput_per_s, 1),
            "p50 (µs)": fmt_number(row.p50_us),
            "p90 (µs)": fmt_number(row.p90_us),
            "p95 (µs)": fmt_number(row.p95_us),
            "p99 (µs)": fmt_number(row.p99_us),
            "errors": str(row.errors),
        }
        for row in sorted(peers.rows, key=lambda r: (r.model, r.concurrency, r.peer))
    ]


def peer_series(row: Any) -> str:
    """A bar series: one peer over one protocol with one driver (a peer may have several)."""
    return f"{row.peer} {row.protocol}" + (" (perf_analyzer)" if row.driver == "perf_analyzer" else "")


def peers_bars(peers: PeersRun) -> go.Figure:
    """Throughput and p99 per peer series (peer, protocol, driver) at each concurrency, one row of
    panels per model."""
    models = sorted({row.model for row in peers.rows}) or ["(none)"]
    names = sorted({peer_series(row) for row in peers.rows}, key=lambda p: (not p.startswith("lumenrt"), p))
    colors = {peer: _COLORS[i % len(_COLORS)] for i, peer in enumerate(names)}
    titles = [t for m in models for t in (f"{m}: throughput (requests/s)", f"{m}: p99 latency (µs)")]
    fig = make_subplots(rows=len(models), cols=2, subplot_titles=titles, vertical_spacing=0.25 / len(models))
    for r, model in enumerate(models, start=1):
        levels = sorted({row.concurrency for row in peers.rows if row.model == model})
        for peer in names:
            by_level = {
                row.concurrency: row for row in peers.rows if row.model == model and peer_series(row) == peer
            }
            x = [f"c{c}" for c in levels]
            for col, values, unit in (
                (1, [by_level[c].throughput_per_s if c in by_level else None for c in levels], "req/s"),
                (2, [by_level[c].p99_us if c in by_level else None for c in levels], "µs"),
            ):
                fig.add_trace(
                    go.Bar(
                        x=x,
                        y=values,
                        name=peer,
                        legendgroup=peer,
                        showlegend=r == 1 and col == 1,
                        marker={"color": colors[peer]},
                        hovertemplate="%{x}: %{y:,.1f} " + unit + "<extra>" + peer + "</extra>",
                    ),
                    row=r,
                    col=col,
                )
        fig.update_yaxes(title_text="requests/s", row=r, col=1)
        fig.update_yaxes(title_text="p99 (µs)", row=r, col=2)
        fig.update_xaxes(title_text="concurrency (clients)", row=r, col=1)
        fig.update_xaxes(title_text="concurrency (clients)", row=r, col=2)
    return _style(
        fig,
        f"Peers: throughput (requests/s) and p99 (µs) by concurrency ({peers.created_utc})",
        None,
        None,
        barmode="group",
        height=120 + 360 * len(models),
        legend=_LEGEND_RIGHT,
    )


# --- summaries ------------------------------------------------------------------------------------


def machine_text(machine: dict[str, Any]) -> str:
    """Hostname, CPU model and core count of a result's machine, in one line."""
    parts = [str(machine[k]) for k in ("hostname", "cpu_model") if machine.get(k)]
    cores = machine.get("nproc_usable") or machine.get("nproc")
    if cores:
        parts.append(f"{cores} cores")
    if machine.get("python"):
        parts.append(f"Python {machine['python']}")
    return ", ".join(parts) or "unknown"


def load_summary(run: LoadRun) -> dict[str, str]:
    """The headline numbers of a load run, as label -> text (units in the labels)."""
    load = run.load
    if load.get("mode") == "open":
        offered = (
            f"open loop, {fmt_number(load.get('rate_per_s'), 1)} requests/s ({load.get('arrival') or '?'})"
        )
    else:
        offered = f"closed loop, concurrency {load.get('concurrency', '?')}"
    counts = run.counts
    errors_by_kind = counts.get("errors_by_kind") or {}
    errors = str(counts.get("errors", "-"))
    if errors_by_kind:
        errors += " (" + ", ".join(f"{k}: {v}" for k, v in errors_by_kind.items()) + ")"
    lat = run.latency_us
    summary = {
        "file": run.rel,
        "created (UTC)": run.created_utc,
        "machine": machine_text(run.machine),
        "commit": run.commit or "unknown",
        "server": " ".join(
            str(run.server[k]) for k in ("protocol", "model", "target") if run.server.get(k) is not None
        )
        or "unknown",
        "load": offered,
        "requests sent / ok / errors": f"{counts.get('sent', '-')} / {counts.get('ok', '-')} / {errors}",
        "measured window (s)": fmt_number(run.elapsed_s, 2),
        "throughput (requests/s)": fmt_number(run.throughput_per_s, 1),
        "latency p50 / p99 / p99.9 / max (µs)": " / ".join(
            fmt_number(lat.get(k)) for k in ("p50", "p99", "p99.9", "max")
        ),
    }
    if run.stages_us:
        summary["stage means (µs)"] = ", ".join(
            f"{s} {fmt_number(v.mean_us)}" for s, v in run.stages_us.items()
        )
    if run.batch_size_mean is not None:
        summary["mean batch size"] = fmt_number(run.batch_size_mean, 2)
    return summary
