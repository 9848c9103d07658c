"""``lumenrt bench load`` against a real ``lumenrt serve``: counts add up, the reported percentiles are
those of the per-request CSV, errors are counted by kind, and the open loop records the queueing a
stalled server causes (latency from the intended send time), where a closed loop hides it."""

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.cli import main
from tests.e2e.conftest import ServeProcess, start_serve

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}


@pytest.fixture(scope="module")
def digits_server() -> Iterator[ServeProcess]:
    server = start_serve("--models", "digits_mlp")
    yield server
    assert server.stop() == 0, "\n".join(server.lines)


def _run(capsys: pytest.CaptureFixture[str], out: Path, *args: str) -> dict[str, Any]:
    assert main(["bench", "load", *args, "--out", str(out), "--json", "--quiet"]) == 0
    summary: dict[str, Any] = json.loads(capsys.readouterr().out)
    return summary


def _csv_rows(out: Path, summary: dict[str, Any]) -> list[dict[str, str]]:
    with (out / summary["csv"]).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _nearest_rank(values: list[float], q: float) -> float:
    """HdrHistogram's rule: the smallest value with at least round(q% of n) values at or below it."""
    ordered = sorted(values)
    rank = max(int(q / 100 * len(ordered) + 0.5), 1)
    return ordered[rank - 1]


@pytest.mark.parametrize("protocol", ["tcp", "http", "grpc"])
def test_counts_add_up_and_percentiles_match_the_csv(
    digits_server: ServeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: str
) -> None:
    target = f"{protocol}://127.0.0.1:{digits_server.ports[protocol]}"
    summary = _run(
        capsys,
        tmp_path,
        "--target",
        target,
        "--model",
        "digits_mlp",
        "--metadata-url",
        digits_server.http_url,
        "--concurrency",
        "3",
        "--requests",
        "400",
        "--warmup-s",
        "0.2",
    )
    counts = summary["counts"]
    assert counts["sent"] == 400
    assert counts["sent"] == counts["ok"] + counts["errors"]
    assert counts["errors"] == 0, counts
    rows = _csv_rows(tmp_path, summary)
    assert len(rows) == counts["sent"]
    latencies = [float(r["latency_us"]) for r in rows if r["ok"] == "1"]
    assert len(latencies) == counts["ok"]
    for name, q in PERCENTILES.items():
        exact = _nearest_rank(latencies, q)
        reported = summary["latency_us"][name]
        # 3 significant digits over whole microseconds: within 0.1% (+1 µs) of the exact value
        assert abs(reported - exact) <= exact * 0.002 + 1.0, (name, reported, exact)
    assert summary["latency_us"]["max"] == pytest.approx(max(latencies), rel=0.002, abs=1.0)
    # the server reported its stages for every answer, and they fit inside the round trip
    stages = summary["stages_us"]
    assert stages is not None and stages["batch_size_mean"] >= 1
    for r in rows:
        assert r["compute_us"] != "" and float(r["compute_us"]) < float(r["latency_us"])
    assert sum(summary["timeseries"]["ok"]) == counts["ok"]
    assert summary["server"]["config"]["name"] == "digits_mlp"
    # the server's architecture, from its model config's lumenrt_* parameters
    assert summary["server"]["architecture"]["queue_type"] == "mpmc"
    assert summary["server"]["architecture"]["mode"] == "thread"
    assert summary["machine"]["nproc"] >= 1 and "commit" in summary
    # the load generator's own CPU over the window: some, and no more than it had wall time for
    cpu = summary["load_cpu"]
    assert 0 < cpu["cpu_s"] <= summary["elapsed_s"] * summary["machine"]["nproc"] + 0.05
    assert cpu["us_per_request"] == pytest.approx(cpu["cpu_s"] * 1e6 / counts["ok"], rel=0.01)


def test_the_load_cpu_of_every_load_process_is_added_up(
    digits_server: ServeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = _run(
        capsys, tmp_path, "--target", f"tcp://127.0.0.1:{digits_server.ports['tcp']}", "--model", "digits_mlp",
        "--metadata-url", digits_server.http_url, "--concurrency", "2", "--processes", "2",
        "--requests", "300", "--warmup-s", "0.2",
    )  # fmt: skip
    assert summary["counts"]["ok"] == 300
    cpu = summary["load_cpu"]
    assert cpu is not None and cpu["cpu_s"] > 0 and cpu["cpus"] > 0


def test_errors_are_counted_by_kind(
    digits_server: ServeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    summary = _run(
        capsys,
        tmp_path,
        "--target",
        f"http://{digits_server.http_url}",
        "--model",
        "nope",
        "--input-file",
        str(tmp_path / "x.npy"),
        "--metadata-url",
        "127.0.0.1:1",
        "--requests",
        "50",
        "--concurrency",
        "2",
        "--warmup-s",
        "0",
    )
    assert summary["counts"] == {"sent": 50, "ok": 0, "errors": 50, "errors_by_kind": {"404": 50}}
    assert summary["latency_us"] is None
    rows = _csv_rows(tmp_path, summary)
    assert {(r["ok"], r["error"], r["latency_us"]) for r in rows} == {("0", "404", "")}


def test_bad_arguments_name_the_field(
    digits_server: ServeProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["bench", "load", "--target", "ftp://127.0.0.1:1", "--model", "m", "--out", str(tmp_path)]) == 2
    )
    assert "--target" in capsys.readouterr().err
    http = f"http://{digits_server.http_url}"
    assert main(["bench", "--target", http, "--model", "missing", "--out", str(tmp_path)]) == 2
    assert "--model 'missing'" in capsys.readouterr().err
    assert (
        main(["bench", "--target", http, "--model", "digits_mlp", "--rate", "-5", "--out", str(tmp_path)])
        == 2
    )
    assert "--rate" in capsys.readouterr().err


# A model that stalls once, for STALL_S, on its STALL_AT-th call (thread mode, one worker).
STALLING_MODEL = """
import time


class Model:
    def load(self):
        self.calls = 0

    def infer(self, inputs):
        self.calls += 1
        if self.calls == {stall_at}:
            time.sleep({stall_s})
        return {{"y": inputs["x"] + 1}}
"""
STALLING_CONFIG = """
backend: python
max_batch_size: 0
input: [{name: x, datatype: FP32, dims: [4]}]
output: [{name: y, datatype: FP32, dims: [4]}]
"""
STALL_S = 0.6
RATE_PER_S = 200


def _stalling_server(tmp_path: Path, stall_at: int) -> ServeProcess:
    repo = tmp_path / "repo"
    (repo / "stall" / "1").mkdir(parents=True)
    (repo / "stall" / "config.yaml").write_text(STALLING_CONFIG)
    (repo / "stall" / "1" / "model.py").write_text(STALLING_MODEL.format(stall_at=stall_at, stall_s=STALL_S))
    return start_serve("--repository", str(repo), "--workers", "1")


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_open_loop_records_the_queueing_a_stall_causes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    # open loop: the stall comes at 0.75 s, after the 0.1 s warm-up, whatever the machine's speed;
    # closed loop: no warm-up, so the 100th call is measured however slowly this machine makes it
    load = (
        ["--rate", str(RATE_PER_S), "--warmup-s", "0.1"]
        if mode == "open"
        else ["--concurrency", "1", "--warmup-s", "0"]
    )
    with _stalling_server(tmp_path, stall_at=150 if mode == "open" else 100) as server:
        summary = _run(
            capsys,
            tmp_path,
            "--target",
            f"tcp://127.0.0.1:{server.ports['tcp']}",
            "--metadata-url",
            server.http_url,
            "--model",
            "stall",
            *load,
            "--duration-s",
            "2",
        )
    assert summary["counts"]["errors"] == 0
    rows = _csv_rows(tmp_path, summary)
    latency_s = np.array([float(r["latency_us"]) for r in rows]) / 1e6
    intended_s = np.array([float(r["intended_s"]) for r in rows])
    slow = latency_s > STALL_S / 2
    if mode == "closed":
        # one client waits out the stall with one request: the stall leaves a single slow sample
        assert slow.sum() == 1, latency_s[slow]
        return
    # every request scheduled during the stall waited for its end: latency from the intended send
    # time, so the first half of the stall alone gives about RATE * STALL_S / 2 slow requests
    assert slow.sum() >= RATE_PER_S * STALL_S / 4, slow.sum()
    assert latency_s.max() >= STALL_S * 0.9
    # and they were sent on schedule (the client did not stall with the server)
    sent_s = np.array([float(r["sent_s"]) for r in rows])
    assert np.median(sent_s[slow] - intended_s[slow]) < STALL_S / 4
    # the slow requests were scheduled across the stall, not bunched at its start
    assert intended_s[slow].max() - intended_s[slow].min() >= STALL_S / 3
