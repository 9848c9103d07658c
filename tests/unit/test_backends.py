"""One test body over every backend: a tiny real model is built here, loaded through the backend
and its outputs compared with calling the model directly; then what each backend owns alone
(ORT threads and options, describe, python model errors)."""

import dataclasses
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import xgboost as xgb
from onnx import TensorProto, helper
from sklearn.datasets import load_breast_cancer

from lumenrt.backends import Placement, get_backend
from lumenrt.backends.python_backend import PythonModelError
from lumenrt.engine.config import ConfigError, ModelConfig, TensorSpec

Arrays = dict[str, np.ndarray[Any, Any]]
ONE_CORE = Placement(cores=(0,), intra_op_threads=1, inter_op_threads=1)


@dataclass(frozen=True, slots=True)
class Case:
    """A model file built for one backend, its config, sample inputs and the direct call."""

    backend: str
    model_path: Path
    config: ModelConfig
    inputs: Arrays
    reference: Callable[[Arrays], Arrays]  # the model called without lumenrt
    rtol: float = 1e-6
    atol: float = 1e-6


def _config(
    backend: str, inputs: tuple[TensorSpec, ...] = (), outputs: tuple[TensorSpec, ...] = (), **kw: Any
) -> ModelConfig:
    return ModelConfig(
        name=f"tiny_{backend}",
        backend=backend,
        max_batch_size=8,
        inputs=inputs,
        outputs=outputs,
        source=f"models/tiny_{backend}/config.yaml",
        **kw,
    )


def _version_dir(root: Path) -> Path:
    folder = root / "1"
    folder.mkdir(parents=True)
    return folder


# ---- ONNX Runtime: relu(x @ W + b) and its row sums, with a symbolic batch dim -------------------

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
B = np.array([0.1, -0.2, 0.3], dtype=np.float32)


def _dense_reference(inputs: Arrays) -> Arrays:
    y = np.maximum(inputs["x"].astype(np.float32) @ W + B, 0)
    return {"y": y, "s": y.sum(axis=1)}


def build_onnx(root: Path) -> Case:
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "B"], ["pre"]),
        helper.make_node("Relu", ["pre"], ["y"]),
        helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N"]),
        ],
        initializer=[
            onnx.numpy_helper.from_array(W, "W"),
            onnx.numpy_helper.from_array(B, "B"),
            onnx.numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = _version_dir(root) / "model.onnx"
    onnx.save(model, str(path))
    x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
    return Case("onnxruntime", path, _config("onnxruntime"), {"x": x}, _dense_reference)


# ---- XGBoost: binary:logistic on breast cancer rows, both predictors --------------------------


def _train_binary() -> tuple[xgb.Booster, np.ndarray[Any, Any]]:
    x, y = load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    params = {"objective": "binary:logistic", "max_depth": 3, "nthread": 1, "seed": 0}
    booster = xgb.train(params, xgb.DMatrix(x[:300], y[:300]), num_boost_round=8)
    rows = x[300:310].copy()
    rows[0, 3] = np.nan  # a missing value takes the default branch
    return booster, rows


def build_xgboost(root: Path, predictor: str) -> Case:
    booster, rows = _train_binary()
    path = _version_dir(root) / "model.json"
    booster.save_model(str(path))

    def reference(inputs: Arrays) -> Arrays:
        return {"predictions": booster.predict(xgb.DMatrix(inputs["input"]))}

    config = _config("xgboost", parameters={"xgboost": {"predictor": predictor}})
    return Case("xgboost", path, config, {"input": rows}, reference, rtol=1e-5, atol=1e-6)


# ---- PyTorch: the same dense layer, as TorchScript and as torch.export ------------------------


class Dense(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        with torch.no_grad():
            self.linear.weight.copy_(torch.from_numpy(W.T.copy()))
            self.linear.bias.copy_(torch.from_numpy(B))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.linear(x))
        return y, y.sum(dim=1)


def _torch_reference(module: torch.nn.Module) -> Callable[[Arrays], Arrays]:
    def reference(inputs: Arrays) -> Arrays:
        with torch.no_grad():
            y, s = module(torch.tensor(inputs["x"]))
        return {"y": y.numpy(), "s": s.numpy()}

    return reference


DENSE_IO = (
    (TensorSpec("x", "FP32", (4,)),),
    (TensorSpec("y", "FP32", (3,)), TensorSpec("s", "FP32", ())),
)


def build_torchscript(root: Path) -> Case:
    module = Dense().eval()
    path = _version_dir(root) / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        torch.jit.script(module).save(str(path))
    x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
    return Case("pytorch", path, _config("pytorch", *DENSE_IO), {"x": x}, _torch_reference(module))


def build_torch_export(root: Path) -> Case:
    module = Dense().eval()
    path = _version_dir(root) / "model.pt2"
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(module, (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(path))
    x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
    return Case("pytorch", path, _config("pytorch", *DENSE_IO), {"x": x}, _torch_reference(module))


# ---- Python: a model.py that reads its weights from the version folder -------------------------

PYTHON_MODEL = """
import numpy as np


class Scaler:
    def load(self, version_dir):
        self.scale = np.load(version_dir / "scale.npy")

    def infer(self, inputs):
        return {"y": inputs["x"] * self.scale + np.float32(1)}
"""


def build_python(root: Path) -> Case:
    folder = _version_dir(root)
    np.save(folder / "scale.npy", np.array([2.0, 3.0], dtype=np.float32))
    path = folder / "model.py"
    path.write_text(PYTHON_MODEL)
    io = ((TensorSpec("x", "FP32", (2,)),), (TensorSpec("y", "FP32", (2,)),))

    def reference(inputs: Arrays) -> Arrays:
        return {"y": inputs["x"] * np.array([2.0, 3.0], dtype=np.float32) + 1}

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    return Case("python", path, _config("python", *io), {"x": x}, reference)


BUILDERS: dict[str, Callable[[Path], Case]] = {
    "onnxruntime": build_onnx,
    "xgboost-onnx": lambda root: build_xgboost(root, "onnx"),
    "xgboost-native": lambda root: build_xgboost(root, "native"),
    "pytorch-torchscript": build_torchscript,
    "pytorch-export": build_torch_export,
    "python": build_python,
}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    return BUILDERS[request.param](tmp_path_factory.mktemp(request.param))


def _load(case: Case, placement: Placement = ONE_CORE) -> Any:
    return get_backend(case.backend).load(case.model_path, case.config, placement)


# ---- one body, every backend ---------------------------------------------------------------------


def test_backend_is_registered_for_its_model_file(case: Case) -> None:
    backend = get_backend(case.backend)
    assert backend.name == case.backend
    assert case.model_path.name in backend.model_files


def test_outputs_equal_calling_the_model_directly(case: Case) -> None:
    session = _load(case)
    try:
        outputs = session.run(case.inputs)
        expected = case.reference(case.inputs)
        assert set(outputs) == set(expected)
        for name, want in expected.items():
            got = outputs[name]
            assert isinstance(got, np.ndarray)
            assert got.shape == want.shape, name
            assert got.dtype == want.dtype, name
            np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, err_msg=name)
    finally:
        session.close()


def test_single_row_equals_its_row_in_a_batch(case: Case) -> None:
    session = _load(case)
    try:
        batch = session.run(case.inputs)
        one = session.run({name: array[1:2] for name, array in case.inputs.items()})
        for name, array in batch.items():
            np.testing.assert_allclose(one[name], array[1:2], rtol=case.rtol, atol=case.atol, err_msg=name)
    finally:
        session.close()


def test_read_only_inputs_are_accepted(case: Case) -> None:
    """Workers in process mode hand read-only views of shared-memory slots to run()."""
    frozen = {name: array.copy() for name, array in case.inputs.items()}
    for array in frozen.values():
        array.flags.writeable = False
    session = _load(case)
    try:
        outputs = session.run(frozen)
        for name, want in case.reference(case.inputs).items():
            np.testing.assert_allclose(outputs[name], want, rtol=case.rtol, atol=case.atol)
    finally:
        session.close()


def test_run_after_close_raises(case: Case) -> None:
    session = _load(case)
    session.close()
    with pytest.raises(RuntimeError, match="after close"):
        session.run(case.inputs)


BAD_OPTIONS = {
    "onnxruntime": ({"onnxruntime": {"no_such_option": 1}}, "parameters.onnxruntime.no_such_option"),
    "xgboost": ({"xgboost": {"predictor": "treelite"}}, "parameters.xgboost.predictor"),
    "pytorch": ({"pytorch": {"jit": True}}, "parameters.pytorch.jit"),
    "python": ({"python": {"klass": "Scaler"}}, "parameters.python.klass"),
}


def test_bad_backend_option_names_the_field(case: Case) -> None:
    parameters, field = BAD_OPTIONS[case.backend]
    config = _replace_parameters(case.config, parameters)
    with pytest.raises(ConfigError) as caught:
        get_backend(case.backend).load(case.model_path, config, ONE_CORE)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{config.source}: {field}: ")


def _replace_parameters(config: ModelConfig, parameters: dict[str, Any]) -> ModelConfig:
    return dataclasses.replace(config, parameters=parameters)


# ---- ONNX Runtime --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    return build_onnx(tmp_path_factory.mktemp("onnx"))


def test_ort_threads_come_from_the_placement(onnx_case: Case) -> None:
    placement = Placement(cores=(0, 1), intra_op_threads=2, inter_op_threads=1)
    session = _load(onnx_case, placement)
    options = session.session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    session.close()


def test_ort_session_options_from_config(onnx_case: Case) -> None:
    parameters = {
        "onnxruntime": {
            "graph_optimization_level": "basic",
            "enable_cpu_mem_arena": False,
            "intra_op_spinning": True,
            "config_entries": {"session.use_env_allocators": "0"},
        }
    }
    session = _load(dataclasses.replace(onnx_case, config=_replace_parameters(onnx_case.config, parameters)))
    options = session.session.get_session_options()
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.enable_cpu_mem_arena is False
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    session.close()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"graph_optimization_level": "fastest"}, "parameters.onnxruntime.graph_optimization_level"),
        ({"enable_cpu_mem_arena": "maybe"}, "parameters.onnxruntime.enable_cpu_mem_arena"),
        ({"intra_op_num_threads": 8}, "parameters.onnxruntime.intra_op_num_threads"),
        ({"log_severity_level": 9}, "parameters.onnxruntime.log_severity_level"),
    ],
)
def test_ort_bad_option_value_names_the_field(onnx_case: Case, options: dict[str, Any], field: str) -> None:
    config = _replace_parameters(onnx_case.config, {"onnxruntime": options})
    with pytest.raises(ConfigError) as caught:
        get_backend("onnxruntime").load(onnx_case.model_path, config, ONE_CORE)
    assert caught.value.field == field


def test_ort_describe_reads_the_graph(onnx_case: Case) -> None:
    backend = get_backend("onnxruntime")
    inputs, outputs = backend.describe(onnx_case.model_path, onnx_case.config)
    assert inputs == (TensorSpec("x", "FP32", (4,)),)
    assert outputs == (TensorSpec("y", "FP32", (3,)), TensorSpec("s", "FP32", ()))
    unbatched = dataclasses.replace(onnx_case.config, max_batch_size=0)
    inputs, outputs = backend.describe(onnx_case.model_path, unbatched)
    assert inputs == (TensorSpec("x", "FP32", (-1, 4)),)
    assert outputs[1] == TensorSpec("s", "FP32", (-1,))


def test_ort_converts_input_dtype_and_fetches_listed_outputs(onnx_case: Case) -> None:
    config = _config("onnxruntime", outputs=(TensorSpec("s", "FP32", ()),))
    session = get_backend("onnxruntime").load(onnx_case.model_path, config, ONE_CORE)
    x64 = onnx_case.inputs["x"].astype(np.float64)
    outputs = session.run({"x": x64})
    assert list(outputs) == ["s"]
    np.testing.assert_allclose(outputs["s"], _dense_reference(onnx_case.inputs)["s"], rtol=1e-6)
    with pytest.raises(ValueError, match="missing input 'x'"):
        session.run({"z": x64})
    session.close()


def test_ort_config_output_the_model_lacks_is_refused(onnx_case: Case) -> None:
    config = _config("onnxruntime", outputs=(TensorSpec("logits", "FP32", (3,)),))
    with pytest.raises(ConfigError) as caught:
        get_backend("onnxruntime").load(onnx_case.model_path, config, ONE_CORE)
    assert caught.value.field == "outputs[0].name"
    assert "'logits'" in str(caught.value)


# ---- PyTorch and Python: the config must list the tensors ---------------------------------------


@pytest.mark.parametrize("backend", ["pytorch", "python"])
def test_describe_asks_for_the_config_to_list_tensors(backend: str, tmp_path: Path) -> None:
    config = _config(backend)
    with pytest.raises(ConfigError, match="list them"):
        get_backend(backend).describe(tmp_path / "model.x", config)


def test_pytorch_without_listed_tensors_is_refused(tmp_path: Path) -> None:
    case = build_torch_export(tmp_path)
    with pytest.raises(ConfigError) as caught:
        get_backend("pytorch").load(case.model_path, _config("pytorch"), ONE_CORE)
    assert caught.value.field == "inputs"


def test_pytorch_dict_outputs_map_by_name(tmp_path: Path) -> None:
    class Named(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"double": x * 2, "neg": -x}

    path = _version_dir(tmp_path) / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(Named()).save(str(path))
    io = (
        (TensorSpec("x", "FP32", (2,)),),
        (TensorSpec("neg", "FP32", (2,)), TensorSpec("double", "FP32", (2,))),
    )
    session = get_backend("pytorch").load(path, _config("pytorch", *io), ONE_CORE)
    x = np.array([[1.0, -2.0]], dtype=np.float32)
    outputs = session.run({"x": x})
    np.testing.assert_array_equal(outputs["neg"], -x)
    np.testing.assert_array_equal(outputs["double"], 2 * x)
    session.close()


# ---- Python model errors -------------------------------------------------------------------------


def _python_case(tmp_path: Path, source: str, **parameters: Any) -> tuple[Path, ModelConfig]:
    path = _version_dir(tmp_path) / "model.py"
    path.write_text(source)
    io = ((TensorSpec("x", "FP32", (2,)),), (TensorSpec("y", "FP32", (2,)),))
    return path, _config("python", *io, parameters={"python": parameters} if parameters else {})


X2 = np.ones((1, 2), dtype=np.float32)


def test_python_file_without_model_class_is_refused(tmp_path: Path) -> None:
    path, config = _python_case(tmp_path, "class Helper:\n    def load(self):\n        pass\n")
    with pytest.raises(ConfigError, match=r"model\.py: defines no class with load\(\) and infer\(\)"):
        get_backend("python").load(path, config, ONE_CORE)


TWO_MODELS = """
class A:
    def load(self): pass
    def infer(self, inputs): return {"y": inputs["x"]}

class B(A):
    def infer(self, inputs): return {"y": inputs["x"] + 1}
"""


def test_python_two_model_classes_need_a_name(tmp_path: Path) -> None:
    path, config = _python_case(tmp_path, TWO_MODELS)
    with pytest.raises(ConfigError) as caught:
        get_backend("python").load(path, config, ONE_CORE)
    assert caught.value.field == "parameters.python.class"
    assert "A, B" in str(caught.value)


def test_python_class_named_in_config_is_used(tmp_path: Path) -> None:
    path, config = _python_case(tmp_path, TWO_MODELS, **{"class": "B"})
    session = get_backend("python").load(path, config, ONE_CORE)
    np.testing.assert_array_equal(session.run({"x": X2})["y"], X2 + 1)
    session.close()


def test_python_missing_named_class_names_the_field(tmp_path: Path) -> None:
    path, config = _python_case(tmp_path, TWO_MODELS, **{"class": "C"})
    with pytest.raises(ConfigError, match="defines no class 'C'") as caught:
        get_backend("python").load(path, config, ONE_CORE)
    assert caught.value.field == "parameters.python.class"


def test_python_import_error_names_the_file(tmp_path: Path) -> None:
    path, config = _python_case(tmp_path, "import no_such_module_here\n")
    with pytest.raises(ConfigError, match=r"model\.py: import failed: ModuleNotFoundError"):
        get_backend("python").load(path, config, ONE_CORE)


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ('{"z": inputs["x"]}', r"returned outputs \['z'\], the config lists \['y'\]"),
        ('{"y": inputs["x"], "extra": inputs["x"]}', r"returned outputs \['extra', 'y'\]"),
        ('[inputs["x"]]', "must return a dict of numpy arrays, got list"),
        ('{"y": [1.0, 2.0]}', "output 'y' must be a numpy array, got list"),
        ('{"y": inputs["x"].astype("float64")}', "output 'y' has dtype float64, the config says FP32"),
    ],
)
def test_python_wrong_outputs_fail_clearly(tmp_path: Path, returned: str, message: str) -> None:
    source = f"class M:\n    def load(self):\n        pass\n\n    def infer(self, inputs):\n        return {returned}\n"
    path, config = _python_case(tmp_path, source)
    session = get_backend("python").load(path, config, ONE_CORE)
    with pytest.raises(PythonModelError, match=message):
        session.run({"x": X2})
    session.close()


COUNTER = """
import numpy as np

calls = 0

class Counter:
    def load(self):
        pass

    def infer(self, inputs):
        global calls
        calls += 1
        return {"y": np.full_like(inputs["x"], calls)}

    def close(self):
        global calls
        calls = -100
"""


def test_python_instances_share_no_module_state(tmp_path: Path) -> None:
    path, config = _python_case(tmp_path, COUNTER)
    backend = get_backend("python")
    first, second = backend.load(path, config, ONE_CORE), backend.load(path, config, ONE_CORE)
    first.run({"x": X2})
    first.run({"x": X2})
    np.testing.assert_array_equal(second.run({"x": X2})["y"], np.ones_like(X2))
    first.close()
    np.testing.assert_array_equal(second.run({"x": X2})["y"], np.full_like(X2, 2))
    second.close()


@pytest.fixture(autouse=True)
def _no_user_modules_left() -> Iterator[None]:
    before = {name for name in sys.modules if name.startswith("lumenrt_python_model_")}
    yield
    after = {name for name in sys.modules if name.startswith("lumenrt_python_model_")}
    assert after <= before, f"python model modules left imported: {sorted(after - before)}"


# ---- ONNX Runtime: a run bound to arrays of one shape (the inline lane's, lane.py invariant 5) ------


def test_a_bound_run_answers_as_run_in_the_same_arrays_each_time(tmp_path: Path) -> None:
    case = build_onnx(tmp_path)
    session = _load(case)
    try:
        bound = session.bind({"x": (2, 4)}, 2)
        assert bound is not None
        assert {k: v.shape for k, v in bound.outputs.items()} == {"y": (2, 3), "s": (2,)}
        first = None
        for rows in (case.inputs["x"][:2], case.inputs["x"][3:5]):
            bound.inputs["x"][...] = rows
            got = bound()
            first = first or {k: id(v) for k, v in got.items()}
            assert {k: id(v) for k, v in got.items()} == first  # no new arrays
            for name, value in case.reference({"x": rows}).items():
                np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6)
        assert session.bind({"y": (2, 4)}, 2) is None  # not the model's inputs
    finally:
        session.close()


def test_no_bound_run_when_an_outputs_shape_is_not_fixed_by_the_inputs(tmp_path: Path) -> None:
    """An output with a symbolic dim other than the batch dim (here ``K``): its size is known only
    once the model has run."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "free",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "K"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "K"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = _version_dir(tmp_path) / "model.onnx"
    onnx.save(model, str(path))
    config = _config("onnxruntime", (TensorSpec("x", "FP32", (-1,)),), (TensorSpec("y", "FP32", (-1,)),))
    session = get_backend("onnxruntime").load(path, config, ONE_CORE)
    try:
        assert session.bind({"x": (1, 3)}, 1) is None
    finally:
        session.close()
