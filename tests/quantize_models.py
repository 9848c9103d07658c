"""Tiny ONNX models for the quantization tests, built in code (milliseconds to quantize and run),
and .npy sample folders for them."""

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)


def _save(graph: onnx.GraphProto, path: Path, opset: int) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, str(path))
    return path


def mlp(path: Path, opset: int = 17, batch: int | str = "batch") -> Path:
    """``x`` FP32 [batch, 16] -> Gemm -> Relu -> Gemm -> Softmax -> ``scores`` FP32 [batch, 4]
    (``batch`` a number: the batch size is fixed)."""
    weights = [
        numpy_helper.from_array(RNG.standard_normal((16, 32)).astype(np.float32), "w0"),
        numpy_helper.from_array(np.zeros(32, np.float32), "b0"),
        numpy_helper.from_array(RNG.standard_normal((32, 4)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b1"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w0", "b0"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w1", "b1"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["scores"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, 4])],
        initializer=weights,
    )
    return _save(graph, path, opset)


def convnet(path: Path) -> Path:
    """``image`` FP32 [batch, 1, 8, 8] -> Conv 3x3 (4 channels) -> Relu -> GlobalAveragePool ->
    Flatten -> ``scores`` FP32 [batch, 4]."""
    weights = [
        numpy_helper.from_array(RNG.standard_normal((4, 1, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["scores"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])],
        initializer=weights,
    )
    return _save(graph, path, 17)


def two_inputs(path: Path) -> Path:
    """``a`` + ``b``, both FP32 [batch, 4] -> ``sum``."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])],
        "two_inputs",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 4])],
    )
    return _save(graph, path, 17)


def sample_folder(folder: Path, arrays: dict[str, npt.NDArray[Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    return folder


def images(count: int, seed: int = 1) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((count, 1, 8, 8), dtype=np.float32)


def header_only_npy(path: Path, shape: tuple[int, ...], dtype: str = "<f4") -> Path:
    """A .npy file whose header claims ``shape`` but that holds no data (would fail to load)."""
    with path.open("wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": dtype, "fortran_order": False, "shape": shape})
    return path
