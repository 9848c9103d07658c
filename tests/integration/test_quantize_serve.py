"""``lumenrt quantize`` on the built-in MLP (dynamic) and SqueezeNet (static QDQ, a small
calibration set): the report's figures, digits accuracy within a point of FP32, and the INT8 models
loaded and served by the engine, answering as the INT8 model itself does and agreeing with the
served FP32 model as the report says. Then the built-in INT8 variants, served only when named."""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lumenrt.cli import main
from lumenrt.engine.engine import Engine, EngineConfig
from lumenrt.models.builtin import MODEL_NAMES, builtin_held_out, ensure_builtin_repository
from lumenrt.models.int8 import INT8_MODELS, builtin_models
from lumenrt.quantize.timing import make_session

MEASURE = ["--seconds", "0.2"]  # the report's timing fields must be there; their values are not tested
# SqueezeNet: 4 calibration images, 8 held out, so that it quantizes and compares in about a second
RUNS = {
    "digits_mlp": [],
    "squeezenet": ["--calibration-samples", "4", "--held-out-samples", "8"],
}
SCORES = {"digits_mlp": "probabilities", "squeezenet": "prob"}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Each built-in ONNX model quantized through the command: its INT8 file and its report."""
    out = tmp_path_factory.mktemp("quantized")
    results = {}
    for model, extra in RUNS.items():
        int8, report = out / f"{model}.onnx", out / f"{model}.json"
        argv = ["quantize", f"builtin:{model}", "--out", str(int8), "--report", str(report), *MEASURE, *extra]
        assert main(argv) == 0
        results[model] = (int8, json.loads(report.read_text()))
    return results


@pytest.fixture(scope="module")
def served(
    quantized: dict[str, tuple[Path, dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """An engine over a repository of the FP32 built-ins and their quantized files (``<name>_q``),
    each INT8 model with its FP32 model's config."""
    repo = tmp_path_factory.mktemp("repo")
    builtin = ensure_builtin_repository()
    for model, (int8, _) in quantized.items():
        shutil.copytree(builtin / model, repo / model)
        (repo / f"{model}_q" / "1").mkdir(parents=True)
        shutil.copy(builtin / model / "config.yaml", repo / f"{model}_q" / "config.yaml")
        shutil.copy(int8, repo / f"{model}_q" / "1" / "model.onnx")
    with Engine(repo, EngineConfig(thread_count=1)) as engine:
        yield engine


def _report_fields_are_complete(report: dict[str, Any], batches: list[str]) -> None:
    assert report["kind"] == "lumenrt-quantize" and report["machine"]["nproc"] >= 1 and "commit" in report
    assert 0 < report["size_bytes"]["int8"] < report["size_bytes"]["fp32"]
    assert list(report["performance"]["batches"]) == batches
    for by_model in report["performance"]["batches"].values():
        for name in ("fp32", "int8"):
            timing = by_model[name]
            assert timing["runs"] >= 1 and 0 < timing["p50_us"] <= timing["p99_us"] and timing["per_s"] > 0
        assert by_model["speedup"] > 0


def test_mlp_is_quantized_dynamically_and_keeps_its_accuracy(
    quantized: dict[str, tuple[Path, dict[str, Any]]],
) -> None:
    report = quantized["digits_mlp"][1]
    assert report["settings"]["method"] == "dynamic" and report["calibration"] is None
    _report_fields_are_complete(report, ["1", "32"])  # 32: digits_mlp's max_batch_size (no preferred size)
    agreement = report["agreement"]
    assert agreement["held_out"] == "builtin:digits_mlp" and agreement["samples"] == 450
    assert agreement["output"] == "probabilities" and agreement["max_abs_error"] >= 0
    accuracy = agreement["accuracy"]
    assert accuracy["int8"] >= accuracy["fp32"] - 0.01  # the bar: within 1 point


def test_squeezenet_is_quantized_statically_on_other_images_than_it_is_compared_on(
    quantized: dict[str, tuple[Path, dict[str, Any]]],
) -> None:
    report = quantized["squeezenet"][1]
    settings = report["settings"]
    assert (settings["method"], settings["format"], settings["per_channel"]) == ("static", "QDQ", True)
    assert report["calibration"] == {"source": "builtin:squeezenet", "samples": 4}
    _report_fields_are_complete(report, ["1", "8"])  # 8: the largest preferred_batch_size
    # INT8 weights are a quarter of FP32's; the scales and the graph's QDQ nodes add a little
    assert report["size_bytes"]["ratio"] < 0.5
    agreement = report["agreement"]
    assert agreement["samples"] == 8 and agreement["accuracy"] is None  # synthetic: no labels
    assert 0 <= agreement["top1_agreement"] <= 1


@pytest.mark.parametrize("model", list(RUNS))
def test_int8_model_serves_what_it_computes_and_agrees_as_reported(
    quantized: dict[str, tuple[Path, dict[str, Any]]], served: Engine, model: str
) -> None:
    int8_file, report = quantized[model]
    inputs, labels = builtin_held_out(model, report["agreement"]["samples"])
    name = next(iter(inputs))
    batch = int(list(report["performance"]["batches"])[-1])  # the report compared in batches of this
    direct = make_session(int8_file, 1, None, "direct")
    fp32_top, int8_top = [], []
    score = SCORES[model]
    for start in range(0, len(inputs[name]), batch):
        feed = {name: inputs[name][start : start + batch]}
        int8_answer = served.infer(f"{model}_q", feed).outputs[score]
        np.testing.assert_allclose(int8_answer, direct.run([score], feed)[0], rtol=1e-5, atol=1e-6)
        int8_top.append(int8_answer.argmax(axis=1))
        fp32_top.append(served.infer(model, feed).outputs[score].argmax(axis=1))
    fp32_labels, int8_labels = np.concatenate(fp32_top), np.concatenate(int8_top)
    agreement = float(np.mean(fp32_labels == int8_labels))
    # the same batches as the report's, so the same answers; one sample of slack for a near-tie that
    # the engine's thread count (its placement's, not the report's one thread) could tip
    slack = 1 / len(fp32_labels) + 1e-9
    assert agreement == pytest.approx(report["agreement"]["top1_agreement"], abs=slack)
    if labels is not None:
        assert np.mean(int8_labels == labels) >= np.mean(fp32_labels == labels) - 0.01


def test_builtin_int8_variants_are_served_only_when_named() -> None:
    with Engine(settings=EngineConfig(thread_count=1), models=list(INT8_MODELS)) as engine:
        assert sorted(engine.models()) == sorted(INT8_MODELS)
        inputs, labels = builtin_held_out("digits_mlp")
        answer = engine.infer("digits_mlp_int8", {"input": inputs["input"][:32]}).outputs["label"]
        assert labels is not None and np.mean(answer == labels[:32]) > 0.9
        images = builtin_held_out("squeezenet", 2)[0]
        assert engine.infer("squeezenet_int8", images).outputs["prob"].shape == (2, 1000)
    repo, names = builtin_models()
    assert names == list(MODEL_NAMES)  # the variants are in the folder now, but not served by default
    config = (repo / "digits_mlp_int8" / "config.yaml").read_text()
    assert "quantization:" in config and "top1_agreement" in config
