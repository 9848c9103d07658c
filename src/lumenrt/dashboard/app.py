"""The Streamlit dashboard over a results folder: ``streamlit run app.py -- --results DIR``
(``lumenrt dashboard`` starts it so).

The sidebar picks the view (single run, compare runs, architecture matrix, peers) and the files;
each view shows an ``st.info`` when the folder has nothing for it. The folder is rescanned whenever
a JSON or CSV file under it changes (the cache key is the listing's sizes and times), so a run
that finishes while the dashboard is open appears on the next interaction.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import streamlit as st

from lumenrt.dashboard import figures
from lumenrt.dashboard.results import (
    Catalog,
    LoadRun,
    LoadSamples,
    ResultError,
    folder_signature,
    load_samples,
    scan,
)

VIEWS = ("Single run", "Compare runs", "Architecture matrix", "Peers")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The script's own arguments (those after ``--`` on the streamlit command line)."""
    parser = argparse.ArgumentParser(prog="lumenrt dashboard app")
    parser.add_argument("--results", default="results", help="folder of result files")
    args, _ = parser.parse_known_args(list(argv))
    return args


@st.cache_data(show_spinner="Reading result files...")
def _catalog(root: str, signature: tuple[tuple[str, int, int], ...]) -> Catalog:
    del signature  # only the cache key: a changed listing means a rescan
    return scan(root)


@st.cache_data(show_spinner="Reading the run's CSV...", max_entries=32)
def _samples(csv_path: str, size_mtime: tuple[int, int], _run: LoadRun) -> LoadSamples | str:
    """The run's CSV columns, or why they cannot be read (cached by file, size and time)."""
    del csv_path, size_mtime
    try:
        return load_samples(_run)
    except ResultError as e:
        return str(e)


def samples_of(run: LoadRun) -> LoadSamples | str:
    """A load run's CSV columns (cached until the file changes), or a sentence saying why not."""
    if run.csv_path is None:
        return f"{run.rel}: its CSV is not there, so there are no per-request plots"
    try:
        stat = run.csv_path.stat()
    except OSError as e:
        return f"{run.csv_path}: {e}"
    return _samples(str(run.csv_path), (stat.st_size, stat.st_mtime_ns), run)


def plot(fig: Any, key: str) -> None:
    """One figure at the container's width; nothing when the builder had no data (None)."""
    if fig is not None:
        st.plotly_chart(fig, width="stretch", key=key, config={"displaylogo": False})


# --- views ----------------------------------------------------------------------------------------


def show_run(run: LoadRun, key: str) -> None:
    """One load run: headline numbers, then latency/throughput over time, percentiles, CDF, stages."""
    st.subheader(run.name)
    st.caption(f"{run.rel} · {run.created_utc} · {figures.machine_text(run.machine)} · commit {run.commit}")
    lat = run.latency_us
    cols = st.columns(5)
    cols[0].metric("throughput (requests/s)", figures.fmt_number(run.throughput_per_s, 1))
    cols[1].metric("p50 (µs)", figures.fmt_number(lat.get("p50")))
    cols[2].metric("p99 (µs)", figures.fmt_number(lat.get("p99")))
    cols[3].metric("max (µs)", figures.fmt_number(lat.get("max")))
    cols[4].metric("errors", str(run.counts.get("errors", "-")))
    with st.expander("Summary"):
        st.table({"value": figures.load_summary(run)})
    samples = samples_of(run)
    if isinstance(samples, str):
        st.warning(samples)
    else:
        plot(figures.latency_over_time(run, samples), f"{key}-latency-time")
    left, right = st.columns(2)
    with left:
        plot(figures.throughput_over_time(run), f"{key}-throughput-time")
    with right:
        plot(figures.latency_percentiles(run), f"{key}-percentiles")
    left, right = st.columns(2)
    with left:
        if not isinstance(samples, str):
            plot(figures.latency_cdf([(run.name, samples.ok_latency_us)]), f"{key}-cdf")
    with right:
        stages = figures.stage_means([run])
        if stages is None:
            st.info("The server reported no stage times for this run.")
        plot(stages, f"{key}-stages")
    if not isinstance(samples, str):
        plot(figures.stages_over_time(run, samples), f"{key}-stages-time")
    for title, doc in (
        ("Server metadata", run.server.get("metadata")),
        ("Model config", run.server.get("config")),
    ):
        if doc:
            with st.expander(title):
                st.json(doc)


def single_view(catalog: Catalog, selected: list[LoadRun]) -> None:
    if not catalog.loads:
        st.info(f"No load runs in {catalog.root}. `lumenrt bench load` writes them.")
        return
    if not selected:
        st.info("Pick a load run in the sidebar.")
        return
    run = selected[0]
    if len(selected) > 1:
        run = st.selectbox("Run", selected, format_func=lambda r: r.label)
    show_run(run, "single")


def compare_view(catalog: Catalog, selected: list[LoadRun]) -> None:
    if len(catalog.loads) < 2:
        st.info(f"Comparing needs two or more load runs; {catalog.root} has {len(catalog.loads)}.")
        return
    if len(selected) < 2:
        st.info("Pick two or more load runs in the sidebar to compare them.")
        return
    names = figures.display_names(selected)
    st.dataframe(figures.compare_table_rows(selected), hide_index=True)
    series = []
    for name, run in zip(names, selected, strict=True):
        samples = samples_of(run)
        if isinstance(samples, str):
            st.warning(samples)
        else:
            series.append((name, samples.ok_latency_us))
    if series:
        plot(figures.latency_cdf(series), "compare-cdf")
    left, right = st.columns(2)
    with left:
        plot(figures.compare_percentiles(selected), "compare-percentiles")
    with right:
        plot(figures.compare_throughput(selected), "compare-throughput")
    plot(figures.compare_throughput_over_time(selected), "compare-throughput-time")
    plot(figures.stage_means(selected), "compare-stages")


def matrix_view(catalog: Catalog, rel: str | None) -> None:
    matrix = next((m for m in catalog.matrices if m.rel == rel), None)
    if matrix is None:
        st.info(f"No matrix files in {catalog.root}. `lumenrt bench matrix` writes them.")
        return
    st.subheader(f"Architecture matrix: {matrix.model}")
    raw = figures.fmt_number(matrix.raw_throughput_per_s, 1)
    st.caption(
        f"{matrix.rel} · {matrix.created_utc} · {figures.machine_text(matrix.machine)} · commit "
        f"{matrix.commit} · raw in-process limit {raw} requests/s ({matrix.raw_threads} threads) · "
        f"fixed rate {figures.fmt_number(matrix.fixed_rate_per_s, 1)} requests/s · saturation "
        f"concurrency {matrix.saturation_concurrency}"
    )
    st.dataframe(figures.matrix_table_rows(matrix), hide_index=True)
    plot(figures.matrix_bars(matrix), "matrix-bars")
    runs = {row.run: f"{row.configuration}, {row.load}" for row in matrix.rows if row.run}
    choice = st.selectbox(
        "Open a row's load run", [None, *runs], format_func=lambda r: "-" if r is None else runs[r]
    )
    if choice is not None:
        run = catalog.load_by_rel(choice)
        if run is None:
            st.warning(f"{choice} is not among the readable load runs.")
        else:
            show_run(run, "matrix-row")


def peers_view(catalog: Catalog, rel: str | None) -> None:
    peers = next((p for p in catalog.peers if p.rel == rel), None)
    if peers is None:
        st.info(f"No peers files in {catalog.root}. `benchmarks/peers/run.py` writes them.")
        return
    st.subheader("lumenrt and other servers")
    st.caption(
        f"{peers.rel} · {peers.created_utc} · {figures.machine_text(peers.machine)} · commit {peers.commit}"
    )
    st.dataframe(figures.peers_table_rows(peers), hide_index=True)
    plot(figures.peers_bars(peers), "peers-bars")
    if peers.peers:
        with st.expander("Peer versions and how they ran"):
            st.json(peers.peers)


# --- page -----------------------------------------------------------------------------------------


def sidebar(catalog: Catalog) -> tuple[str, list[LoadRun], str | None, str | None]:
    """The view and the files picked in the sidebar."""
    bar = st.sidebar
    bar.title("lumenrt results")
    bar.caption(str(catalog.root))
    view = bar.radio("View", VIEWS, key="view")
    by_rel = {run.rel: run for run in catalog.loads}
    picked = bar.multiselect(
        "Load runs",
        list(by_rel),
        default=list(by_rel)[:1],
        format_func=lambda rel: by_rel[rel].label,
        key="runs",
    )
    matrix = bar.selectbox(
        "Matrix file",
        [m.rel for m in catalog.matrices],
        format_func=lambda rel: rel,
        key="matrix",
        placeholder="none in this folder",
    )
    peers = bar.selectbox(
        "Peers file", [p.rel for p in catalog.peers], key="peers", placeholder="none in this folder"
    )
    if catalog.others or catalog.skipped:
        with bar.expander(f"Files not plotted ({len(catalog.others) + len(catalog.skipped)})"):
            for other in catalog.others:
                st.caption(f"{other.rel}: kind '{other.kind}' (listed, not plotted)")
            for skipped in catalog.skipped:
                st.caption(f"{skipped.path}: {skipped.reason}")
    return str(view), [by_rel[rel] for rel in picked if rel in by_rel], matrix, peers


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    st.set_page_config(page_title="lumenrt results", layout="wide")
    root = Path(args.results)
    if not root.is_dir():
        st.error(f"{root} is not a folder of result files.")
        return
    catalog = _catalog(str(root), folder_signature(root))
    view, selected, matrix, peers = sidebar(catalog)
    st.title(view)
    if view == "Single run":
        single_view(catalog, selected)
    elif view == "Compare runs":
        compare_view(catalog, selected)
    elif view == "Architecture matrix":
        matrix_view(catalog, matrix)
    else:
        peers_view(catalog, peers)


if __name__ == "__main__":
    main(sys.argv[1:])
