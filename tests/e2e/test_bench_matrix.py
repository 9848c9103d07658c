"""``lumenrt bench matrix`` end to end on a small slice (one configuration, the tiny MLP): it serves
the configuration, loads it at a fixed rate and at saturation, writes the table and each row's run;
and the batch size really is the served model's max batch."""

import json
from pathlib import Path

import pytest
import yaml

from lumenrt.bench.matrix import format_table, repository_with_batch
from lumenrt.cli import main
from lumenrt.models.builtin import ensure_builtin_repository


def test_repository_with_batch_sets_the_max_batch(tmp_path: Path) -> None:
    source = ensure_builtin_repository()
    repo = repository_with_batch(source, "squeezenet", 1, tmp_path)
    config = yaml.safe_load((repo / "squeezenet" / "config.yaml").read_text())
    assert config["max_batch_size"] == 1
    assert "preferred_batch_size" not in config.get("dynamic_batching", {})  # 4 and 8 dropped
    model = repo / "squeezenet" / "1" / "model.onnx"
    assert (
        model.is_file() and not (repo / "squeezenet" / "1").is_symlink()
    )  # the repository refuses links out
    original = source / "squeezenet" / "1" / "model.onnx"
    if model.stat().st_dev == original.stat().st_dev:  # one file system: hard-linked, not copied
        assert model.stat().st_ino == original.stat().st_ino


def test_matrix_runs_a_slice_and_writes_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "matrix",
            "--model",
            "digits_mlp",
            "--queue-types",
            "naive",
            "--allocators",
            "standard",
            "--modes",
            "thread",
            "--batch-sizes",
            "4",
            "--no-single-worker",
            "--fixed-rate",
            "200",
            "--concurrency",
            "2",
            "--duration-s",
            "0.5",
            "--warmup-s",
            "0.2",
            "--raw-duration-s",
            "0.3",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    (path,) = tmp_path.glob("matrix-*.json")
    doc = json.loads(path.read_text())
    assert doc["kind"] == "matrix" and doc["raw"]["throughput_per_s"] > 0
    assert [(r["queue_type"], r["allocator_type"], r["batch_size"], r["load"]) for r in doc["rows"]] == [
        ("naive", "standard", 4, "fixed"),
        ("naive", "standard", 4, "saturation"),
    ]
    for row in doc["rows"]:
        assert row["errors"] == 0 and row["throughput_per_s"] > 0
        assert row["ratio_to_raw"] == pytest.approx(
            row["throughput_per_s"] / doc["raw"]["throughput_per_s"], abs=1e-3
        )
        run = json.loads((tmp_path / row["run"]).read_text())
        assert run["kind"] == "load" and run["server"]["config"]["max_batch_size"] == 4
        assert run["server"]["label"]["queue_type"] == "naive"
        assert (tmp_path / row["run"]).with_suffix(".csv").is_file()
    fixed = doc["rows"][0]
    # the offered rate was carried (saturation gives thousands); a busy machine delays the last answers
    assert fixed["throughput_per_s"] == pytest.approx(200, rel=0.5)
    assert all(r["lane"] == "auto" for r in doc["rows"])  # the lane `lumenrt serve` uses by default
    assert all(r["loop_spin_us"] == 0 for r in doc["rows"])  # serve's default: the loop sleeps at once
    assert "| naive | standard | thread | 2 | 4 | auto | 0 | saturation |" in format_table(doc)
    assert "| naive | standard | thread | 2 | 4 | auto | 0 | saturation |" in out


def test_spsc_rows_have_their_one_worker() -> None:
    import argparse

    from lumenrt.bench.matrix import add_arguments, configs

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    rows = configs(parser.parse_args([]))
    assert {c.workers for c in rows if c.queue_type == "spsc"} == {1}
    assert {c.workers for c in rows if c.queue_type != "spsc" and c.queue_type != "mpmc"} == {2}
    # queue x allocator x mode x batch, less standard with process workers (the engine refuses
    # it: process workers always use the shared arena), plus one-worker mpmc rows per mode
    assert len(rows) == 4 * 2 * 2 * 2 - 4 * 2 + 2
    assert not [c for c in rows if c.allocator_type == "standard" and c.mode == "process"]


def test_loop_spin_is_a_dimension_given_to_serve() -> None:
    import argparse

    from lumenrt.bench.matrix import add_arguments, configs

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    plain = configs(parser.parse_args(["--queue-types", "mpmc", "--modes", "thread"]))
    both = configs(
        parser.parse_args(["--queue-types", "mpmc", "--modes", "thread", "--loop-spin-us", "0", "200"])
    )
    assert len(both) == 2 * len(plain) - 1  # the one-worker row takes the first value only
    spun = [c for c in both if c.loop_spin_us == 200]
    assert spun and all(c.label.endswith("/spin200") for c in spun)
    args = spun[0].serve_args()
    assert args[args.index("--loop-spin-us") + 1] == "200"
    assert {c.loop_spin_us for c in plain} == {0}
