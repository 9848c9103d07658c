"""The pure parts of benchmarks/peers/ (run.py and the modules it imports): rows from a load summary
and from perf_analyzer figures, the markdown table and its marks, and the small builders around them
(no server is started)."""

import base64
import importlib
import importlib.util
import io
import itertools
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.benchmark_modules import import_benchmark_module

triton_peer = import_benchmark_module("triton_peer")  # benchmarks/triton_peer.py
parse_perf_analyzer_csv = import_benchmark_module("perf_analyzer").parse_perf_analyzer_csv

PEERS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"
RUN_PY = PEERS_DIR / "run.py"


def _import_peers_module(name: str) -> ModuleType:
    """benchmarks/ is not an installed package and the modules in benchmarks/peers import each other by
    plain name (run.py's folder comes first on sys.path when it runs as a script): the same here."""
    if str(PEERS_DIR) not in sys.path:
        sys.path.insert(0, str(PEERS_DIR))
    module = importlib.import_module(name)
    assert Path(module.__file__ or "").parent == PEERS_DIR, f"{name} is not benchmarks/peers/{name}.py"
    return module


def _load_run_module() -> ModuleType:
    """run.py is a script: import it by path (registered first, as dataclasses look their module up in
    sys.modules), after its folder is on sys.path for the modules it imports."""
    name = "benchmarks_peers_run"
    if name in sys.modules:
        return sys.modules[name]
    _import_peers_module("common")
    spec = importlib.util.spec_from_file_location(name, RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


run = _load_run_module()
common = _import_peers_module("common")
venvs = _import_peers_module("venvs")
models = _import_peers_module("models")
servers = _import_peers_module("servers")
drivers = _import_peers_module("drivers")
table = _import_peers_module("table")


def _summary(concurrency: int, throughput_per_s: float, p99_us: float, errors: int = 0) -> dict[str, Any]:
    """A ``lumenrt bench load --json`` summary, as docs/bench-results.md describes it (the parts used)."""
    return {
        "kind": "load",
        "name": f"http squeezenet c{concurrency}",
        "load": {"mode": "closed", "concurrency": concurrency, "rate_per_s": None},
        "counts": {"sent": 1000 + errors, "ok": 1000, "errors": errors, "errors_by_kind": {}},
        "elapsed_s": 10.0,
        "throughput_per_s": throughput_per_s,
        "latency_us": {
            "min": 100,
            "mean": 900.5,
            "p50": 800,
            "p90": 1500,
            "p95": 1800,
            "p99": p99_us,
            "p99.9": p99_us * 2,
            "max": p99_us * 3,
        },
    }


def _row(peer: str, model: str, c: int, driver: str, protocol: str, tp: float, p99: float) -> dict[str, Any]:
    return {"peer": peer, "model": model, "concurrency": c, "driver": driver, "protocol": protocol,
            "throughput_per_s": tp, "p50_us": p99 / 2, "p90_us": p99 * 0.8, "p95_us": p99 * 0.9,
            "p99_us": p99, "errors": 0}  # fmt: skip


def test_row_from_summary_takes_the_documented_fields() -> None:
    row = drivers.row_from_summary("triton", "squeezenet", "http", _summary(4, 250.6349, 12345.0, errors=2))
    assert row == {
        "peer": "triton",
        "model": "squeezenet",
        "concurrency": 4,
        "driver": "lumenrt bench",
        "protocol": "http",
        "throughput_per_s": 250.6,
        "p50_us": 800.0,
        "p90_us": 1500.0,
        "p95_us": 1800.0,
        "p99_us": 12345.0,
        "errors": 2,
    }
    assert tuple(row) == drivers.ROW_KEYS


def test_row_from_perf_analyzer_csv_figures(tmp_path: Path) -> None:
    csv_path = tmp_path / "report.csv"
    csv_path.write_text(
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
        "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
        "p50 latency,p90 latency,p95 latency,p99 latency\n"
        "2,481.25,30,200,50,10,3900,5,2,4100,4600,4800,5300\n",
        encoding="utf-8",
    )
    figures = parse_perf_analyzer_csv(csv_path, 2)
    row = drivers.row_from_perf_analyzer("lumenrt", "digits_mlp", figures)
    assert row == {
        "peer": "lumenrt",
        "model": "digits_mlp",
        "concurrency": 2,
        "driver": "perf_analyzer",
        "protocol": "http",
        "throughput_per_s": 481.2,
        "p50_us": 4100.0,
        "p90_us": 4600.0,
        "p95_us": 4800.0,
        "p99_us": 5300.0,
        "errors": 0,
    }
    assert tuple(row) == drivers.ROW_KEYS


def _table_rows() -> list[dict[str, Any]]:
    pa, load = common.PA_DRIVER, common.LOAD_DRIVER
    return [
        _row("lumenrt", "squeezenet", 1, pa, "http", 110.0, 9000.0),
        _row("lumenrt", "squeezenet", 4, pa, "http", 240.0, 24000.0),
        _row("lumenrt", "squeezenet", 1, load, "tcp", 120.0, 8000.0),
        _row("lumenrt", "squeezenet", 4, load, "tcp", 250.0, 25000.0),
        _row("triton", "squeezenet", 1, load, "http", 90.0, 12000.0),
        _row("triton", "squeezenet", 4, load, "http", 160.0, 20000.0),
        _row("fastapi", "digits_mlp", 1, load, "http-raw", 3000.0, 400.0),
        _row("fastapi", "digits_mlp", 4, load, "http-raw", 6000.0, 1100.0),
        _row("mlserver", "digits_mlp", 4, load, "http-json", 900.0, 9000.0),
    ]


def _table_lines(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")
    ]


def test_markdown_table_columns_follow_peer_order_then_first_appearance() -> None:
    header = _table_lines(table.markdown_table(_table_rows()))[0]
    assert header == [
        "model", "concurrency",
        "lumenrt http (pa) /s", "lumenrt http (pa) p99 ms", "lumenrt tcp /s", "lumenrt tcp p99 ms",
        "triton http /s", "triton http p99 ms", "mlserver http-json /s", "mlserver http-json p99 ms",
        "fastapi http-raw /s", "fastapi http-raw p99 ms",
    ]  # fmt: skip


def test_markdown_table_marks_best_throughput_at_c4_and_lowest_p99_per_concurrency() -> None:
    lines = _table_lines(table.markdown_table(_table_rows()))
    body = {(line[0], line[1]): line[2:] for line in lines[2:]}
    assert set(body) == {("squeezenet", "1"), ("squeezenet", "4"), ("digits_mlp", "1"), ("digits_mlp", "4")}
    # squeezenet c1: no throughput mark (not concurrency 4); lowest p99 is lumenrt tcp (8.00 ms)
    assert body["squeezenet", "1"][:6] == ["110.0", "9.00", "120.0", "**8.00**", "90.0", "12.00"]
    # squeezenet c4: best throughput lumenrt tcp (250), lowest p99 triton (20 ms)
    assert body["squeezenet", "4"][:6] == ["240.0", "24.00", "**250.0**", "25.00", "160.0", "**20.00**"]
    assert body["squeezenet", "4"][6:] == ["-", "-", "-", "-"]  # mlserver, fastapi: not run on it
    # digits_mlp c4: fastapi best throughput and lowest p99; mlserver unmarked; c1 has no mlserver run
    assert body["digits_mlp", "4"][6:] == ["900.0", "9.00", "**6,000.0**", "**1.10**"]
    assert body["digits_mlp", "1"][6:] == ["-", "-", "3,000.0", "**0.40**"]


def test_best_marks_marks_every_tie() -> None:
    rows = [
        _row("lumenrt", "m", 4, common.LOAD_DRIVER, "tcp", 100.0, 5000.0),
        _row("triton", "m", 4, common.LOAD_DRIVER, "http", 100.0, 5000.0),
    ]
    best_tp, low_p99 = table.best_marks(rows)
    assert best_tp == {("m", "lumenrt tcp"), ("m", "triton http")}
    assert low_p99 == {("m", 4, "lumenrt tcp"), ("m", 4, "triton http")}


def test_markdown_table_shows_errors_and_missing_figures() -> None:
    row = _row("mlserver", "m", 1, common.LOAD_DRIVER, "grpc", 50.0, 1000.0)
    row["errors"], row["p99_us"] = 3, None
    lines = _table_lines(table.markdown_table([row]))
    assert lines[2] == ["m", "1", "50.0 (3 err)", "-"]


def test_parse_load_json_skips_text_before_the_summary() -> None:
    summary = _summary(1, 10.0, 100.0)
    assert drivers.parse_load_json("connecting ...\n" + json.dumps(summary, indent=2)) == summary
    with pytest.raises(ValueError):
        drivers.parse_load_json("no summary here")


def test_perf_analyzer_input_carries_the_same_bytes_as_the_npz() -> None:
    x = np.arange(2 * 64, dtype=np.float32).reshape(2, 64)[:1]  # batch 1
    data = models.perf_analyzer_input({"input": x})
    assert list(data) == ["data"] and len(data["data"]) == 1
    raw = base64.b64decode(data["data"][0]["input"]["b64"])
    buf = io.BytesIO()
    np.savez(buf, input=x)
    buf.seek(0)
    assert raw == np.load(buf)["input"].tobytes()


def test_load_command_passes_the_shared_settings() -> None:
    settings = drivers.LoadSettings(duration_s=10, warmup_s=2, timeout_s=30, processes=1, pa_window_ms=3333,
                                pa_stability_pct=25, pa_max_trials=6)  # fmt: skip
    cmd = drivers.load_command("tcp://127.0.0.1:9", "squeezenet", 4, settings, Path("in.npz"), Path("out"),
                           "label", "http://127.0.0.1:8")  # fmt: skip
    assert cmd[:5] == [sys.executable, "-m", "lumenrt.cli", "bench", "load"]
    pairs = dict(itertools.pairwise(cmd))
    assert pairs["--target"] == "tcp://127.0.0.1:9" and pairs["--concurrency"] == "4"
    assert pairs["--duration-s"] == "10" and pairs["--warmup-s"] == "2"
    assert pairs["--input-file"] == "in.npz" and pairs["--out"] == "out"
    assert pairs["--metadata-url"] == "http://127.0.0.1:8"
    assert "--no-stages" in cmd and "--json" in cmd
    assert "--metadata-url" not in drivers.load_command("http-raw://h:1/p", "m", 1, settings, Path("x.npz"),
                                                    Path("o"), "l", None)  # fmt: skip


def test_run_py_turns_its_flags_into_settings_and_an_estimate() -> None:
    args = run.build_parser().parse_args(["--quick", "--peers", "lumenrt,fastapi"])
    settings, concurrency = run.load_settings(args)
    assert isinstance(settings, drivers.LoadSettings)  # run.py and this test share benchmarks/peers' modules
    assert concurrency == [1, 4] and (settings.warmup_s, settings.duration_s) == (1.0, 3.0)
    assert settings.pa_window_ms == 1000
    # per concurrency: lumenrt perf_analyzer 4 x 1 s + 2, its tcp, http and grpc load runs 1 + 3 + 1.5 s
    # each, fastapi one load run; 15 s per server start
    assert run.estimate_s(args.peers, 1, len(concurrency), settings) == pytest.approx(
        (6.0 + 3 * 5.5) * 2 + 15 + 5.5 * 2 + 15
    )


def test_venv_marker_records_the_pins(tmp_path: Path) -> None:
    spec = venvs.VenvSpec("fastapi", tmp_path / "venv", ("b==2", "a==1"), ("a", "b"))
    assert not venvs.venv_is_current(spec)  # no interpreter
    (spec.path / "bin").mkdir(parents=True)
    (spec.path / "bin" / "python").write_text("")
    assert not venvs.venv_is_current(spec)  # no marker
    (spec.path / venvs.MARKER_NAME).write_text(venvs.marker_text(spec.pins))
    assert venvs.venv_is_current(spec)
    changed = venvs.VenvSpec("fastapi", spec.path, ("a==1", "b==3"), ("a", "b"))
    assert not venvs.venv_is_current(changed)  # a pin change reinstalls


def test_mlserver_model_settings_describe_the_model() -> None:
    model = SimpleNamespace(
        name="digits_mlp",
        onnx_path=Path("/m/model.onnx"),
        inputs=({"name": "input", "datatype": "FP32", "dims": [64]},),
        outputs=({"name": "probabilities", "datatype": "FP32", "dims": [10]},
                 {"name": "label", "datatype": "INT64", "dims": []}),
    )  # fmt: skip
    settings = servers.mlserver_model_settings(model)
    assert settings["implementation"] == "mlserver_onnx.OnnxRuntimeModel"
    assert settings["parameters"]["uri"] == "/m/model.onnx"
    assert settings["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert settings["outputs"][1] == {"name": "label", "datatype": "INT64", "shape": [-1]}
    assert servers.mlserver_settings(1, 2, 3)["parallel_workers"] == common.SESSIONS


def test_triton_peer_reads_tensors_and_preferred_sizes() -> None:
    assert triton_peer.preferred_batch_sizes(8, None) == [4, 8]
    assert triton_peer.preferred_batch_sizes(2, None) == [2]
    assert triton_peer.preferred_batch_sizes(32, []) == []
    assert triton_peer.preferred_batch_sizes(8, [4, 16]) == [4]
    session = SimpleNamespace(
        get_inputs=lambda: [SimpleNamespace(name="input", type="tensor(float)", shape=["batch", 64])],
        get_outputs=lambda: [SimpleNamespace(name="label", type="tensor(int64)", shape=["batch"])],
    )
    inputs, outputs = triton_peer.model_io(session)
    assert inputs == [triton_peer.TensorSpec("input", np.float32, (64,))]
    assert outputs == [triton_peer.TensorSpec("label", np.int64, (1,))]  # a scalar per item: dims [1]
