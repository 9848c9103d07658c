"""Plotly figures of the live view: throughput, p50/p99 and queue depth over the kept history.

Every builder takes the history's points and the current time (the same monotonic clock the
points are stamped with) and draws one trace per model (two for latency: p50 dashed, p99 solid)
against "seconds ago", so the newest interval is at x = 0. An interval without requests has no
latency: the line has a gap there rather than a made-up zero.
"""

from collections.abc import Callable, Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative

from lumenrt.dashboard.live_metrics import IntervalStats, LivePoint, series

_HEIGHT_PX = 320
_COLORS = qualitative.Plotly
_LEGEND_BELOW = {"orientation": "h", "yanchor": "top", "y": -0.25, "xanchor": "left", "x": 0.0}
_X_TITLE = "seconds ago"


def _figure(title: str, y_title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title={"text": title},
        template="plotly_white",
        height=_HEIGHT_PX,
        margin={"l": 60, "r": 20, "t": 50, "b": 90},
        legend=_LEGEND_BELOW,
        uirevision="live",  # keep the user's zoom across the once-a-second redraws
    )
    fig.update_xaxes(title_text=_X_TITLE)
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    return fig


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None else value_s * 1e3


def _add(
    fig: go.Figure,
    points: Sequence[LivePoint],
    now_s: float,
    name: str,
    value: Callable[[IntervalStats], float | None],
    color: str,
    dash: str = "solid",
) -> None:
    fig.add_trace(
        go.Scatter(
            x=[p.time_s - now_s for p in points],
            y=[value(p.stats) for p in points],
            mode="lines",
            name=name,
            line={"color": color, "dash": dash},
            connectgaps=False,
        )
    )


def throughput(points: Sequence[LivePoint], models: Sequence[str], now_s: float) -> go.Figure:
    """Requests answered per second (every status), per model."""
    fig = _figure("Throughput (requests/s)", "requests/s")
    for i, model in enumerate(models):
        _add(
            fig, series(points, model), now_s, model, lambda s: s.throughput_per_s, _COLORS[i % len(_COLORS)]
        )
    return fig


def latency(points: Sequence[LivePoint], models: Sequence[str], now_s: float) -> go.Figure:
    """p50 (dashed) and p99 (solid) of each interval, in milliseconds, per model."""
    fig = _figure("Latency p50 / p99 (ms, per interval)", "ms")
    for i, model in enumerate(models):
        color = _COLORS[i % len(_COLORS)]
        points_of = series(points, model)
        _add(fig, points_of, now_s, f"{model} p99", lambda s: _ms(s.p99_s), color)
        _add(fig, points_of, now_s, f"{model} p50", lambda s: _ms(s.p50_s), color, "dash")
    return fig


def queue_depth(points: Sequence[LivePoint], models: Sequence[str], now_s: float) -> go.Figure:
    """Requests waiting in each model's queue at each scrape."""
    fig = _figure("Queue depth (requests)", "requests")
    for i, model in enumerate(models):
        _add(fig, series(points, model), now_s, model, lambda s: s.queue_depth, _COLORS[i % len(_COLORS)])
    return fig
