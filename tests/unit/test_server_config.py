"""Server config: the seed's engine keys keep working, defaults follow the usable cores, overrides
win over the file, and every broken value is refused naming the file and the field."""

import argparse
import json
import os
from pathlib import Path

import pytest

from lumenrt.engine.config import ConfigError
from lumenrt.engine.server_config import (
    DEFAULT_ARENA_SLOT_BYTES,
    DEFAULT_ARENA_SLOTS,
    ENGINE_KEYS,
    EngineConfig,
    load_engine_config,
)
from lumenrt.ingress.serve import add_arguments as add_serve_arguments

USABLE = tuple(sorted(os.sched_getaffinity(0)))


def test_defaults_use_every_usable_core() -> None:
    config = load_engine_config(None)
    assert config == EngineConfig()
    assert (config.queue_type, config.allocator_type, config.worker_mode) == ("mpmc", "lumen_arena", "thread")
    assert config.cores == USABLE
    assert config.thread_count == len(USABLE)
    assert config.batch_size == 0  # no cap
    assert config.pin is True
    assert (config.arena_slot_bytes, config.arena_slots) == (DEFAULT_ARENA_SLOT_BYTES, DEFAULT_ARENA_SLOTS)


def test_seed_config_json_keeps_working(tmp_path: Path) -> None:
    seed = {
        "engine": {"queue_type": "mpmc", "allocator_type": "lumen_arena", "thread_count": 8, "batch_size": 1}
    }
    path = tmp_path / "lumenrt.json"
    path.write_text(json.dumps(seed))
    config = load_engine_config(path)
    assert (config.queue_type, config.allocator_type, config.thread_count, config.batch_size) == (
        "mpmc",
        "lumen_arena",
        8,  # more workers than cores is allowed (oversubscribed), as the seed ran it
        1,
    )


def test_yaml_config_with_every_key(tmp_path: Path) -> None:
    path = tmp_path / "lumenrt.yaml"
    path.write_text(
        f"""engine:
  queue_type: batched
  allocator_type: lumen_arena
  thread_count: 3
  batch_size: 16
  worker_mode: thread
  pin: false
  cores: [{USABLE[0]}]
  arena_slot_bytes: 4096
  arena_slots: 32
"""
    )
    assert load_engine_config(path) == EngineConfig(
        queue_type="batched",
        allocator_type="lumen_arena",
        thread_count=3,
        batch_size=16,
        worker_mode="thread",
        pin=False,
        cores=(USABLE[0],),
        arena_slot_bytes=4096,
        arena_slots=32,
    )


def test_overrides_win_and_none_means_not_given(tmp_path: Path) -> None:
    path = tmp_path / "lumenrt.json"
    path.write_text('{"engine": {"queue_type": "naive", "batch_size": 4}}')
    config = load_engine_config(path, {"queue_type": "mpmc", "batch_size": None, "worker_mode": "process"})
    assert (config.queue_type, config.batch_size, config.worker_mode) == ("mpmc", 4, "process")


def test_thread_count_follows_given_cores() -> None:
    config = load_engine_config(None, {"cores": [USABLE[0]]})
    assert (config.cores, config.thread_count) == ((USABLE[0],), 1)


def test_spsc_defaults_to_one_worker() -> None:
    assert load_engine_config(None, {"queue_type": "spsc"}).thread_count == 1


def test_spsc_with_several_workers_explains_single_consumer(tmp_path: Path) -> None:
    path = tmp_path / "lumenrt.yaml"
    path.write_text("engine: {queue_type: spsc, thread_count: 2}\n")
    with pytest.raises(ConfigError, match="single consumer") as caught:
        load_engine_config(path)
    assert (caught.value.source, caught.value.field) == (str(path), "engine.queue_type")


def test_to_dict_records_resolved_values() -> None:
    config = load_engine_config(None, {"thread_count": 2})
    recorded = json.loads(json.dumps(config.to_dict()))
    assert recorded["cores"] == list(USABLE)
    assert recorded["thread_count"] == 2
    assert EngineConfig(**{**recorded, "cores": tuple(recorded["cores"])}) == config
    assert config.label == "mpmc/lumen_arena/thread/w2"


BROKEN = [
    ('{"engin": {}}', "engin", "unknown key (valid: engine, rate_limits, server)"),
    ('{"engine": {"queue": "mpmc"}}', "engine.queue", "did you mean 'queue_type'"),
    ('{"engine": []}', "engine", "must be a mapping"),
    (
        '{"engine": {"queue_type": "lockfree"}}',
        "engine.queue_type",
        "must be one of mpmc, spsc, naive, batched",
    ),
    ('{"engine": {"allocator_type": "malloc"}}', "engine.allocator_type", "got 'malloc'"),
    ('{"engine": {"thread_count": -1}}', "engine.thread_count", "must be >= 0, got -1"),
    ('{"engine": {"thread_count": "2"}}', "engine.thread_count", "must be an integer"),
    ('{"engine": {"batch_size": -1}}', "engine.batch_size", "must be >= 0, got -1"),
    (
        '{"engine": {"allocator_type": "standard", "worker_mode": "process"}}',
        "engine.allocator_type",
        "'standard' cannot be combined with engine.worker_mode 'process'",
    ),
    ('{"engine": {"worker_mode": "fiber"}}', "engine.worker_mode", "must be one of thread, process"),
    ('{"engine": {"pin": "yes"}}', "engine.pin", "must be true or false"),
    ('{"engine": {"cores": "0-3"}}', "engine.cores", "must be a list of core numbers"),
    ('{"engine": {"cores": [100000]}}', "engine.cores[0]", "core 100000 is not usable"),
    (f'{{"engine": {{"cores": [{USABLE[0]}, {USABLE[0]}]}}}}', "engine.cores[1]", "duplicate core"),
    ('{"engine": {"cores": [-1]}}', "engine.cores[0]", "must be >= 0"),
    ('{"engine": {"arena_slot_bytes": 8}}', "engine.arena_slot_bytes", "must be >= 64, got 8"),
    ('{"engine": {"arena_slots": 0}}', "engine.arena_slots", "must be >= 1, got 0"),
    ('{"engine": {"large_arena_bytes": -1}}', "engine.large_arena_bytes", "must be >= 0, got -1"),
    ('{"engine": {"batch_size": 1, "batch_size": 2}}', "engine.batch_size", "given twice"),
]


@pytest.mark.parametrize(("text", "field", "fragment"), BROKEN)
def test_broken_server_config_names_file_and_field(
    tmp_path: Path, text: str, field: str, fragment: str
) -> None:
    path = tmp_path / "lumenrt.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_engine_config(path)
    assert (caught.value.source, caught.value.field) == (str(path), field)
    assert fragment in caught.value.problem
    assert str(caught.value).startswith(f"{path}: {field}: ")


def test_bad_override_is_named_as_an_override(tmp_path: Path) -> None:
    path = tmp_path / "lumenrt.json"
    path.write_text('{"engine": {"batch_size": 4}}')
    with pytest.raises(ConfigError) as caught:
        load_engine_config(path, {"queue_type": "ring"})
    assert (caught.value.source, caught.value.field) == ("<overrides>", "engine.queue_type")
    with pytest.raises(ConfigError) as caught:
        load_engine_config(path, {"threads": 2})
    assert (caught.value.source, caught.value.field) == ("<overrides>", "engine.threads")


def test_defaults_replace_built_in_defaults_but_not_the_file_or_overrides(tmp_path: Path) -> None:
    assert load_engine_config(None, None, defaults={"spin_us": 0}).spin_us == 0
    path = tmp_path / "lumenrt.yaml"
    path.write_text("engine: {spin_us: 30}\n")
    assert load_engine_config(path, None, defaults={"spin_us": 0}).spin_us == 30
    assert load_engine_config(path, {"spin_us": 7}, defaults={"spin_us": 0}).spin_us == 7


def test_every_engine_key_is_explained_in_serve_help_and_the_readme() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    text = parser.format_help()
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for key in ENGINE_KEYS:
        assert f"\n  {key} " in text, f"lumenrt serve --help does not explain engine.{key}"
        assert f"| `{key}`" in readme, f"the README's server config table lacks engine.{key}"
