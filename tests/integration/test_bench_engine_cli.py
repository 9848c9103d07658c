"""benchmarks/engine.py and benchmarks/stages.py as a user runs them (smoke: short phases; the
figures are not judged)."""

import json
import subprocess
from pathlib import Path

from tests.benchmark_modules import run_benchmark_script

ROW_KEYS = {"model", "config", "throughput_per_s", "p50_us", "p99_us", "overhead_p50_us", "status"}


def run(script: str, args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return run_benchmark_script(script, args, timeout_s)


def test_bench_engine_help_lists_its_options() -> None:
    out = run("engine", ["--help"])
    assert out.returncode == 0 and "usage: benchmarks/engine.py" in out.stdout
    for option in ("--quick", "--json", "--duration-s", "--warmup-s", "--concurrency", "--scenario", "--out"):
        assert option in out.stdout


def test_bench_engine_json_rows_and_result_file(tmp_path: Path) -> None:
    out = run(
        "engine",
        [
            "--quick", "--json", "--duration-s", "0.3", "--out", str(tmp_path),
            "--scenario", "digits-overhead", "--scenario", "matrix",
        ]
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    for r in rows:
        assert r.keys() >= ROW_KEYS, r
        assert r["status"] == "ok" or r["status"].startswith("skipped: "), r
    by_key = {(r["scenario"], r["config"]): r for r in rows}
    digits = by_key[("digits-overhead", "mpmc/lumen_arena/thread/w2")]
    assert digits["model"] == "digits_mlp" and digits["overhead_p50_us"] is not None
    assert ("digits-overhead", "raw") in by_key
    assert ("digits-overhead", "mpmc/lumen_arena/process/w2") in by_key  # measured or skipped
    matrix = {config for scenario, config in by_key if scenario == "matrix"}
    assert matrix == {
        "raw",
        *(f"{q}/{a}/thread/w2" for q in ("mpmc", "naive", "batched") for a in ("lumen_arena", "standard")),
        "spsc/lumen_arena/thread/w1",
        "spsc/standard/thread/w1",
    }
    for config in matrix - {"raw"}:
        row = by_key[("matrix", config)]
        assert row["throughput_per_s"] > 0 and row["ratio_to_raw"] is not None
        assert row["mean_compute_us"] is not None
    (result,) = tmp_path.glob("engine-*.json")
    doc = json.loads(result.read_text())
    assert doc["machine"]["nproc"] >= 1 and "commit" in doc and len(doc["rows"]) == len(rows)
    assert doc["configs"]["mpmc/lumen_arena/thread/w2"]["queue_type"] == "mpmc"


def test_bench_engine_rejects_bad_arguments(tmp_path: Path) -> None:
    out = run("engine", ["--duration-s", "0", "--out", str(tmp_path)])
    assert out.returncode == 2 and "--duration-s" in out.stderr
    assert not list(tmp_path.glob("engine-*.json"))


def test_bench_stages_prints_every_stage_and_writes_them(tmp_path: Path) -> None:
    out = run("stages", ["--requests", "300", "--warmup", "30", "--out", str(tmp_path)])
    assert out.returncode == 0, out.stdout + out.stderr
    for stage in ("ingress", "handoff to worker", "compute", "return to caller", "total"):
        assert stage in out.stdout
    (result,) = tmp_path.glob("stages-*.json")
    data = json.loads(result.read_text())
    assert data["model"] == "digits_mlp" and data["requests"] == 300
    for mode in ("thread", "process"):
        stages = data["stages_us"][mode]
        assert all(v["p50_us"] >= 0 for v in stages.values()), stages
        # the stages partition the call: their medians cannot exceed the total's p99
        parts = sum(v["p50_us"] for k, v in stages.items() if k != "total")
        assert parts <= stages["total"]["p99_us"] * 2, stages
