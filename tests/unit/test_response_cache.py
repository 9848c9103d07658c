"""The response cache on its own: what its key covers, LRU eviction within the budget, statistics;
and the model config field that enables it."""

from typing import Any

import numpy as np
import pytest

from lumenrt.engine.config import ConfigError, model_config_from_dict
from lumenrt.ingress.response_cache import CacheInput, CacheKey, ResponseCache


def x_input(data: Any, datatype: str = "FP32", name: str = "x") -> CacheInput:
    return CacheInput(name, datatype, np.asarray(data))


def key_of(
    cache: ResponseCache,
    inputs: list[CacheInput],
    outputs: tuple[str, ...] = ("y",),
    model: str = "m",
    version: int = 1,
    load_id: int = 7,
) -> CacheKey:
    return cache.key(model, version, load_id, inputs, list(outputs))


def answer(value: float = 1.0, size: int = 4) -> list[tuple[str, Any]]:
    return [("y", np.full(size, value, dtype=np.float32))]


BASE = np.arange(8, dtype=np.float32).reshape(2, 4)


def test_identical_requests_hit_with_the_stored_outputs() -> None:
    cache = ResponseCache(1 << 20)
    first = key_of(cache, [x_input(BASE)])
    assert cache.lookup(first, 0) is None
    assert cache.store(first, answer(3.0))
    again = key_of(cache, [x_input(BASE.copy())])  # equal bytes in another array
    found = cache.lookup(again, 0)
    assert found is not None
    ((name, array),) = found
    assert name == "y" and array.tolist() == [3.0] * 4
    stats = cache.stats("m", 1)
    assert (stats.hits, stats.misses) == (1, 1)
    assert stats.hit_ns > 0 and stats.miss_ns > 0


def test_cached_outputs_are_read_only_copies() -> None:
    cache = ResponseCache(1 << 20)
    key = key_of(cache, [x_input(BASE)])
    produced = answer(2.0)
    cache.store(key, produced)
    produced[0][1][:] = 9.0  # the producer's buffer is reused: the cache keeps its own copy
    found = cache.lookup(key, 0)
    assert found is not None
    array = found[0][1]
    assert array.tolist() == [2.0] * 4
    with pytest.raises(ValueError):
        array[0] = 5.0


@pytest.mark.parametrize("index", [0, 13, 31])
def test_any_single_byte_different_misses(index: int) -> None:
    cache = ResponseCache(1 << 20)
    cache.store(key_of(cache, [x_input(BASE)]), answer())
    raw = bytearray(BASE.tobytes())
    raw[index] ^= 0x01
    changed = np.frombuffer(bytes(raw), dtype=np.float32).reshape(2, 4)
    assert cache.lookup(key_of(cache, [x_input(changed)]), 0) is None


@pytest.mark.parametrize(
    "other",
    [
        pytest.param([x_input(BASE.reshape(4, 2))], id="shape"),
        pytest.param([x_input(BASE.reshape(8))], id="rank"),
        pytest.param([x_input(BASE.view(np.int32), "INT32")], id="datatype-same-bytes"),
        pytest.param([x_input(BASE, name="z")], id="input-name"),
        pytest.param([x_input(BASE), x_input(BASE, name="w")], id="extra-input"),
    ],
)
def test_a_different_shape_datatype_or_input_misses(other: list[CacheInput]) -> None:
    cache = ResponseCache(1 << 20)
    cache.store(key_of(cache, [x_input(BASE)]), answer())
    assert cache.lookup(key_of(cache, other), 0) is None


def test_different_requested_outputs_miss() -> None:
    cache = ResponseCache(1 << 20)
    cache.store(key_of(cache, [x_input(BASE)], ("y", "p")), answer())
    assert cache.lookup(key_of(cache, [x_input(BASE)], ("y",)), 0) is None
    assert cache.lookup(key_of(cache, [x_input(BASE)], ("p", "y")), 0) is None
    assert cache.lookup(key_of(cache, [x_input(BASE)], ("y", "p")), 0) is not None


def test_input_order_does_not_change_the_key() -> None:
    cache = ResponseCache(1 << 20)
    a, b = x_input(BASE, name="a"), x_input(BASE[::-1], name="b")
    assert key_of(cache, [a, b]) == key_of(cache, [b, a])


def test_non_contiguous_inputs_key_like_their_contiguous_copy() -> None:
    cache = ResponseCache(1 << 20)
    strided = np.arange(16, dtype=np.float32).reshape(4, 4)[:, ::2]
    assert key_of(cache, [x_input(strided)]) == key_of(cache, [x_input(np.ascontiguousarray(strided))])


def test_bytes_tensors_key_every_element_with_its_length() -> None:
    cache = ResponseCache(1 << 20)
    one = np.array([b"ab", b"c"], dtype=object)
    other = np.array([b"a", b"bc"], dtype=object)  # same bytes joined, split elsewhere
    assert key_of(cache, [x_input(one, "BYTES")]) != key_of(cache, [x_input(other, "BYTES")])
    assert key_of(cache, [x_input(one, "BYTES")]) == key_of(cache, [x_input(one.copy(), "BYTES")])


def test_never_serves_across_models_versions_or_loads() -> None:
    cache = ResponseCache(1 << 20)
    cache.store(key_of(cache, [x_input(BASE)], model="m", version=1), answer())
    assert cache.lookup(key_of(cache, [x_input(BASE)], model="n", version=1), 0) is None
    assert cache.lookup(key_of(cache, [x_input(BASE)], model="m", version=2), 0) is None
    assert cache.lookup(key_of(cache, [x_input(BASE)], load_id=8), 0) is None  # a reloaded model
    assert cache.lookup(key_of(cache, [x_input(BASE)], model="m", version=1), 0) is not None
    assert cache.stats("n", 1).misses == 1 and cache.stats("m", 2).misses == 1
    assert cache.stats("m", 1).hits == 1


def test_eviction_at_the_budget_in_least_recently_used_order() -> None:
    entry_bytes = 16  # four FP32
    cache = ResponseCache(3 * entry_bytes)
    keys = [key_of(cache, [x_input([float(i)])]) for i in range(4)]
    for k in keys[:3]:
        assert cache.store(k, answer())
    assert cache.used_bytes == 3 * entry_bytes
    assert cache.lookup(keys[0], 0) is not None  # 0 is now the most recently used; 1 the least
    cache.store(keys[3], answer())
    assert cache.used_bytes == 3 * entry_bytes and len(cache) == 3
    assert cache.lookup(keys[1], 0) is None
    assert all(cache.lookup(k, 0) is not None for k in (keys[0], keys[2], keys[3]))
    assert cache.evictions == 1


def test_an_entry_larger_than_the_budget_is_not_stored() -> None:
    cache = ResponseCache(32)
    small = key_of(cache, [x_input([1.0])])
    cache.store(small, answer())
    big = key_of(cache, [x_input([2.0])])
    assert not cache.store(big, answer(size=9))  # 36 bytes
    assert cache.lookup(big, 0) is None
    assert cache.lookup(small, 0) is not None  # nothing was evicted for it
    assert cache.used_bytes == 16


def test_storing_a_key_again_replaces_its_entry() -> None:
    cache = ResponseCache(1 << 10)
    key = key_of(cache, [x_input(BASE)])
    cache.store(key, answer(1.0))
    cache.store(key, answer(2.0, size=2))
    assert cache.used_bytes == 8 and len(cache) == 1


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="budget_bytes"):
        ResponseCache(-1)


# ---- the model config field --------------------------------------------------------------------

MODEL = {"backend": "python", "max_batch_size": 4}


def test_response_cache_is_off_by_default() -> None:
    assert not model_config_from_dict(MODEL, "cfg.yaml", "m").response_cache


def test_response_cache_enable_turns_it_on() -> None:
    cfg = model_config_from_dict({**MODEL, "response_cache": {"enable": True}}, "cfg.yaml", "m")
    assert cfg.response_cache


@pytest.mark.parametrize(
    ("value", "field", "problem"),
    [
        ({"enable": "yes"}, "response_cache.enable", "must be true or false"),
        ({"enabled": True}, "response_cache.enabled", "did you mean 'enable'"),
        (True, "response_cache", "must be a mapping"),
    ],
)
def test_a_bad_response_cache_names_the_field(value: Any, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        model_config_from_dict({**MODEL, "response_cache": value}, "cfg.yaml", "m")
    assert info.value.field == field
    assert problem in info.value.problem
