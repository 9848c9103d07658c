"""The engine's side of placement (engine/placing.py): what a model's config and the engine's
settings ask of the plan, and the config forms that ask it (Triton's host policies included)."""

import re
from pathlib import Path

import pytest

from lumenrt.engine.config import ConfigError, model_config_from_dict
from lumenrt.engine.placing import demand_for
from lumenrt.engine.server_config import EngineConfig, HostPolicy, load_engine_config
from lumenrt.placement.plan import Demand


def config(group: object) -> object:
    return model_config_from_dict({"backend": "python", "instance_group": group}, "m/config.yaml", "m")


def test_instance_group_forms_become_demands() -> None:
    settings = EngineConfig(host_policies=(HostPolicy("cpu1", numa_node=1, cpu_cores=(4, 5)),))
    assert demand_for(config({"count": 2, "numa_node": 1}), settings) == Demand("m", count=2, node=1)
    assert demand_for(config([{"kind": "KIND_CPU", "cores": [2, 3]}]), settings) == Demand("m", cores=(2, 3))
    assert demand_for(config({"host_policy": "cpu1"}), settings) == Demand("m", cores=(4, 5), node=1)
    with pytest.raises(ConfigError, match=r"no host policy 'gpu0' in engine.host_policies \(defined: cpu1\)"):
        demand_for(config({"host_policy": "gpu0"}), settings)


def test_a_group_names_one_place_at_most() -> None:
    with pytest.raises(ConfigError, match="give one of cores, numa_node and host_policy"):
        config({"cores": [1], "numa_node": 0})
    with pytest.raises(ConfigError, match=re.escape("instance_group.numa_node: must be an integer")):
        config({"numa_node": "0"})


def test_thread_count_places_round_robin_and_spsc_one_worker() -> None:
    assert EngineConfig(thread_count=2).placement == "roundrobin"
    assert EngineConfig().placement == "spread"
    assert demand_for(config({}), EngineConfig(thread_count=3)) == Demand("m", count=3)
    assert demand_for(config({}), EngineConfig(queue_type="spsc")) == Demand("m", count=1)
    with pytest.raises(ConfigError, match=re.escape("engine.thread_count")):
        EngineConfig(thread_count=2, placement="spread")


def test_host_policies_read_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "lumenrt.yaml"
    path.write_text(
        'engine:\n  placement: pack\n  host_policies:\n    cpu0: {numa-node: 0, cpu-cores: "0-1"}\n'
    )
    settings = load_engine_config(path)
    assert settings.placement == "pack"
    assert settings.host_policies == (HostPolicy("cpu0", numa_node=0, cpu_cores=(0, 1)),)
    assert EngineConfig(**settings.to_dict()) == settings  # recorded in result files, read back
    path.write_text("engine:\n  host_policies:\n    cpu0: {numa_node: 0}\n")
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "engine.host_policies.cpu0.numa_node: unknown key (valid: cpu-cores, numa-node); did you mean"
        ),
    ):
        load_engine_config(path)
    path.write_text("engine:\n  placement: node:x\n")
    with pytest.raises(ConfigError, match=re.escape("engine.placement: must be one of")):
        load_engine_config(path)
