"""Hostile system shared memory against a real ``lumenrt serve --allow-client-shm`` child process,
through tritonclient over HTTP and gRPC (issue 38): a client that shrinks, truncates or unlinks its
object before or while the server reads it, or that truncates the region an output is written to,
gets a 400 (gRPC: INVALID_ARGUMENT) naming the region, and the server never dies (SIGBUS was the
way it died); a key that names one of lumenrt's own segments, directly or through a hard link, is
refused. After each case the server still answers a plain inference and its process is alive.

The server runs in its own process so that a fault kills it and not the test. The test's own
objects are never mapped here (written with ``pwrite``): truncating an object this process mapped
could fault the test itself."""

import argparse
import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from lumenrt.bench.serve_process import ServeProcess, start_serve
from lumenrt.ingress.serve import add_arguments
from lumenrt.models.builtin import builtin_examples
from lumenrt.native import create_shared

MODEL = "digits_mlp"  # input [-1, 64] FP32 -> probabilities [-1, 10] FP32, label [-1] INT64
PROTOCOLS = ["http", "grpc"]
PAGE = os.sysconf("SC_PAGE_SIZE")
OBJECT_BYTES = 3 * PAGE  # page 0 | page 1: outputs | page 2: the input
OUT_AT = PAGE
IN_AT = 2 * PAGE
ROW = builtin_examples(MODEL, 1)["input"].astype(np.float32)  # [1, 64]: 256 bytes
OUT_BYTES = 40  # probabilities of one row: 10 FP32
CONCURRENT_REQUESTS = 150  # per protocol, with a thread truncating the object all along
_names = itertools.count()


class HostileObject:
    """A client's POSIX shared-memory object, kept as a descriptor (never mapped here)."""

    def __init__(self, byte_size: int = OBJECT_BYTES) -> None:
        self.name = f"lrt-hostile-{os.getpid()}-{next(_names)}"
        self.key = f"/{self.name}"
        self.path = f"/dev/shm/{self.name}"
        self.byte_size = byte_size
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        os.ftruncate(self.fd, byte_size)
        self.write_input()

    def write_input(self) -> None:
        os.pwrite(self.fd, ROW.tobytes(), IN_AT)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def close(self) -> None:
        self.unlink()
        os.close(self.fd)


@pytest.fixture
def objects() -> Iterator[Callable[[], HostileObject]]:
    made: list[HostileObject] = []

    def make() -> HostileObject:
        made.append(HostileObject())
        return made[-1]

    yield make
    for each in made:
        each.close()


def serve() -> ServeProcess:
    return start_serve("--models", MODEL, "--allow-client-shm", "--workers", "1", "--no-pin")


@pytest.fixture(scope="module")
def servers() -> Iterator[list[ServeProcess]]:
    """The module's server, started again by ``server`` after a test that killed it (so that each
    test's verdict is its own); stopped at the end."""
    held: list[ServeProcess] = []
    try:
        yield held
    finally:
        for each in held:
            each.stop()


@pytest.fixture
def server(servers: list[ServeProcess]) -> ServeProcess:
    if not servers or servers[-1].proc.poll() is not None:
        servers.append(serve())
    return servers[-1]


class Client:
    def __init__(self, served: ServeProcess, protocol: str) -> None:
        self.lib: Any = thttp if protocol == "http" else tgrpc
        self.protocol = protocol
        self.client = self.lib.InferenceServerClient(
            served.http_url if protocol == "http" else served.grpc_url
        )

    def register(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self.client.register_system_shared_memory(name, key, byte_size, offset=offset)

    def regions(self) -> list[str]:
        got = self.client.get_system_shared_memory_status()
        return sorted(r["name"] for r in got) if self.protocol == "http" else sorted(got.regions)

    def infer_from(self, region: str, out_region: str | None = None) -> Any:
        """One row read from ``region`` (its offset 0); probabilities into ``out_region`` when given."""
        given = self.lib.InferInput("input", [1, 64], "FP32")
        given.set_shared_memory(region, ROW.nbytes)
        wanted = self.lib.InferRequestedOutput("probabilities")
        if out_region is not None:
            wanted.set_shared_memory(out_region, OUT_BYTES)
        return self.client.infer(MODEL, [given], outputs=[wanted, self.lib.InferRequestedOutput("label")])

    def plain(self) -> int:
        """A plain inference (the tensor in the request): its label."""
        given = self.lib.InferInput("input", [1, 64], "FP32")
        given.set_data_from_numpy(ROW)
        return int(self.client.infer(MODEL, [given]).as_numpy("label")[0])


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: ServeProcess) -> Iterator[Client]:
    made = Client(server, request.param)
    yield made
    with contextlib.suppress(Exception):  # the server may be gone: the test says so itself
        made.client.unregister_system_shared_memory()
    made.client.close()


def refusal(call: Callable[[], Any]) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), info.value.message()


def is_bad_request(status: str) -> bool:
    return status in ("400", "StatusCode.INVALID_ARGUMENT")


def assert_still_serving(server: ServeProcess, client: Client) -> None:
    assert server.proc.poll() is None, f"the server died ({server.proc.returncode}):\n" + "\n".join(
        server.lines
    )
    assert client.plain() == client.plain()  # answers, and answers the same


HOSTILE = {
    # case: what the client does to the object after registering it
    "shrink": lambda obj: obj.truncate(PAGE),  # the input's page and the outputs' page are gone
    "truncate": lambda obj: obj.truncate(0),
    "unlink": lambda obj: obj.unlink(),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_an_object_changed_before_a_read_is_refused_by_region(
    server: ServeProcess, client: Client, objects: Callable[[], HostileObject], case: str
) -> None:
    obj = objects()
    name = f"in-{case}"
    client.register(name, obj.key, ROW.nbytes, offset=IN_AT)
    assert client.infer_from(name).as_numpy("probabilities").shape == (1, 10)  # as registered: fine
    HOSTILE[case](obj)
    status, message = refusal(lambda: client.infer_from(name))
    assert is_bad_request(status), (status, message)
    assert f"region {name!r}" in message, message
    assert_still_serving(server, client)


@pytest.mark.parametrize("case", ["shrink", "truncate"])
def test_an_output_region_truncated_before_the_write_is_refused_by_region(
    server: ServeProcess, client: Client, objects: Callable[[], HostileObject], case: str
) -> None:
    source, target = objects(), objects()
    client.register("in", source.key, ROW.nbytes, offset=IN_AT)
    client.register("out", target.key, OUT_BYTES, offset=OUT_AT)
    HOSTILE[case](target)
    status, message = refusal(lambda: client.infer_from("in", "out"))
    assert is_bad_request(status), (status, message)
    assert "region 'out'" in message, message
    assert_still_serving(server, client)


def test_a_key_naming_a_lumenrt_segment_is_refused(server: ServeProcess, client: Client) -> None:
    segment = create_shared(4096, tag="victim")  # lumenrt.<pid>.<n>.victim: as the engine names them
    assert segment.name is not None
    link = f"/dev/shm/lrt-hostile-link-{os.getpid()}-{next(_names)}"
    os.link(f"/dev/shm/{segment.name}", link)  # the same object under a name of the client's
    try:
        for key in (segment.name, f"/{segment.name}", "/" + os.path.basename(link)):
            status, message = refusal(lambda key=key: client.register("stolen", key, 64))  # type: ignore[misc]
            assert is_bad_request(status), (key, status, message)
            assert "lumenrt" in message and repr(key) in message, message
        assert client.regions() == []
    finally:
        os.unlink(link)
        segment.close()
    assert_still_serving(server, client)


def test_truncating_in_a_loop_while_requests_read_and_write(
    server: ServeProcess, client: Client, objects: Callable[[], HostileObject]
) -> None:
    """A thread truncates the object and grows it back, over and over, while requests read their
    input from it and write their output into it: every request is answered, with the probabilities
    or with a 400 naming one of the two regions (the sweeper may unregister them meanwhile: they
    are registered again)."""
    obj = objects()
    stop, first_round = threading.Event(), threading.Event()

    def hostile() -> None:
        while not stop.is_set():
            obj.truncate(0)
            obj.truncate(OBJECT_BYTES)
            obj.write_input()
            first_round.set()

    def register_again() -> None:
        present = client.regions()
        for name, size, offset in (("in", ROW.nbytes, IN_AT), ("out", OUT_BYTES, OUT_AT)):
            if name not in present:
                with contextlib.suppress(InferenceServerException):  # shrunk right now: next time
                    client.register(name, obj.key, size, offset=offset)

    register_again()
    worker = threading.Thread(target=hostile, name="truncate-loop", daemon=True)
    worker.start()
    assert first_round.wait(30)
    answered: dict[str, int] = {"ok": 0, "refused": 0}
    try:
        for _ in range(CONCURRENT_REQUESTS):
            try:
                result = client.infer_from("in", "out")
            except InferenceServerException as exc:
                status, message = str(exc.status()), exc.message()
                assert is_bad_request(status), (status, message)
                assert "region 'in'" in message or "region 'out'" in message, message
                answered["refused"] += 1
                register_again()
            else:
                assert result.as_numpy("label").shape == (1,)
                answered["ok"] += 1
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()
    assert answered["ok"] + answered["refused"] == CONCURRENT_REQUESTS
    assert_still_serving(server, client)
    # the object whole again: a request reads and writes it as before
    client.client.unregister_system_shared_memory()
    register_again()
    deadline = time.monotonic() + 30
    while set(client.regions()) != {"in", "out"}:
        assert time.monotonic() < deadline, client.regions()
        register_again()
    client.infer_from("in", "out")
    got = np.frombuffer(os.pread(obj.fd, OUT_BYTES, OUT_AT), np.float32)
    assert np.isclose(got.sum(), 1.0, atol=1e-4), got


def test_client_shm_prefix_admits_only_its_names(objects: Callable[[], HostileObject]) -> None:
    ours, theirs = objects(), HostileObject()
    os.rename(theirs.path, theirs.path.replace("lrt-hostile-", "lrt-other-"))
    theirs.path = theirs.path.replace("lrt-hostile-", "lrt-other-")
    theirs.key = theirs.key.replace("lrt-hostile-", "lrt-other-")
    served = start_serve(
        "--models", MODEL, "--allow-client-shm", "--client-shm-prefix", "/lrt-hostile-", "--workers", "1", "--no-pin"
    )  # fmt: skip
    http = thttp.InferenceServerClient(served.http_url)
    try:
        http.register_system_shared_memory("ours", ours.key, ROW.nbytes, offset=IN_AT)
        status, message = refusal(lambda: http.register_system_shared_memory("theirs", theirs.key, 64))
        assert status == "400" and message == (
            f"region 'theirs': key {theirs.key!r}: this server takes only objects whose names start with "
            "'lrt-hostile-' (--client-shm-prefix)"
        )
        assert [r["name"] for r in http.get_system_shared_memory_status()] == ["ours"]
    finally:
        http.close()
        served.stop()
        theirs.close()


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--client-shm-prefix", "lumenrt."], "lumenrt.* names lumenrt's own segments"),
        (["--client-shm-prefix", "a/b"], "must be the start of an object name"),
    ],
)
def test_client_shm_prefix_is_checked(argv: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    err = capsys.readouterr().err
    assert "--client-shm-prefix" in err and text in err


def test_client_shm_prefix_needs_allow_client_shm() -> None:
    argv = ["serve", "--client-shm-prefix", "app-", "--models", MODEL, "--http-port", "0"]
    argv += ["--grpc-port", "off", "--tcp-port", "off"]
    out = subprocess.run(
        [sys.executable, "-m", "lumenrt.cli", *argv], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--client-shm-prefix has no effect without --allow-client-shm" in out.stdout + out.stderr
