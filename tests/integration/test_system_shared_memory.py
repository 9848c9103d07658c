"""Triton's system shared-memory extension in a real server (ServerThread, loopback), through the real
tritonclient over HTTP and gRPC: one test body per case, run with each client. Regions are POSIX
shared-memory objects made as tritonclient.utils.shared_memory makes them (tests/shm_regions.py)."""

import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.models.builtin import builtin_examples
from tests.shm_regions import ClientRegion

MODEL = "digits_mlp"  # input [-1, 64] FP32 -> probabilities [-1, 10] FP32, label [-1] INT64
PROTOCOLS = ["http", "grpc"]
_names = itertools.count()


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(models=[MODEL], settings=EngineConfig(thread_count=1, pin=False)) as eng:
        yield eng


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[ServerThread]:
    options = ServeOptions(http_port=0, grpc_port=0, tcp_port=None, allow_client_shm=True)
    with ServerThread(engine, options) as st:
        yield st


@pytest.fixture
def region() -> Iterator[Any]:
    """A factory of client regions, all unlinked and unmapped at the end."""
    made: list[ClientRegion] = []

    def make(byte_size: int = 4096) -> ClientRegion:
        made.append(ClientRegion(f"/lrt-it-{os.getpid()}-{next(_names)}", byte_size))
        return made[-1]

    yield make
    for each in made:
        each.close()


class Client:
    """tritonclient's HTTP or gRPC client, with the two status forms made one."""

    def __init__(self, st: ServerThread, protocol: str) -> None:
        self.lib: Any = thttp if protocol == "http" else tgrpc
        self.protocol = protocol
        self.client = self.lib.InferenceServerClient(f"127.0.0.1:{st.ports[protocol]}")

    def status(self, name: str = "") -> list[dict[str, Any]]:
        got = self.client.get_system_shared_memory_status(name)
        if self.protocol == "http":
            return sorted(got, key=lambda r: r["name"])
        return sorted(
            ({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in got.regions.values()),
            key=lambda r: r["name"],
        )  # fmt: skip

    def infer(self, inputs: list[Any], outputs: list[Any]) -> Any:
        return self.client.infer(MODEL, inputs, outputs=outputs)


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: ServerThread) -> Iterator[Client]:
    made = Client(server, request.param)
    yield made
    made.client.unregister_system_shared_memory()
    made.client.close()


def held_by_server(region: ClientRegion) -> bool:
    """Whether the server (this process) holds the object: a descriptor of it beyond the one the
    test's own mapping keeps (Python's mmap keeps a duplicate). It never maps a client's object
    (ingress/shared_memory.py), so the test's mapping is the only one."""
    names = (region.path, f"{region.path} (deleted)")
    with open("/proc/self/maps") as maps:
        paths = (line.split(maxsplit=5)[-1].strip() for line in maps)
        assert sum(1 for p in paths if p in names) <= 1, "the server maps a client's object"
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            held += os.readlink(f"/proc/self/fd/{fd}") in names
    return held > 1


def plain_answer(client: Client, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    given = client.lib.InferInput("input", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    result = client.infer([given], [client.lib.InferRequestedOutput(n) for n in ("probabilities", "label")])
    return result.as_numpy("probabilities"), result.as_numpy("label")


def test_inputs_and_outputs_in_shared_memory(client: Client, region: Any) -> None:
    x = builtin_examples(MODEL, 2)["input"].astype(np.float32)
    inputs, outputs = region(8192), region(4096)
    inputs.write(x, offset=1024)
    client.client.register_system_shared_memory("in", inputs.key, 4096, offset=512)
    client.client.register_system_shared_memory("out", outputs.key, 4096)
    assert client.status() == [
        {"name": "in", "key": inputs.key, "offset": 512, "byte_size": 4096},
        {"name": "out", "key": outputs.key, "offset": 0, "byte_size": 4096},
    ]
    assert [r["name"] for r in client.status("out")] == ["out"]

    given = client.lib.InferInput("input", list(x.shape), "FP32")
    given.set_shared_memory("in", x.nbytes, offset=512)  # from the region's start: 1024 in the object
    in_shm = client.lib.InferRequestedOutput("probabilities")
    in_shm.set_shared_memory("out", 80, offset=64)
    result = client.infer([given], [in_shm, client.lib.InferRequestedOutput("label")])

    want_probabilities, want_label = plain_answer(client, x)
    np.testing.assert_array_equal(outputs.read(np.float32, (2, 10), offset=64), want_probabilities)
    np.testing.assert_array_equal(result.as_numpy("label"), want_label)  # the other output in the answer
    entry = result.get_output("probabilities")
    shape = entry["shape"] if client.protocol == "http" else list(entry.shape)
    assert shape == [2, 10]
    assert (entry.get("data") if client.protocol == "http" else None) is None

    client.client.unregister_system_shared_memory("in")
    assert [r["name"] for r in client.status()] == ["out"]
    assert not held_by_server(inputs) and held_by_server(outputs)
    client.client.unregister_system_shared_memory()  # every region
    assert client.status() == []
    assert not held_by_server(outputs)


def error_of(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), info.value.message()


BAD_REQUESTS = {
    # case: (input region, offset, byte size, output byte size, what the message names)
    "unknown-region": ("nope", 0, 256, 4096, "shared_memory_region: no registered region 'nope'"),
    "offset-past-end": ("in", 4000, 256, 4096, "shared_memory_offset 4000 + shared_memory_byte_size 256 is past the end of region 'in' (4096 bytes)"),
    "size-not-the-shape": ("in", 0, 128, 4096, "128 bytes"),
    "output-too-small": ("in", 0, 256, 16, "output 'probabilities': needs 40 bytes but its shared_memory_byte_size is 16"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_offsets_sizes_and_regions_are_refused_by_name(client: Client, region: Any, case: str) -> None:
    name, offset, size, out_size, text = BAD_REQUESTS[case]
    inputs, outputs = region(4096), region(4096)
    client.client.register_system_shared_memory("in", inputs.key, 4096)
    client.client.register_system_shared_memory("out", outputs.key, 4096)
    given = client.lib.InferInput("input", [1, 64], "FP32")
    given.set_shared_memory(name, size, offset=offset)
    wanted = client.lib.InferRequestedOutput("probabilities")
    wanted.set_shared_memory("out", out_size)
    status, message = error_of(lambda: client.infer([given], [wanted]))
    assert status in ("400", "StatusCode.INVALID_ARGUMENT")
    assert text in message
    plain_answer(client, np.zeros((1, 64), np.float32))  # the server serves on


@pytest.mark.parametrize(
    ("key", "offset", "size", "text"),
    [
        ("../../etc/passwd", 0, 8, "must be a shared-memory object name"),
        ("/dev/shm/x", 0, 8, "not a path"),
        ("/lrt-no-such-object", 0, 8, "cannot open key '/lrt-no-such-object'"),
        (None, 4000, 200, "past the end of key"),  # None: the test's own object of 4096 bytes
    ],
)
def test_bad_registrations_are_refused_by_name(
    client: Client, region: Any, key: str | None, offset: int, size: int, text: str
) -> None:
    made = region(4096)
    status, message = error_of(
        lambda: client.client.register_system_shared_memory("r", key or made.key, size, offset=offset)
    )
    assert status in ("400", "StatusCode.INVALID_ARGUMENT")
    assert text in message
    assert client.status() == []


def test_a_region_the_client_unlinks_is_unregistered(client: Client, region: Any) -> None:
    made = region(4096)
    client.client.register_system_shared_memory("r", made.key, 4096)
    made.unlink()
    deadline = time.monotonic() + 10
    while client.status() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.status() == []
    assert not held_by_server(made)


def test_off_by_default_and_regions_unmapped_at_shutdown(engine: Engine, region: Any) -> None:
    with ServerThread(engine, ServeOptions(http_port=0, grpc_port=None, tcp_port=None)) as st:
        http = thttp.InferenceServerClient(f"127.0.0.1:{st.ports['http']}")
        status, message = error_of(lambda: http.get_system_shared_memory_status())
        assert status == "400" and "--allow-client-shm" in message
        given = thttp.InferInput("input", [1, 64], "FP32")
        given.set_shared_memory("r", 256)
        status, message = error_of(lambda: http.infer(MODEL, [given]))
        assert "inputs[0].parameters.shared_memory_region: system shared memory is off" in message
        assert "system_shared_memory" not in http.get_server_metadata()["extensions"]
        http.close()
    made = region(4096)
    options = ServeOptions(http_port=0, grpc_port=None, tcp_port=None, allow_client_shm=True)
    with ServerThread(engine, options) as st:
        http = thttp.InferenceServerClient(f"127.0.0.1:{st.ports['http']}")
        assert "system_shared_memory" in http.get_server_metadata()["extensions"]
        http.register_system_shared_memory("r", made.key, 4096)
        assert held_by_server(made)
        http.close()
    assert not held_by_server(made)
