"""``lumenrt bench load``: drive one model of a running server and write what it saw.

    lumenrt bench load --target http://127.0.0.1:8000 --model squeezenet --concurrency 4 --duration-s 10
    lumenrt bench load --target tcp://127.0.0.1:8003 --model digits_mlp --rate 2000 --arrival poisson
    lumenrt bench --target grpc://127.0.0.1:8001 --model digits_mlp --requests 5000

Inputs come from the model's metadata (fetched over KServe V2 HTTP: the target itself, or
``--metadata-url``; for a TCP target the default is the same host's port 8000) or from
``--input-file``. Writes ``load-<stamp>.json`` (summary) and ``load-<stamp>.csv`` (one row per
request) into ``--out``; docs/bench-results.md describes both.
"""

import argparse
import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumenrt.bench.load_inputs import inputs_from_file, inputs_from_metadata, payload_bytes
from lumenrt.bench.load_run import LoadPlan, Records, Window, run_load
from lumenrt.bench.load_stats import summarize, write_csv
from lumenrt.bench.load_targets import Credentials, MetadataRefused, fetch_model_info, parse_target
from lumenrt.bench.results import git_commit, machine_info, new_result_path, write_json

_PROGRESS_EVERY_S = 0.25
_BAR_WIDTH = 28


@dataclass
class LoadOutcome:
    summary: dict[str, Any]
    json_path: Path
    csv_path: Path


def _metadata_base(args: argparse.Namespace) -> str | None:
    url = parse_target(args.target)
    if args.metadata_url:
        return str(args.metadata_url).removeprefix("http://").rstrip("/")
    if url.protocol in ("http", "http-json"):
        return f"{url.host}:{url.port}"
    if url.protocol == "tcp":
        return f"{url.host}:8000"
    return None


def prepare_inputs(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any, str]:
    """(inputs, metadata, config, where the inputs came from); ValueError/ConnectionError explain."""
    base = _metadata_base(args)
    metadata = config = None
    if base is not None:
        try:
            metadata, config = fetch_model_info(base, args.model, args.model_version, credentials(args))
        except (ConnectionError, MetadataRefused):
            if not args.input_file:
                raise
    if args.input_file:
        return inputs_from_file(args.input_file, metadata), metadata, config, f"file:{args.input_file}"
    if metadata is None:
        raise ValueError(
            f"no model metadata for a {parse_target(args.target).protocol} target: give "
            "--input-file or --metadata-url"
        )
    return inputs_from_metadata(metadata, config, args.batch), metadata, config, "metadata"


class Progress:
    """A progress bar on stderr (when it is a terminal, or when forced), fed by the shared counters."""

    def __init__(self, plan: LoadPlan, counters: Any, started_ns: Any, enabled: bool) -> None:
        self.plan, self.counters, self.started_ns, self.enabled = plan, counters, started_ns, enabled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lumenrt-load-progress", daemon=True)

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            self._draw(final=True)
            sys.stderr.write("\n")

    def _loop(self) -> None:
        while not self._stop.wait(_PROGRESS_EVERY_S):
            self._draw()

    def _draw(self, final: bool = False) -> None:
        done = sum(self.counters[:])
        if not self.started_ns.value:
            sys.stderr.write("\rconnecting ...")
            sys.stderr.flush()
            return
        elapsed = max(time.monotonic_ns() - self.started_ns.value, 0) / 1e9
        measured = max(elapsed - self.plan.warmup_s, 0.0)
        if self.plan.duration_s is not None:
            fraction = min(measured / self.plan.duration_s, 1.0)
        else:
            fraction = min(done / (self.plan.requests or 1), 1.0)
        if final:
            fraction = 1.0
        filled = int(fraction * _BAR_WIDTH)
        phase = "warm-up" if elapsed < self.plan.warmup_s and not final else f"{fraction:4.0%}"
        rate = done / measured if measured > 0 else 0.0
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {phase} {elapsed:6.1f}s "
            f"{done} answered {rate:8.1f}/s "
        )
        sys.stderr.flush()


def run_plan(
    plan: LoadPlan,
    *,
    out_dir: str | Path,
    name: str,
    server: Mapping[str, Any],
    load_extra: Mapping[str, Any],
    progress: bool = False,
) -> LoadOutcome:
    """Run ``plan``, summarize it and write the JSON + CSV pair; the summary and paths."""
    counters = multiprocessing.RawArray("q", plan.processes)
    started_ns = multiprocessing.RawValue("q", 0)
    with Progress(plan, counters, started_ns, progress):
        records, window = run_load(plan, counters, started_ns)
    return write_outcome(
        records, window, plan, out_dir=out_dir, name=name, server=server, load_extra=load_extra
    )


def write_outcome(
    records: Records,
    window: Window,
    plan: LoadPlan,
    *,
    out_dir: str | Path,
    name: str,
    server: Mapping[str, Any],
    load_extra: Mapping[str, Any],
) -> LoadOutcome:
    columns = records.arrays()
    figures = summarize(columns, window)
    figures["load_cpu"] = load_cpu(records.cpu_ns, figures)
    summary: dict[str, Any] = {
        "kind": "load",
        "name": name,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "commit": git_commit(),
        "server": dict(server),
        "load": {
            "mode": plan.mode,
            "concurrency": plan.concurrency if plan.mode == "closed" else None,
            "rate_per_s": plan.rate_per_s if plan.mode == "open" else None,
            "arrival": plan.arrival if plan.mode == "open" else None,
            "warmup_s": plan.warmup_s,
            "duration_s": plan.duration_s,
            "requests": plan.requests,
            "processes": plan.processes,
            "connections": plan.connections,
            "timeout_s": plan.timeout_s,
            "stages": plan.stages,
            **load_extra,
        },
        **figures,
    }
    json_path = new_result_path(out_dir, "load")
    csv_path = json_path.with_suffix(".csv")
    summary["csv"] = csv_path.name
    write_csv(csv_path, columns, window)
    write_json(json_path, summary)  # after the CSV: a summary never names a CSV that is not there
    return LoadOutcome(summary, json_path, csv_path)


def load_cpu(cpu_ns: list[int], figures: Mapping[str, Any]) -> dict[str, float] | None:
    """The load generator's own CPU time over the measured window (all its processes): seconds,
    CPUs' worth (seconds per second of the window) and microseconds per answered request. On a
    machine it shares with the server, this is CPU the server did not have."""
    if not cpu_ns:
        return None
    cpu_s = sum(cpu_ns) / 1e9
    ok = figures["counts"]["ok"]
    return {
        "cpu_s": round(cpu_s, 6),  # to the µs: us_per_request is derived from it
        "cpus": round(cpu_s / figures["elapsed_s"], 3),
        "us_per_request": round(cpu_s * 1e6 / ok, 1) if ok else None,
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    counts = summary["counts"]
    lines = [
        f"{summary['name']}: {summary['server']['target']} model {summary['server']['model']}",
        f"  sent {counts['sent']}  ok {counts['ok']}  errors {counts['errors']}"
        + (f" {counts['errors_by_kind']}" if counts["errors"] else ""),
        f"  throughput {summary['throughput_per_s']:.1f}/s over {summary['elapsed_s']:.2f} s",
    ]
    lat = summary["latency_us"]
    if lat:
        cells = "  ".join(f"{k} {lat[k]:.0f}" for k in ("p50", "p90", "p95", "p99", "p99.9", "max"))
        lines.append(f"  latency µs: {cells}  (mean {lat['mean']:.0f})")
    stages = summary.get("stages_us")
    if stages:
        parts = [f"{k} {v['mean']:.0f}" for k, v in stages.items() if isinstance(v, dict)]
        lines.append(
            f"  server stages, mean µs: {'  '.join(parts)}  batch size {stages.get('batch_size_mean')}"
        )
    cpu = summary.get("load_cpu")
    if cpu and cpu["us_per_request"] is not None:
        lines.append(
            f"  load generator CPU: {cpu['us_per_request']:.0f} µs a request ({cpu['cpus']:.2f} CPUs)"
        )
    return "\n".join(lines)


def architecture(config: Mapping[str, Any] | None) -> dict[str, str] | None:
    """lumenrt's engine architecture from its model config's ``lumenrt_*`` parameters (queue type,
    allocator, worker mode, spin, pinning); None for a server that does not say (another server)."""
    params = (config or {}).get("parameters") or {}
    found = {
        k.removeprefix("lumenrt_"): str(v.get("string_value"))
        for k, v in params.items()
        if k.startswith("lumenrt_") and isinstance(v, dict)
    }
    return found or None


def _default_name(args: argparse.Namespace) -> str:
    protocol = parse_target(args.target).protocol
    load = f"c{args.concurrency}" if args.rate is None else f"r{args.rate:g}"
    return f"{protocol} {args.model} {load}"


def _labels(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--server-label {pair!r}: write KEY=VALUE")
        out[key] = value
    return out


def plan_from_args(args: argparse.Namespace, inputs: Mapping[str, Any]) -> LoadPlan:
    return LoadPlan(
        target=args.target,
        model=args.model,
        inputs=inputs,
        version=args.model_version,
        mode="closed" if args.rate is None else "open",
        concurrency=args.concurrency,
        rate_per_s=args.rate or 0.0,
        arrival=args.arrival,
        warmup_s=args.warmup_s,
        duration_s=None if args.requests is not None else args.duration_s,
        requests=args.requests,
        connections=args.connections,
        timeout_s=args.timeout_s,
        stages=not args.no_stages,
        processes=args.processes,
        seed=args.seed,
        credentials=credentials(args),
    )


def credentials(args: argparse.Namespace) -> Credentials:
    """The API key (from the environment variable --api-key-env names) and TLS files."""
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise ValueError(
                f"--api-key-env {args.api_key_env}: that environment variable is not set or empty"
            )
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together: give both")
    return Credentials(key, args.tls_ca, args.tls_cert, args.tls_key)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        required=True,
        help="tcp://H:P, http://H:P (V2 binary), http-json://H:P, http-raw://H:P/PATH (raw body), grpc://H:P (lumenrt's gRPC client), grpcio://H:P (grpcio's)",
    )
    p.add_argument("--model", required=True, help="model name")
    sec = p.add_argument_group("a secured server (README: Securing a deployment)")
    sec.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="send the API key held by this environment variable (the key never goes on the command line)",
    )
    sec.add_argument(
        "--tls-ca", metavar="FILE", help="TLS: the CA file that the server's certificate chains to"
    )
    sec.add_argument("--tls-cert", metavar="FILE", help="mTLS: this client's certificate (PEM)")
    sec.add_argument("--tls-key", metavar="FILE", help="mTLS: its private key (PEM)")
    p.add_argument("--model-version", default=None, help="model version (default: the server's choice)")
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", type=int, default=1, help="closed loop: concurrent clients (default 1)"
    )
    load.add_argument("--rate", type=float, default=None, help="open loop: requests per second offered")
    p.add_argument(
        "--arrival",
        choices=["constant", "poisson"],
        default="constant",
        help="open loop arrivals (default constant)",
    )
    p.add_argument(
        "--duration-s", type=float, default=10.0, help="measured seconds after warm-up (default 10)"
    )
    p.add_argument(
        "--requests", type=int, default=None, help="measure this many requests instead of a duration"
    )
    p.add_argument("--warmup-s", type=float, default=2.0, help="seconds of load before measuring (default 2)")
    p.add_argument(
        "--processes", type=int, default=1, help="load processes (default 1; use 2+ for tiny models)"
    )
    p.add_argument(
        "--connections",
        type=int,
        default=None,
        help="connections per run (default: one per client in closed loop, 16 in open loop)",
    )
    p.add_argument(
        "--timeout-s", type=float, default=30.0, help="per-request time limit (default 30; 0 = none)"
    )
    p.add_argument("--input-file", default=None, help=".npy (one input) or .npz (one array per input name)")
    p.add_argument(
        "--batch", type=int, default=1, help="rows per request when inputs come from metadata (default 1)"
    )
    p.add_argument(
        "--metadata-url",
        default=None,
        help="KServe V2 HTTP server to read the model metadata from "
        "(default: the target when it is HTTP; for tcp://H:P, http://H:8000)",
    )
    p.add_argument("--no-stages", action="store_true", help="do not ask the server for its stage times")
    p.add_argument("--name", default=None, help="label of this run in tables and the dashboard")
    p.add_argument(
        "--server-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recorded in the summary's server.label (repeatable), e.g. queue_type=mpmc",
    )
    p.add_argument("--seed", type=int, default=1, help="Poisson arrival seed (default 1)")
    p.add_argument("--out", default="results", help="results folder (default results/)")
    p.add_argument(
        "--progress", action="store_true", help="draw the progress bar even when stderr is not a terminal"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary JSON instead of the table")


def run_from_args(args: argparse.Namespace) -> int:
    try:
        url = parse_target(args.target)
        inputs, metadata, config, source = prepare_inputs(args)
        plan = plan_from_args(args, inputs)
        labels = _labels(args.server_label)
    except (ValueError, ConnectionError) as exc:
        print(f"lumenrt bench load: {exc}", file=sys.stderr)
        return 2
    server = {
        "target": url.url,
        "protocol": url.protocol,
        "model": args.model,
        "version": args.model_version,
        "architecture": architecture(config),
        "metadata": metadata,
        "config": config,
        "label": labels,
    }
    extra = {"inputs": source, "input_bytes": payload_bytes(inputs)}
    show = not args.quiet and (args.progress or sys.stderr.isatty())
    try:
        outcome = run_plan(
            plan,
            out_dir=args.out,
            name=args.name or _default_name(args),
            server=server,
            load_extra=extra,
            progress=show,
        )
    except ValueError as exc:
        print(f"lumenrt bench load: {exc}", file=sys.stderr)
        return 2
    except (ConnectionError, OSError, RuntimeError) as exc:
        print(f"lumenrt bench load: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(outcome.summary, default=str))
    else:
        print(format_summary(outcome.summary))
    print(
        f"wrote {outcome.json_path} and {outcome.csv_path.name}", file=sys.stderr if args.json else sys.stdout
    )
    return 0
