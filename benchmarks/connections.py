"""Connection density (C10K, issue 18): what an idle keep-alive connection costs ``lumenrt serve``,
and whether 10,000 of them slow down the clients that are busy.

    .venv/bin/python benchmarks/connections.py [--connections 10000] [--rounds 6] [--rate 1000]
        [--duration-s 5] [--protocols http tcp] [--no-uring] [--out results]
    .venv/bin/python benchmarks/connections.py --http 127.0.0.1:8000 --tcp 127.0.0.1:8003 [--server-pid PID]

One run, this machine, three processes: the server, the idle crowd (``idle_crowd.py``: raw sockets
on one loop, cheap to hold) and this one, which drives the load.
  1. The server: ``lumenrt serve`` with digits_mlp only, gRPC off, and ``--idle-timeout-s`` longer
     than the whole run (no idle connection may be closed); or a running one (``--http``/``--tcp``;
     its memory, descriptors and open-file limit only with ``--server-pid``).
  2. Memory per idle connection: the server's RSS before and after the crowd opens N/2 HTTP, then
     N/2 TCP connections, each of which has answered one request (kept alive, then idle). The
     first opening is quoted: later ones reuse memory freed when the crowd last closed.
  3. Load without and with the crowd: ``lumenrt bench load``'s loop (density_load.py), open loop at
     ``--rate`` requests/s with constant arrivals (the same load both ways, and a stall shows in
     every request scheduled during it), digits_mlp batch 1, over each of ``--protocols``, in
     interleaved rounds (without, with | with, without | ...). The figure is, per protocol, the
     median over the rounds of the p99 with the crowd over the median p99 without it; the issue's
     bound is 1.2.
  4. Dropped: before the crowd closes, each of its connections sends one more request; one that
     does not answer is dropped (none may be: the idle timeout is longer than the run).
  5. io_uring against uvloop, the same crowd and load on two frame responders
     (``uring/uring_compare.py``), unless ``--no-uring``.
Prints a table and writes ``<out>/connections-<stamp>.json`` (machine, commit, configuration, every
round). Run alone on the machine (``flock /tmp/lumenrt-bench.lock ...`` where others benchmark too).
"""

import argparse
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from density_load import MODEL, Load, fd_limit, memory_kib, open_fds, run
from idle_crowd import IdleCrowd, http_request, tcp_request
from lumenrt.bench.load_inputs import inputs_from_metadata
from lumenrt.bench.load_targets import fetch_model_info
from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import ServeProcess, start_serve
from lumenrt.ingress.fd_limit import raise_fd_limit

HERE = Path(__file__).resolve().parent

BOUND = 1.2  # issue 18: p99 with the crowd within 1.2x of p99 without it
PROTOCOLS = ("http", "tcp")


def _progress(msg: str) -> None:
    print(f"[bench connections] {msg}", file=sys.stderr, flush=True)


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"write HOST:PORT, got {text!r}")
    return host, int(port)


class Server:
    """The server under test: started here or given; memory and descriptors when its pid is known."""

    def __init__(
        self, host: str, ports: dict[str, int], pid: int | None, started: ServeProcess | None
    ) -> None:
        self.host, self.ports, self.pid, self.started = host, ports, pid, started

    def memory(self) -> dict[str, int] | None:
        return None if self.pid is None else memory_kib(self.pid)

    def fds(self) -> int | None:
        return None if self.pid is None else open_fds(self.pid)

    def target(self, protocol: str) -> str:
        return f"{protocol}://{self.host}:{self.ports[protocol]}"


def _per_connection(
    before: Mapping[str, int] | None, after: Mapping[str, int] | None, n: int
) -> float | None:
    if before is None or after is None or n <= 0:
        return None
    return round((after["VmRSS"] - before["VmRSS"]) / n, 3)


def open_crowd(
    server: Server, requests: Mapping[str, bytes], n_each: int, protocols: tuple[str, ...]
) -> tuple[IdleCrowd, dict[str, Any]]:
    """Start a crowd and open ``n_each`` connections of each protocol; their memory."""
    crowd = IdleCrowd(server.host, {p: server.ports[p] for p in PROTOCOLS}, requests)
    record: dict[str, Any] = {"rss_kib_before": server.memory(), "fds_before": server.fds()}
    try:
        for protocol in protocols:
            before = server.memory()
            started = time.monotonic()
            opened = crowd.open(protocol, n_each)
            after = server.memory()
            record[protocol] = {
                **opened,
                "open_s": round(time.monotonic() - started, 2),
                "rss_kib_after": after,
                "kib_per_connection": _per_connection(before, after, opened["opened"]),
            }
            if opened["failed"]:
                _progress(f"{protocol}: {opened['opened']} opened, failed {opened['failed']}")
    except BaseException:
        crowd.close()
        raise
    record["fds_with_crowd"] = server.fds()
    return crowd, record


def rounds_plan(rounds: int) -> list[tuple[int, str]]:
    """(round, condition) in the order run: without, with | with, without | ... (ABBA)."""
    order = []
    for r in range(rounds):
        pair = ("without", "with") if r % 2 == 0 else ("with", "without")
        order += [(r, c) for c in pair]
    return order


def measure(server: Server, inputs: Mapping[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    load = Load(rate_per_s=args.rate, duration_s=args.duration_s, warmup_s=args.warmup_s)
    requests = {"http": http_request(server.host, MODEL, inputs), "tcp": tcp_request(MODEL, inputs)}
    n_each = args.connections // len(PROTOCOLS)
    crowd: IdleCrowd | None = None
    openings: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    try:
        for r, condition in rounds_plan(args.rounds):
            if condition == "with" and crowd is None:
                _progress(f"round {r + 1}: opening {n_each} idle HTTP and {n_each} idle TCP connections")
                crowd, record = open_crowd(server, requests, n_each, PROTOCOLS)
                openings.append(record)
            if condition == "without" and crowd is not None:
                openings[-1]["check"] = _check(crowd)
                crowd.close()
                crowd = None
            for protocol in args.protocols:
                _progress(
                    f"round {r + 1}/{args.rounds}: {protocol} load at {args.rate:g}/s {condition} the crowd"
                )
                got = run(server.target(protocol), inputs, load)
                loads.append({"round": r, "condition": condition, "protocol": protocol, **got})
        if crowd is not None:
            openings[-1]["check"] = _check(crowd)
    finally:
        if crowd is not None:
            crowd.close()
    return {"load": load.describe(), "openings": openings, "loads": loads}


def _check(crowd: IdleCrowd) -> dict[str, Any]:
    _progress("every idle connection answers one more request")
    return crowd.check()


def summarize(measured: Mapping[str, Any], protocols: list[str]) -> dict[str, Any]:
    """Medians per protocol and condition, the ratios, memory per connection, drops."""
    out: dict[str, Any] = {"protocols": {}}
    for protocol in protocols:
        rows = {
            c: [x for x in measured["loads"] if x["protocol"] == protocol and x["condition"] == c]
            for c in ("without", "with")
        }
        fig: dict[str, Any] = {}
        for c, got in rows.items():
            fig[f"p50_us_{c}"] = statistics.median(x["latency_us"]["p50"] for x in got)
            fig[f"p99_us_{c}"] = statistics.median(x["latency_us"]["p99"] for x in got)
            fig[f"throughput_per_s_{c}"] = statistics.median(x["throughput_per_s"] for x in got)
            fig[f"errors_{c}"] = sum(x["counts"]["errors"] for x in got)
        fig["p99_ratio"] = round(fig["p99_us_with"] / fig["p99_us_without"], 3)
        by_round = {
            (x["round"], x["condition"]): x["latency_us"]["p99"] for x in rows["with"] + rows["without"]
        }
        fig["p99_ratio_per_round"] = [
            round(by_round[(r, "with")] / by_round[(r, "without")], 3)
            for r in sorted({r for r, _ in by_round})
        ]
        fig["within_bound"] = fig["p99_ratio"] <= BOUND
        out["protocols"][protocol] = fig
    first = measured["openings"][0] if measured["openings"] else {}
    out["kib_per_idle_connection"] = {p: first.get(p, {}).get("kib_per_connection") for p in PROTOCOLS}
    out["dropped"] = sum(
        o.get("check", {}).get(p, {}).get("dropped", 0) for o in measured["openings"] for p in PROTOCOLS
    )
    out["checked"] = sum(
        o.get("check", {}).get(p, {}).get("answered", 0) + o.get("check", {}).get(p, {}).get("dropped", 0)
        for o in measured["openings"]
        for p in PROTOCOLS
    )
    out["failed_to_open"] = sum(
        sum(o.get(p, {}).get("failed", {}).values()) for o in measured["openings"] for p in PROTOCOLS
    )
    out["bound"] = BOUND
    out["meets_bound"] = all(f["within_bound"] for f in out["protocols"].values()) and out["dropped"] == 0
    return out


def format_table(summary: Mapping[str, Any], uring: Mapping[str, Any] | None, n: int) -> str:
    lines = [f"connection density: {n} idle connections ({n // 2} HTTP + {n // 2} TCP)"]
    kib = summary["kib_per_idle_connection"]
    lines.append(
        "  server memory per idle connection: "
        + ", ".join(
            f"{p.upper()} {v:.2f} KiB" if v is not None else f"{p.upper()} n/a" for p, v in kib.items()
        )
    )
    lines.append(
        f"  dropped: {summary['dropped']} of {summary['checked']} checked; "
        f"failed to open: {summary['failed_to_open']}"
    )
    lines.append(
        f"  {'protocol':<9}{'p50 w/o':>9}{'p50 with':>10}{'p99 w/o':>9}{'p99 with':>10}{'ratio':>7}"
        f"{'req/s w/o':>11}{'req/s with':>12}"
    )
    for protocol, f in summary["protocols"].items():
        lines.append(
            f"  {protocol:<9}{f['p50_us_without']:>9.0f}{f['p50_us_with']:>10.0f}{f['p99_us_without']:>9.0f}"
            f"{f['p99_us_with']:>10.0f}{f['p99_ratio']:>7.2f}{f['throughput_per_s_without']:>11.0f}"
            f"{f['throughput_per_s_with']:>12.0f}  {'ok' if f['within_bound'] else 'MISS'} (bound {BOUND})"
        )
    lines.append("  (latencies in µs, medians over the rounds)")
    if uring is not None:
        lines.append(
            f"io_uring against uvloop: {uring['result']}"
            + (f" ({uring['reason']})" if "reason" in uring else "")
        )
        if uring["result"] == "measured":
            s = uring["summary"]
            lines.append(
                f"  {'loop':<9}{'KiB/conn':>9}{'p99 w/o':>9}{'p99 with':>10}{'closed-loop req/s':>19}"
                f"{'dropped':>9}"
            )
            for name in ("io_uring", "uvloop"):
                f = s[name]
                lines.append(
                    f"  {name:<9}{f['kib_per_connection']:>9.2f}{f['p99_us_without_crowd']:>9.0f}"
                    f"{f['p99_us_with_crowd']:>10.0f}{f['closed_loop_per_s']:>19.0f}{f['dropped']:>9}"
                )
    return "\n".join(lines)


def _server(args: argparse.Namespace) -> Server:
    if args.http is None:
        flags = ["--models", MODEL, "--grpc-port", "off", "--idle-timeout-s", str(args.idle_timeout_s)]
        started = start_serve(*flags, *args.serve_args.split())  # the last of a flag given twice wins
        return Server("127.0.0.1", dict(started.ports), started.proc.pid, started)
    (host, http_port), (_, tcp_port) = args.http, args.tcp
    return Server(host, {"http": http_port, "tcp": tcp_port}, args.server_pid, None)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__.split("\n\n", 2)[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--connections", type=int, default=10_000, help="idle connections, half HTTP half TCP (default 10000)"
    )
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds of without/with (default 6)")
    p.add_argument(
        "--rate", type=float, default=1000.0, help="open-loop requests/s of each load (default 1000)"
    )
    p.add_argument("--duration-s", type=float, default=5.0, help="measured seconds of each load (default 5)")
    p.add_argument("--warmup-s", type=float, default=1.0, help="seconds of load before measuring (default 1)")
    p.add_argument(
        "--protocols",
        nargs="+",
        choices=PROTOCOLS,
        default=list(PROTOCOLS),
        help="protocols of the load (default both)",
    )
    p.add_argument(
        "--idle-timeout-s",
        type=float,
        default=3600.0,
        help="the started server's --idle-timeout-s: longer than the run (default 3600)",
    )
    p.add_argument("--serve-args", default="", help="more flags for the started lumenrt serve, in one string")
    p.add_argument(
        "--http", type=_address, metavar="HOST:PORT", help="a running server's HTTP port (with --tcp)"
    )
    p.add_argument("--tcp", type=_address, metavar="HOST:PORT", help="a running server's TCP protocol port")
    p.add_argument("--server-pid", type=int, help="the running server's pid: its memory and descriptors")
    p.add_argument("--no-uring", action="store_true", help="leave out the io_uring comparison")
    p.add_argument(
        "--uring-rounds", type=int, default=2, help="rounds of the io_uring comparison (default 2)"
    )
    p.add_argument("--out", default="results", help="results folder (default results/)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if (args.http is None) != (args.tcp is None):
        print("connections.py: --http and --tcp go together", file=sys.stderr)
        return 2
    if args.connections < 2 or args.rounds < 1:
        print("connections.py: --connections must be at least 2 and --rounds at least 1", file=sys.stderr)
        return 2
    limit = raise_fd_limit()  # this process and its children: the load, the crowd
    _progress(f"this process: open-file limit {limit.before} -> {limit.after}")
    server = _server(args)
    try:
        metadata, config = fetch_model_info(f"{server.host}:{server.ports['http']}", MODEL, None)
        inputs = inputs_from_metadata(metadata, config)
        server_info: dict[str, Any] = {
            "started": server.started is not None,
            "pid": server.pid,
            "fd_limit": None if server.pid is None else fd_limit(server.pid),
            "fds_at_start": server.fds(),
            "rss_kib_at_start": server.memory(),
            "lifecycle": []
            if server.started is None
            else [x for x in server.started.lines if "open-file" in x],
        }
        measured = measure(server, inputs, args)
        server_info["fds_at_end"] = server.fds()
    finally:
        if server.started is not None:
            server.started.stop()
    summary = summarize(measured, args.protocols)
    uring = None
    if not args.no_uring:
        sys.path.insert(0, str(HERE / "uring"))  # its modules, beside this folder's
        import uring_compare

        uring_load = Load(rate_per_s=args.rate, duration_s=args.duration_s, warmup_s=args.warmup_s)
        uring = uring_compare.compare(args.connections, uring_load, args.uring_rounds, inputs, _progress)
    print(format_table(summary, uring, args.connections))
    payload = {
        "kind": "connections",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "commit": git_commit(),
        "config": vars(args),
        "server": server_info,
        "summary": summary,
        "measured": measured,
        "io_uring": uring,
    }
    path = write_result(args.out, "connections", payload)
    print(f"wrote {path}")
    return 0 if summary["meets_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
