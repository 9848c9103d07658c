"""``lumenrt bench report``: one self-contained HTML file with a plot for each run."""

import json
import re
from pathlib import Path

import pytest

from lumenrt.cli import main
from lumenrt.dashboard.report import write_report
from tests.dashboard_fixtures import FixtureResults, write_load_run, write_results

PLOTLY_JS_HEADER = re.compile(r"\* plotly\.js v\d+\.\d+\.\d+")


@pytest.fixture
def fixture_results(tmp_path: Path) -> FixtureResults:
    return write_results(tmp_path / "results")


def _plot_ids(page: str) -> list[str]:
    """The div ids passed to Plotly.newPlot, in page order."""
    return re.findall(r'Plotly\.newPlot\(\s*"([^"]+)"', page)


def _has_title(page: str, title: str) -> bool:
    # the figure JSON escapes non-ASCII (µ -> \u00b5) and "/" (-> \u002f, so "</script>" cannot occur)
    return json.dumps(title)[1:-1].replace("/", "\\u002f") in page


def test_report_has_a_plot_for_each_run_and_plotly_js_once(fixture_results: FixtureResults) -> None:
    out = write_report(fixture_results.root, None, fixture_results.root / "report.html")
    page = out.read_text(encoding="utf-8")

    assert len(PLOTLY_JS_HEADER.findall(page)) == 1
    assert page.count('src="https://cdn') == 0  # nothing fetched: works offline
    ids = _plot_ids(page)
    assert len(ids) == len(set(ids))
    for i, name in enumerate(fixture_results.load_names):
        assert f"<h2>Load run: {name}</h2>" in page
        for kind in ("latency-time", "throughput-time", "percentiles", "cdf"):
            assert f"load-{i}-{kind}" in ids
        assert _has_title(page, f"Latency over time (µs): {name}")
        assert _has_title(page, f"Latency CDF (µs): {name}")
    # only the closed-loop run (the older, second one) reported stages
    assert {"load-1-stages", "load-1-stages-time"} <= set(ids)
    assert not {"load-0-stages", "load-0-stages-time"} & set(ids)
    assert {
        "compare-cdf",
        "compare-percentiles",
        "compare-throughput",
        "matrix-0-bars",
        "peers-0-bars",
    } <= set(ids)
    assert _has_title(page, "Architecture matrix (requests/s, µs): squeezenet")
    assert "mpmc/lumen_arena/thread w2 b8" in page  # the matrix table
    assert "fixture-host, Fixture CPU @ 3.0GHz, 2 cores" in page  # machine under each heading
    assert "0123456789abcdef0123456789abcdef01234567" in page  # commit
    # matrix rows are summarised by their matrix, not reported as load runs of their own
    assert "<h2>Load run: matrix" not in page


def test_report_of_chosen_runs_keeps_their_order(fixture_results: FixtureResults, tmp_path: Path) -> None:
    older, newer = fixture_results.load_paths[1], fixture_results.load_paths[0]
    out = write_report(
        fixture_results.root,
        [older.name, str(newer), fixture_results.peers_path.name],
        tmp_path / "sub" / "chosen.html",
    )
    page = out.read_text(encoding="utf-8")
    headings = re.findall(r"<h2>Load run: ([^<]+)</h2>", page)
    assert headings == list(reversed(fixture_results.load_names))
    assert "peers-0-bars" in _plot_ids(page)
    assert "matrix-0" not in page
    assert len(PLOTLY_JS_HEADER.findall(page)) == 1


def test_report_of_one_peers_file_still_embeds_plotly_js(
    fixture_results: FixtureResults, tmp_path: Path
) -> None:
    out = write_report(fixture_results.root, [fixture_results.peers_path], tmp_path / "peers.html")
    page = out.read_text(encoding="utf-8")
    assert _plot_ids(page) == ["peers-0-bars"]
    assert len(PLOTLY_JS_HEADER.findall(page)) == 1


def test_report_notes_a_run_without_its_csv(tmp_path: Path) -> None:
    path, _ = write_load_run(tmp_path, "20261121T100000Z", "no csv", seed=1, rows=40)
    path.with_suffix(".csv").unlink()
    page = write_report(tmp_path, None, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "No per-request plots" in page
    assert {"load-0-throughput-time", "load-0-percentiles"} <= set(_plot_ids(page))
    assert "load-0-latency-time" not in _plot_ids(page)


def test_cli_writes_the_default_path_and_prints_it(
    fixture_results: FixtureResults, capsys: pytest.CaptureFixture[str]
) -> None:
    (fixture_results.root / "junk.json").write_text("{")
    assert main(["bench", "report", str(fixture_results.root)]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.parent == fixture_results.root
    assert re.fullmatch(r"report-\d{8}T\d{6}Z(-\d+)?\.html", printed.name)
    page = printed.read_text(encoding="utf-8")
    assert "Files not read" in page and "junk.json" in page
    # a second report in the same second gets its own file
    assert main(["bench", "report", str(fixture_results.root)]) == 0
    assert Path(capsys.readouterr().out.strip()) != printed


def test_cli_fails_clearly_with_nothing_to_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "report", str(tmp_path)]) == 1
    assert "no load, matrix or peers result files" in capsys.readouterr().err
    assert main(["bench", "report", str(tmp_path / "missing")]) == 1
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "queues-1.json").write_text(json.dumps({"kind": "queues"}))
    assert main(["bench", "report", str(tmp_path), "--runs", "queues-1.json"]) == 1
    assert "a 'queues' file" in capsys.readouterr().err
    assert main(["bench", "report", str(tmp_path), "--runs", "nope.json"]) == 1
    assert "cannot read" in capsys.readouterr().err
