"""Engine settings that have no effect beside another key's value are refused, naming both keys:
from a file, from overrides (the command line) and from EngineConfig built in code."""

from pathlib import Path

import pytest
import yaml

from lumenrt.engine.config import ConfigError
from lumenrt.engine.server_config import NO_EFFECT, EngineConfig, load_engine_config

# (the keys given, the key refused, the key named beside it)
INERT = [
    ({"pin": False, "memory_binding": "first_touch"}, "memory_binding", "pin"),
    ({"pin": False, "memory_binding": "bind"}, "memory_binding", "pin"),  # given, though the default
    ({"placement": "roundrobin", "memory_binding": "first_touch"}, "memory_binding", "placement"),
    ({"lane": "queue", "lane_max_us": 100}, "lane_max_us", "lane"),
    ({"lane": "inline", "lane_max_us": 100}, "lane_max_us", "lane"),
    ({"lane": "queue", "lane_turn_us": 500}, "lane_turn_us", "lane"),
    ({"worker_mode": "process", "large_arena_bytes": 1 << 20}, "large_arena_bytes", "worker_mode"),
    ({"allocator_type": "standard", "large_arena_bytes": 1 << 20}, "large_arena_bytes", "allocator_type"),
    ({"allocator_type": "standard", "arena_slot_bytes": 4096}, "arena_slot_bytes", "allocator_type"),
    ({"allocator_type": "standard", "arena_slots": 8}, "arena_slots", "allocator_type"),
]

# each has an effect: accepted
EFFECTIVE = [
    {"pin": True, "memory_binding": "first_touch"},
    {"lane": "auto", "lane_max_us": 100},
    {"lane": "inline", "lane_turn_us": 500},
    {"lane": "auto", "lane_turn_us": 0},
    {"worker_mode": "process", "arena_slot_bytes": 4096, "arena_slots": 8},
    {"large_arena_bytes": 1 << 20},
    {"pin": False},
    {"placement": "roundrobin"},
]


def test_every_rule_is_in_the_table() -> None:
    assert {(r.key, r.other) for r in NO_EFFECT} == {(key, other) for _, key, other in INERT}


@pytest.mark.parametrize(("given", "key", "other"), INERT, ids=lambda v: str(v))
def test_a_key_without_effect_is_refused_naming_both_keys(
    given: dict[str, object], key: str, other: str, tmp_path: Path
) -> None:
    match = rf"engine\.{key}: has no effect with engine\.{other} .*remove engine\.{key}, or change engine\.{other}"
    path = tmp_path / "lumenrt.yaml"
    path.write_text(yaml.safe_dump({"engine": given}))
    with pytest.raises(ConfigError, match=match) as from_file:
        load_engine_config(path)
    assert str(path) in str(from_file.value)
    with pytest.raises(ConfigError, match=match):
        load_engine_config(None, given)
    if given.get(key) != getattr(EngineConfig(), key):  # in code: a value off its default counts as set
        with pytest.raises(ConfigError, match=match):
            EngineConfig(**given)  # type: ignore[arg-type]


@pytest.mark.parametrize("given", EFFECTIVE, ids=lambda v: str(v))
def test_combinations_with_an_effect_are_accepted(given: dict[str, object], tmp_path: Path) -> None:
    path = tmp_path / "lumenrt.yaml"
    path.write_text(yaml.safe_dump({"engine": given}))
    assert load_engine_config(path) == load_engine_config(None, given) == EngineConfig(**given)  # type: ignore[arg-type]
