"""Connection density, CI-sized (issue 18; benchmarks/connections.py runs 10,000 under load):
``lumenrt serve`` started with a soft open-file limit of 1024 raises it and then holds 2,000 idle
keep-alive connections (1,000 HTTP, 1,000 TCP, from the benchmarks' idle crowd in a process of its
own); requests on top are answered, every idle connection still answers afterwards, and once the
crowd closes the server's descriptors come back to where they were."""

import contextlib
import os
import resource
import time
from collections.abc import Callable, Iterator

import pytest

from lumenrt.bench.serve_process import ServeProcess, start_serve
from lumenrt.client import HttpClient, TcpClient
from lumenrt.ingress.fd_limit import FD_LIMIT_CAP
from lumenrt.models.builtin import builtin_examples
from tests.benchmark_modules import import_benchmark_module

MODEL = "digits_mlp"
PER_PROTOCOL = 1_000
LOW_SOFT_LIMIT = 1024  # the usual default: 2,000 connections do not fit under it
WAIT_S = 30.0  # the most any condition below is waited for
FD_SLACK = 4  # descriptors the server may open or close meanwhile besides connections (guessed)

idle_crowd = import_benchmark_module("idle_crowd")


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def soft_fd_limit(soft: int) -> Iterator[None]:
    """This process's soft open-file limit lowered to ``soft`` (children inherit it), then restored."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, before), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))


def server_fds(server: ServeProcess) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def server_soft_fd_limit(server: ServeProcess) -> int:
    with open(f"/proc/{server.proc.pid}/limits", encoding="ascii") as f:
        line = next(x for x in f if x.startswith("Max open files"))
    return int(line.split()[3])


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * PER_PROTOCOL + 1024:
        pytest.skip(f"the hard open-file limit ({hard}) is too low for {2 * PER_PROTOCOL} connections")
    with soft_fd_limit(LOW_SOFT_LIMIT):
        started = start_serve("--models", MODEL, "--grpc-port", "off", "--idle-timeout-s", "600")
    yield started
    assert started.stop() == 0, "\n".join(started.lines)


def test_serve_raises_its_open_file_limit_and_says_so(server: ServeProcess) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = FD_LIMIT_CAP if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT_CAP)
    assert server_soft_fd_limit(server) == expected
    said = f"lumenrt serve: open-file limit raised {LOW_SOFT_LIMIT} -> {expected} "
    assert [line for line in server.lines if line.startswith(said)], "\n".join(server.lines)


def test_two_thousand_idle_connections_stay_answered_and_leave_nothing_open(server: ServeProcess) -> None:
    host, http_port, tcp_port = "127.0.0.1", server.ports["http"], server.ports["tcp"]
    x = builtin_examples(MODEL, batch=1)
    requests = {
        "http": idle_crowd.http_request(host, MODEL, x),
        "tcp": idle_crowd.tcp_request(MODEL, x),
    }
    fds_before = server_fds(server)
    with idle_crowd.IdleCrowd(host, {"http": http_port, "tcp": tcp_port}, requests) as crowd:
        for protocol in ("http", "tcp"):
            assert crowd.open(protocol, PER_PROTOCOL) == {"opened": PER_PROTOCOL, "failed": {}}
        assert server_fds(server) >= fds_before + 2 * PER_PROTOCOL  # held by the server, all of them
        with TcpClient(host, tcp_port) as tcp, HttpClient(host, http_port) as http:  # load on top
            for _ in range(20):
                assert tcp.infer(MODEL, x).outputs and http.infer(MODEL, x).outputs
        checked = crowd.check()
        assert checked == {p: {"answered": PER_PROTOCOL, "dropped": 0, "errors": {}} for p in ("http", "tcp")}
    wait_for(
        lambda: server_fds(server) <= fds_before + FD_SLACK, "the server to close the crowd's connections"
    )
