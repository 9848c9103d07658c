"""The quantizer's choices (method, per-channel, reduce range), its output on tiny models, and the
agreement figures computed from known outputs."""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest

from lumenrt.cli import main
from lumenrt.quantize.agreement import compare, score_output
from lumenrt.quantize.calibration import Samples
from lumenrt.quantize.model_source import open_model, preferred_batch
from lumenrt.quantize.quantizer import needs_reduce_range, quantize_model, resolve_settings
from lumenrt.quantize.timing import make_session
from tests.quantize_models import convnet, images, mlp, sample_folder


def test_auto_picks_static_for_convolutions_and_dynamic_otherwise(tmp_path: Path) -> None:
    assert resolve_settings(open_model(str(convnet(tmp_path / "c.onnx")))).method == "static"
    assert resolve_settings(open_model(str(mlp(tmp_path / "m.onnx")))).method == "dynamic"
    assert resolve_settings(open_model(str(mlp(tmp_path / "m.onnx"))), method="static").method == "static"


def test_per_channel_is_on_where_the_opset_allows_it(tmp_path: Path) -> None:
    assert resolve_settings(open_model(str(mlp(tmp_path / "new.onnx")))).per_channel
    assert not resolve_settings(open_model(str(mlp(tmp_path / "old.onnx", opset=11)))).per_channel


@pytest.mark.parametrize(
    ("machine", "flags", "expected"),
    [
        ("x86_64", {"avx2", "fma"}, True),  # VPMADDUBSW saturates: 7-bit weights
        ("x86_64", {"avx2", "avx512_vnni"}, False),
        ("x86_64", {"avx2", "avx_vnni"}, False),
        ("aarch64", {"asimd"}, False),
    ],
)
def test_reduce_range_only_on_x86_without_vnni(machine: str, flags: set[str], expected: bool) -> None:
    assert needs_reduce_range(machine, frozenset(flags)) is expected


def test_preferred_batch_without_config_is_the_flag_or_the_default(tmp_path: Path) -> None:
    source = open_model(str(mlp(tmp_path / "m.onnx")))
    assert preferred_batch(source, None) == 8
    assert preferred_batch(source, 3) == 3


def _ops(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_static_qdq_model_runs_and_stays_close(tmp_path: Path) -> None:
    source = open_model(str(convnet(tmp_path / "c.onnx")))
    out = tmp_path / "c8.onnx"
    quantize_model(source.path, out, resolve_settings(source), Samples({"image": images(16)}, "calib"), None)
    assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(out)
    assert list(tmp_path.glob(".*.tmp")) == []
    fp32, int8 = (make_session(p, 1, None, "test") for p in (source.path, out))
    held_out = Samples({"image": images(16, seed=2)}, "held")
    agreement = compare(fp32, int8, held_out, score_output(fp32.get_outputs(), None), batch=4)
    assert agreement.samples == 16 and agreement.output == "scores"
    assert agreement.max_abs_error < 0.2  # scores are means of ~unit activations: 8-bit steps are ~0.01


def test_dynamic_model_has_integer_matmuls(tmp_path: Path) -> None:
    source = open_model(str(mlp(tmp_path / "m.onnx")))
    out = tmp_path / "m8.onnx"
    quantize_model(source.path, out, resolve_settings(source), None, None)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= _ops(out)


def test_failed_quantization_leaves_no_file(tmp_path: Path) -> None:
    source = open_model(str(convnet(tmp_path / "c.onnx")))
    out = tmp_path / "c8.onnx"
    empty = Samples({"image": images(0)}, "calib")
    with pytest.raises(ValueError):  # ONNX Runtime's calibrator: no data collected
        quantize_model(source.path, out, resolve_settings(source), empty, None)
    assert not out.exists() and list(tmp_path.glob(".*.tmp")) == []


def test_command_on_a_folder_holds_out_its_last_quarter_and_reports(tmp_path: Path) -> None:
    model = convnet(tmp_path / "c.onnx")
    calib = sample_folder(tmp_path / "calib", {"image": images(8)})
    report_file = tmp_path / "r.json"
    argv = ["quantize", str(model), "--out", str(tmp_path / "c8.onnx"), "--calibration", str(calib)]
    assert main([*argv, "--report", str(report_file), "--seconds", "0.01", "--batch", "4"]) == 0
    report = json.loads(report_file.read_text())
    assert report["calibration"] == {"source": str(calib), "samples": 6}
    assert report["agreement"]["samples"] == 2 and report["agreement"]["output"] == "scores"
    assert list(report["performance"]["batches"]) == ["1", "4"]
    assert report["settings"]["method"] == "static" and report["agreement"]["accuracy"] is None


class FixedSession:
    """Answers each run with the next rows of a fixed output."""

    def __init__(self, scores: np.ndarray) -> None:
        self.scores, self.at = scores, 0

    def run(self, names: list[str], feed: dict[str, Any]) -> list[np.ndarray]:
        rows = len(next(iter(feed.values())))
        self.at += rows
        return [self.scores[self.at - rows : self.at]]


def test_agreement_counts_top1_errors_and_accuracy() -> None:
    fp32 = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]], np.float32)
    int8 = np.array([[0.8, 0.2], [0.2, 0.8], [0.45, 0.55], [0.3, 0.7]], np.float32)  # row 2 flips
    labels = np.array([0, 1, 1, 1])
    held_out = Samples({"x": np.zeros((4, 2), np.float32)}, "held", labels=labels)
    agreement = compare(FixedSession(fp32), FixedSession(int8), held_out, "scores", batch=3)
    assert agreement.top1_agreement == 0.75
    assert agreement.max_abs_error == pytest.approx(0.15)
    assert agreement.accuracy_fp32 == 0.75 and agreement.accuracy_int8 == 1.0


def test_one_value_per_sample_has_no_top1() -> None:
    held_out = Samples({"x": np.zeros((3, 2), np.float32)}, "held")
    values = np.array([[1.0], [2.0], [3.0]], np.float32)
    agreement = compare(FixedSession(values), FixedSession(values + 0.5), held_out, "y", batch=2)
    assert agreement.top1_agreement is None and agreement.max_abs_error == pytest.approx(0.5)


def test_score_output_prefers_a_float_output_with_classes() -> None:
    outputs = [
        SimpleNamespace(name="label", type="tensor(int64)", shape=["batch"]),
        SimpleNamespace(name="probabilities", type="tensor(float)", shape=["batch", 10]),
    ]
    assert score_output(outputs, None) == "probabilities"
    assert score_output(outputs, "label") == "label"
    with pytest.raises(ValueError, match="--output nope: the model has no such output"):
        score_output(outputs, "nope")
