"""``lumenrt bench report``: the dashboard's figures for result files, as ONE static HTML file.

plotly.js is embedded inline once (with the first figure), so the file opens anywhere: no server,
no network. Each load run gets a heading with its name, machine, commit and summary numbers, then
its plots; two or more load runs also get a comparison section; each matrix and peers file gets
its table and bars.
"""

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lumenrt.dashboard import figures
from lumenrt.dashboard.results import (
    MAX_LOAD_RUNS,
    Catalog,
    LoadRun,
    LoadSamples,
    MatrixRun,
    PeersRun,
    ResultError,
    ResultFile,
    catalog_of,
    load_samples,
    read_result,
    scan,
)

"""Default bound on the load runs in a report (newest first), so it stays readable and small."""

REPORT_SCATTER_POINTS = 5_000
"""Points per latency-over-time scatter in the report (the app draws more: it shows one run)."""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2rem; margin-top: 2.5rem; }
table.summary { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
table.summary th { text-align: left; padding: 2px 12px 2px 0; color: #555; font-weight: 600; }
table.summary td { padding: 2px 0; font-variant-numeric: tabular-nums; }
.meta { color: #555; font-size: 0.9rem; } .note { color: #8a5300; }
nav ul { columns: 2; font-size: 0.9rem; }
table.data { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1rem; }
table.data th, table.data td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
table.data th { background: #eef1f6; } table.data td:first-child { text-align: left; }
table.data tbody tr:nth-child(even) { background: #f8f9fb; }
"""


class _Figures:
    """Renders figures to HTML divs: plotly.js inline with the first only, unique div ids."""

    def __init__(self) -> None:
        self.count = 0

    def div(self, fig: Any, div_id: str) -> str:
        if fig is None:
            return ""
        self.count += 1
        return str(
            fig.to_html(
                full_html=False,
                include_plotlyjs=self.count == 1,
                div_id=div_id,
                default_width="100%",
                config={"displaylogo": False, "responsive": True},
            )
        )


def _data_table(rows: Sequence[dict[str, str]]) -> str:
    """Rows with the same keys as an HTML table (text copies cleanly, the size follows the rows)."""
    if not rows:
        return "<p>No rows.</p>"
    head = "".join(f"<th>{html.escape(key)}</th>" for key in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(value)}</td>" for value in row.values()) + "</tr>" for row in rows
    )
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _summary_table(rows: dict[str, str]) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(key)}</th><td>{html.escape(value)}</td></tr>" for key, value in rows.items()
    )
    return f'<table class="summary">{cells}</table>'


def _load_section(
    run: LoadRun, index: int, samples: LoadSamples | None, note: str | None, out: _Figures
) -> str:
    prefix = f"load-{index}"
    parts = [
        f'<section id="{prefix}"><h2>Load run: {html.escape(run.name)}</h2>',
        _summary_table(figures.load_summary(run)),
    ]
    if note:
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    if samples is not None:
        parts.append(
            out.div(figures.latency_over_time(run, samples, REPORT_SCATTER_POINTS), f"{prefix}-latency-time")
        )
    parts.append(out.div(figures.throughput_over_time(run), f"{prefix}-throughput-time"))
    parts.append(out.div(figures.latency_percentiles(run), f"{prefix}-percentiles"))
    if samples is not None:
        parts.append(out.div(figures.latency_cdf([(run.name, samples.ok_latency_us)]), f"{prefix}-cdf"))
    parts.append(out.div(figures.stage_means([run]), f"{prefix}-stages"))
    if samples is not None:
        parts.append(out.div(figures.stages_over_time(run, samples), f"{prefix}-stages-time"))
    parts.append("</section>")
    return "\n".join(parts)


def _compare_section(runs: list[LoadRun], samples: dict[str, LoadSamples], out: _Figures) -> str:
    names = figures.display_names(runs)
    series = [
        (name, samples[run.rel].ok_latency_us)
        for name, run in zip(names, runs, strict=True)
        if run.rel in samples
    ]
    parts = [
        '<section id="compare"><h2>Load runs compared</h2>',
        _data_table(figures.compare_table_rows(runs)),
    ]
    if series:
        parts.append(out.div(figures.latency_cdf(series), "compare-cdf"))
    parts.append(out.div(figures.compare_percentiles(runs), "compare-percentiles"))
    parts.append(out.div(figures.compare_throughput(runs), "compare-throughput"))
    parts.append(out.div(figures.compare_throughput_over_time(runs), "compare-throughput-time"))
    parts.append(out.div(figures.stage_means(runs), "compare-stages"))
    parts.append("</section>")
    return "\n".join(parts)


def _matrix_section(matrix: MatrixRun, index: int, out: _Figures) -> str:
    meta = {
        "file": matrix.rel,
        "created (UTC)": matrix.created_utc,
        "machine": figures.machine_text(matrix.machine),
        "commit": matrix.commit or "unknown",
        "raw limit (requests/s)": figures.fmt_number(matrix.raw_throughput_per_s, 1),
        "fixed rate (requests/s)": figures.fmt_number(matrix.fixed_rate_per_s, 1),
        "saturation concurrency": str(matrix.saturation_concurrency or "-"),
    }
    return "\n".join(
        [
            f'<section id="matrix-{index}"><h2>Architecture matrix: {html.escape(matrix.model)}</h2>',
            _summary_table(meta),
            _data_table(figures.matrix_table_rows(matrix)),
            out.div(figures.matrix_bars(matrix), f"matrix-{index}-bars"),
            "</section>",
        ]
    )


def _peers_section(peers: PeersRun, index: int, out: _Figures) -> str:
    meta = {
        "file": peers.rel,
        "created (UTC)": peers.created_utc,
        "machine": figures.machine_text(peers.machine),
        "commit": peers.commit or "unknown",
        **{
            f"peer {name}": " ".join(str(v) for v in (info.get("version"), info.get("how")) if v)
            for name, info in peers.peers.items()
        },
    }
    return "\n".join(
        [
            f'<section id="peers-{index}"><h2>Peers ({html.escape(peers.created_utc)})</h2>',
            _summary_table(meta),
            _data_table(figures.peers_table_rows(peers)),
            out.div(figures.peers_bars(peers), f"peers-{index}-bars"),
            "</section>",
        ]
    )


def default_selection(catalog: Catalog, max_load_runs: int = MAX_LOAD_RUNS) -> Catalog:
    """What a report shows by default: the newest ``max_load_runs`` load runs that are not a
    matrix row (those are summarised by their matrix), every matrix and every peers file."""
    rows = {row.run for matrix in catalog.matrices for row in matrix.rows if row.run}
    loads = [run for run in catalog.loads if run.rel not in rows][:max_load_runs]
    return Catalog(
        root=catalog.root,
        loads=loads,
        matrices=catalog.matrices,
        peers=catalog.peers,
        others=catalog.others,
        skipped=catalog.skipped,
    )


def _explicit_selection(results_dir: Path, runs: Sequence[Path]) -> Catalog:
    """The given files, in the given order; ResultError when one is not a usable load/matrix/peers
    file (the user asked for it, so saying so beats leaving it out)."""
    paths = [results_dir / run if (results_dir / run).exists() else run for run in runs]
    for path in paths:
        parsed = read_result(path, results_dir)
        if isinstance(parsed, ResultFile):
            raise ResultError(
                f"{path}: a '{parsed.kind}' file; the report plots load, matrix and peers files"
            )
    catalog = catalog_of(results_dir, paths)
    order = {path: i for i, path in enumerate(paths)}
    catalog.loads.sort(key=lambda run: order[run.path])
    catalog.matrices.sort(key=lambda run: order[run.path])
    catalog.peers.sort(key=lambda run: order[run.path])
    return catalog


def render(catalog: Catalog, title: str = "lumenrt benchmark report") -> str:
    """The whole HTML document for the runs in ``catalog``."""
    out = _Figures()
    samples: dict[str, LoadSamples] = {}
    sections = []
    for i, run in enumerate(catalog.loads):
        note = None
        try:
            samples[run.rel] = load_samples(run)
        except ResultError as e:
            note = f"No per-request plots: {e}"
        sections.append(_load_section(run, i, samples.get(run.rel), note, out))
    if len(catalog.loads) >= 2:
        sections.append(_compare_section(catalog.loads, samples, out))
    sections.extend(_matrix_section(m, i, out) for i, m in enumerate(catalog.matrices))
    sections.extend(_peers_section(p, i, out) for i, p in enumerate(catalog.peers))

    toc = [
        f'<li><a href="#load-{i}">load: {html.escape(r.name)}</a></li>' for i, r in enumerate(catalog.loads)
    ]
    if len(catalog.loads) >= 2:
        toc.append('<li><a href="#compare">load runs compared</a></li>')
    toc += [
        f'<li><a href="#matrix-{i}">matrix: {html.escape(m.model)}</a></li>'
        for i, m in enumerate(catalog.matrices)
    ]
    toc += [
        f'<li><a href="#peers-{i}">peers {html.escape(p.created_utc)}</a></li>'
        for i, p in enumerate(catalog.peers)
    ]
    skipped = ""
    if catalog.skipped:
        items = "".join(
            f"<li>{html.escape(str(s.path))}: {html.escape(s.reason)}</li>" for s in catalog.skipped
        )
        skipped = f'<section id="skipped"><h2>Files not read</h2><ul>{items}</ul></section>'
    written = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">Results folder {html.escape(str(catalog.root))}; written {written}.
{len(catalog.loads)} load run(s), {len(catalog.matrices)} matrix file(s), {len(catalog.peers)} peers file(s).
Units: µs microseconds, s seconds, requests/s.</p>
<nav><ul>{"".join(toc)}</ul></nav>
{"".join(sections)}
{skipped}
</body></html>
"""


def _new_report_path(root: Path) -> Path:
    """``root/report-<UTC stamp>.html``, never an existing file (like the result files)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = root / f"report-{stamp}.html"
    n = 1
    while path.exists():
        path = root / f"report-{stamp}-{n}.html"
        n += 1
    return path


def write_report(
    results_dir: str | Path, runs: Sequence[str | Path] | None = None, out: str | Path | None = None
) -> Path:
    """Write the report for ``runs`` (default: ``default_selection`` of the folder) to ``out``
    (default ``results_dir/report-<UTC stamp>.html``); the path written.

    ResultError when a given run cannot be used, or when there is nothing to plot.
    """
    root = Path(results_dir)
    if runs:
        catalog = _explicit_selection(root, [Path(r) for r in runs])
    else:
        if not root.is_dir():
            raise ResultError(f"{root}: no such folder")
        catalog = default_selection(scan(root))
    if not (catalog.loads or catalog.matrices or catalog.peers):
        raise ResultError(f"{root}: no load, matrix or peers result files to report")
    path = Path(out) if out else _new_report_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(catalog), encoding="utf-8")
    tmp.replace(path)
    return path
