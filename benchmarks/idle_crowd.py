"""An idle crowd: many keep-alive connections to a server's HTTP and binary TCP ports, held by a
process of their own and cheap to hold (raw non-blocking sockets on one uvloop loop: no transport,
protocol or stream object per connection), each sending one request when asked.

A module of this folder, used through ``IdleCrowd`` by ``connections.py`` (10,000 connections under
load), ``uring/uring_compare.py`` and ``tests/integration/test_connection_density.py`` (2,000,
CI-sized). ``IdleCrowd`` runs this file as a script:

    python benchmarks/idle_crowd.py --tcp 127.0.0.1:8003 --tcp-request FILE
        [--http 127.0.0.1:8000 --http-request FILE]

The request files hold the exact bytes one request sends (``http_request``, ``tcp_request``).
Commands on stdin, each answered with one JSON line on stdout:
  open PROTOCOL N  N more connections (PROTOCOL: http or tcp), each sends one request and reads
                   its answer, then idles (a kept-alive connection is one that has been used):
                   {"opened": n, "failed": {kind: count}}
  check            one request on every open connection, which then idles again:
                   {"http": {"answered": a, "dropped": d, "errors": {kind: count}}, "tcp": {...}}
  close            close them all: {"closed": n}; then it exits (as it does at the end of its input)
A connection that does not answer (closed by the server, reset, an error answer, no answer within
``--timeout-s``) is dropped: closed and counted under its error kind.

Source addresses: on loopback the crowd spreads each protocol's connections over 127.0.0.2, .3, ...
at most ``--per-address`` (default 500) from each, under the server's default
``--max-connections-per-client`` (512), as connections from many clients would be. Elsewhere they
all come from one address (serve with ``--max-connections-per-client 0``).
"""

import argparse
import asyncio
import contextlib
import json
import select
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lumenrt.client.http import encode_infer
from lumenrt.ingress.fd_limit import raise_fd_limit
from lumenrt.protocols.tcp import HEADER, HEADER_BYTES, RESPONSE, encode_request

PROTOCOLS = ("http", "tcp")
IN_FLIGHT = 256  # connects or requests under way at once (guessed: well under the listen backlog, 1024)
PER_ADDRESS = 500  # connections per protocol from one source address: under the default per-client 512
MAX_ADDRESSES = 250  # 127.0.0.2 .. 127.0.0.251
RECV_BYTES = 65536
START_TIMEOUT_S = 60.0  # the crowd process imports lumenrt and says it is ready


def http_request(host: str, model: str, inputs: Mapping[str, Any]) -> bytes:
    """A keep-alive V2 binary inference request, written out whole."""
    req = encode_infer(model, inputs)
    head = [f"POST {req.path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(req.body)}"]
    head += [f"{k}: {v}" for k, v in req.headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + req.body


def tcp_request(model: str, inputs: Mapping[str, Any]) -> bytes:
    """A request frame of the binary TCP protocol (docs/tcp-protocol.md), id 1 every time."""
    return b"".join(bytes(part) for part in encode_request(1, model, inputs))


class Dropped(Exception):
    """A connection that did not answer: ``kind`` says how (eof, reset, timeout, status 503, ...)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


async def _recv(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    try:
        data = await loop.sock_recv(sock, RECV_BYTES)
    except ConnectionResetError:
        raise Dropped("reset") from None
    except OSError as exc:
        raise Dropped(f"error {exc.errno}") from None
    if not data:
        raise Dropped("eof")
    return data


async def _read_http_answer(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Read one HTTP/1.1 response (Content-Length framed, as the server writes them)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await _recv(loop, sock)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += await _recv(loop, sock)
    if status != 200:
        raise Dropped(f"status {status}")


async def _read_tcp_answer(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Read one frame; anything but a response frame is an error answer."""
    data = b""
    while len(data) < HEADER_BYTES:
        data += await _recv(loop, sock)
    _, kind, _, _, _, meta_len, payload_len = HEADER.unpack_from(data)
    while len(data) < HEADER_BYTES + meta_len + payload_len:
        data += await _recv(loop, sock)
    if kind != RESPONSE:
        raise Dropped(f"frame kind {kind}")


READERS = {"http": _read_http_answer, "tcp": _read_tcp_answer}


@dataclass
class Crowd:
    """The connections of one crowd process (its event loop only)."""

    host: str
    ports: dict[str, int]  # protocol -> port, for the protocols it speaks
    requests: dict[str, bytes]  # protocol -> one request's bytes
    per_address: int
    timeout_s: float
    socks: dict[str, list[socket.socket]] = field(default_factory=lambda: {p: [] for p in PROTOCOLS})
    made: Counter[str] = field(default_factory=Counter)  # connections tried per protocol, ever

    def _source(self, protocol: str) -> str | None:
        if not self.host.startswith("127.") or self.per_address <= 0:
            return None
        index = self.made[protocol] // self.per_address
        if index >= MAX_ADDRESSES:
            raise ValueError(
                f"more than {MAX_ADDRESSES * self.per_address} {protocol} connections: raise --per-address"
            )
        return f"127.0.0.{2 + index}"

    async def _ask(self, protocol: str, sock: socket.socket) -> None:
        """One request on ``sock`` and its answer, within ``timeout_s``; Dropped if it fails."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout_s):
                await loop.sock_sendall(sock, self.requests[protocol])
                await READERS[protocol](loop, sock)
        except TimeoutError:
            raise Dropped("timeout") from None
        except (ConnectionResetError, BrokenPipeError):
            raise Dropped("reset") from None

    async def _open_one(
        self, protocol: str, source: str | None, gate: asyncio.Semaphore, failed: Counter[str]
    ) -> None:
        loop = asyncio.get_running_loop()
        async with gate:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                if source is not None:
                    sock.bind((source, 0))
                async with asyncio.timeout(self.timeout_s):
                    await loop.sock_connect(sock, (self.host, self.ports[protocol]))
                await self._ask(protocol, sock)
            except Dropped as exc:
                failed[exc.kind] += 1
                sock.close()
                return
            except (OSError, TimeoutError) as exc:
                failed[f"connect {type(exc).__name__}"] += 1
                sock.close()
                return
            self.socks[protocol].append(sock)

    async def open(self, protocol: str, n: int) -> dict[str, Any]:
        if protocol not in self.ports:
            raise ValueError(f"open: this crowd speaks {', '.join(self.ports)}, not {protocol!r}")
        before = len(self.socks[protocol])
        gate, failed = asyncio.Semaphore(IN_FLIGHT), Counter[str]()
        sources = []
        for _ in range(n):
            sources.append(self._source(protocol))
            self.made[protocol] += 1
        await asyncio.gather(*(self._open_one(protocol, s, gate, failed) for s in sources))
        return {"opened": len(self.socks[protocol]) - before, "failed": dict(failed)}

    async def _check_one(
        self, protocol: str, sock: socket.socket, gate: asyncio.Semaphore, errors: Counter[str]
    ) -> bool:
        async with gate:
            try:
                await self._ask(protocol, sock)
            except Dropped as exc:
                errors[exc.kind] += 1
                sock.close()
                return False
            return True

    async def check(self) -> dict[str, Any]:
        """One request on every connection; those that fail are closed and dropped."""
        gate = asyncio.Semaphore(IN_FLIGHT)
        out: dict[str, Any] = {}
        for protocol in self.ports:
            errors = Counter[str]()
            socks = self.socks[protocol]
            ok = await asyncio.gather(*(self._check_one(protocol, s, gate, errors) for s in socks))
            self.socks[protocol] = [s for s, good in zip(socks, ok, strict=True) if good]
            out[protocol] = {"answered": sum(ok), "dropped": len(ok) - sum(ok), "errors": dict(errors)}
        return out

    def close(self) -> dict[str, Any]:
        closed = 0
        for socks in self.socks.values():
            for sock in socks:
                sock.close()
            closed += len(socks)
            socks.clear()
        return {"closed": closed}


async def _serve_commands(crowd: Crowd) -> None:
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "close":
                _answer(crowd.close())
                return
            try:
                if words[0] == "open" and len(words) == 3:
                    _answer(await crowd.open(words[1], int(words[2])))
                elif words[0] == "check":
                    _answer(await crowd.check())
                else:
                    _answer({"error": f"unknown command {line.strip()!r}: open PROTOCOL N | check | close"})
            except ValueError as exc:
                _answer({"error": str(exc)})
    finally:
        crowd.close()


def _answer(doc: Mapping[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"write HOST:PORT, got {text!r}")
    return host, int(port)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Idle keep-alive connections held for a benchmark (see benchmarks/idle_crowd.py).",
        epilog="Commands on stdin: 'open http|tcp N', 'check', 'close' (one JSON line answers each).",
    )
    for protocol in PROTOCOLS:
        p.add_argument(
            f"--{protocol}", type=_address, metavar="HOST:PORT", help=f"the server's {protocol} port"
        )
        p.add_argument(
            f"--{protocol}-request", type=Path, metavar="FILE", help=f"the bytes of one {protocol} request"
        )
    p.add_argument(
        "--per-address",
        type=int,
        default=PER_ADDRESS,
        help=f"loopback: connections per protocol from one source address (default {PER_ADDRESS}; 0: all "
        "from 127.0.0.1)",
    )
    p.add_argument("--timeout-s", type=float, default=30.0, help="per connect and per request (default 30)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    ports: dict[str, int] = {}
    requests: dict[str, bytes] = {}
    hosts = set()
    for protocol in PROTOCOLS:
        where, request = getattr(args, protocol), getattr(args, f"{protocol}_request")
        if (where is None) != (request is None):
            print(f"idle_crowd: --{protocol} and --{protocol}-request go together", file=sys.stderr)
            return 2
        if where is not None:
            hosts.add(where[0])
            ports[protocol] = where[1]
            requests[protocol] = request.read_bytes()
    if len(hosts) != 1:
        print("idle_crowd: give --http and/or --tcp, on one host", file=sys.stderr)
        return 2
    raise_fd_limit()  # one descriptor per connection here too
    crowd = Crowd(hosts.pop(), ports, requests, args.per_address, args.timeout_s)
    import uvloop

    _answer({"ready": True})
    uvloop.run(_serve_commands(crowd))
    return 0


# ---- the parent's side ---------------------------------------------------------------------------


class IdleCrowd:
    """A crowd process (this file run as a script) and its commands; a context manager that
    closes it. ``requests``: protocol -> the bytes of one request (``http_request``,
    ``tcp_request``), for the protocols in ``ports``."""

    def __init__(
        self, host: str, ports: Mapping[str, int], requests: Mapping[str, bytes], *extra: str
    ) -> None:
        self._files = tempfile.TemporaryDirectory(prefix="lumenrt-crowd-")
        cmd = [sys.executable, str(Path(__file__).resolve())]
        for protocol, port in ports.items():
            path = Path(self._files.name) / f"{protocol}.request"
            path.write_bytes(requests[protocol])
            cmd += [f"--{protocol}", f"{host}:{port}", f"--{protocol}-request", str(path)]
        self.proc = subprocess.Popen([*cmd, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            first = self._read(START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        if not first.get("ready"):
            self.close()
            raise RuntimeError(f"the idle crowd did not start: {first}")

    def _read(self, timeout_s: float | None = None) -> dict[str, Any]:
        assert self.proc.stdout is not None
        if timeout_s is not None and not select.select([self.proc.stdout], [], [], timeout_s)[0]:
            self.proc.kill()
            raise RuntimeError(f"the idle crowd said nothing within {timeout_s:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the idle crowd exited (status {self.proc.wait()})")
        doc: dict[str, Any] = json.loads(line)
        if "error" in doc:
            raise RuntimeError(f"idle crowd: {doc['error']}")
        return doc

    def command(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._read()

    def open(self, protocol: str, n: int) -> dict[str, Any]:
        return self.command(f"open {protocol} {n}")

    def check(self) -> dict[str, Any]:
        return self.command("check")

    def close(self) -> None:
        """Close every connection and end the process (killed if it does not end)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                self.command("close")
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._files.cleanup()

    def __enter__(self) -> "IdleCrowd":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
