"""``digits_mlp``: a scikit-learn MLP trained on the 8x8 digits data, exported to ONNX by hand.

The export is the forward pass of ``MLPClassifier`` written as ONNX nodes: one ``Gemm`` per layer
from ``coefs_`` / ``intercepts_``, the hidden activation after each hidden layer, ``Softmax`` at the
end, ``ArgMax`` for the label. Its probabilities equal ``clf.predict_proba`` up to float32 rounding.
Inputs are the raw pixel intensities of ``sklearn.datasets.load_digits`` (0..16), unscaled: the MLP
converges on them as they are (159 iterations, measured).
"""

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from lumenrt.models.split import Split, held_out_split

INPUT_NAME = "input"
PROBABILITIES = "probabilities"
LABEL = "label"
NUM_FEATURES = 64
NUM_CLASSES = 10
SEED = 0
HIDDEN = (64,)
MAX_ITER = 500  # converges (tol 1e-4 for 10 epochs) at 159: measured with scikit-learn 1.9
OPSET = 17
IR_VERSION = 8

_ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh", "logistic": "Sigmoid", "identity": "Identity"}


def held_out() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The held-out quarter of the digits data (stratified, fixed seed): the examples and the
    accuracy are measured on it, never on training rows. Read-only arrays (models/split.py)."""
    return _split()[1]


def calibration_rows() -> npt.NDArray[np.float32]:
    """The training rows (never the held-out ones): what quantizing the model calibrates on."""
    return _split()[0][0]


def _split() -> Split:
    from sklearn.datasets import load_digits

    return held_out_split(load_digits, SEED)


def train() -> tuple[Any, float]:
    """The fitted ``MLPClassifier`` and its accuracy on the test split."""
    from sklearn.neural_network import MLPClassifier

    (x_train, y_train), (x_test, y_test) = _split()
    # Trained in float64 (measured: 0.4 s against 1.1 s in float32); the ONNX graph runs in float32.
    x_train, x_test = x_train.astype(np.float64), x_test.astype(np.float64)
    clf = MLPClassifier(hidden_layer_sizes=HIDDEN, activation="relu", max_iter=MAX_ITER, random_state=SEED)
    clf.fit(x_train, y_train)
    return clf, float(clf.score(x_test, y_test))


def to_onnx(clf: Any) -> onnx.ModelProto:
    """``input`` FP32 [N, 64] -> ``probabilities`` FP32 [N, 10], ``label`` INT64 [N]."""
    if clf.out_activation_ != "softmax":
        raise ValueError(f"expected a multi-class MLP (softmax output), got {clf.out_activation_!r}")
    if not np.array_equal(clf.classes_, np.arange(len(clf.classes_))):
        raise ValueError("classes must be 0..n-1 so that ArgMax gives the label")
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    x = INPUT_NAME
    last = len(clf.coefs_) - 1
    for i, (weight, bias) in enumerate(zip(clf.coefs_, clf.intercepts_, strict=True)):
        initializers.append(numpy_helper.from_array(np.asarray(weight, dtype=np.float32), f"layer{i}.weight"))
        initializers.append(numpy_helper.from_array(np.asarray(bias, dtype=np.float32), f"layer{i}.bias"))
        out = f"layer{i}.out"
        nodes.append(
            helper.make_node("Gemm", [x, f"layer{i}.weight", f"layer{i}.bias"], [out], name=f"layer{i}")
        )
        if i < last:
            act = f"layer{i}.act"
            nodes.append(helper.make_node(_ACTIVATIONS[clf.activation], [out], [act], name=act))
            out = act
        x = out
    nodes.append(helper.make_node("Softmax", [x], [PROBABILITIES], name="softmax", axis=1))
    nodes.append(helper.make_node("ArgMax", [PROBABILITIES], [LABEL], name="argmax", axis=1, keepdims=0))
    graph = helper.make_graph(
        nodes,
        "digits_mlp",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", NUM_FEATURES])],
        [
            helper.make_tensor_value_info(PROBABILITIES, TensorProto.FLOAT, ["batch", NUM_CLASSES]),
            helper.make_tensor_value_info(LABEL, TensorProto.INT64, ["batch"]),
        ],
        initializer=initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="lumenrt",
        ir_version=IR_VERSION,
        doc_string="scikit-learn MLPClassifier trained on load_digits; inputs are pixel intensities 0..16",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def write(model_dir: Path) -> dict[str, Any]:
    """Train, write ``1/model.onnx`` and return the model's config."""
    clf, accuracy = train()
    (model_dir / "1").mkdir(parents=True)
    onnx.save_model(to_onnx(clf), str(model_dir / "1" / "model.onnx"))
    return {
        "backend": "onnxruntime",
        "max_batch_size": 32,
        "input": [{"name": INPUT_NAME, "datatype": "FP32", "dims": [NUM_FEATURES]}],
        "output": [
            {"name": PROBABILITIES, "datatype": "FP32", "dims": [NUM_CLASSES]},
            {"name": LABEL, "datatype": "INT64", "dims": []},
        ],
        "dynamic_batching": {
            "max_queue_delay_us": 0
        },  # batch what is queued: a wait costs more than this model computes
        # One instance: a batch-1 run (~8 µs) costs less than a hand-off between threads, so one worker
        # that takes everything queued as one batch serves more, and sooner, than two splitting it
        # (lumenrt bench load, TCP, concurrency 4: 9.6k/s p99 0.72 ms with one, 6.9k/s 1.24 ms with two).
        "instance_group": {"count": 1},
        "parameters": {
            "training": {
                "dataset": "sklearn.datasets.load_digits (75/25 stratified split, random_state 0)",
                "estimator": f"sklearn MLPClassifier hidden={list(HIDDEN)} relu random_state={SEED}",
                "iterations": int(clf.n_iter_),
                "test_accuracy": round(accuracy, 4),
            }
        },
    }
