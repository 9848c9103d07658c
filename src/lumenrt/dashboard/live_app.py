"""The live view: ``streamlit run live_app.py -- --url URL`` (``lumenrt dashboard --live URL``
starts it so).

A fragment reruns every second: it scrapes the server's metrics URL, turns the scrape and the
previous one into each model's throughput, p50/p99 and queue depth (``live_metrics``), appends
them to a bounded history kept in the browser session's state, and draws the history. A scrape
that fails (server down, not Prometheus text, an HTTP error) shows a warning saying why and is
retried on the next tick; the history drawn so far stays on the page.
"""

import argparse
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st

from lumenrt.dashboard import live_figures
from lumenrt.dashboard.live_metrics import (
    DEFAULT_HISTORY_S,
    History,
    MetricsError,
    Scrape,
    interval_stats,
    metrics_url,
    parse_scrape,
)

SCRAPE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 2.0  # a server that takes longer to answer a scrape is shown as unreachable
_MAX_SCRAPE_BYTES = 16 * 1024 * 1024  # a metrics page of a few models is a few tens of kB


@dataclass
class LiveState:
    """One browser session's scrapes: the last good one, the kept history, the last failure."""

    history: History
    previous: Scrape | None = None
    failure: str | None = None
    scrapes_ok: int = 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The script's own arguments (those after ``--`` on the streamlit command line)."""
    parser = argparse.ArgumentParser(prog="lumenrt dashboard live app")
    parser.add_argument("--url", required=True, help="the server's metrics URL (or its base URL)")
    parser.add_argument("--history-s", type=float, default=DEFAULT_HISTORY_S, help="seconds of history kept")
    args, _ = parser.parse_known_args(list(argv))
    return args


def fetch(url: str) -> str:
    """The metrics page's text; raises MetricsError saying why not."""
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            body: bytes = response.read(_MAX_SCRAPE_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise MetricsError(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise MetricsError(str(e.reason)) from None
    except OSError as e:  # timeouts, resets
        raise MetricsError(str(e) or type(e).__name__) from None
    if len(body) > _MAX_SCRAPE_BYTES:
        raise MetricsError(f"the page is larger than {_MAX_SCRAPE_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


def scrape_once(state: LiveState, url: str) -> None:
    """Scrape ``url`` and fold the result into ``state`` (a failure is recorded, not raised)."""
    now_s = time.monotonic()
    try:
        scrape = parse_scrape(fetch(url), now_s)
    except MetricsError as e:
        state.failure = str(e)
        return
    state.failure = None
    state.scrapes_ok += 1
    if state.previous is not None and scrape.time_s > state.previous.time_s:
        state.history.add(scrape.time_s, interval_stats(state.previous, scrape))
    state.previous = scrape


def model_key(model: str) -> str:
    """The key of a model's container: the page gives it the CSS class ``st-key-<key>``."""
    return "live-model-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in model)


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def _plot(fig: Any, key: str) -> None:
    st.plotly_chart(fig, width="stretch", key=key, config={"displaylogo": False})


def show(state: LiveState, url: str) -> None:
    """The page body for the current state."""
    if state.failure is not None:
        st.warning(f"Cannot scrape {url}: {state.failure}. Retrying every {SCRAPE_INTERVAL_S:g} s.")
    if not len(state.history):
        if state.failure is None:
            st.info("Waiting for a second scrape to compute rates...")
        return
    if state.previous is not None and not state.previous.models:
        st.info(f"{url} has no lumenrt_ metrics with a model label yet.")
    latest = state.history.latest()
    for model in sorted(latest):
        stats = latest[model]
        box = st.container(key=model_key(model))
        box.subheader(model)
        cols = box.columns(5)
        cols[0].metric("throughput (requests/s)", _fmt(stats.throughput_per_s))
        cols[1].metric("p50 (ms)", _fmt(stats.p50_s, 1e3, 2))
        cols[2].metric("p99 (ms)", _fmt(stats.p99_s, 1e3, 2))
        cols[3].metric("queue depth", _fmt(stats.queue_depth, digits=0))
        cols[4].metric("errors (requests/s)", _fmt(stats.errors_per_s))
    points, models, now_s = state.history.points(), state.history.models(), time.monotonic()
    _plot(live_figures.throughput(points, models, now_s), "live-throughput")
    left, right = st.columns(2)
    with left:
        _plot(live_figures.latency(points, models, now_s), "live-latency")
    with right:
        _plot(live_figures.queue_depth(points, models, now_s), "live-queue")


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    st.set_page_config(page_title="lumenrt live", layout="wide")
    st.title("Live")
    try:
        url = metrics_url(args.url)
    except MetricsError as e:
        st.error(str(e))
        return
    st.caption(
        f"{url} · scraped every {SCRAPE_INTERVAL_S:g} s · last {args.history_s / 60:g} min kept · "
        "rates and percentiles over each interval between scrapes"
    )
    if "live" not in st.session_state:
        st.session_state["live"] = LiveState(History(args.history_s))
    state: LiveState = st.session_state["live"]

    @st.fragment(run_every=SCRAPE_INTERVAL_S)
    def tick() -> None:
        scrape_once(state, url)
        show(state, url)

    tick()


if __name__ == "__main__":
    main(sys.argv[1:])
