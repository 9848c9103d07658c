"""The system shared-memory registry (``lumenrt.ingress.shared_memory``): keys that are names, never
paths; every size checked before anything is mapped or read; regions bounded per client; mappings
gone on unregister, on close and when the client unlinks its object, but never under a request
that still views them."""

import itertools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from lumenrt.ingress.shared_memory import SharedMemoryRegistry, object_name, write_shm_output
from lumenrt.protocols.errors import ServerError
from lumenrt.protocols.parameters import SharedMemoryRef
from tests.shm_regions import ClientRegion

_names = itertools.count()


@pytest.fixture
def region() -> Iterator[ClientRegion]:
    with ClientRegion(f"/lrt-test-{os.getpid()}-{next(_names)}", 4096) as made:
        yield made


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry(max_per_client=2, max_regions=3)
    yield reg
    reg.close()


def refused(call: Any, *args: Any, status: int = 400) -> str:
    with pytest.raises(ServerError) as info:
        call(*args)
    assert info.value.status == status
    return info.value.message


def mapped(key: str) -> bool:
    """Whether the registry maps the object ``key``: ``/proc/self/maps`` names the file in each
    mapping of it, and the test's client (this process too) maps it once itself."""
    path = f"/dev/shm/{key.lstrip('/')}"
    with open("/proc/self/maps") as maps:
        count = sum(1 for line in maps if line.split(maxsplit=5)[-1].strip() in (path, f"{path} (deleted)"))
    return count > 1


@pytest.mark.parametrize("key", ["/ok", "ok", "a.b-c_d", "/" + "x" * 255])
def test_keys_are_object_names(key: str) -> None:
    assert object_name(key) == key.lstrip("/")


@pytest.mark.parametrize(
    "key", ["", "/", "../etc/passwd", "/dev/shm/x", "a/b", ".", "..", "/..", "x" * 256, "sp ace", "nul\0", 7]
)
def test_keys_that_are_paths_or_not_names_are_refused(key: Any) -> None:
    assert "must be a shared-memory object name" in refused(object_name, key)


def test_register_status_read_write_unregister(registry: SharedMemoryRegistry, region: ClientRegion) -> None:
    data = np.arange(16, dtype=np.float32)
    region.write(data, offset=128)
    registry.register("in", region.key, 64, 1024, "alice")
    assert registry.status(None) == [{"name": "in", "key": region.key, "offset": 64, "byte_size": 1024}]
    assert registry.status("in") == registry.status("")
    # tensor offsets are from the region's start (64 into the object)
    array = registry.read(SharedMemoryRef("in", 64, 64), "FP32", (4, 4), "inputs[0].parameters")
    assert np.array_equal(array, data.reshape(4, 4))
    target = registry.target(SharedMemoryRef("in", 512, 512), "outputs[0].parameters")
    out = np.linspace(0, 1, 10, dtype=np.float32)
    assert write_shm_output("probabilities", out, target, SharedMemoryRef("in", 512, 512)) == ("FP32", 40)
    assert np.array_equal(region.read(np.float32, (10,), offset=64 + 512), out)
    del array, target
    registry.unregister("in")
    assert registry.status(None) == []
    assert not mapped(region.key)


@pytest.mark.parametrize(
    ("ref", "shape", "text"),
    [
        (SharedMemoryRef("in", 1000, 64), (16,), "shared_memory_offset 1000 + shared_memory_byte_size 64 is past the end of region 'in' (1024 bytes)"),
        (SharedMemoryRef("in", 0, 2048), (512,), "is past the end of region 'in'"),
        (SharedMemoryRef("in", 0, 60), (16,), "60 bytes"),  # not the shape's 64
        (SharedMemoryRef("nope", 0, 64), (16,), "inputs[0].parameters.shared_memory_region: no registered region 'nope'"),
    ],
)  # fmt: skip
def test_tensor_bytes_are_checked_against_the_region(
    registry: SharedMemoryRegistry,
    region: ClientRegion,
    ref: SharedMemoryRef,
    shape: tuple[int, ...],
    text: str,
) -> None:
    registry.register("in", region.key, 0, 1024, "alice")
    assert text in refused(registry.read, ref, "FP32", shape, "inputs[0].parameters")


def test_an_output_bigger_than_its_place_is_refused(
    registry: SharedMemoryRegistry, region: ClientRegion
) -> None:
    registry.register("out", region.key, 0, 64, "alice")
    ref = SharedMemoryRef("out", 0, 16)
    target = registry.target(ref, "outputs[0].parameters")
    text = refused(write_shm_output, "probabilities", np.zeros(10, np.float32), target, ref)
    assert (
        text == "output 'probabilities': needs 40 bytes but its shared_memory_byte_size is 16 (region 'out')"
    )


def test_registration_is_checked_before_mapping(
    registry: SharedMemoryRegistry, region: ClientRegion, tmp_path: Any
) -> None:
    assert "past the end of key" in refused(registry.register, "r", region.key, 4000, 200, "alice")
    assert "byte_size must be more than 0" in refused(registry.register, "r", region.key, 0, 0, "alice")
    assert "offset must be a non-negative integer" in refused(
        registry.register, "r", region.key, -1, 8, "alice"
    )
    assert "cannot open key '/lrt-missing-key'" in refused(
        registry.register, "r", "/lrt-missing-key", 0, 8, "a"
    )
    assert "not a path" in refused(registry.register, "r", "../../etc/passwd", 0, 8, "alice")
    # a symbolic link under /dev/shm is not followed (O_NOFOLLOW)
    link = f"/dev/shm/lrt-link-{os.getpid()}"
    os.symlink(region.path, link)
    try:
        assert "cannot open key" in refused(registry.register, "r", os.path.basename(link), 0, 8, "alice")
    finally:
        os.unlink(link)
    assert "region name" in refused(registry.register, "", region.key, 0, 8, "alice")
    registry.register("r", region.key, 0, 8, "alice")
    assert "already registered" in refused(registry.register, "r", region.key, 0, 8, "alice")
    assert "'ghost' is not registered" in refused(registry.unregister, "ghost")
    assert "no registered region 'ghost'" in refused(registry.status, "ghost")
    assert len(registry) == 1


def test_regions_are_bounded_per_client_and_in_all(
    registry: SharedMemoryRegistry, region: ClientRegion
) -> None:
    registry.register("a1", region.key, 0, 8, "alice")
    registry.register("a2", region.key, 8, 8, "alice")
    assert "this client has 2 regions" in refused(
        registry.register, "a3", region.key, 0, 8, "alice", status=429
    )
    registry.register("b1", region.key, 0, 8, "bob")
    assert "holds 3 regions" in refused(registry.register, "b2", region.key, 0, 8, "bob", status=429)
    registry.unregister("a1")
    registry.register("a3", region.key, 0, 8, "alice")  # the count came back
    registry.unregister(None)
    assert len(registry) == 0 and not mapped(region.key)


def test_a_view_outlives_the_unregister_then_the_mapping_goes(
    registry: SharedMemoryRegistry, region: ClientRegion
) -> None:
    region.write(np.full(4, 7, np.int32))
    registry.register("in", region.key, 0, 16, "alice")
    array = registry.read(SharedMemoryRef("in", 0, 16), "INT32", (4,), "inputs[0].parameters")
    registry.unregister("in")
    assert mapped(region.key)  # a request still reads it
    assert array.tolist() == [7, 7, 7, 7]
    del array
    assert not mapped(region.key)


def test_the_sweeper_unregisters_unlinked_and_shrunk_objects(
    registry: SharedMemoryRegistry, region: ClientRegion
) -> None:
    with ClientRegion(f"/lrt-test-{os.getpid()}-{next(_names)}", 4096) as other:
        registry.register("kept", region.key, 0, 64, "alice")
        registry.register("gone", other.key, 0, 64, "alice")
        assert registry.sweep() == []
        other.unlink()
        assert mapped(other.key)
        assert registry.sweep() == ["gone"]
        assert not mapped(other.key)
        os.truncate(region.path, 32)  # shrank below the region
        assert registry.sweep() == ["kept"]
        assert len(registry) == 0


def test_a_bytes_output_is_written_in_its_raw_form(
    registry: SharedMemoryRegistry, region: ClientRegion
) -> None:
    registry.register("out", region.key, 0, 64, "alice")
    ref = SharedMemoryRef("out", 8, 32)
    words = np.array([b"ab", b"cde"], dtype=object)
    assert write_shm_output("upper", words, registry.target(ref, "outputs[0].parameters"), ref) == (
        "BYTES",
        13,
    )
    # each element: a 4-byte little-endian length, then its bytes
    assert bytes(region.map[8 : 8 + 13]) == b"\x02\x00\x00\x00ab\x03\x00\x00\x00cde"
