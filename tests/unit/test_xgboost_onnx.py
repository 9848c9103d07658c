"""The XGBoost backend's two predictors agree, and the ONNX converter reproduces XGBoost's trees
(base score, missing-value directions, ``<`` splits) for every objective it accepts."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import xgboost as xgb
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

from lumenrt.backends import Placement, get_backend, xgboost_backend
from lumenrt.backends.xgboost_onnx import OBJECTIVES, XGBoostConversionError, convert
from lumenrt.engine.config import ConfigError, ModelConfig, TensorSpec

ONE_CORE = Placement(cores=(0,), intra_op_threads=1)
Matrix = np.ndarray[Any, Any]

DATASETS: dict[str, Callable[..., Any]] = {
    "binary": load_breast_cancer,
    "regression": load_diabetes,
    "multiclass": load_iris,
}


def _dataset_for(objective: str) -> str:
    if objective.startswith("multi:"):
        return "multiclass"
    if objective.startswith("binary:") or objective == "reg:logistic":
        return "binary"
    return "regression"


def _with_missing(x: Matrix, fraction: float, seed: int) -> Matrix:
    rng = np.random.default_rng(seed)
    x = x.astype(np.float32)  # a copy
    x[rng.random(x.shape) < fraction] = np.nan
    return x


def train(objective: str, rounds: int = 10, **params: Any) -> tuple[xgb.Booster, Matrix]:
    """A small booster trained on a few hundred rows with some values missing (so that trees learn
    both default directions), and held-out rows with more values missing plus an all-NaN row."""
    x, y = DATASETS[_dataset_for(objective)](return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    split = min(300, len(x) - 30)
    all_params = {"objective": objective, "max_depth": 4, "nthread": 1, "seed": 0, **params}
    if objective.startswith("multi:"):
        all_params["num_class"] = 3
    booster = xgb.train(all_params, xgb.DMatrix(_with_missing(x[:split], 0.1, 1), y[:split]), rounds)
    rows = _with_missing(x[split:], 0.25, 2)
    rows[0, :] = np.nan
    return booster, rows


def _config(predictor: str, **kw: Any) -> ModelConfig:
    return ModelConfig(
        name="tabular",
        backend="xgboost",
        max_batch_size=64,
        parameters={"xgboost": {"predictor": predictor}},
        source="models/tabular/config.yaml",
        **kw,
    )


def _save(booster: xgb.Booster, folder: Path, name: str = "model.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    booster.save_model(str(path))
    return path


REQUIRED = ("binary:logistic", "reg:squarederror", "multi:softprob")


@pytest.mark.parametrize("objective", REQUIRED)
def test_native_and_onnx_predictors_match(objective: str, tmp_path: Path) -> None:
    booster, rows = train(objective)
    path = _save(booster, tmp_path / "1")
    backend = get_backend("xgboost")
    native = backend.load(path, _config("native"), ONE_CORE)
    onnx = backend.load(path, _config("onnx"), ONE_CORE)
    try:
        expected_shape = (len(rows), 3) if objective == "multi:softprob" else (len(rows),)
        for batch in (rows, rows[:1], rows[5:6]):
            a = native.run({"input": batch})["predictions"]
            b = onnx.run({"input": batch})["predictions"]
            assert a.dtype == b.dtype == np.float32
            assert a.shape == b.shape == (len(batch), *expected_shape[1:])
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        direct = booster.predict(xgb.DMatrix(rows))
        np.testing.assert_allclose(onnx.run({"input": rows})["predictions"], direct, rtol=1e-5, atol=1e-6)
    finally:
        native.close()
        onnx.close()


def test_trained_trees_use_both_missing_directions() -> None:
    """Guards the test above: a missing value must sometimes go left and sometimes right."""
    booster, _ = train("binary:logistic")
    trees = json.loads(bytes(booster.save_raw("json")))["learner"]["gradient_booster"]["model"]["trees"]
    directions = {
        flag
        for tree in trees
        for node, flag in enumerate(tree["default_left"])
        if tree["left_children"][node] != -1
    }
    assert directions == {0, 1}


@pytest.mark.parametrize(
    ("objective", "params"),
    [(objective, {}) for objective in sorted(OBJECTIVES)]
    + [("binary:logistic", {"base_score": 0.3}), ("multi:softprob", {"base_score": 0.2})],
)
def test_converted_graph_equals_xgboost_predict(objective: str, params: dict[str, Any]) -> None:
    booster, rows = train(objective, rounds=5, **params)
    session = ort.InferenceSession(convert(booster).SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input": rows})
    want = booster.predict(xgb.DMatrix(rows))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_split_threshold_goes_right_as_xgboost_does() -> None:
    """x < threshold goes to "yes"; a value equal to the threshold goes to "no"."""
    booster, _ = train("reg:squarederror", rounds=1, max_depth=1)
    tree = json.loads(bytes(booster.save_raw("json")))["learner"]["gradient_booster"]["model"]["trees"][0]
    feature, threshold = tree["split_indices"][0], np.float32(tree["split_conditions"][0])
    rows = np.zeros((3, booster.num_features()), dtype=np.float32)
    rows[:, feature] = [np.nextafter(threshold, np.float32(-np.inf)), threshold, np.nan]
    session = ort.InferenceSession(convert(booster).SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input": rows})
    np.testing.assert_allclose(got, booster.predict(xgb.DMatrix(rows)), rtol=1e-6)
    assert got[0] != got[1]


@pytest.mark.parametrize("objective", ["multi:softmax", "rank:pairwise"])
def test_unsupported_objective_is_refused_by_onnx_but_served_natively(objective: str, tmp_path: Path) -> None:
    booster, rows = train(objective, rounds=2)
    with pytest.raises(XGBoostConversionError, match=f"objective '{objective}' is not supported"):
        convert(booster)
    path = _save(booster, tmp_path / "1")
    with pytest.raises(ConfigError) as caught:
        get_backend("xgboost").load(path, _config("onnx"), ONE_CORE)
    assert caught.value.field == "parameters.xgboost.predictor"
    native = get_backend("xgboost").load(path, _config("native"), ONE_CORE)
    np.testing.assert_allclose(native.run({"input": rows})["predictions"], booster.predict(xgb.DMatrix(rows)))
    native.close()


def test_categorical_splits_are_refused() -> None:
    x = np.array([[0.0], [1.0], [2.0], [0.0], [1.0], [2.0]] * 20, dtype=np.float32)
    y = (x[:, 0] == 1).astype(np.float32)
    data = xgb.DMatrix(x, y, feature_types=["c"], enable_categorical=True)
    booster = xgb.train({"max_depth": 2, "nthread": 1}, data, 2)
    with pytest.raises(XGBoostConversionError, match="categorical"):
        convert(booster)


def test_onnx_form_is_cached_next_to_the_model_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    booster, rows = train("binary:logistic", rounds=3)
    path = _save(booster, tmp_path / "1")
    backend = get_backend("xgboost")
    first = backend.load(path, _config("onnx"), ONE_CORE)
    cached = sorted(p.name for p in path.parent.iterdir() if p.name != "model.json")
    assert len(cached) == 1 and cached[0].startswith("model.json.") and cached[0].endswith(".onnx")

    def no_conversion(document: Any) -> Any:
        raise AssertionError("converted again although the cache holds this model")

    monkeypatch.setattr(xgboost_backend, "convert_document", no_conversion)
    second = backend.load(path, _config("onnx"), ONE_CORE)
    np.testing.assert_array_equal(
        first.run({"input": rows})["predictions"], second.run({"input": rows})["predictions"]
    )
    first.close()
    second.close()
    monkeypatch.undo()

    retrained, _ = train("binary:logistic", rounds=4)  # a changed model file gets its own entry
    _save(retrained, tmp_path / "1")
    third = backend.load(path, _config("onnx"), ONE_CORE)
    np.testing.assert_allclose(
        third.run({"input": rows})["predictions"], retrained.predict(xgb.DMatrix(rows)), rtol=1e-5, atol=1e-6
    )
    third.close()
    assert len([p for p in path.parent.iterdir() if p.suffix == ".onnx"]) == 2
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("model_file", ["model.ubj", "model.json"])
@pytest.mark.parametrize("predictor", ["onnx", "native"])
def test_names_and_threads_from_config(model_file: str, predictor: str, tmp_path: Path) -> None:
    booster, rows = train("multi:softprob", rounds=2)
    path = _save(booster, tmp_path / "1", model_file)
    config = _config(
        predictor,
        inputs=(TensorSpec("features", "FP32", (4,)),),
        outputs=(TensorSpec("probabilities", "FP32", (3,)),),
    )
    session = get_backend("xgboost").load(path, config, Placement(cores=(0, 1), intra_op_threads=2))
    outputs = session.run({"features": rows.astype(np.float64)})
    assert list(outputs) == ["probabilities"]
    np.testing.assert_allclose(
        outputs["probabilities"], booster.predict(xgb.DMatrix(rows)), rtol=1e-5, atol=1e-6
    )
    if predictor == "onnx":
        assert session.session.get_session_options().intra_op_num_threads == 2
    else:
        assert json.loads(session.booster.save_config())["learner"]["generic_param"]["nthread"] == "2"
    session.close()


@pytest.mark.parametrize("predictor", ["onnx", "native"])
def test_config_with_wrong_feature_count_is_refused(predictor: str, tmp_path: Path) -> None:
    booster, _ = train("reg:squarederror", rounds=2)
    path = _save(booster, tmp_path / "1")
    config = _config(predictor, inputs=(TensorSpec("input", "FP32", (7,)),))
    with pytest.raises(ConfigError, match="the model takes 10 features, the config says 7") as caught:
        get_backend("xgboost").load(path, config, ONE_CORE)
    assert caught.value.field == "inputs[0].dims"


@pytest.mark.parametrize(
    ("objective", "output_dims"),
    [("binary:logistic", ()), ("reg:squarederror", ()), ("multi:softprob", (3,))],
)
def test_describe_gives_fp32_io_without_batch_dim(
    objective: str, output_dims: tuple[int, ...], tmp_path: Path
) -> None:
    booster, _ = train(objective, rounds=1)
    path = _save(booster, tmp_path / "1")
    inputs, outputs = get_backend("xgboost").describe(path, _config("onnx"))
    assert inputs == (TensorSpec("input", "FP32", (booster.num_features(),)),)
    assert outputs == (TensorSpec("predictions", "FP32", output_dims),)
