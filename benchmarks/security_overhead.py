"""What TLS and API keys cost: the same load against a plain server, one with TLS and one with keys,
in one run.

    .venv/bin/python benchmarks/security_overhead.py [--seconds 10] [--rounds 3] [--out results/]
    make bench-security ARGS="--rounds 5"

Three ``lumenrt serve`` processes (digits_mlp and SqueezeNet each), started once and kept:
**plain** (clear text, no keys), **tls** (``--tls-cert``/``--tls-key``, a certificate made for the
run with the ``openssl`` command) and **auth** (API keys from ``LUMENRT_API_KEYS``; every group but
health needs one). ``lumenrt bench load`` (closed loop) drives each row against its two
configurations in interleaved rounds; each figure is the median over the rounds:

| row | configurations | what it shows |
|---|---|---|
| squeezenet/http c4 | plain, tls | TLS on a compute-bound model (the issue's bar: <= 10% throughput) |
| digits_mlp/tcp c1 | plain, tls | TLS on the latency path (p50, p99) |
| digits_mlp/tcp c4 | plain, auth | the key check per request (the issue's bar: <= 2% throughput) |
| digits_mlp/http c4 | plain, auth | the same over HTTP (a header and a SHA-256 per request) |

Ratios are configuration / plain from the same run. Each run also records the CPU time per
request of the server process (``/proc/<pid>/stat``) and of the load generator (``getrusage`` of
the child), over the whole run, warm-up included: on a machine where both share the cores, TLS
costs on both sides, and these say how much of a throughput ratio is the server's own cost.
Writes ``security-overhead-<stamp>.json`` with the machine, the commit and every round.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import ServeProcess, start_serve
from roundtrip import cpu_s  # beside this file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WARMUP_S = 1.0
KEYS = ("throughput_per_s", "p50_us", "p99_us", "server_cpu_us", "client_cpu_us")
KEY_ENV = "LUMENRT_BENCH_KEY"  # the load generator reads the key from here (--api-key-env)
# (model, protocol, concurrency, the configuration compared with plain)
ROWS = (
    ("squeezenet", "http", 4, "tls"),
    ("digits_mlp", "tcp", 1, "tls"),
    ("digits_mlp", "tcp", 4, "auth"),
    ("digits_mlp", "http", 4, "auth"),
)


def make_certificate(folder: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 (EC P-256), with the openssl command."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl(
        "req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=bench CA"
    )
    openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.ext")  # fmt: skip
    return {"ca": folder / "ca.crt", "cert": folder / "server.crt", "key": folder / "server.key"}


def load(
    server: ServeProcess,
    model: str,
    protocol: str,
    concurrency: int,
    seconds: float,
    out: Path,
    extra: list[str],
) -> dict[str, float]:
    """One closed-loop ``lumenrt bench load`` run in its own process; throughput, p50, p99."""
    target = f"{protocol}://127.0.0.1:{server.ports[protocol]}"
    cmd = [sys.executable, "-m", "lumenrt.cli", "bench", "load", "--target", target, "--model", model,
           "--metadata-url", server.http_url, "--concurrency", str(concurrency), "--duration-s", str(seconds),
           "--warmup-s", str(WARMUP_S), "--no-stages", "--quiet", "--json", "--out", str(out), *extra]  # fmt: skip
    server_before = cpu_s(server.proc.pid)
    client_before = children_cpu_s()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    client_s = children_cpu_s() - client_before
    server_s = cpu_s(server.proc.pid) - server_before
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    summary = json.loads(done.stdout[done.stdout.find("{") :])
    if summary["counts"]["errors"]:
        raise RuntimeError(f"{' '.join(cmd)}: {summary['counts']['errors_by_kind']}")
    lat = summary["latency_us"]
    throughput = float(summary["throughput_per_s"])
    requests = throughput * (seconds + WARMUP_S)  # the warm-up ran at about the same rate
    return {
        "throughput_per_s": throughput,
        "p50_us": float(lat["p50"]),
        "p99_us": float(lat["p99"]),
        "server_cpu_us": server_s / requests * 1e6,
        "client_cpu_us": client_s / requests * 1e6,
    }


def children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def servers(certs: dict[str, Path], key: str) -> Iterator[dict[str, ServeProcess]]:
    env_plain = {k: v for k, v in os.environ.items() if k != "LUMENRT_API_KEYS"}
    env_auth = {
        **env_plain,
        "LUMENRT_API_KEYS": json.dumps({"keys": [{"name": "bench", "key": key, "groups": ["*"]}]}),
    }
    configs = {
        "plain": ([], env_plain),
        "tls": (["--tls-cert", str(certs["cert"]), "--tls-key", str(certs["key"])], env_plain),
        "auth": ([], env_auth),
    }
    started: dict[str, ServeProcess] = {}
    try:
        for name, (flags, env) in configs.items():
            started[name] = start_serve(
                "--models", "digits_mlp", "squeezenet", *flags, env=env, cwd=str(ROOT)
            )
        yield started
    finally:
        for server in started.values():
            server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per load run (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--out", type=Path, default=ROOT / "results", help="folder for the result file")
    args = ap.parse_args(argv)
    for flag in ("seconds", "rounds"):
        if getattr(args, flag) <= 0:
            ap.error(f"--{flag} must be > 0, got {getattr(args, flag)}")

    import secrets

    key = secrets.token_urlsafe(32)
    os.environ[KEY_ENV] = key  # inherited by the load generator; never on a command line
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="lumenrt-security-overhead-") as tmp:
        scratch = Path(tmp)
        certs = make_certificate(scratch)
        extra = {"plain": [], "tls": ["--tls-ca", str(certs["ca"])], "auth": ["--api-key-env", KEY_ENV]}
        with servers(certs, key) as started:
            for r in range(args.rounds):
                for model, protocol, concurrency, other in ROWS:
                    row = f"{model}/{protocol}/c{concurrency}"
                    for name in ("plain", other):
                        got = load(
                            started[name], model, protocol, concurrency, args.seconds, scratch, extra[name]
                        )
                        runs.setdefault(row, {}).setdefault(name, []).append(got)
                        print(
                            f"round {r + 1}/{args.rounds} {row:<22} {name:<6} {got['throughput_per_s']:9.1f}/s  "
                            f"p50 {got['p50_us']:8.1f} us  p99 {got['p99_us']:8.1f} us  cpu/request: "
                            f"server {got['server_cpu_us']:.1f} us, load generator {got['client_cpu_us']:.1f} us",
                            flush=True,
                        )

    results: dict[str, Any] = {}
    print(
        f"\n{'row':<22} {'config':<6} {'req/s':>9} {'p50 us':>9} {'p99 us':>9} {'tput x':>7} {'p50 x':>7} "
        f"{'p99 x':>7} {'srv cpu us':>10} {'cli cpu us':>10}"
    )
    for row, by_config in runs.items():
        medians = {
            name: {k: float(np.median([g[k] for g in got])) for k in KEYS} for name, got in by_config.items()
        }
        plain = medians["plain"]
        results[row] = {}
        for name, med in medians.items():
            ratios = {
                "throughput_ratio": round(med["throughput_per_s"] / plain["throughput_per_s"], 4),
                "p50_ratio": round(med["p50_us"] / plain["p50_us"], 4),
                "p99_ratio": round(med["p99_us"] / plain["p99_us"], 4),
            }
            results[row][name] = {
                **{k: round(v, 1) for k, v in med.items()},
                **ratios,
                "rounds": by_config[name],
            }
            print(
                f"{row:<22} {name:<6} {med['throughput_per_s']:9.1f} {med['p50_us']:9.1f} {med['p99_us']:9.1f} "
                f"{ratios['throughput_ratio']:7.3f} {ratios['p50_ratio']:7.3f} {ratios['p99_ratio']:7.3f} "
                f"{med['server_cpu_us']:10.1f} {med['client_cpu_us']:10.1f}"
            )
    payload = {
        "benchmark": "security_overhead",
        "machine": machine_info(),
        "commit": git_commit(ROOT),
        "config": {
            "rows": [f"{m}/{p}/c{c}: plain vs {o}" for m, p, c, o in ROWS],
            "seconds": args.seconds,
            "warmup_s": WARMUP_S,
            "rounds": args.rounds,
        },
        "results": results,
        "bar": {"tls_throughput_ratio_min": 0.90, "auth_throughput_ratio_min": 0.98},
    }
    path = write_result(args.out, "security-overhead", payload)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
