"""The system shared-memory registry (``lumenrt.ingress.shared_memory``): keys that are names, never
paths, and never lumenrt's own segments; every size checked before anything is read or allocated;
regions bounded per client; descriptors closed on unregister, on close and when the client unlinks
its object; bytes copied with preadv/pwrite, never through a mapping, so an object the client
shrinks, truncates or unlinks, before or during a copy, is a 400 naming the region and never a
fault."""

import itertools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from lumenrt.ingress import shared_memory
from lumenrt.ingress.shared_memory import SharedMemoryRegistry, key_prefix, object_name, write_shm_output
from lumenrt.native import create_shared
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


def held(key: str) -> bool:
    """Whether the registry has the object ``key`` open: a descriptor of it beyond the one the
    test's client keeps (Python's mmap keeps a duplicate of the descriptor it mapped). Nothing
    maps it beyond the client's own mapping, ever."""
    path = f"/dev/shm/{key.lstrip('/')}"
    names = (path, f"{path} (deleted)")
    with open("/proc/self/maps") as maps:
        mappings = sum(1 for line in maps if line.split(maxsplit=5)[-1].strip() in names)
    assert mappings <= 1, "the registry maps a client's object"
    fds = sum(1 for fd in os.listdir("/proc/self/fd") if _link(f"/proc/self/fd/{fd}") in names)
    return fds > 1


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


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
    assert not held(region.key)


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
    assert len(registry) == 0 and not held(region.key)


def test_an_input_is_the_servers_own_copy(registry: SharedMemoryRegistry, region: ClientRegion) -> None:
    region.write(np.full(4, 7, np.int32))
    registry.register("in", region.key, 0, 16, "alice")
    array = registry.read(SharedMemoryRef("in", 0, 16), "INT32", (4,), "inputs[0].parameters")
    region.write(np.full(4, 9, np.int32))  # the client writes on: the request's input stays
    registry.unregister("in")
    assert not held(region.key)  # nothing of the object is kept for the request
    assert array.tolist() == [7, 7, 7, 7]


def test_an_output_target_of_a_region_unregistered_meanwhile_is_refused(
    registry: SharedMemoryRegistry, region: ClientRegion
) -> None:
    registry.register("out", region.key, 0, 64, "alice")
    ref = SharedMemoryRef("out", 0, 64)
    target = registry.target(ref, "outputs[0].parameters")  # at parse time
    registry.unregister("out")  # while the request ran
    other = os.open(region.path, os.O_RDONLY)  # may take the descriptor number the region had
    try:
        text = refused(write_shm_output, "probabilities", np.ones(10, np.float32), target, ref)
    finally:
        os.close(other)
    assert text == "output 'probabilities': region 'out' was unregistered while the request ran"
    assert bytes(region.map[:40]) == bytes(40)


HOSTILE = {
    "shrink": lambda r: os.truncate(r.path, 2048),
    "truncate": lambda r: os.truncate(r.path, 0),
    "unlink": lambda r: r.unlink(),
}
CHANGED = {"shrink": "is now 2048 bytes", "truncate": "is now 0 bytes", "unlink": "was unlinked"}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_an_object_changed_before_a_copy_is_refused_by_region(
    registry: SharedMemoryRegistry, case: str
) -> None:
    # the client's own mapping is left alone (truncated under it, it would fault this test)
    with ClientRegion(f"/lrt-test-{os.getpid()}-{next(_names)}", 4096) as made:
        registry.register("r", made.key, 1024, 3072, "alice")
        ref = SharedMemoryRef("r", 2048, 64)  # bytes 3072..3136 of the object
        HOSTILE[case](made)
        text = refused(registry.read, ref, "FP32", (16,), "inputs[0].parameters")
        assert text.startswith("inputs[0].parameters: region 'r': its object (key ") and CHANGED[case] in text
        target = registry.target(ref, "outputs[0].parameters")
        text = refused(write_shm_output, "y", np.zeros(16, np.float32), target, ref)
        assert text.startswith("output 'y': region 'r': its object") and CHANGED[case] in text


def test_an_object_that_shrinks_during_a_read_is_refused_and_a_write_cannot_fault(
    registry: SharedMemoryRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client truncates right after the server's check, before its copy: the read comes back
    short and is refused; the write re-extends the object (the client's doing) and faults nothing."""
    with ClientRegion(f"/lrt-test-{os.getpid()}-{next(_names)}", 8192) as made:
        registry.register("r", made.key, 0, 8192, "alice")
        checked = shared_memory._object_fits

        def then_truncate(*args: Any) -> int:
            fd = checked(*args)
            os.truncate(made.path, 0)
            return fd

        monkeypatch.setattr(shared_memory, "_object_fits", then_truncate)
        ref = SharedMemoryRef("r", 4096, 64)
        text = refused(registry.read, ref, "FP32", (16,), "inputs[0].parameters")
        assert (
            text
            == f"inputs[0].parameters: region 'r': its object (key {made.key!r}) shrank while it was read"
        )
        os.truncate(made.path, 8192)  # whole again for the write's check; truncated after it
        out = np.arange(16, dtype=np.float32)
        write_shm_output("y", out, registry.target(ref, "outputs[0].parameters"), ref)
        assert os.stat(made.path).st_size == 4096 + 64
        with open(made.path, "rb") as f:
            f.seek(4096)
            assert np.array_equal(np.frombuffer(f.read(64), np.float32), out)


def test_keys_naming_lumenrt_segments_are_refused(registry: SharedMemoryRegistry) -> None:
    segment = create_shared(4096, tag="victim")
    assert segment.name is not None
    link = f"/dev/shm/lrt-test-link-{os.getpid()}-{next(_names)}"
    os.link(f"/dev/shm/{segment.name}", link)  # the segment under a name of the client's
    try:
        for key in (segment.name, f"/{segment.name}"):
            text = refused(registry.register, "r", key, 0, 64, "alice")
            assert f"key {key!r} names one of lumenrt's own shared-memory segments (lumenrt.*)" in text
        key = "/" + os.path.basename(link)
        text = refused(registry.register, "r", key, 0, 64, "alice")
        assert f"key {key!r} is another name (a link) of one of lumenrt's own shared-memory segments" in text
        assert len(registry) == 0 and not held(key)
    finally:
        os.unlink(link)
        segment.close()


def test_a_configured_prefix_admits_only_its_names(region: ClientRegion) -> None:
    name = region.key.lstrip("/")
    reg = SharedMemoryRegistry(prefix=f"/{name[:8]}")
    try:
        reg.register("ok", region.key, 0, 8, "alice")
        other = SharedMemoryRegistry(prefix="app-")
        text = refused(other.register, "r", region.key, 0, 8, "alice")
        assert text == (
            f"region 'r': key {region.key!r}: this server takes only objects whose names start with "
            "'app-' (--client-shm-prefix)"
        )
    finally:
        reg.close()


@pytest.mark.parametrize("prefix", ["lumenrt.", "/lumenrt.x", "a/b", "sp ace", "x" * 255])
def test_prefixes_that_are_not_name_starts_or_name_lumenrt_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="client shared-memory prefix"):
        key_prefix(prefix)
    assert key_prefix("/app-") == "app-" and key_prefix("") == ""


def test_a_bytes_input_is_bounded_before_it_is_copied(region: ClientRegion) -> None:
    reg = SharedMemoryRegistry(max_bytes_tensor=1024)
    try:
        reg.register("in", region.key, 0, 4096, "alice")
        text = refused(reg.read, SharedMemoryRef("in", 0, 2048), "BYTES", (1,), "inputs[0].parameters")
        assert text == (
            "inputs[0].parameters: shared_memory_byte_size 2048 is more than a tensor may have here (1024 bytes)"
        )
        region.write(np.frombuffer(b"\x02\x00\x00\x00hi", np.uint8))
        array = reg.read(SharedMemoryRef("in", 0, 6), "BYTES", (1,), "inputs[0].parameters")
        assert array.tolist() == [b"hi"]
    finally:
        reg.close()


def test_the_sweeper_unregisters_unlinked_and_shrunk_objects(
    registry: SharedMemoryRegistry, region: ClientRegion
) -> None:
    with ClientRegion(f"/lrt-test-{os.getpid()}-{next(_names)}", 4096) as other:
        registry.register("kept", region.key, 0, 64, "alice")
        registry.register("gone", other.key, 0, 64, "alice")
        assert registry.sweep() == []
        other.unlink()
        assert held(other.key)
        assert registry.sweep() == ["gone"]
        assert not held(other.key)
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
