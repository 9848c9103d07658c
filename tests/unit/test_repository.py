"""The model repository: version folders and policies, finding the model file, filling inputs and
outputs from the model file (a real ONNX graph through the onnxruntime backend), and clear errors
naming the path for whatever is missing."""

from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from lumenrt.backends.base import REGISTRY, Placement, register
from lumenrt.engine.config import ConfigError, ModelConfig, TensorSpec
from lumenrt.engine.repository import LoadedModel, ModelNotFound, ModelRepository


class FakeBackend:
    """Model files ``model.bin`` or ``model.txt``; describe says what ``described`` holds, or
    that the file cannot say when it is None."""

    name = "fake"
    model_files: tuple[str, ...] = ("model.bin", "model.txt")
    described: tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]] | None = None

    def describe(
        self, model_path: Path, config: ModelConfig
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        if self.described is None:
            raise ConfigError(model_path, "", "a fake model file says nothing")
        return self.described

    def load(self, model_path: Path, config: ModelConfig, placement: Placement) -> object:
        raise NotImplementedError


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    backend = FakeBackend()
    register(backend)  # type: ignore[arg-type]
    yield backend
    REGISTRY.pop("fake", None)


FAKE_CONFIG = """backend: fake
inputs: [{name: x, datatype: FP32, dims: [4]}]
outputs: [{name: y, datatype: FP32, dims: [1]}]
"""


def make_model(root: Path, name: str, config: str | None, versions: dict[str, str]) -> Path:
    """A model folder: ``config.yaml`` (None: no config) and ``{version folder: model file name}``."""
    folder = root / name
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.yaml").write_text(config)
    for version, file_name in versions.items():
        (folder / version).mkdir()
        if file_name:
            (folder / version / file_name).write_bytes(b"weights")
    return folder


# --- versions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [10]),  # latest by default; 10 > 2 numerically
        ("version_policy: latest\n", [10]),
        ("version_policy: all\n", [1, 2, 10]),
        ("version_policy: {specific: [10, 1]}\n", [1, 10]),
    ],
)
def test_version_policy_selects_versions(
    fake: FakeBackend, tmp_path: Path, policy: str, expected: list[int]
) -> None:
    folder = make_model(
        tmp_path, "m", FAKE_CONFIG + policy, {"1": "model.bin", "2": "model.bin", "10": "model.txt"}
    )
    loaded = ModelRepository(tmp_path).load("m")
    assert [m.version for m in loaded] == expected
    assert [m.model_path.parent for m in loaded] == [folder / str(v) for v in expected]
    assert all(isinstance(m, LoadedModel) and m.config.name == "m" for m in loaded)


def test_folders_that_are_not_versions_are_ignored(fake: FakeBackend, tmp_path: Path) -> None:
    make_model(tmp_path, "m", FAKE_CONFIG, {"3": "model.bin", "0": "", "07": "", "__pycache__": "", "v4": ""})
    repo = ModelRepository(tmp_path)
    assert repo.versions("m") == (3,)
    assert [m.version for m in repo.load("m")] == [3]


def test_missing_specific_version_names_its_path(fake: FakeBackend, tmp_path: Path) -> None:
    folder = make_model(
        tmp_path, "m", FAKE_CONFIG + "version_policy: {specific: [1, 3]}\n", {"1": "model.bin"}
    )
    with pytest.raises(ModelNotFound, match="version 3") as caught:
        ModelRepository(tmp_path).load("m")
    assert caught.value.path == folder / "3"
    assert str(folder / "3") in str(caught.value)


def test_model_without_versions_is_refused(fake: FakeBackend, tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m", FAKE_CONFIG, {})
    with pytest.raises(ModelNotFound, match="no version folders") as caught:
        ModelRepository(tmp_path).load("m")
    assert caught.value.path == folder


# --- finding things --------------------------------------------------------------------------------


def test_missing_model_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound) as caught:
        ModelRepository(tmp_path).load("absent")
    assert caught.value.path == tmp_path / "absent"
    assert str(tmp_path / "absent") in str(caught.value)


@pytest.mark.parametrize("name", ["", ".", "..", "../etc", "a/b", ".hidden"])
def test_names_that_are_paths_are_not_models(tmp_path: Path, name: str) -> None:
    (tmp_path / ".hidden").mkdir()
    with pytest.raises(ModelNotFound, match="is not a model name"):
        ModelRepository(tmp_path).load(name)


def test_missing_repository_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="does not exist") as caught:
        ModelRepository(tmp_path / "nowhere")
    assert caught.value.path == tmp_path / "nowhere"


def test_missing_config_names_the_folder(fake: FakeBackend, tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m", None, {"1": "model.bin"})
    (folder / "config.pbtxt").write_text('platform: "onnxruntime_onnx"')
    with pytest.raises(
        ConfigError, match=r"no model config: expected one of config\.yaml.*config\.pbtxt"
    ) as caught:
        ModelRepository(tmp_path).load("m")
    assert caught.value.source == str(folder)


def test_two_configs_are_ambiguous(fake: FakeBackend, tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m", FAKE_CONFIG, {"1": "model.bin"})
    (folder / "config.json").write_text('{"backend": "fake"}')
    with pytest.raises(ConfigError, match=r"several model configs \(config\.yaml, config\.json\)"):
        ModelRepository(tmp_path).load("m")


def test_missing_model_file_names_the_version_folder(fake: FakeBackend, tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m", FAKE_CONFIG, {"1": "weights.onnx"})
    with pytest.raises(ModelNotFound, match=r"expected model\.bin or model\.txt") as caught:
        ModelRepository(tmp_path).load("m")
    assert caught.value.path == folder / "1"


def test_two_model_files_are_ambiguous(fake: FakeBackend, tmp_path: Path) -> None:
    folder = make_model(tmp_path, "m", FAKE_CONFIG, {"1": "model.bin"})
    (folder / "1" / "model.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"several model files \(model\.bin, model\.txt\)") as caught:
        ModelRepository(tmp_path).load("m")
    assert caught.value.source == str(folder / "1")


def test_index_reports_each_model_without_raising(fake: FakeBackend, tmp_path: Path) -> None:
    make_model(tmp_path, "good", FAKE_CONFIG, {"1": "model.bin", "2": "model.bin"})
    make_model(tmp_path, "no_config", None, {"1": "model.bin"})
    make_model(tmp_path, "bad_config", "backend: fake\nwarmup: -1\n", {"1": "model.bin"})
    make_model(tmp_path, "no_versions", FAKE_CONFIG, {})
    make_model(tmp_path, "no_file", FAKE_CONFIG, {"1": ""})
    (tmp_path / ".git").mkdir()
    (tmp_path / "README.md").write_text("not a model")
    entries = {entry.name: entry for entry in ModelRepository(tmp_path).index()}
    assert sorted(entries) == ["bad_config", "good", "no_config", "no_file", "no_versions"]
    good = entries["good"]
    assert (good.versions, good.has_config, good.problems, good.loadable) == ((1, 2), True, (), True)
    assert entries["no_config"].has_config is False
    expected = {
        "no_config": "no model config",
        "bad_config": "warmup: must be >= 0",
        "no_versions": "no version folders",
        "no_file": "no model file",
    }
    for name, fragment in expected.items():
        (problem,) = entries[name].problems
        assert fragment in problem
        assert str(tmp_path / name) in problem


# --- inputs and outputs from the model file --------------------------------------------------------


def write_onnx(path: Path) -> None:
    """a + b -> sum, and a copy of a -> a_copy; a dynamic batch dimension."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4])
    total = helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 4])
    copy = helper.make_tensor_value_info("a_copy", TensorProto.FLOAT, ["batch", 4])
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Identity", ["a"], ["a_copy"])]
    graph = helper.make_graph(nodes, "add", [a, b], [total, copy])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def onnx_repo(tmp_path: Path, config: str) -> ModelRepository:
    folder = tmp_path / "adder"
    write_onnx(folder / "1" / "model.onnx")
    (folder / "config.yaml").write_text(config)
    return ModelRepository(tmp_path)


def test_inputs_and_outputs_come_from_the_onnx_file(tmp_path: Path) -> None:
    (loaded,) = onnx_repo(tmp_path, "backend: onnxruntime\nmax_batch_size: 8\n").load("adder")
    spec = ("FP32", (4,))  # the batch dimension is left out when max_batch_size > 0
    assert [(s.name, s.datatype, s.dims) for s in loaded.config.inputs] == [("a", *spec), ("b", *spec)]
    assert [(s.name, s.datatype, s.dims) for s in loaded.config.outputs] == [
        ("sum", *spec),
        ("a_copy", *spec),
    ]
    assert loaded.model_path == tmp_path / "adder" / "1" / "model.onnx"


def test_config_wins_and_missing_inputs_are_filled(tmp_path: Path) -> None:
    config = """backend: onnxruntime
max_batch_size: 8
inputs: [{name: b, datatype: FP32, dims: [-1]}]
outputs: [{name: sum, datatype: FP32, dims: [4]}]
"""
    (loaded,) = onnx_repo(tmp_path, config).load("adder")
    assert loaded.config.inputs == (TensorSpec("a", "FP32", (4,)), TensorSpec("b", "FP32", (-1,)))
    assert loaded.config.outputs == (TensorSpec("sum", "FP32", (4,)),)  # listing outputs selects them


@pytest.mark.parametrize(
    ("tensor", "field", "fragment"),
    [
        (
            "inputs: [{name: a, datatype: INT64, dims: [4]}]",
            "inputs[0].datatype",
            "'a' is INT64 here but FP32 in",
        ),
        (
            "inputs: [{name: a, datatype: FP32, dims: [4, 1]}]",
            "inputs[0].dims",
            "has dims [4, 1] here but [4] in",
        ),
        ("inputs: [{name: a, datatype: FP32, dims: [5]}]", "inputs[0].dims", "has dims [5] here but [4] in"),
        ("outputs: [{name: total, datatype: FP32, dims: [4]}]", "outputs[0].name", "'total' is not in"),
    ],
)
def test_config_contradicting_the_model_names_the_tensor(
    tmp_path: Path, tensor: str, field: str, fragment: str
) -> None:
    repo = onnx_repo(tmp_path, f"backend: onnxruntime\nmax_batch_size: 8\n{tensor}\n")
    with pytest.raises(ConfigError) as caught:
        repo.load("adder")
    assert (caught.value.source, caught.value.field) == (str(tmp_path / "adder" / "config.yaml"), field)
    assert fragment in caught.value.problem
    assert str(tmp_path / "adder" / "1" / "model.onnx") in caught.value.problem


def test_unreadable_model_file_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"\x00not an onnx model")
    (folder / "config.yaml").write_text("backend: onnxruntime\n")
    with pytest.raises(ConfigError, match="cannot read the model file") as caught:
        ModelRepository(tmp_path).load("broken")
    assert caught.value.source == str(folder / "1" / "model.onnx")


def test_file_that_cannot_say_needs_a_complete_config(fake: FakeBackend, tmp_path: Path) -> None:
    make_model(tmp_path, "full", FAKE_CONFIG, {"1": "model.bin"})
    make_model(
        tmp_path,
        "partial",
        "backend: fake\ninputs: [{name: x, datatype: FP32, dims: [4]}]\n",
        {"1": "model.bin"},
    )
    repo = ModelRepository(tmp_path)
    (loaded,) = repo.load("full")
    assert loaded.config == repo.config("full")  # used as written
    with pytest.raises(ConfigError, match=r"not given, and .* cannot say") as caught:
        repo.load("partial")
    assert caught.value.field == "outputs"


def test_each_version_is_described_on_its_own(fake: FakeBackend, tmp_path: Path) -> None:
    fake.described = ((TensorSpec("x", "FP32", (4,)), TensorSpec("extra", "INT64", (1,))), ())
    make_model(tmp_path, "m", FAKE_CONFIG + "version_policy: all\n", {"1": "model.bin", "2": "model.bin"})
    loaded = ModelRepository(tmp_path).load("m")
    assert [m.config.inputs for m in loaded] == [fake.described[0]] * 2
    assert [m.config.outputs for m in loaded] == [(TensorSpec("y", "FP32", (1,)),)] * 2
