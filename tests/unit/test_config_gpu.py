"""GPU instances in model configs (issue 17): Triton's ``kind: KIND_GPU`` groups beside a KIND_CPU
group, the ``optimization`` switches that GPU instances read, and errors naming the field."""

import pytest

from lumenrt.engine.config import (
    ConfigError,
    GpuGroup,
    GpuOptions,
    InstanceGroup,
    ModelConfig,
    model_config_from_dict,
)
from lumenrt.engine.placing import demand_for
from lumenrt.engine.server_config import EngineConfig
from lumenrt.placement.plan import Demand


def parse(raw: dict[str, object]) -> ModelConfig:
    return model_config_from_dict({"backend": "pytorch", "max_batch_size": 8, **raw}, "m/config.yaml", "m")


def test_gpu_group_in_triton_form_defaults_to_one_instance_on_gpu_0() -> None:
    config = parse({"instance_group": [{"kind": "KIND_GPU"}]})
    assert config.instance_group is None  # no CPU instances
    assert config.gpu_groups == (GpuGroup(count=1, gpus=(0,)),)
    assert config.gpu_devices == (0,)
    assert config.gpu == GpuOptions()


def test_cpu_and_gpu_groups_coexist_and_count_per_listed_gpu() -> None:
    config = parse(
        {
            "instance_group": [
                {"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]},
                {"kind": "KIND_CPU", "count": 3},
                {"kind": "KIND_GPU", "gpus": [1]},
            ]
        }
    )
    assert config.instance_group == InstanceGroup(count=3)
    assert config.gpu_devices == (0, 0, 1, 1, 1)  # Triton: count instances on each listed GPU


def test_a_mapping_group_may_be_a_gpu_group() -> None:
    config = parse({"instance_group": {"kind": "KIND_GPU", "count": 2}})
    assert config.instance_group is None and config.gpu_devices == (0, 0)


def test_optimization_switches_use_triton_names() -> None:
    config = parse(
        {
            "instance_group": [{"kind": "KIND_GPU"}],
            "optimization": {
                "cuda": {"graphs": True, "autocast": "FP16", "copy_streams": False, "busy_wait_events": True},
                "input_pinned_memory": {"enable": False},
            },
        }
    )
    assert config.gpu == GpuOptions(
        graphs=True, autocast="FP16", copy_streams=False, busy_wait_events=True, pinned_input=False
    )
    assert parse(
        {"instance_group": [{"kind": "KIND_GPU"}], "optimization": {"cuda": {"autocast": "FP32"}}}
    ).gpu == (GpuOptions())


def test_onnx_models_name_the_cuda_accelerator_in_tritons_form() -> None:
    raw = {
        "backend": "onnxruntime",
        "instance_group": [{"kind": "KIND_GPU"}],
        "optimization": {"execution_accelerators": {"gpu_execution_accelerator": [{"name": "cuda"}]}},
    }
    assert model_config_from_dict(raw, "m/config.yaml", "m").gpu.accelerator == "cuda"


GPU = {"instance_group": [{"kind": "KIND_GPU"}]}
ACCEL = "optimization.execution_accelerators.gpu_execution_accelerator"
BROKEN = [
    ({"instance_group": [{"kind": "KIND_GPU", "gpus": []}]}, "instance_group[0].gpus", "at least one device"),
    ({"instance_group": [{"kind": "KIND_GPU", "gpus": [0, -1]}]}, "instance_group[0].gpus[1]", "got -1"),
    ({"instance_group": [{"kind": "KIND_GPU", "gpus": [1, 1]}]}, "instance_group[0].gpus[1]", "duplicate"),
    ({"instance_group": [{"kind": "KIND_GPU", "count": 0}]}, "instance_group[0].count", "must be >= 1"),
    (
        {"instance_group": [{"kind": "KIND_GPU", "cores": [1]}]},
        "instance_group[0].cores",
        "only for KIND_CPU",
    ),
    (
        {"instance_group": [{"count": 1}, {"kind": "KIND_GPU", "numa_node": 0}]},
        "instance_group[1].numa_node",
        "only for KIND_CPU",
    ),
    (
        {"instance_group": [{"kind": "KIND_CPU", "gpus": [0]}]},
        "instance_group[0].gpus",
        "only for kind KIND_GPU",
    ),
    ({"instance_group": []}, "instance_group", "lists no group"),
    ({"optimization": {"cuda": {"graphs": True}}}, "optimization", "applies to KIND_GPU instances only"),
    ({**GPU, "optimization": {"cuda": {"graph": True}}}, "optimization.cuda.graph", "did you mean 'graphs'"),
    ({**GPU, "optimization": {"cuda": {"autocast": "FP8"}}}, "optimization.cuda.autocast", "FP16, BF16"),
    ({**GPU, "optimization": {"cuda": {"graphs": "yes"}}}, "optimization.cuda.graphs", "true or false"),
    (
        {**GPU, "optimization": {"input_pinned_memory": {"enable": 1}}},
        "optimization.input_pinned_memory.enable",
        "true or false",
    ),
    (
        {
            **GPU,
            "optimization": {"execution_accelerators": {"gpu_execution_accelerator": [{"name": "cuda"}]}},
        },
        ACCEL,
        "only the onnxruntime backend",
    ),
]
BROKEN_ONNX = [
    ({"gpu_execution_accelerator": [{"name": "tensorrt"}]}, f"{ACCEL}[0].name", "TensorRT is not supported"),
    ({"gpu_execution_accelerator": [{"name": "openvino"}]}, f"{ACCEL}[0].name", "must be cuda"),
    ({"gpu_execution_accelerator": []}, ACCEL, "a list of one accelerator"),
    (
        {"gpu_execution_accelerator": [{"name": "cuda", "parameters": {"x": "1"}}]},
        f"{ACCEL}[0].parameters",
        "takes no parameters",
    ),
    ({"cpu_execution_accelerator": [{"name": "openvino"}]}, "optimization.execution_accelerators.cpu", ""),
]


@pytest.mark.parametrize(("raw", "field", "fragment"), BROKEN)
def test_broken_gpu_config_names_the_field(raw: dict[str, object], field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    assert caught.value.field == field
    assert fragment in caught.value.problem


@pytest.mark.parametrize(("accelerators", "field", "fragment"), BROKEN_ONNX)
def test_broken_onnx_accelerator_names_the_field(
    accelerators: dict[str, object], field: str, fragment: str
) -> None:
    raw = {
        "backend": "onnxruntime",
        **GPU,
        "optimization": {"execution_accelerators": accelerators},
    }
    with pytest.raises(ConfigError) as caught:
        model_config_from_dict(raw, "m/config.yaml", "m")
    assert caught.value.field.startswith(field)
    assert fragment in caught.value.problem


def test_pytorch_only_switches_are_refused_for_onnx_models() -> None:
    for cuda, field in (({"autocast": "BF16"}, "autocast"), ({"graphs": True}, "graphs")):
        raw = {"backend": "onnxruntime", **GPU, "optimization": {"cuda": cuda}}
        with pytest.raises(ConfigError, match=f"optimization.cuda.{field}"):
            model_config_from_dict(raw, "m/config.yaml", "m")


def test_gpu_instances_become_host_threads_in_the_demand() -> None:
    settings = EngineConfig()
    mixed = parse({"instance_group": [{"count": 2}, {"kind": "KIND_GPU", "count": 2}]})
    assert demand_for(mixed, settings) == Demand("m", count=2, gpus=(0, 0))
    assert demand_for(parse(GPU), settings) == Demand("m", gpus=(0,), cpu=False)
    with pytest.raises(ConfigError, match="spsc has one consumer per model"):
        demand_for(mixed, EngineConfig(queue_type="spsc"))
    assert demand_for(parse(GPU), EngineConfig(queue_type="spsc")) == Demand("m", gpus=(0,), cpu=False)
