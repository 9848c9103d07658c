"""Convert a trained XGBoost tree model into an ONNX graph that ONNX Runtime runs.

The graph is one ``ai.onnx.ml`` ``TreeEnsembleRegressor`` (every tree, summed, plus the base
margin) followed by the objective's link function written as standard ONNX ops:

    input  FP32 [batch, num_features]  (NaN = missing)
      -> TreeEnsembleRegressor -> margin [batch, n_targets]
      -> Sigmoid | Exp | Softmax(axis=1) | nothing
      -> Reshape to [batch] when n_targets == 1
    predictions FP32 [batch] or [batch, num_class]

It reproduces XGBoost's tree walk exactly: a split sends ``x < threshold`` to the "yes" child
(BRANCH_LT), a missing value (NaN) follows the node's ``default_left`` flag
(``nodes_missing_value_tracks_true``), thresholds and leaf values are XGBoost's float32 values.

The base score is read from the saved JSON model (``learner.learner_model_param.base_score``; in
XGBoost 3 a bracketed list, one value per class for multi-class). It is stored in the output space
and moved to the margin space the trees add to, as XGBoost's ``ProbToMargin`` does: logit for
the logistic objectives, log for poisson/gamma/tweedie, unchanged otherwise (measured against
``predict(output_margin=True)`` with xgboost 3.2).

Supported: gbtree boosters with numerical splits and one output per class (see ``OBJECTIVES``).
Anything else (dart, gblinear, categorical splits, multi-target trees, other objectives) raises
:class:`XGBoostConversionError` rather than converting into something that predicts differently.
"""

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx
import xgboost
from onnx import TensorProto, helper

INPUT_NAME = "input"
OUTPUT_NAME = "predictions"
ML_OPSET = 3  # ai.onnx.ml opset of TreeEnsembleRegressor with the attributes used here
ONNX_OPSET = 17
CONVERTER_VERSION = 1  # bump when the graph built here changes (it keys the on-disk cache)


class XGBoostConversionError(ValueError):
    """The model uses something the converter does not reproduce exactly."""


@dataclass(frozen=True, slots=True)
class Objective:
    base_to_margin: str  # "identity" | "logit" | "log": ProbToMargin applied to base_score
    link: str  # "identity" | "sigmoid" | "exp" | "softmax": margin -> prediction


# objective name -> how its base score and predictions relate to the margin (XGBoost's PredTransform)
OBJECTIVES: dict[str, Objective] = {
    "reg:squarederror": Objective("identity", "identity"),
    "reg:squaredlogerror": Objective("identity", "identity"),
    "reg:pseudohubererror": Objective("identity", "identity"),
    "reg:absoluteerror": Objective("identity", "identity"),
    "binary:logitraw": Objective("identity", "identity"),
    "binary:logistic": Objective("logit", "sigmoid"),
    "reg:logistic": Objective("logit", "sigmoid"),
    "count:poisson": Objective("log", "exp"),
    "reg:gamma": Objective("log", "exp"),
    "reg:tweedie": Objective("log", "exp"),
    "multi:softprob": Objective("identity", "softmax"),
}


@dataclass(frozen=True, slots=True)
class ModelSummary:
    """What the serving side needs to know about a booster: its input width and output shape."""

    objective: str
    num_features: int
    num_class: int  # 0 unless multi-class
    num_target: int  # 1 unless a multi-target model

    @property
    def output_dims(self) -> tuple[int, ...]:
        """Prediction dims without the batch dimension, as ``inplace_predict`` returns them."""
        if self.objective == "multi:softprob":
            return (self.num_class,)
        return (self.num_target,) if self.num_target > 1 else ()


def model_json(booster: xgboost.Booster) -> dict[str, Any]:
    """The booster as XGBoost's JSON model document (the same as a saved ``model.json``)."""
    raw = booster.save_raw(raw_format="json")
    document: dict[str, Any] = json.loads(bytes(raw))
    return document


def summarize(document: Mapping[str, Any]) -> ModelSummary:
    """Objective, feature, class and target counts of a JSON model (any objective)."""
    learner = document["learner"]
    params = learner["learner_model_param"]
    return ModelSummary(
        objective=str(learner["objective"]["name"]),
        num_features=int(params["num_feature"]),
        num_class=int(params.get("num_class", "0")),
        num_target=int(params.get("num_target", "1")),
    )


def check_convertible(document: Mapping[str, Any]) -> ModelSummary:
    """The summary of a model this module converts exactly; else XGBoostConversionError."""
    summary = summarize(document)
    if summary.objective not in OBJECTIVES:
        raise XGBoostConversionError(
            f"objective {summary.objective!r} is not supported "
            f"(supported: {', '.join(sorted(OBJECTIVES))}); use predictor: native"
        )
    if summary.num_target != 1:
        raise XGBoostConversionError(
            f"multi-target models (num_target={summary.num_target}) are not supported"
        )
    multiclass = summary.objective == "multi:softprob"
    if multiclass != (summary.num_class > 1):
        raise XGBoostConversionError(f"{summary.objective} with num_class={summary.num_class}")
    booster_name = document["learner"]["gradient_booster"]["name"]
    if booster_name != "gbtree":
        raise XGBoostConversionError(f"booster {booster_name!r} is not supported (only gbtree)")
    return summary


def base_margins(document: Mapping[str, Any], summary: ModelSummary) -> list[float]:
    """The base score of each output, in margin space."""
    text = str(document["learner"]["learner_model_param"]["base_score"])
    values = [float(part) for part in text.strip("[]").split(",") if part.strip()]
    n_targets = max(summary.num_class, 1)
    if len(values) == 1 and n_targets > 1:
        values = values * n_targets
    if len(values) != n_targets:
        raise XGBoostConversionError(f"base_score {text!r} has {len(values)} values for {n_targets} outputs")
    how = OBJECTIVES[summary.objective].base_to_margin
    if how == "logit" and not all(0.0 < value < 1.0 for value in values):
        raise XGBoostConversionError(f"base_score {text!r} must lie in (0, 1) for {summary.objective}")
    if how == "log" and not all(value > 0.0 for value in values):
        raise XGBoostConversionError(f"base_score {text!r} must be > 0 for {summary.objective}")
    if how == "logit":
        return [-math.log(1.0 / value - 1.0) for value in values]
    if how == "log":
        return [math.log(value) for value in values]
    return values


@dataclass(slots=True)
class _Ensemble:
    """The flat attribute lists of TreeEnsembleRegressor, filled tree by tree."""

    tree_ids: list[int] = field(default_factory=list)
    node_ids: list[int] = field(default_factory=list)
    feature_ids: list[int] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    true_ids: list[int] = field(default_factory=list)
    false_ids: list[int] = field(default_factory=list)
    missing_tracks_true: list[int] = field(default_factory=list)
    target_tree_ids: list[int] = field(default_factory=list)
    target_node_ids: list[int] = field(default_factory=list)
    target_ids: list[int] = field(default_factory=list)
    target_weights: list[float] = field(default_factory=list)

    def add_tree(self, tree_id: int, tree: Mapping[str, Any], target: int) -> None:
        if any(int(kind) != 0 for kind in tree.get("split_type", ())):
            raise XGBoostConversionError(f"tree {tree_id} has categorical splits, which are not supported")
        if int(tree["tree_param"].get("size_leaf_vector", "1")) > 1:
            raise XGBoostConversionError(f"tree {tree_id} has vector leaves (multi-target), not supported")
        left = tree["left_children"]
        right = tree["right_children"]
        conditions = tree["split_conditions"]
        features = tree["split_indices"]
        default_left = tree["default_left"]
        stack = [0]  # walk from the root: nodes deleted by pruning are never reached
        while stack:
            node = stack.pop()
            self.tree_ids.append(tree_id)
            self.node_ids.append(node)
            if left[node] == -1:  # a leaf: XGBoost keeps its value in split_conditions
                self.feature_ids.append(0)
                self.modes.append("LEAF")
                self.values.append(0.0)
                self.true_ids.append(0)
                self.false_ids.append(0)
                self.missing_tracks_true.append(0)
                self.target_tree_ids.append(tree_id)
                self.target_node_ids.append(node)
                self.target_ids.append(target)
                self.target_weights.append(float(conditions[node]))
                continue
            self.feature_ids.append(int(features[node]))
            self.modes.append("BRANCH_LT")  # XGBoost: x < split_condition goes to the "yes" (left) child
            self.values.append(float(conditions[node]))
            self.true_ids.append(int(left[node]))
            self.false_ids.append(int(right[node]))
            self.missing_tracks_true.append(int(default_left[node]))
            stack.extend((int(right[node]), int(left[node])))


def convert_document(document: Mapping[str, Any]) -> onnx.ModelProto:
    """The ONNX model for an XGBoost JSON model document."""
    summary = check_convertible(document)
    model = document["learner"]["gradient_booster"]["model"]
    trees = model["trees"]
    tree_info = model["tree_info"]
    n_targets = max(summary.num_class, 1)
    ensemble = _Ensemble()
    for tree_id, (tree, target) in enumerate(zip(trees, tree_info, strict=True)):
        ensemble.add_tree(tree_id, tree, int(target))
    margin_name = "margin"
    nodes = [
        helper.make_node(
            "TreeEnsembleRegressor",
            [INPUT_NAME],
            [margin_name],
            domain="ai.onnx.ml",
            n_targets=n_targets,
            aggregate_function="SUM",
            post_transform="NONE",
            base_values=base_margins(document, summary),
            nodes_treeids=ensemble.tree_ids,
            nodes_nodeids=ensemble.node_ids,
            nodes_featureids=ensemble.feature_ids,
            nodes_modes=ensemble.modes,
            nodes_values=ensemble.values,
            nodes_truenodeids=ensemble.true_ids,
            nodes_falsenodeids=ensemble.false_ids,
            nodes_missing_value_tracks_true=ensemble.missing_tracks_true,
            target_treeids=ensemble.target_tree_ids,
            target_nodeids=ensemble.target_node_ids,
            target_ids=ensemble.target_ids,
            target_weights=ensemble.target_weights,
        )
    ]
    # the link function, then [batch, 1] -> [batch]; the last step writes OUTPUT_NAME
    link = OBJECTIVES[summary.objective].link
    steps: list[tuple[str, list[str], dict[str, Any]]] = []
    if link != "identity":
        op = {"sigmoid": "Sigmoid", "exp": "Exp", "softmax": "Softmax"}[link]
        steps.append((op, [], {"axis": 1} if op == "Softmax" else {}))
    initializers: list[onnx.TensorProto] = []
    if n_targets == 1:
        initializers.append(helper.make_tensor("flat_shape", TensorProto.INT64, [1], [-1]))
        steps.append(("Reshape", ["flat_shape"], {}))
    if not steps:
        steps.append(("Identity", [], {}))
    current = margin_name
    for index, (op, extra_inputs, attributes) in enumerate(steps):
        result = OUTPUT_NAME if index == len(steps) - 1 else f"{op.lower()}_{index}"
        nodes.append(helper.make_node(op, [current, *extra_inputs], [result], **attributes))
        current = result
    output_shape: list[str | int] = ["batch", n_targets] if n_targets > 1 else ["batch"]
    graph = helper.make_graph(
        nodes,
        "xgboost",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", summary.num_features])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, output_shape)],
        initializer=initializers,
    )
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid("ai.onnx.ml", ML_OPSET)],
        producer_name="lumenrt.xgboost_onnx",
        producer_version=str(CONVERTER_VERSION),
    )
    onnx_model.ir_version = 8  # accepted by every ONNX Runtime that has opset 17
    onnx.checker.check_model(onnx_model)
    return onnx_model


def convert(booster: xgboost.Booster) -> onnx.ModelProto:
    """The ONNX model for a trained booster (see the module docstring for what it computes)."""
    return convert_document(model_json(booster))
