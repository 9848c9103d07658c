"""Model configs: YAML and JSON read alike, Triton's spellings are accepted, and every broken
config is refused with an error naming the file and the exact field."""

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from lumenrt.backends.base import REGISTRY, Placement, register
from lumenrt.engine.config import (
    ConfigError,
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    QueuePolicy,
    TensorSpec,
)
from lumenrt.engine.repository import load_model_config
from lumenrt.protocols import dtypes


class FakeBackend:
    name = "fake"
    model_files: tuple[str, ...] = ("model.bin",)

    def describe(
        self, model_path: Path, config: ModelConfig
    ) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
        raise ConfigError(model_path, "", "a fake model file says nothing")

    def load(self, model_path: Path, config: ModelConfig, placement: Placement) -> object:
        raise NotImplementedError


@pytest.fixture(autouse=True)
def fake_backend() -> Iterator[None]:
    register(FakeBackend())  # type: ignore[arg-type]
    yield
    REGISTRY.pop("fake", None)


FULL_YAML = """
name: digits
backend: fake
max_batch_size: 8
input:
  - {name: x, datatype: FP32, dims: [64]}
  - {name: mask, datatype: BOOL, dims: [-1]}
output:
  - {name: probs, datatype: FP32, dims: [10]}
dynamic_batching:
  preferred_batch_size: [4, 8]
  max_queue_delay_us: 100
  max_queue_size: 64
  default_timeout_us: 5000
instance_group: {count: 2, cores: [0, 1]}
parameters: {intra_op_threads: 1, nested: {a: [1, 2]}}
warmup: 3
version_policy: all
"""

EXPECTED = ModelConfig(
    name="digits",
    backend="fake",
    max_batch_size=8,
    inputs=(TensorSpec("x", "FP32", (64,)), TensorSpec("mask", "BOOL", (-1,))),
    outputs=(TensorSpec("probs", "FP32", (10,)),),
    dynamic_batching=DynamicBatching(
        preferred_batch_size=(4, 8), max_queue_delay_us=100, max_queue_size=64, default_timeout_us=5000
    ),
    instance_group=InstanceGroup(count=2, cores=(0, 1)),
    parameters={"intra_op_threads": 1, "nested": {"a": [1, 2]}},
    warmup=3,
    version_policy="all",
)


def write(tmp_path: Path, file_name: str, text: str) -> Path:
    folder = tmp_path / "digits"
    folder.mkdir(exist_ok=True)
    path = folder / file_name
    path.write_text(text, encoding="utf-8")
    return path


def as_json(yaml_text: str) -> str:
    import yaml

    return json.dumps(yaml.safe_load(yaml_text))


@pytest.mark.parametrize("file_name", ["config.yaml", "config.yml", "config.json"])
def test_full_config_reads_the_same_in_yaml_and_json(tmp_path: Path, file_name: str) -> None:
    text = as_json(FULL_YAML) if file_name.endswith(".json") else FULL_YAML
    path = write(tmp_path, file_name, text)
    config = load_model_config(path, default_name="digits")
    assert config.source == str(path)
    assert config == replace(EXPECTED, source=str(path))


def test_minimal_config_takes_folder_name_and_defaults(tmp_path: Path) -> None:
    config = load_model_config(write(tmp_path, "config.yaml", "backend: fake\n"), default_name="digits")
    assert config.name == "digits"
    assert (config.max_batch_size, config.inputs, config.outputs) == (0, (), ())
    assert config.dynamic_batching is None
    assert config.instance_group == InstanceGroup()
    assert (config.warmup, config.version_policy, config.versions) == (0, "latest", ())


def test_empty_dynamic_batching_enables_it_with_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", "backend: fake\nmax_batch_size: 4\ndynamic_batching: {}\n")
    assert load_model_config(path, default_name="digits").dynamic_batching == DynamicBatching()


def test_queue_policies_per_priority_level(tmp_path: Path) -> None:
    text = """
backend: fake
max_batch_size: 4
dynamic_batching:
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy: {max_queue_size: 10, default_timeout_microseconds: 500}
  priority_queue_policy:
    1: {max_queue_size: 2, allow_timeout_override: false, timeout_action: DELAY}
"""
    db = load_model_config(write(tmp_path, "config.yaml", text), default_name="digits").dynamic_batching
    assert db is not None and db.levels == 3
    assert db.policy(1) == QueuePolicy(2, 0, allow_timeout_override=False, timeout_action="DELAY")
    assert db.policy(2) == db.policy(3) == QueuePolicy(10, 500)
    assert (db.max_queue_size, db.default_timeout_us) == (10, 500)  # the default policy's
    assert (db.level_of(0), db.level_of(1), db.level_of(3)) == (2, 1, 3)
    assert DynamicBatching(max_queue_size=7).policy(1) == QueuePolicy(7, 0)  # one level, the shortcuts
    assert DynamicBatching().level_of(0) == 1


def test_triton_spellings_are_accepted(tmp_path: Path) -> None:
    text = """
backend: fake
max_batch_size: 4
inputs: [{name: text, data_type: TYPE_STRING, dims: [1]}]
outputs: [{name: y, datatype: TYPE_FP32, dims: [-1, 2]}]
instance_group: [{count: 2, kind: KIND_CPU}]
version_policy: {specific: {versions: [3, 1]}}
"""
    config = load_model_config(write(tmp_path, "config.yaml", text), default_name="digits")
    assert config.inputs == (TensorSpec("text", "BYTES", (1,)),)
    assert config.outputs == (TensorSpec("y", "FP32", (-1, 2)),)
    assert config.instance_group == InstanceGroup(count=2)
    assert (config.version_policy, config.versions) == ("specific", (1, 3))


def test_specific_versions_short_form(tmp_path: Path) -> None:
    path = write(tmp_path, "config.json", '{"backend": "fake", "version_policy": {"specific": [2, 1]}}')
    config = load_model_config(path, default_name="digits")
    assert (config.version_policy, config.versions) == ("specific", (1, 2))


BASE = "backend: fake\nmax_batch_size: 8\n"

# (file text, field named in the error, fragment of the problem)
BROKEN_YAML = [
    ("backend: fake\nmax_batch_sise: 8\n", "max_batch_sise", "did you mean 'max_batch_size'"),
    ("max_batch_size: 8\n", "backend", "required"),
    ("backend: tensorrt\n", "backend", "unknown backend 'tensorrt'"),
    ("backend: ''\n", "backend", "non-empty string"),
    ("name: other\nbackend: fake\n", "name", "'other' differs from the model folder name 'digits'"),
    ("backend: fake\nmax_batch_size: -1\n", "max_batch_size", "must be >= 0, got -1"),
    ("backend: fake\nmax_batch_size: '8'\n", "max_batch_size", "must be an integer, got '8' (str)"),
    ("backend: fake\nmax_batch_size: true\n", "max_batch_size", "must be an integer, got True"),
    ("backend: fake\nmax_batch_size: 2.5\n", "max_batch_size", "must be an integer"),
    (
        "backend: fake\nmax_batch_size: 1\nmax_batch_size: 2\n",
        "max_batch_size",
        "given twice (lines 2 and 3)",
    ),
    (BASE + "input: {name: x}\n", "input", "must be a list of tensors"),
    (BASE + "input: [{datatype: FP32, dims: [1]}]\n", "input[0].name", "required"),
    (BASE + "input: [{name: x, dims: [1]}]\n", "input[0].datatype", "required"),
    (BASE + "input: [{name: x, datatype: FP32}]\n", "input[0].dims", "required"),
    (
        BASE + "input: [{name: x, datatype: FLOAT32, dims: [1]}]\n",
        "input[0].datatype",
        "unknown datatype 'FLOAT32'",
    ),
    (BASE + "input: [{name: x, datatype: TYPE_BF16, dims: [1]}]\n", "input[0].datatype", "unknown datatype"),
    (
        BASE + "input: [{name: x, datatype: FP32, data_type: FP32, dims: [1]}]\n",
        "input[0].data_type",
        "keep one",
    ),
    (BASE + "input: [{name: x, datatype: FP32, dims: 4}]\n", "input[0].dims", "must be a list of sizes"),
    (
        BASE + "input: [{name: x, datatype: FP32, dims: [1]}, {name: y, datatype: FP32, dims: [0]}]\n",
        "input[1].dims[0]",
        "got 0",
    ),
    (BASE + "input: [{name: x, datatype: FP32, dims: [3, -2]}]\n", "input[0].dims[1]", "got -2"),
    (BASE + "inputs: [{name: x, datatype: FP32, shape: [1]}]\n", "inputs[0].shape", "unknown key"),
    (
        BASE + "output: [{name: y, datatype: FP32, dims: [1]}, {name: y, datatype: INT64, dims: [1]}]\n",
        "output[1].name",
        "duplicate tensor name 'y' (also output[0])",
    ),
    (BASE + "input: []\ninputs: []\n", "inputs", "given both as 'input' and 'inputs'"),
    ("backend: fake\ndynamic_batching: {}\n", "dynamic_batching", "needs max_batch_size > 0"),
    (BASE + "dynamic_batching: null\n", "dynamic_batching", "must be a mapping, got None"),
    (
        BASE + "dynamic_batching: {preferred_batch_size: [4, 16]}\n",
        "dynamic_batching.preferred_batch_size[1]",
        "must be <= max_batch_size (8), got 16",
    ),
    (
        BASE + "dynamic_batching: {preferred_batch_size: [0]}\n",
        "dynamic_batching.preferred_batch_size[0]",
        "got 0",
    ),
    (
        BASE + "dynamic_batching: {preferred_batch_size: [2, 2]}\n",
        "dynamic_batching.preferred_batch_size[1]",
        "duplicate",
    ),
    (BASE + "dynamic_batching: {max_queue_delay_us: -5}\n", "dynamic_batching.max_queue_delay_us", "got -5"),
    (
        BASE + "dynamic_batching: {max_queue_size: 0}\n",
        "dynamic_batching.max_queue_size",
        "must be >= 1, got 0",
    ),
    (BASE + "dynamic_batching: {default_timeout_us: -1}\n", "dynamic_batching.default_timeout_us", "got -1"),
    (
        BASE + "dynamic_batching: {max_queue_delay_microseconds: 100}\n",
        "dynamic_batching.max_queue_delay_microseconds",
        "did you mean 'max_queue_delay_us'",
    ),
    (
        BASE + "dynamic_batching: {priority_levels: 17}\n",
        "dynamic_batching.priority_levels",
        "got 17",
    ),
    (
        BASE + "dynamic_batching: {priority_levels: 2, default_priority_level: 3}\n",
        "dynamic_batching.default_priority_level",
        "got 3",
    ),
    (
        BASE + "dynamic_batching: {priority_levels: 2, priority_queue_policy: {3: {max_queue_size: 4}}}\n",
        "dynamic_batching.priority_queue_policy.3",
        "a priority level must be 1 .. priority_levels (2), got 3",
    ),
    (
        BASE + "dynamic_batching: {priority_queue_policy: [1]}\n",
        "dynamic_batching.priority_queue_policy",
        "must be a mapping of level: policy",
    ),
    (
        BASE + "dynamic_batching: {default_queue_policy: {timeout_action: DROP}}\n",
        "dynamic_batching.default_queue_policy.timeout_action",
        "must be one of REJECT, DELAY; got 'DROP'",
    ),
    (
        BASE + "dynamic_batching: {default_queue_policy: {max_queue_size: 0}}\n",
        "dynamic_batching.default_queue_policy.max_queue_size",
        "must be >= 1, got 0",
    ),
    (
        BASE + "dynamic_batching: {default_queue_policy: {allow_timeout_override: 1}}\n",
        "dynamic_batching.default_queue_policy.allow_timeout_override",
        "must be true or false, got 1",
    ),
    (
        BASE + "dynamic_batching: {default_queue_policy: {default_timeout_us: 5}}\n",
        "dynamic_batching.default_queue_policy.default_timeout_us",
        "did you mean 'default_timeout_microseconds'",
    ),
    (
        BASE + "dynamic_batching: {max_queue_size: 4, default_queue_policy: {max_queue_size: 8}}\n",
        "dynamic_batching.max_queue_size",
        "give it inside default_queue_policy",
    ),
    (BASE + "instance_group: {count: -1}\n", "instance_group.count", "got -1"),
    (BASE + "instance_group: {cores: [0, -1]}\n", "instance_group.cores[1]", "got -1"),
    (BASE + "instance_group: {cores: [1, 1]}\n", "instance_group.cores[1]", "duplicate value 1"),
    (BASE + "instance_group: {cores: 3}\n", "instance_group.cores", "must be a list of integers"),
    (
        BASE + "instance_group: [{count: 1}, {count: 1}]\n",
        "instance_group[1]",
        "one KIND_CPU instance group per model (also instance_group[0])",
    ),
    (BASE + "instance_group: [{count: 1, kind: KIND_TPU}]\n", "instance_group[0].kind", "got 'KIND_TPU'"),
    (BASE + "instance_group: [{count: 1, gpus: [0]}]\n", "instance_group[0].gpus", "only for kind KIND_GPU"),
    (BASE + "parameters: [a, b]\n", "parameters", "must be a mapping"),
    (BASE + "parameters: {1: a}\n", "parameters", "keys must be strings"),
    (BASE + "warmup: -1\n", "warmup", "must be >= 0, got -1"),
    (BASE + "version_policy: newest\n", "version_policy", "got 'newest'"),
    (BASE + "version_policy: {specific: []}\n", "version_policy.specific", "at least one version"),
    (BASE + "version_policy: {specific: [0]}\n", "version_policy.specific[0]", "must be >= 1, got 0"),
    (
        BASE + "version_policy: {specific: {versions: [1, 1]}}\n",
        "version_policy.specific.versions[1]",
        "duplicate",
    ),
    (BASE + "version_policy: {latest: {num_versions: 2}}\n", "version_policy.latest", "unknown key"),
    (BASE + "version_policy: {}\n", "version_policy", "empty mapping"),
    ("- backend: fake\n", "", "must be a mapping of keys at the top level"),
    ("backend: fake\n  max_batch_size: 8\n", "", "invalid YAML at line 2"),
    ("backend: fake\n---\nbackend: fake\n", "", "invalid YAML"),
]

BROKEN_JSON = [
    ('{"backend": "fake", "max_batch_size": 8,}', "", "invalid JSON at line 1"),
    (
        '{"backend": "fake", "max_batch_size": 8, "dynamic_batching": {"max_queue_size": 1, "max_queue_size": 2}}',
        "dynamic_batching.max_queue_size",
        "given twice",
    ),
    ('{"backend": "fake", "warmup": "3"}', "warmup", "must be an integer, got '3' (str)"),
    ("[1, 2]", "", "must be a mapping of keys at the top level"),
]


@pytest.mark.parametrize(
    ("file_name", "text", "field", "fragment"),
    [("config.yaml", *case) for case in BROKEN_YAML] + [("config.json", *case) for case in BROKEN_JSON],
)
def test_broken_config_error_names_file_and_field(
    tmp_path: Path, file_name: str, text: str, field: str, fragment: str
) -> None:
    path = write(tmp_path, file_name, text)
    with pytest.raises(ConfigError) as caught:
        load_model_config(path, default_name="digits")
    error = caught.value
    assert error.source == str(path)
    assert error.field == field
    assert fragment in error.problem
    assert str(error).startswith(f"{path}: {field}: " if field else f"{path}: ")


@pytest.mark.parametrize(
    ("file_name", "fragment"),
    [("config.toml", "unsupported config file type '.toml'"), ("missing.yaml", "file not found")],
)
def test_unreadable_config_file_is_refused(tmp_path: Path, file_name: str, fragment: str) -> None:
    path = tmp_path / file_name
    if file_name.endswith(".toml"):
        path.write_text("backend = 'fake'\n")
    with pytest.raises(ConfigError, match=fragment) as caught:
        load_model_config(path, default_name="digits")
    assert caught.value.source == str(path)


def test_invalid_folder_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("backend: fake\n")
    with pytest.raises(ConfigError, match="model name 'my model'") as caught:
        load_model_config(path, default_name="my model")
    assert caught.value.field == "name"


# --- datatypes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", dtypes.DATATYPES)
def test_datatype_round_trips_through_numpy(name: str) -> None:
    assert dtypes.is_valid(name)
    assert dtypes.from_numpy(dtypes.to_numpy(name)) == name


def test_datatype_sizes_and_bytes() -> None:
    assert dtypes.to_numpy("BYTES") == np.dtype(object)
    assert dtypes.element_size_bytes("BYTES") is None
    assert dtypes.element_size_bytes("FP16") == 2
    assert dtypes.element_size_bytes("BOOL") == 1
    assert dtypes.element_size_bytes("INT64") == 8
    assert dtypes.from_numpy(np.array(["a"]).dtype) == "BYTES"
    assert dtypes.from_numpy(np.array([b"a"]).dtype) == "BYTES"
    assert dtypes.from_numpy(np.dtype(">f4")) == "FP32"


def test_datatype_names_are_checked() -> None:
    assert not dtypes.is_valid("fp32")
    assert dtypes.normalize("TYPE_INT8") == "INT8"
    assert dtypes.normalize("TYPE_STRING") == "BYTES"
    with pytest.raises(ValueError, match="unknown datatype 'FLOAT'"):
        dtypes.to_numpy("FLOAT")
    with pytest.raises(ValueError, match="no KServe V2 datatype"):
        dtypes.from_numpy(np.complex64)
