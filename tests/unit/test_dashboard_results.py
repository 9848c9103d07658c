"""Reading a results folder (bad files skipped with a reason), the figures built from each kind,
and the Streamlit app's views run headless (streamlit.testing: no browser, no server)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

import lumenrt.dashboard
from lumenrt.dashboard import figures
from lumenrt.dashboard.results import (
    LoadRun,
    ResultError,
    ResultFile,
    load_samples,
    read_result,
    scan,
)
from tests.dashboard_fixtures import FixtureResults, write_load_run, write_results

APP_PATH = Path(lumenrt.dashboard.__file__).with_name("app.py")


@pytest.fixture
def fixture_results(tmp_path: Path) -> FixtureResults:
    return write_results(tmp_path / "results")


# --- scanning --------------------------------------------------------------------------------------


def test_scan_finds_each_kind_newest_first_with_matrix_rows(fixture_results: FixtureResults) -> None:
    catalog = scan(fixture_results.root)
    assert catalog.skipped == []
    top_level = [run for run in catalog.loads if "/" not in run.rel]
    assert [run.name for run in top_level] == fixture_results.load_names
    assert [run.path for run in top_level] == fixture_results.load_paths
    row_runs = {run.path for run in catalog.loads if run.rel.startswith("matrix-")}
    assert row_runs == set(fixture_results.matrix_row_paths)
    created = [run.created_utc for run in catalog.loads]
    assert created == sorted(created, reverse=True)
    (matrix,) = catalog.matrices
    assert matrix.path == fixture_results.matrix_path
    assert all(row.run is not None and catalog.load_by_rel(row.run) is not None for row in matrix.rows)
    (peers,) = catalog.peers
    assert peers.path == fixture_results.peers_path
    assert {row.peer for row in peers.rows} == {"lumenrt", "triton", "mlserver", "fastapi"}


def test_scan_skips_bad_files_with_a_reason(tmp_path: Path) -> None:
    root = tmp_path / "results"
    write_load_run(root, "20261121T100000Z", "good run", seed=1, rows=50)
    (root / "truncated.json").write_text('{"kind": "load", ')
    (root / "list.json").write_text("[1, 2, 3]")
    (root / "nokind.json").write_text('{"name": "x"}')
    (root / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (root / "load-bad.json").write_text(json.dumps({"kind": "load", "name": "bad", "latency_us": {}}))
    (root / "load-nan.json").write_text(
        '{"kind": "load", "latency_us": {}, "elapsed_s": 1.0, "throughput_per_s": NaN}'
    )
    (root / "matrix-bad.json").write_text(json.dumps({"kind": "matrix", "rows": [{"load": "fixed"}]}))
    (root / "peers-bad.json").write_text(json.dumps({"kind": "peers", "rows": "no"}))
    (root / "engine-old.json").write_text(json.dumps({"benchmark": "engine", "machine": {}}))
    (root / "queues-new.json").write_text(
        json.dumps({"kind": "queues", "created_utc": "2026-01-01T00:00:00Z"})
    )
    (root / "notes.txt").write_text("not a result")

    catalog = scan(root)

    assert [run.name for run in catalog.loads] == ["good run"]
    reasons = {skip.path.name: skip.reason for skip in catalog.skipped}
    assert reasons.keys() == {
        "truncated.json",
        "list.json",
        "nokind.json",
        "binary.json",
        "load-bad.json",
        "load-nan.json",
        "matrix-bad.json",
        "peers-bad.json",
    }
    assert reasons["truncated.json"].startswith("not valid JSON")
    assert "not an object" in reasons["list.json"]
    assert "no 'kind'" in reasons["nokind.json"]
    assert reasons["binary.json"].startswith("cannot read")
    assert reasons["load-bad.json"] == "load file: no 'elapsed_s' field"
    assert "throughput_per_s" in reasons["load-nan.json"] and "finite" in reasons["load-nan.json"]
    assert reasons["matrix-bad.json"] == "matrix file: no 'throughput_per_s' field"
    assert "'rows' is not a list" in reasons["peers-bad.json"]
    assert sorted((f.rel, f.kind) for f in catalog.others) == [
        ("engine-old.json", "engine"),
        ("queues-new.json", "queues"),
    ]


def test_a_load_run_where_nothing_was_answered_still_loads(tmp_path: Path) -> None:
    doc = {"kind": "load", "name": "all failed", "latency_us": None, "elapsed_s": 1.0, "throughput_per_s": 0}
    (tmp_path / "load-1.json").write_text(json.dumps(doc))
    (run,) = scan(tmp_path).loads
    assert run.latency_us == {} and run.timeseries is None and run.stages_us is None
    assert figures.latency_percentiles(run).data[0].x == ()
    assert figures.throughput_over_time(run) is None


def test_scan_skips_an_unreadable_file(tmp_path: Path) -> None:
    # a link to nowhere cannot be read, even by root (file modes would not stop root)
    (tmp_path / "load-dangling.json").symlink_to(tmp_path / "gone.json")
    (skipped,) = scan(tmp_path).skipped
    assert skipped.reason.startswith("cannot read")


def test_scan_of_a_missing_folder_is_empty_with_a_reason(tmp_path: Path) -> None:
    catalog = scan(tmp_path / "nope")
    assert (catalog.loads, catalog.matrices, catalog.peers) == ([], [], [])
    assert [s.reason for s in catalog.skipped] == ["not a folder"]


def test_read_result_of_an_older_benchmark_is_a_listed_file(tmp_path: Path) -> None:
    path = tmp_path / "stages-1.json"
    path.write_text(json.dumps({"benchmark": "stages"}))
    parsed = read_result(path, tmp_path)
    assert isinstance(parsed, ResultFile)
    assert (parsed.kind, parsed.rel) == ("stages", "stages-1.json")


# --- a load run's CSV --------------------------------------------------------------------------------


def _only_load(root: Path) -> LoadRun:
    (run,) = scan(root).loads
    return run


def test_load_samples_match_the_csv(tmp_path: Path) -> None:
    path, doc = write_load_run(tmp_path, "20261121T100000Z", "r", seed=5, rows=120, errors=4)
    run = _only_load(tmp_path)
    assert run.csv_path == path.with_suffix(".csv")
    samples = load_samples(run)
    assert samples.intended_s.size == 120
    assert int((~samples.ok).sum()) == 4
    assert np.isnan(samples.latency_us[~samples.ok]).all()
    assert samples.ok_latency_us.size == doc["counts"]["ok"]
    assert math.isclose(float(samples.ok_latency_us.max()), doc["latency_us"]["max"], rel_tol=1e-3)
    assert set(samples.stages_us) == {"queue", "batch", "compute", "return"}


def test_load_samples_without_stages_has_no_stage_columns(tmp_path: Path) -> None:
    write_load_run(tmp_path, "20261121T100000Z", "r", seed=5, rows=30, stages=False)
    run = _only_load(tmp_path)
    assert run.stages_us is None
    assert load_samples(run).stages_us == {}


def test_load_run_without_its_csv_still_loads(tmp_path: Path) -> None:
    path, _ = write_load_run(tmp_path, "20261121T100000Z", "r", seed=5, rows=30)
    path.with_suffix(".csv").unlink()
    run = _only_load(tmp_path)
    assert run.csv_path is None
    with pytest.raises(ResultError, match="CSV is not there"):
        load_samples(run)


def test_malformed_csv_is_a_result_error_naming_the_line(tmp_path: Path) -> None:
    path, _ = write_load_run(tmp_path, "20261121T100000Z", "r", seed=5, rows=30)
    csv_path = path.with_suffix(".csv")
    lines = csv_path.read_text().splitlines()
    lines[3] = "0.5,0.5,fast,1,,,,,,,0"
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ResultError, match="line 4: column latency_us"):
        load_samples(_only_load(tmp_path))
    csv_path.write_text("a,b\n1,2\n")
    with pytest.raises(ResultError, match="no column intended_s, latency_us, ok"):
        load_samples(_only_load(tmp_path))


# --- figures ------------------------------------------------------------------------------------


def _title(fig: object) -> str:
    return str(fig.layout.title.text)  # type: ignore[attr-defined]


def test_figures_build_for_a_load_run(fixture_results: FixtureResults) -> None:
    catalog = scan(fixture_results.root)
    for run in catalog.loads[:2]:
        samples = load_samples(run)
        latency = figures.latency_over_time(run, samples)
        assert _title(latency).startswith("Latency over time (µs)")
        assert latency.layout.yaxis.title.text == "latency (µs)"
        assert len(latency.data[0].x) == samples.ok_latency_us.size  # few points: none dropped
        throughput = figures.throughput_over_time(run)
        assert throughput is not None and "requests/s" in _title(throughput)
        assert list(throughput.data[0].y) == run.timeseries.throughput_per_s  # type: ignore[union-attr]
        percentiles = figures.latency_percentiles(run)
        assert list(percentiles.data[0].x) == ["p50", "p90", "p95", "p99", "p99.9", "max"]
        cdf = figures.latency_cdf([(run.name, samples.ok_latency_us)])
        assert cdf.layout.xaxis.type == "log" and cdf.data[0].y[-1] == 1.0
    with_stages = next(run for run in catalog.loads if run.stages_us)
    stages = figures.stage_means([with_stages])
    assert stages is not None and [t.name for t in stages.data] == ["queue", "batch", "compute", "return"]
    over_time = figures.stages_over_time(with_stages, load_samples(with_stages))
    assert over_time is not None and "(µs, per 1 s)" in _title(over_time)
    without = next(run for run in catalog.loads if not run.stages_us)
    assert figures.stage_means([without]) is None
    assert figures.stages_over_time(without, load_samples(without)) is None


def test_latency_scatter_is_bounded_and_keeps_the_slowest() -> None:
    latency_us = np.arange(100_000, dtype=np.float64)
    keep = figures.downsample_indices(latency_us, 2_000)
    assert keep.size <= 2_000
    assert np.all(np.diff(keep) > 0)
    assert keep[-1] == 99_999 and 99_990 in keep  # the slowest survive
    assert figures.downsample_indices(latency_us[:10], 2_000).tolist() == list(range(10))


def test_figures_compare_two_runs(fixture_results: FixtureResults) -> None:
    runs = scan(fixture_results.root).loads[:2]
    names = fixture_results.load_names
    grouped = figures.compare_percentiles(runs)
    assert [t.name for t in grouped.data] == names and grouped.layout.barmode == "group"
    assert list(figures.compare_throughput(runs).data[0].x) == names
    over_time = figures.compare_throughput_over_time(runs)
    assert over_time is not None and [t.name for t in over_time.data] == names
    assert [row["run"] for row in figures.compare_table_rows(runs)] == names
    cdf = figures.latency_cdf(
        [(name, load_samples(run).ok_latency_us) for name, run in zip(names, runs, strict=True)]
    )
    assert [t.name for t in cdf.data] == names


def test_display_names_are_unique() -> None:
    base = dict(
        path=Path("x"), machine={}, commit=None, server={}, load={}, counts={}, elapsed_s=1.0,
        throughput_per_s=1.0, latency_us={}, stages_us=None, batch_size_mean=None, timeseries=None,
        csv_path=None,
    )  # fmt: skip
    runs = [
        LoadRun(rel="a.json", name="same", created_utc="t1", **base),  # type: ignore[arg-type]
        LoadRun(rel="b.json", name="same", created_utc="t2", **base),  # type: ignore[arg-type]
        LoadRun(rel="c.json", name="other", created_utc="t3", **base),  # type: ignore[arg-type]
    ]
    assert figures.display_names(runs) == ["same @ t1", "same @ t2", "other"]


def test_figures_build_for_matrix_and_peers(fixture_results: FixtureResults) -> None:
    catalog = scan(fixture_results.root)
    (matrix,) = catalog.matrices
    bars = figures.matrix_bars(matrix)
    assert {t.name for t in bars.data} == {"fixed", "saturation"}
    assert len(bars.data) == 4  # throughput and p99 panels, per load point
    assert "requests/s" in _title(bars)
    assert any("raw ONNX Runtime" in a.text for a in bars.layout.annotations)
    rows = figures.matrix_table_rows(matrix)
    assert len(rows) == 4 and all(row["ratio to raw"].endswith("x") for row in rows)
    (peers,) = catalog.peers
    peer_bars = figures.peers_bars(peers)
    assert len(peer_bars.data) == 2 * 4 * 2  # models x peers x (throughput, p99)
    assert [a.text for a in peer_bars.layout.annotations] == [
        "digits_mlp: throughput (requests/s)",
        "digits_mlp: p99 latency (µs)",
        "squeezenet: throughput (requests/s)",
        "squeezenet: p99 latency (µs)",
    ]
    assert len(figures.peers_table_rows(peers)) == 16


# --- the Streamlit app, headless ------------------------------------------------------------------


def _app(results: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from streamlit.testing.v1 import AppTest

    monkeypatch.setattr("sys.argv", [str(APP_PATH), "--results", str(results)])
    return AppTest.from_file(str(APP_PATH), default_timeout=60).run()


def test_app_renders_every_view(fixture_results: FixtureResults, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(fixture_results.root, monkeypatch)
    assert not app.exception
    assert app.title[0].value == "Single run"
    assert len(app.get("plotly_chart")) == 4  # the newest run has no stages: no stage plots
    app.sidebar.radio(key="view").set_value("Compare runs").run()
    assert [i.value for i in app.info] == ["Pick two or more load runs in the sidebar to compare them."]
    app.sidebar.multiselect(key="runs").select(fixture_results.load_paths[1].name).run()
    assert not app.exception
    assert len(app.get("plotly_chart")) == 5
    for view in ("Architecture matrix", "Peers"):
        app.sidebar.radio(key="view").set_value(view).run()
        assert not app.exception and not app.error
        assert len(app.get("plotly_chart")) == 1


def test_app_says_what_is_missing_in_a_folder_with_only_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.dashboard_fixtures import write_peers

    write_peers(tmp_path, "20261121T120000Z")
    (tmp_path / "junk.json").write_text("{")
    app = _app(tmp_path, monkeypatch)
    for view in ("Single run", "Compare runs", "Architecture matrix", "Peers"):
        app.sidebar.radio(key="view").set_value(view).run()
        assert not app.exception and not app.error
        if view == "Peers":
            assert len(app.get("plotly_chart")) == 1
        else:
            assert len(app.info) == 1 and not app.get("plotly_chart")


def test_app_shows_a_run_without_its_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = write_load_run(tmp_path, "20261121T100000Z", "no csv", seed=1, rows=40)
    path.with_suffix(".csv").unlink()
    app = _app(tmp_path, monkeypatch)
    assert not app.exception and not app.error
    assert [w.value for w in app.warning] == [
        "load-20261121T100000Z.json: its CSV is not there, so there are no per-request plots"
    ]
    assert len(app.get("plotly_chart")) == 3  # throughput over time, percentiles, stage means


# --- the launcher (the real start is tests/e2e/test_dashboard.py) ---------------------------------


def test_dashboard_refuses_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lumenrt.cli import main

    assert main(["dashboard", str(tmp_path / "nope"), "--no-browser"]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_dashboard_command_line(tmp_path: Path) -> None:
    from lumenrt.dashboard.launch import streamlit_command, url_of

    command = streamlit_command(tmp_path, "127.0.0.1", 8600, browser=False)
    assert command[1:5] == ["-m", "streamlit", "run", str(APP_PATH)]
    options = dict(zip(command[5:-3:2], command[6:-3:2], strict=True))
    assert options["--server.headless"] == "true" and options["--server.port"] == "8600"
    assert options["--browser.gatherUsageStats"] == "false"
    assert command[-3:] == ["--", "--results", str(tmp_path)]
    assert url_of("0.0.0.0", 8501) == "http://127.0.0.1:8501/"
    assert url_of("::1", 8501) == "http://[::1]:8501/"


def test_matrix_rows_that_differ_in_lane_or_loop_spin_have_their_own_names(tmp_path: Path) -> None:
    from lumenrt.dashboard.results import parse_matrix

    base = {"queue_type": "mpmc", "allocator_type": "lumen_arena", "mode": "thread", "workers": 2,
            "batch_size": 8, "load": "saturation", "throughput_per_s": 1000.0}  # fmt: skip
    rows = [
        {**base, "lane": "queue", "loop_spin_us": 0},
        {**base, "lane": "queue", "loop_spin_us": 200},
        {**base, "lane": "auto", "loop_spin_us": 0},
        base,  # a row written before the matrix had either dimension
    ]
    doc = {"kind": "matrix", "model": "digits_mlp", "rows": rows}
    run = parse_matrix(tmp_path / "matrix.json", "matrix.json", doc)
    names = [row.configuration for row in run.rows]
    assert names == [
        "mpmc/lumen_arena/thread w2 b8 queue",
        "mpmc/lumen_arena/thread w2 b8 queue spin200",
        "mpmc/lumen_arena/thread w2 b8 auto",
        "mpmc/lumen_arena/thread w2 b8",
    ]
