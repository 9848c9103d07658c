"""``lumenrt serve``: load a repository, listen on HTTP, gRPC and TCP, stop cleanly on a signal.

Shutdown on SIGINT or SIGTERM (see ``ServerApp``): readiness turns false; new requests are still
served for ``--drain-delay-s`` (default 0: behind a load balancer, longer than its readiness check
interval), then refused (503); no worker process is replaced any more, requests in flight finish
within ``--grace-s``, then the engine stops its workers and the process exits 0. A second signal
skips the rest of the drain delay and of the grace period.

Other exits: process-mode workers share only unnamed memory with the server (nothing in /dev/shm)
and die with it (parent-death signal), so even SIGKILL of the server leaves no process and no
segment. Segments of older versions or of the demo whose owner died are swept at start.
"""

import argparse
import asyncio
import logging
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from lumenrt.ingress.service import GRPC_SERVERS, ServeLimits
from lumenrt.ingress.shared_memory import key_prefix
from lumenrt.observability.logging import say

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "tcp": 8003}
# Workers of `lumenrt serve` sleep at once when idle, unlike the in-process engine's 50 us poll: the
# server's event loop is one more busy thread, and on a 2-core machine a polling worker takes the core
# the loop needs. digits_mlp over TCP (`lumenrt bench load`, 1 instance), requests/s (p99 ms):
# concurrency 2: 5,533 (0.58) at 0 us vs 3,983 (0.82) at 50 us; concurrency 4: 8,832 (0.93) vs
# 6,385 (1.35); concurrency 8: 14,135 (1.18) vs 8,266 (2.12); concurrency 1 alike (3.1k/s).
SERVE_SPIN_US = 0
# The server runs small models inline on its event loop (engine/lane.py); the in-process Engine
# keeps "queue" unless told, since its callers may be many threads.
SERVE_LANE = "auto"


# Busy threads of the front ends, for the placement plan: the event loop (HTTP, TCP, the inline
# lane's models). gRPC's completion-queue threads and the access log's writer mostly wait.
INGRESS_THREADS = 1


def _place_ingress(engine: Any) -> None:
    """Pin the event loop's thread (this one) where the plan put the ingress. (The plan's
    warnings were logged by the engine: a plan that shrinks or shares says so at every start.)"""
    import os

    plan = engine.plan
    if plan is None:
        return
    if plan.ingress_cpus and engine.settings.pin:
        os.sched_setaffinity(0, plan.ingress_cpus)  # threads started from here on inherit it


def _port(text: str) -> int | None:
    if text in ("off", "none"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be 0..65535 or 'off', got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535 or 'off', got {text!r}")
    return value


def _shm_prefix(text: str) -> str:
    try:
        return key_prefix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size_bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes >= 0, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (
        "examples:\n"
        "  lumenrt serve                                  built-in models on 127.0.0.1:8000/8001/8003\n"
        "  lumenrt serve --repository ./models --mode process --workers 2\n"
        "  lumenrt serve --http-port 0 --grpc-port off    any free HTTP port, no gRPC\n"
        "\nOn SIGINT/SIGTERM: readiness false, new requests refused (503), no worker replaced, in-flight\n"
        "requests finish within --grace-s, workers stop, exit 0. On SIGKILL, process-mode workers die\n"
        "with the server and nothing is left in /dev/shm.\n"
        "\n--config file, section 'server': any flag above by its name with '_' for '-' (http_port: 0,\n"
        "  no_pin: true, access_log: '-'); the command line overrides it, and it overrides 'engine'.\n"
        "Environment: the per-deployment flags as LUMENRT_<NAME> (LUMENRT_HOST, LUMENRT_HTTP_PORT, _GRPC_PORT,\n"
        "  _TCP_PORT, _METRICS_PORT, _REPOSITORY, _MODEL_DIR, _MODEL_NAME, _MODELS, _LOG_LEVEL, _LOG_FORMAT,\n"
        "  _GRACE_S, _DRAIN_DELAY_S), read as the command line reads them: below it, above --config.\n"
        "\n--config file keys (section 'engine'; the flags above override them):\n"
        "  queue_type        mpmc | spsc (one worker) | naive | batched             (--queue-type)\n"
        "  allocator_type    lumen_arena | standard (thread mode only)              (--allocator)\n"
        "  thread_count      workers per every model version, placed round-robin; 0 = planned (--workers)\n"
        "  batch_size        cap on rows per batch for every model; 0 = no cap      (--batch-size)\n"
        "  worker_mode       thread | process                                       (--mode)\n"
        "  pin               pin workers to their planned cores, memory to their node (--no-pin)\n"
        "  cores             the cores workers are placed on (default: all usable)\n"
        "  placement         spread | pack | node:N | roundrobin (default: spread, or roundrobin\n"
        "                    when thread_count is given): see `lumenrt topology --plan` (--placement)\n"
        "  placement_strict  refuse a plan that must shrink or share CPUs            (--placement-strict)\n"
        "  memory_binding    bind (a pinned worker's memory policy: its node) | first_touch (--memory-binding)\n"
        "  host_policies     Triton's: {name: {numa-node: 0, cpu-cores: '0-3'}} for instance_group.host_policy\n"
        "  arena_slot_bytes  thread mode: input arena slot size (default 1 MiB)\n"
        "  arena_slots       arena slots per model version (default 256)\n"
        "  large_arena_bytes GPU models: slots of max_batch_size rows, up to this much (default 1 GiB)\n"
        "  spin_us           poll this long before sleeping                         (--spin-us)\n"
        "  loop_spin_us      the event loop polls this long after a request or answer (--loop-spin-us)\n"
        "  lane              queue | inline | auto: small models run on the ingress thread (--lane)\n"
        "  lane_max_us       auto: largest batch-1 compute run inline (default 30)\n"
        "  lane_turn_us      inline compute per event-loop turn before the rest go to the workers\n"
        "                    (default 1000; 0: one request a turn)\n"
        "  batching          fixed | adaptive: CPU batches capped at the size cheapest per row (--batching)"
    )
    where = p.add_argument_group("where to listen")
    where.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    for name, port in DEFAULT_PORTS.items():
        where.add_argument(
            f"--{name}-port",
            type=_port,
            default=port,
            metavar="PORT",
            help=f"{name.upper()} port (default {port}; 0 = any free port; 'off' = no {name.upper()} server)",
        )
    where.add_argument(
        "--grpc-server",
        choices=GRPC_SERVERS,
        default="h2",
        help="who serves gRPC: h2 = lumenrt's own HTTP/2 server (default; ModelInfer on the request "
        "path HTTP takes), grpcio = grpc.aio (the grpc library's server)",
    )
    what = p.add_argument_group("what to serve")
    what.add_argument(
        "--repository",
        type=Path,
        help="model repository folder (<repo>/<model>/config.yaml + <repo>/<model>/<version>/...); "
        "default: the built-in models (squeezenet, digits_mlp, tabular_xgb), built on first use; their INT8 "
        "variants (digits_mlp_int8, squeezenet_int8) only when named in --models (built on first use too)",
    )
    what.add_argument(
        "--model-dir",
        type=Path,
        metavar="DIR",
        help="what a platform mounts (KServe: /mnt/models): a repository, or one model's folder (model.onnx, "
        "model.json|ubj|bst, model.pt|pt2 or model.py, with or without a config.yaml) served as --model-name",
    )
    what.add_argument(
        "--model-name",
        metavar="NAME",
        help="--model-dir with one model's files: its name (default: the folder's)",
    )
    what.add_argument("--models", nargs="+", metavar="NAME", help="load only these models (default: all)")
    what.add_argument(
        "--cache-size-bytes",
        type=_size_bytes,
        default=0,
        metavar="N",
        help="response cache budget shared by the models whose config says response_cache: {enable: true} "
        "(least recently used answers are evicted past it); default 0 = no cache, even for those models",
    )
    obs = p.add_argument_group("metrics (Prometheus: GET /metrics on the HTTP port)")
    obs.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="also serve the metrics on this port, alone (as Triton's 8002; 0 = any free port); "
        "default: only on the HTTP port",
    )
    obs.add_argument("--no-metrics", action="store_true", help="no metrics: GET /metrics answers 404")
    eng = p.add_argument_group("engine (override the --config file's engine section)")
    eng.add_argument(
        "--config",
        type=Path,
        help="server config file (lumenrt.json / .yaml: an 'engine' section, and a 'server' section with any "
        "of these flags)",
    )
    eng.add_argument("--workers", type=int, help="workers per model version (default: one per core)")
    eng.add_argument("--mode", choices=("thread", "process"), help="worker threads or worker processes")
    eng.add_argument("--queue-type", choices=("mpmc", "spsc", "naive", "batched"), help="request ring kind")
    eng.add_argument(
        "--allocator",
        choices=("lumen_arena", "standard"),
        help="where request tensors live: a pre-allocated arena slot, or a fresh numpy array per request "
        "(thread mode only: process workers always use the shared arena)",
    )
    eng.add_argument(
        "--batch-size",
        type=int,
        help="cap on rows per batch for every model: lowers each model's max_batch_size to it (requests "
        "with more rows are refused with 400); default 0 = each model's own max_batch_size",
    )
    eng.add_argument(
        "--spin-us",
        type=int,
        help=f"poll this long before sleeping (default {SERVE_SPIN_US}: the event loop already keeps a core busy)",
    )
    eng.add_argument(
        "--loop-spin-us",
        type=int,
        help="after each request and each answer from the workers, the event loop polls its "
        "sockets this long (µs) instead of sleeping, so that a client's next request is read "
        "without waking it (lower latency at a few clients, a CPU kept busy meanwhile; default 0: "
        "sleep at once)",
    )
    eng.add_argument(
        "--lane",
        choices=("queue", "inline", "auto"),
        help=f"the inline lane (default {SERVE_LANE}): 'auto' runs a model whose batch-1 compute is "
        "at most lane_max_us on the thread that received the request whenever its queue is empty; "
        "'inline' does so for every model; 'queue' hands every request to the workers",
    )
    eng.add_argument(
        "--batching",
        choices=("fixed", "adaptive"),
        help="dynamic batching on CPU workers (default adaptive): 'fixed' forms batches as "
        "each model's config says; 'adaptive' does the same, but no larger than the batch size whose "
        "time per row the worker measured lowest (larger and smaller sizes are tried now and then)",
    )
    eng.add_argument("--no-pin", action="store_true", help="do not pin workers to cores")
    eng.add_argument(
        "--placement",
        metavar="POLICY",
        help="spread (instances dealt over NUMA nodes), pack (node 0 first), node:N, or roundrobin "
        "(every model on every core, no budget: the placement before planning)",
    )
    eng.add_argument(
        "--memory-binding",
        choices=("bind", "first_touch"),
        help="bind: a pinned worker's memory policy is its planned node (set_mempolicy); first_touch: "
        "pinning only, pages land where the pinned worker first touches them (default bind)",
    )
    eng.add_argument(
        "--placement-strict",
        action="store_true",
        default=None,
        help="refuse to start when the models need more busy threads than usable CPUs, instead of "
        "shrinking or sharing with a warning",
    )
    lim = p.add_argument_group("limits")
    d = ServeLimits()
    lim.add_argument(
        "--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body/frame"
    )
    lim.add_argument("--max-elements", type=int, default=d.max_elements, help="most elements in one tensor")
    lim.add_argument(
        "--receive-timeout-s",
        type=float,
        default=d.receive_timeout_s,
        help="a started request must arrive whole within this (slow clients are cut off)",
    )
    lim.add_argument(
        "--idle-timeout-s", type=float, default=d.idle_timeout_s, help="close connections idle this long"
    )
    lim.add_argument(
        "--grace-s", type=float, default=d.grace_s, help="shutdown: time in-flight requests get to finish"
    )
    lim.add_argument(
        "--drain-delay-s",
        type=float,
        default=d.drain_delay_s,
        help="shutdown: readiness turns false at once, but new requests are still served this long, so "
        "that a load balancer polling /v2/health/ready stops sending before any is refused (default "
        f"{d.drain_delay_s:g}: refused at once; behind a balancer, more than its check interval)",
    )
    lim.add_argument(
        "--max-connections-per-client",
        type=int,
        default=d.max_connections_per_client,
        metavar="N",
        help=f"open connections from one address, per front end (default {d.max_connections_per_client}; "
        "0 = no limit); past it a new connection gets 429 and is closed",
    )
    tls = p.add_argument_group(
        "TLS (README: Securing a deployment)",
        "One certificate for HTTP, gRPC and TCP (and --metrics-port). SIGHUP, or a change to the files, loads "
        "them again: new connections get the new certificate, open ones go on.",
    )
    tls.add_argument("--tls-cert", type=Path, metavar="FILE", help="PEM certificate chain (turns TLS on)")
    tls.add_argument("--tls-key", type=Path, metavar="FILE", help="PEM private key of --tls-cert")
    tls.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="FILE",
        help="PEM CA certificate(s): clients must present a certificate signed by one (mTLS)",
    )
    from lumenrt.ingress.auth import DEFAULT_KEY_HEADER, DEFAULT_OPEN_GROUPS, GROUPS, KEYS_ENV

    auth = p.add_argument_group(
        "authentication and rate limits (README: Securing a deployment)",
        "SIGHUP, or a change to the key file, reloads the keys (and the TLS certificates) without a restart.",
    )
    auth.add_argument(
        "--api-keys",
        type=Path,
        metavar="FILE",
        help="API keys file (YAML/JSON: keys: [{name, key | sha256, groups}]); or put the same document in "
        f"${KEYS_ENV} (keys never go on the command line). With keys, every endpoint group but the open "
        "ones needs a key: HTTP 'Authorization: Bearer <key>', gRPC the same metadata, TCP an AUTH frame",
    )
    auth.add_argument(
        "--open-groups",
        nargs="+",
        choices=(*GROUPS, "none"),
        default=list(DEFAULT_OPEN_GROUPS),
        metavar="GROUP",
        help=f"endpoint groups that need no key when keys are on (default: {' '.join(DEFAULT_OPEN_GROUPS)}; "
        f"'none': every group needs one); groups: {', '.join(GROUPS)}",
    )
    auth.add_argument(
        "--api-key-header",
        default=DEFAULT_KEY_HEADER,
        metavar="NAME",
        help=f"a header (and gRPC metadata key) that may carry the key instead of Authorization (Triton's "
        f"restricted-API form, '<NAME>: <key>'; default {DEFAULT_KEY_HEADER})",
    )
    auth.add_argument(
        "--rate-limit",
        type=float,
        metavar="PER_S",
        help="inference requests per second per client (its key's name, or its address without keys), "
        "all models together, burst = one second's worth; over it: 429 + Retry-After. The --config "
        "file's rate_limits section sets per-model and per-key limits",
    )
    shm = p.add_argument_group(
        "system shared memory (Triton's extension: clients on this host send region names, not bytes)"
    )
    shm.add_argument(
        "--allow-client-shm",
        action="store_true",
        default=False,
        help="serve /v2/systemsharedmemory and the SystemSharedMemory rpcs, and take inputs from and write "
        "outputs to the regions clients register (off by default: for trusted clients on this host; with "
        "API keys it is the shared-memory endpoint group)",
    )
    shm.add_argument(
        "--max-shm-regions-per-client",
        type=int,
        default=64,
        metavar="N",
        help="registered regions one client (API key, else address) may hold (default 64)",
    )
    shm.add_argument(
        "--client-shm-prefix",
        type=_shm_prefix,
        default="",
        metavar="PREFIX",
        help="register only objects whose names start with PREFIX (a leading '/' is ignored), e.g. a "
        "prefix your clients share; default: any name. Objects named lumenrt.* (lumenrt's own segments) "
        "are refused whatever the prefix. Needs --allow-client-shm",
    )
    from lumenrt.observability.logging import DEFAULT_LOG_LEVEL, LOG_FORMATS, LOG_LEVELS

    logs = p.add_argument_group("logs and traces")
    logs.add_argument(
        "--log-level", choices=LOG_LEVELS, default=DEFAULT_LOG_LEVEL, help="the server's log (stderr)"
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text: log lines on stderr, lifecycle lines plain on stdout; json: one JSON object per "
        "line on stdout for both (for a container platform's log collector)",
    )
    logs.add_argument(
        "--access-log",
        metavar="PATH",
        help="one JSON line per request (id, model, status, stage times in us) appended to PATH; "
        "'-' = stderr; written by a thread of its own, off the request path (default: none)",
    )
    logs.add_argument(
        "--trace",
        metavar="URL",
        help="OpenTelemetry spans per request (queue, batch, compute, return) sent over OTLP/HTTP to URL, "
        "e.g. http://127.0.0.1:4318/v1/traces (needs the 'trace' extra; default: none)",
    )
    from lumenrt.ingress.serve_config import defer_defaults

    defer_defaults(p)  # keep last: the config file's server section takes every flag added above


def run_from_args(args: argparse.Namespace) -> int:
    from lumenrt.engine.config import ConfigError
    from lumenrt.engine.server_config import load_engine_config
    from lumenrt.ingress.serve_config import apply_server_section
    from lumenrt.observability.logging import redacted, setup_logging

    try:
        origin = apply_server_section(args)
    except (ConfigError, OSError) as exc:
        print(f"lumenrt serve: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, log_format=args.log_format)
    if origin:
        given = {k: getattr(args, k) for k, where in origin.items() if where != "default"}
        source = f"the command line and {args.config}" if args.config is not None else "the command line"
        logger.debug("settings given (from %s): %s", source, redacted(given))
    try:
        settings = load_engine_config(
            args.config,
            {
                "thread_count": args.workers,
                "worker_mode": args.mode,
                "queue_type": args.queue_type,
                "allocator_type": args.allocator,
                "batch_size": args.batch_size,
                "spin_us": args.spin_us,
                "loop_spin_us": args.loop_spin_us,
                "lane": args.lane,
                "batching": args.batching,
                "pin": False if args.no_pin else None,
                "placement": args.placement,
                "placement_strict": args.placement_strict,
                "memory_binding": args.memory_binding,
            },
            defaults={"spin_us": SERVE_SPIN_US, "lane": SERVE_LANE},
        )
        limits = ServeLimits(
            max_body_bytes=args.max_body_bytes,
            max_elements=args.max_elements,
            receive_timeout_s=args.receive_timeout_s,
            idle_timeout_s=args.idle_timeout_s,
            grace_s=args.grace_s,
            drain_delay_s=args.drain_delay_s,
            max_connections_per_client=args.max_connections_per_client,
        )
    except (ConfigError, OSError) as exc:
        say(f"lumenrt serve: {exc}", error=True)
        return 2
    if args.no_metrics and args.metrics_port is not None:
        say("lumenrt serve: --metrics-port and --no-metrics contradict each other: give one", error=True)
        return 2
    try:
        security = _security(args)
    except (ConfigError, ValueError, OSError) as exc:
        say(f"lumenrt serve: {exc}", error=True)
        return 2
    try:
        access = _open_access_log(args.access_log, args.trace)
    except OSError as exc:
        say(f"lumenrt serve: --access-log {args.access_log}: {exc}", error=True)
        return 2
    try:
        links = _model_dir(args)
    except ConfigError as exc:
        say(f"lumenrt serve: {exc}", error=True)
        if access is not None:
            access.close()
        return 2
    _raise_fd_limit(limits)  # the flags are good: the server starts
    _report_cpu_idle()
    from lumenrt.ingress.app import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(_serve(args, settings, limits, access, security))
    finally:
        loop.close()
        if access is not None:  # after the loop: every answer has been recorded
            access.close()
        if links is not None:
            shutil.rmtree(links, ignore_errors=True)


def _raise_fd_limit(limits: ServeLimits) -> None:
    """A descriptor per connection: the soft open-file limit up to the hard one (fd_limit.py)."""
    from lumenrt.ingress.fd_limit import describe, raise_fd_limit

    line, warning = describe(raise_fd_limit(), limits.max_connections_per_client)
    say(f"lumenrt serve: {line}")
    if warning is not None:
        logger.warning("%s", warning)


def _report_cpu_idle() -> None:
    """A note when idle CPUs halt at once (placement/cpu_idle.py): low-load latency pays for it."""
    from lumenrt.placement.cpu_idle import halts_at_once, read_cpu_idle

    note = halts_at_once(read_cpu_idle())
    if note is not None:
        say(f"lumenrt serve: note: {note}")


def _model_dir(args: argparse.Namespace) -> Path | None:
    """``--model-dir``: sets ``args.repository`` (engine/model_dir.py); returns the temporary folder
    of links it made, if any, for the caller to remove."""
    from lumenrt.engine.config import ConfigError
    from lumenrt.engine.model_dir import repository_for

    if args.model_dir is None:
        if args.model_name is not None:
            raise ConfigError("--model-name", "", "names the model of --model-dir: give --model-dir too")
        return None
    if args.repository is not None:
        raise ConfigError("--model-dir", "", "give --model-dir or --repository, not both")
    work = Path(tempfile.mkdtemp(prefix="lumenrt-model-dir-"))
    try:
        args.repository = repository_for(args.model_dir, args.model_name, work)  # a ModelRepository
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if args.repository.root != work:  # a repository, served as it is
        shutil.rmtree(work, ignore_errors=True)
        return None
    return work


def _security(args: argparse.Namespace) -> dict[str, Any]:
    """ServeOptions' ``tls``, ``auth`` and ``rate_limits``, from the flags and the config file;
    raises ConfigError / KeyFileError / TlsError (ValueErrors) naming the flag or field."""
    from lumenrt.engine.config import check_keys, read_config_file
    from lumenrt.engine.server_config import SECTIONS
    from lumenrt.ingress.auth import Gate, key_source
    from lumenrt.ingress.rate_limit import SECTION, Rate, RateLimits, parse_rate_limits
    from lumenrt.ingress.tls import TlsFiles, server_context

    out: dict[str, Any] = {"auth": None, "rate_limits": None, "tls": None}
    for flag in ("grace_s", "drain_delay_s"):
        value = getattr(args, flag)
        if not value >= 0:  # NaN too
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0 seconds, got {value}")
    if args.max_connections_per_client < 0:
        raise ValueError(
            f"--max-connections-per-client must be >= 0 (0: no limit), got {args.max_connections_per_client}"
        )
    if args.max_shm_regions_per_client < 1:
        raise ValueError(f"--max-shm-regions-per-client must be >= 1, got {args.max_shm_regions_per_client}")
    if args.client_shm_prefix and not args.allow_client_shm:
        raise ValueError(
            "--client-shm-prefix has no effect without --allow-client-shm: give both (or neither)"
        )
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together: give both (or neither, for clear text)")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise ValueError("--tls-client-ca needs TLS: give --tls-cert and --tls-key too")
    if args.tls_cert is not None:
        out["tls"] = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
        server_context(out["tls"])  # raises TlsError naming the flag and file, before models load
    source = key_source(args.api_keys)
    open_groups = [] if "none" in args.open_groups else args.open_groups
    if source is not None:
        out["auth"] = Gate(source, open_groups, args.api_key_header)
        if args.metrics_port is not None and "metrics" not in open_groups:
            raise ValueError(
                "--metrics-port serves the metrics without a key check: with API keys, scrape GET /metrics "
                "on the HTTP port with a key, or open the group (--open-groups health metrics)"
            )
    limits = RateLimits()
    if args.config is not None:
        raw = check_keys(read_config_file(args.config), SECTIONS, args.config, "")
        if raw.get(SECTION) is not None:
            limits = parse_rate_limits(raw[SECTION], args.config)
    if args.rate_limit is not None:
        if not args.rate_limit > 0:
            raise ValueError(f"--rate-limit must be > 0 requests per second, got {args.rate_limit:g}")
        per_s = float(args.rate_limit)
        limits = RateLimits(Rate(per_s, max(1.0, per_s)), limits.models, limits.clients, limits.max_clients)
    if limits.active:
        out["rate_limits"] = limits
    return out


def _open_access_log(path: str | None, trace_url: str | None) -> Any:
    """The access log's writer (observability/access_log.py), which also makes the spans of
    ``--trace``; None when neither is on (then nothing of either is imported)."""
    if path is None and trace_url is None:
        return None
    from lumenrt.observability.access_log import AccessLog

    spans = None
    if trace_url is not None:
        from lumenrt.observability.tracing import SpanExporter

        spans = SpanExporter(trace_url)  # raises MissingExtra without the 'trace' extra
    try:
        return AccessLog.open(path, spans=spans)
    except OSError:
        if spans is not None:
            spans.close()
        raise


async def _serve(
    args: argparse.Namespace,
    settings: Any,
    limits: ServeLimits,
    access: Any = None,
    security: dict[str, Any] | None = None,
) -> int:
    from lumenrt.engine.engine import Engine
    from lumenrt.ingress.app import ServeOptions, ServerApp

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    app_ref: list[Any] = []  # the app once it exists: SIGHUP reloads its keys and certificates

    def on_reload() -> None:
        if app_ref:
            done = app_ref[0].reload()
            say(f"lumenrt serve: SIGHUP: reloaded {', '.join(done) or 'nothing'}")

    loop.add_signal_handler(signal.SIGHUP, on_reload)
    from lumenrt.native import clean_stale

    swept = clean_stale()
    if swept:
        say(f"lumenrt serve: removed {len(swept)} stale shared-memory segment(s) of dead processes")
    say(f"lumenrt serve: loading models ({settings.label}, placement {settings.placement})")
    try:
        engine = await loop.run_in_executor(
            None,
            lambda: Engine(args.repository, settings, models=args.models, ingress_threads=INGRESS_THREADS),
        )
    except Exception as exc:
        say(f"lumenrt serve: cannot load the models: {exc}", error=True)
        return 2
    _place_ingress(engine)
    try:
        app = ServerApp(
            engine,
            ServeOptions(
                args.host,
                args.http_port,
                args.grpc_port,
                args.tcp_port,
                limits,
                cache_size_bytes=args.cache_size_bytes,
                metrics=not args.no_metrics,
                metrics_port=args.metrics_port,
                allow_client_shm=args.allow_client_shm,
                max_shm_regions_per_client=args.max_shm_regions_per_client,
                client_shm_prefix=args.client_shm_prefix,
                grpc_server=args.grpc_server,
                **(security or {}),
            ),
        )
    except ValueError as exc:
        say(f"lumenrt serve: {exc}", error=True)
        await loop.run_in_executor(None, engine.close)
        return 2
    app_ref.append(app)
    app.service.access_log = access
    try:
        try:
            await app.start()
        except OSError as exc:
            say(f"lumenrt serve: cannot listen: {exc}", error=True)
            return 2
        where = " ".join(f"{name}={args.host}:{port}" for name, port in app.ports.items())
        if app.tls is not None:
            where += " (TLS" + (", client certificates required)" if args.tls_client_ca else ")")
        say(f"lumenrt serve: listening {where}")
        say(f"lumenrt serve: ready, models: {', '.join(engine.models())}")
        await stop.wait()
        say("lumenrt serve: shutting down (draining in-flight requests)")
        engine.begin_shutdown()
        drain = asyncio.ensure_future(app.shutdown())
        while not drain.done():
            before = signals
            await asyncio.wait({drain}, timeout=0.05)
            if signals > before and not drain.done():
                say("lumenrt serve: second signal, not waiting for in-flight requests")
                app.service.cut_drain()
        drained = drain.result()
        if not drained:
            say(f"lumenrt serve: grace period of {limits.grace_s:g} s over, requests dropped")
    finally:
        await loop.run_in_executor(None, engine.close)
    say("lumenrt serve: stopped")
    return 0
