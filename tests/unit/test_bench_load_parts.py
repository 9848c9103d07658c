"""The load generator's pure parts: target URLs, inputs from metadata or a file, plan checks, the
statistics (HdrHistogram rule, error counts, per-interval series) and the CSV."""

import csv
from pathlib import Path

import numpy as np
import pytest

from lumenrt.bench.load_cli import load_cpu
from lumenrt.bench.load_inputs import inputs_from_file, inputs_from_metadata, payload_bytes
from lumenrt.bench.load_run import LoadPlan, Records, share, window_for
from lumenrt.bench.load_stats import CSV_COLUMNS, summarize, write_csv
from lumenrt.bench.load_targets import error_kind, parse_target
from lumenrt.cli import _expand_bench_shorthand
from lumenrt.client.errors import InferenceError

METADATA = {
    "name": "m",
    "inputs": [
        {"name": "a", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "b", "datatype": "INT64", "shape": [2]},
        {"name": "c", "datatype": "BYTES", "shape": [1]},
    ],
}


def test_parse_target() -> None:
    t = parse_target("http-raw://127.0.0.1:9000/predict/m")
    assert (t.protocol, t.host, t.port, t.path) == ("http-raw", "127.0.0.1", 9000, "/predict/m")
    assert parse_target("tcp://localhost:8003").url == "tcp://localhost:8003"
    for bad, why in [
        ("ftp://h:1", "scheme"),
        ("tcp://h", "port"),
        ("http-raw://h:1", "path"),
        ("http://h:1/x", "path"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_target(bad)


def test_error_kinds() -> None:
    assert error_kind(InferenceError(503, "busy")) == "503"
    assert error_kind(TimeoutError()) == "timeout"
    assert error_kind(ConnectionResetError()) == "connection"
    assert error_kind(KeyError("x")) == "client:KeyError"


def test_inputs_from_metadata_fill_dims_and_datatypes() -> None:
    inputs = inputs_from_metadata(METADATA, {"max_batch_size": 8}, batch=4)
    assert inputs["a"].shape == (4, 3) and inputs["a"].dtype == np.float32
    assert inputs["b"].shape == (2,) and inputs["b"].dtype == np.int64
    assert inputs["c"].tolist() == [b"lumenrt"]
    assert inputs_from_metadata(METADATA, None)["a"].shape == (1, 3)  # not batching: -1 is 1
    again = inputs_from_metadata(METADATA, {"max_batch_size": 8}, batch=4)
    assert np.array_equal(again["a"], inputs["a"])  # deterministic
    assert payload_bytes(inputs) == 4 * 3 * 4 + 2 * 8 + 4 + 7
    with pytest.raises(ValueError, match=r"inputs\[0\]"):
        inputs_from_metadata({"inputs": [{"name": "a", "shape": [1]}]}, None)
    with pytest.raises(ValueError, match="datatype 'F99'"):
        inputs_from_metadata({"inputs": [{"name": "a", "datatype": "F99", "shape": [1]}]}, None)


def test_inputs_from_file(tmp_path: Path) -> None:
    np.save(tmp_path / "one.npy", np.ones((1, 3), np.float32))
    np.savez(tmp_path / "two.npz", a=np.ones(3, np.float32), b=np.zeros(2, np.int64))
    assert list(inputs_from_file(tmp_path / "one.npy", None)) == ["input"]
    assert list(inputs_from_file(tmp_path / "one.npy", {"inputs": [{"name": "x"}]})) == ["x"]
    assert sorted(inputs_from_file(tmp_path / "two.npz", None)) == ["a", "b"]
    with pytest.raises(ValueError, match="the model takes"):
        inputs_from_file(tmp_path / "two.npz", {"inputs": [{"name": "a"}]})
    with pytest.raises(ValueError, match="one input"):
        inputs_from_file(tmp_path / "one.npy", METADATA)
    with pytest.raises(ValueError, match="no such file"):
        inputs_from_file(tmp_path / "missing.npz", None)


def _plan(**kw: object) -> LoadPlan:
    args: dict[str, object] = {"target": "tcp://127.0.0.1:1", "model": "m", "inputs": {}}
    args.update(kw)
    return LoadPlan(**args)  # type: ignore[arg-type]


def test_plan_checks_and_shares() -> None:
    with pytest.raises(ValueError, match="--rate"):
        _plan(mode="open", rate_per_s=0)
    with pytest.raises(ValueError, match="one of --duration-s and --requests"):
        _plan(duration_s=None)
    plan = _plan(concurrency=5, requests=11, duration_s=None, processes=2)
    parts = [share(plan, p) for p in range(2)]
    assert [p.concurrency for p in parts] == [3, 2]
    assert [p.requests for p in parts] == [6, 5]
    assert [p.process for p in parts] == [0, 1]


def _records() -> tuple[Records, object]:
    plan = _plan(warmup_s=0.0, duration_s=2.0)
    window = window_for(plan, 1_000_000_000)
    rec = Records()
    rng = np.random.default_rng(3)
    for i in range(1000):
        intended = window.measure_ns + i * 2_000_000  # 500/s over 2 s
        latency = int(rng.integers(100_000, 5_000_000))
        error = "503" if i % 100 == 7 else ""
        timing = {} if i % 2 else {"queue_ns": 10_000, "compute_ns": 50_000, "batch_size": 2}
        rec.add(intended, intended + 1000, intended + latency, error, timing, i % 2)
    return rec, window


def test_summary_counts_percentiles_and_series() -> None:
    rec, window = _records()
    columns = rec.arrays()
    summary = summarize(columns, window)  # type: ignore[arg-type]
    assert summary["counts"] == {"sent": 1000, "ok": 990, "errors": 10, "errors_by_kind": {"503": 10}}
    ok = columns["error"] == ""
    lat_us = np.sort((columns["done_ns"][ok] - columns["intended_ns"][ok]) / 1000)
    for name, q in [("p50", 50), ("p99", 99), ("p99.9", 99.9)]:
        exact = lat_us[max(int(q / 100 * len(lat_us) + 0.5), 1) - 1]
        assert abs(summary["latency_us"][name] - exact) <= exact * 0.002 + 1
    assert summary["stages_us"]["compute"]["mean"] == 50.0
    assert summary["stages_us"]["batch_size_mean"] == 2.0
    series = summary["timeseries"]
    assert sum(series["ok"]) == 990 and sum(series["errors"]) == 10
    assert len(series["t_s"]) == len(series["throughput_per_s"]) == len(series["p99_us"])


def test_load_cpu_adds_up_the_processes_and_is_not_a_column() -> None:
    rec, window = _records()
    other = Records()
    other.cpu_ns.append(250_000_000)
    rec.cpu_ns.append(750_000_000)
    rec.extend(other)  # a second load process's records
    columns = rec.arrays()
    assert "cpu_ns" not in columns and len(columns["done_ns"]) == 1000
    summary = summarize(columns, window)  # type: ignore[arg-type]
    cpu = load_cpu(rec.cpu_ns, summary)
    assert cpu is not None
    assert cpu["cpu_s"] == 1.0
    assert cpu["cpus"] == pytest.approx(1.0 / summary["elapsed_s"], rel=1e-3)
    assert cpu["us_per_request"] == pytest.approx(1e6 / 990, rel=1e-3)
    assert load_cpu([], summary) is None  # a run that did not reach its window


def test_csv_has_one_row_per_request(tmp_path: Path) -> None:
    rec, window = _records()
    path = tmp_path / "run.csv"
    write_csv(path, rec.arrays(), window)  # type: ignore[arg-type]
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == 1000
    assert rows[7]["ok"] == "0" and rows[7]["error"] == "503" and rows[7]["latency_us"] == ""
    assert rows[0]["compute_us"] == "50.000" and rows[1]["compute_us"] == ""
    assert float(rows[1]["intended_s"]) == pytest.approx(0.002)


def test_bench_shorthand() -> None:
    assert _expand_bench_shorthand(["bench", "--target", "x"]) == ["bench", "load", "--target", "x"]
    assert _expand_bench_shorthand(["bench", "queues"]) == ["bench", "queues"]
    assert _expand_bench_shorthand(["bench", "--help"]) == ["bench", "--help"]
