"""The built-in repository: three models built in code, real predictions, cached and reused, and a
build that is safe against concurrent first uses and crashed earlier builds."""

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from lumenrt.models import builtin, digits, squeezenet, tabular
from lumenrt.models.builtin import (
    MARKER,
    MODEL_NAMES,
    builtin_examples,
    builtin_info,
    ensure_builtin_repository,
)

ort = pytest.importorskip("onnxruntime")
xgboost = pytest.importorskip("xgboost")

MODEL_FILES = {
    "squeezenet": "1/model.onnx",
    "digits_mlp": "1/model.onnx",
    "tabular_xgb": "1/model.json",
}


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once for the whole session."""
    return ensure_builtin_repository(tmp_path_factory.mktemp("cache"))


def session(path: Path) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_repository_has_three_models_with_config_and_version_1(repo: Path) -> None:
    assert repo.name == builtin.BUILTIN_VERSION
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == sorted(MODEL_NAMES)
    for name, model_file in MODEL_FILES.items():
        config = yaml.safe_load((repo / name / "config.yaml").read_text())
        assert (repo / name / model_file).is_file()
        assert config["max_batch_size"] > 0
        assert config["input"] and config["output"]
        assert (
            config["dynamic_batching"]["max_queue_delay_us"] >= 0
        )  # 0 for the tiny models: batch what is queued
    assert yaml.safe_load((repo / "tabular_xgb" / "config.yaml").read_text())["backend"] == "xgboost"
    assert (repo / MARKER).is_file()
    assert not list(repo.parent.glob(".builtin-v4.tmp-*"))


def test_configs_pass_the_model_config_loader(repo: Path) -> None:
    from lumenrt.engine.repository import load_model_config

    for name in MODEL_NAMES:
        config = load_model_config(repo / name / "config.yaml", default_name=name)
        assert config.name == name and config.dynamic_batching is not None
        assert [s.name for s in config.inputs] == [s["name"] for s in _config_inputs(repo, name)]
    tabular_config = load_model_config(repo / "tabular_xgb" / "config.yaml", default_name="tabular_xgb")
    assert tabular_config.outputs[0].dims == ()  # the xgboost backend: binary:logistic gives [batch]
    assert tabular_config.parameters["xgboost"] == {"predictor": "onnx"}


def _config_inputs(repo: Path, name: str) -> list[dict[str, Any]]:
    specs: list[dict[str, Any]] = yaml.safe_load((repo / name / "config.yaml").read_text())["input"]
    return specs


def test_squeezenet_gives_distinct_probabilities_at_batch_1_and_4(repo: Path) -> None:
    sess = session(repo / "squeezenet" / "1" / "model.onnx")
    assert [tuple(i.shape) for i in sess.get_inputs()] == [("batch", 3, 224, 224)]
    images = builtin_examples("squeezenet", batch=4)["data"]
    (batched,) = sess.run(["prob"], {"data": images})
    (single,) = sess.run(["prob"], {"data": images[:1]})
    assert batched.shape == (4, 1000) and single.shape == (1, 1000)
    assert batched.dtype == np.float32
    assert np.isfinite(batched).all()
    np.testing.assert_allclose(batched.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(single[0], batched[0], rtol=1e-4, atol=1e-7)
    # Not degenerate: every image gets its own distribution, peaked above uniform (1/1000).
    assert np.ptp(batched[0]) > 0
    for i in range(1, 4):
        assert np.abs(batched[i] - batched[0]).max() > 1e-3
    assert len(set(batched.argmax(axis=1).tolist())) > 1
    assert (batched.max(axis=1) > 10 / 1000).all()


def test_squeezenet_has_the_squeezenet_1_1_parameter_count(repo: Path) -> None:
    import onnx

    model = onnx.load(str(repo / "squeezenet" / "1" / "model.onnx"))
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert params == 1_235_496  # torchvision squeezenet1_1: 1,235,496 parameters


def test_digits_onnx_matches_sklearn_predict_proba() -> None:
    clf, accuracy = digits.train()
    assert accuracy > 0.9
    x, _ = digits.held_out()
    sess = ort.InferenceSession(digits.to_onnx(clf).SerializeToString(), providers=["CPUExecutionProvider"])
    probabilities, label = sess.run(["probabilities", "label"], {"input": x})
    np.testing.assert_allclose(probabilities, clf.predict_proba(x.astype(np.float64)), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(label, clf.predict(x.astype(np.float64)))
    assert label.dtype == np.int64


def test_digits_model_predicts_held_out_digits(repo: Path) -> None:
    x, y = digits.held_out()
    probabilities, label = session(repo / "digits_mlp" / "1" / "model.onnx").run(None, {"input": x})
    assert probabilities.shape == (len(x), 10) and label.shape == (len(x),)
    assert np.mean(label == y) > 0.9
    np.testing.assert_array_equal(label, probabilities.argmax(axis=1))
    recorded = yaml.safe_load((repo / "digits_mlp" / "config.yaml").read_text())["parameters"]["training"]
    assert recorded["test_accuracy"] == pytest.approx(np.mean(label == y), abs=1e-3)


def test_xgboost_model_file_loads_and_predicts_held_out_rows(repo: Path) -> None:
    booster = xgboost.Booster(model_file=str(repo / "tabular_xgb" / "1" / "model.json"))
    assert booster.num_features() == 30
    x, y = tabular.held_out()
    probability = booster.inplace_predict(x)
    assert probability.shape == (len(x),)
    assert ((probability >= 0) & (probability <= 1)).all()
    accuracy = float(np.mean((probability > 0.5) == y))
    assert accuracy > 0.9
    info = builtin_info(repo)["models"]["tabular_xgb"]
    assert info["test_accuracy"] == pytest.approx(accuracy, abs=1e-3)


def test_examples_have_the_configured_names_shapes_and_dtypes(repo: Path) -> None:
    for name in MODEL_NAMES:
        config = yaml.safe_load((repo / name / "config.yaml").read_text())
        examples = builtin_examples(name)
        assert sorted(examples) == sorted(spec["name"] for spec in config["input"])
        for spec in config["input"]:
            array = examples[spec["name"]]
            assert array.dtype == np.float32 and array.flags.c_contiguous
            assert 1 <= array.shape[0] <= config["max_batch_size"]
            assert list(array.shape[1:]) == spec["dims"]
    np.testing.assert_array_equal(
        builtin_examples("squeezenet")["data"], builtin_examples("squeezenet")["data"]
    )
    with pytest.raises(KeyError, match="no built-in model"):
        builtin_examples("resnet50")


def test_second_call_reuses_the_cache_without_rebuilding(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker_mtime = (repo / MARKER).stat().st_mtime_ns
    model_mtime = (repo / "squeezenet" / "1" / "model.onnx").stat().st_mtime_ns

    def no_build(dest: Path) -> dict[str, Any]:
        raise AssertionError("rebuilt a complete repository")

    monkeypatch.setattr(builtin, "build_repository", no_build)
    assert ensure_builtin_repository(repo.parent) == repo
    assert (repo / MARKER).stat().st_mtime_ns == marker_mtime
    assert (repo / "squeezenet" / "1" / "model.onnx").stat().st_mtime_ns == model_mtime


def test_cache_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(builtin.CACHE_ENV, str(tmp_path / "env-cache"))
    assert builtin.builtin_repository_path() == tmp_path / "env-cache" / builtin.BUILTIN_VERSION
    monkeypatch.delenv(builtin.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert builtin.builtin_repository_path() == tmp_path / "xdg" / "lumenrt" / builtin.BUILTIN_VERSION


def test_concurrent_first_uses_build_once_and_clear_crashed_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Leftovers of a crash: a temporary folder, and a final folder without its marker.
    (tmp_path / ".builtin-v4.tmp-crashed" / "squeezenet").mkdir(parents=True)
    (tmp_path / builtin.BUILTIN_VERSION / "digits_mlp").mkdir(parents=True)
    real_build = builtin.build_repository
    builds: list[Path] = []

    def counting_build(dest: Path) -> dict[str, Any]:
        builds.append(dest)
        return real_build(dest)

    monkeypatch.setattr(builtin, "build_repository", counting_build)
    results: list[Path] = []
    errors: list[BaseException] = []

    def first_use() -> None:
        try:
            results.append(ensure_builtin_repository(tmp_path))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(builds) == 1
    assert results == [tmp_path / builtin.BUILTIN_VERSION] * 3
    assert sorted(os.listdir(tmp_path)) == [builtin.BUILTIN_VERSION, f"{builtin.BUILTIN_VERSION}.lock"]
    assert builtin.is_complete(results[0])


def test_failed_build_leaves_no_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_build(dest: Path) -> dict[str, Any]:
        (dest / "squeezenet").mkdir()
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(builtin, "build_repository", half_build)
    with pytest.raises(RuntimeError, match="mid-build"):
        ensure_builtin_repository(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [f"{builtin.BUILTIN_VERSION}.lock"]


def test_squeezenet_weights_are_deterministic() -> None:
    a = squeezenet.build_squeezenet()
    b = squeezenet.build_squeezenet()
    assert a.SerializeToString() == b.SerializeToString()
