"""The ``lumenrt`` command as a user runs it: the demo and the queue benchmark (smoke; the
benchmark's figures are not judged here)."""

import json
import subprocess
import sys
from pathlib import Path

LUMENRT = [sys.executable, "-m", "lumenrt.cli"]


def run(args: list[str], timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(LUMENRT + args, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_help_explains_the_commands() -> None:
    out = run(["--help"])
    assert out.returncode == 0 and "demo" in out.stdout and "bench" in out.stdout
    out = run(["bench", "queues", "--help"])
    assert out.returncode == 0 and "--json" in out.stdout and "--spin-iters" in out.stdout


def test_demo_answers_every_request_and_cleans_up() -> None:
    out = run(["demo", "--requests", "3000", "--workers", "2"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3000/3000 answered, 0 wrong" in out.stdout
    assert "shared memory cleaned up" in out.stdout


def test_demo_rejects_bad_arguments() -> None:
    out = run(["demo", "--queue-type", "fifo"])
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_bench_queues_json_rows_and_result_file(tmp_path: Path) -> None:
    out = run(
        [
            "bench", "queues", "--quick", "--scale", "0.2", "--json", "--out", str(tmp_path),
            "--scenario", "pair", "--scenario", "handoff-process-waiting", "--scenario", "throughput-2p2c",
            "--impl", "mpmc", "--impl", "naive", "--impl", "queue.Queue", "--impl", "multiprocessing.Queue",
        ]
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert {(r["impl"], r["scenario"]) for r in rows} >= {
        ("mpmc", "pair"),
        ("queue.Queue", "pair"),
        ("mpmc", "handoff-process-waiting"),
        ("multiprocessing.Queue", "handoff-process-waiting"),
        ("mpmc", "throughput-2p2c"),
    }
    for r in rows:
        assert {"impl", "scenario", "p50_ns", "p99_ns", "ops_per_s"} <= r.keys()
    pair = next(r for r in rows if (r["impl"], r["scenario"]) == ("mpmc", "pair"))
    assert pair["syscalls"] == 0  # the busy path made no futex call
    (result,) = tmp_path.glob("queues-*.json")
    doc = json.loads(result.read_text())
    assert doc["machine"]["nproc"] >= 1 and "config" in doc and len(doc["rows"]) == len(rows)
