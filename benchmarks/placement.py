"""Worker placement under a mixed load: the planned placement against today's round-robin and none (#15).

    .venv/bin/python benchmarks/placement.py [--quick] [--repeats 3] [--duration-s 10] [--warmup-s 2]
        [--squeezenet-concurrency 2] [--digits-concurrency 4] [--protocol tcp|http]
        [--serve-args '--mode process'] [--models squeezenet digits_mlp] [--out results]

The NUMA series' experiment on what this machine allows. ``lumenrt serve`` with no
``--repository`` loads every built-in model (squeezenet, digits_mlp, tabular_xgb); each placement
below is a server of its own, started, measured and stopped before the next one starts:

  planned     ``--placement spread``: the placement plan (workers pinned to the cores the plan
              gives them, ONNX Runtime's threads bound with them, memory bound to their node);
  planned_first_touch  the same with ``--memory-binding first_touch``: pinned, memory left to
              first touch (the issue asks for whichever of the two the measurements favour);
  roundrobin  ``--placement roundrobin``: the placement before planning (every model gets one
              worker per usable core, pinned round-robin);
  unpinned    ``--placement roundrobin --no-pin``: the same workers, pinned nowhere.

Load: two ``lumenrt bench load`` processes started together, each a closed loop, squeezenet at
``--squeezenet-concurrency`` and digits_mlp at ``--digits-concurrency`` clients, over the binary TCP
protocol (``--protocol http``: KServe V2 HTTP). Both warm up for ``--warmup-s`` and then measure for
``--duration-s``, so their windows overlap but for the start-up skew of the two processes (tens of
ms). ``--models squeezenet`` serves and loads SqueezeNet alone (``lumenrt serve --models
squeezenet``, the lone heavy model whose default placement must not fall behind round-robin). Before the load, with the models loaded and idle, the server's threads are counted
(``/proc/<pid>/task``, and those of any worker process it started) and each thread's allowed CPUs
read; they are counted again after the load.

A round measures every placement once; each round starts one placement later than the one before
(round 2: planned_first_touch, roundrobin, unpinned, planned), so that none always runs first and
the machine's noise falls on all alike. Reported per placement and model: the medians over rounds
of throughput (answered requests/s), p50 and p99 latency, and the ratios of planned to each other
placement of those medians for throughput and p99 (each round's own ratios are in the result file). The load generators share the machine with the server: on a small
machine they take cores the workers would use, alike for every placement.

Writes ``<out>/placement-<UTC stamp>.json`` (machine, commit, command line, configuration, the
topology, every run's figures, thread counts and the server's ``placement:`` lines, the medians and
ratios; rewritten after every run, so an interrupted run keeps what it measured) and, beside it,
``placement-<stamp>/`` with each load run's summary, per-request CSV and output. Prints a markdown
table at the end. ``--quick``: one round of 3 s runs (a smoke check, not a figure to quote).
"""

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from lumenrt.bench.results import git_commit, machine_info, new_result_path, write_json
from lumenrt.bench.serve_process import ServeProcess, start_serve

SQUEEZENET = "squeezenet"
DIGITS = "digits_mlp"
MODELS = (SQUEEZENET, DIGITS)
PLACEMENTS: dict[str, tuple[str, ...]] = {
    "planned": ("--placement", "spread"),
    "planned_first_touch": ("--placement", "spread", "--memory-binding", "first_touch"),
    "roundrobin": ("--placement", "roundrobin"),
    "unpinned": ("--placement", "roundrobin", "--no-pin"),
}
BASELINES = ("roundrobin", "unpinned", "planned_first_touch")  # the ratios are planned / each of these
PLAN_MARK = " placement: "  # the engine's log lines for the plan's warnings (engine/engine.py)
LOAD_SLACK_S = 120.0  # guessed: a load process's start (imports, metadata) plus its summary, with room
LOAD_STOP_S = 10.0  # guessed: a load process that got SIGTERM is gone well within this
SERVE_STOP_S = 60.0  # the server drains in-flight requests (its --grace-s) before it exits
SETTLE_S = 3.0  # guessed: threads a loaded server still starts after "ready" appear within this
SETTLE_POLL_S = 0.1


def _progress(msg: str) -> None:
    print(f"[bench placement] {msg}", file=sys.stderr, flush=True)


# ---- interrupts ---------------------------------------------------------------------------------


class Interrupts:
    """SIGINT and SIGTERM as KeyboardInterrupt, except inside ``held()``: there a signal is remembered
    and raised when the block ends. Starting a server and stopping servers run held, so that no
    interrupt leaves a server started but not yet ours to stop, or a cleanup half done."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.depth:
            self.pending = signum
            _progress(f"{signal.Signals(signum).name}: stopping once this step is done")
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                self.pending = None
                raise KeyboardInterrupt


INTERRUPTS = Interrupts()


# ---- the server's threads -----------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (worker processes in process mode), from /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # after "(comm)": state, ppid
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _thread_affinity(pid: int) -> Counter[str]:
    """'<thread name> on <allowed CPUs>' -> how many of ``pid``'s threads."""
    seen: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                comm = (task / "comm").read_text().strip()
                status = (task / "status").read_text()
            except OSError:
                continue
            cpus = next(
                (
                    ln.split(":", 1)[1].strip()
                    for ln in status.splitlines()
                    if ln.startswith("Cpus_allowed_list:")
                ),
                "?",
            )
            seen[f"{comm} on {cpus}"] += 1
    return seen


@dataclass(slots=True)
class Threads:
    server: int  # threads of the server process
    total: int  # with every process below it
    processes: int  # the server and its worker processes
    affinity: dict[str, int] = field(default_factory=dict)  # '<name> on <cpus>' -> threads (all processes)


def count_threads(pid: int) -> Threads:
    pids = _descendants(pid)
    per_process = {p: _thread_affinity(p) for p in pids}
    total: Counter[str] = Counter()
    for counts in per_process.values():
        total.update(counts)
    return Threads(
        server=sum(per_process.get(pid, Counter()).values()),
        total=sum(total.values()),
        processes=len(pids),
        affinity=dict(sorted(total.items())),
    )


def settled_threads(pid: int) -> Threads:
    """The thread count once it has stopped changing (three equal reads), or after ``SETTLE_S``."""
    deadline = time.monotonic() + SETTLE_S
    last, same = count_threads(pid), 0
    while same < 2 and time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)
        now = count_threads(pid)
        same = same + 1 if now.total == last.total else 0
        last = now
    return last


# ---- one placement, one round -------------------------------------------------------------------


def _load_command(model: str, concurrency: int, target: str, meta_url: str, out_dir: Path,
                  name: str, args: argparse.Namespace) -> list[str]:  # fmt: skip
    return [sys.executable, "-m", "lumenrt.cli", "bench", "load", "--target", target, "--model", model,
            "--concurrency", str(concurrency), "--duration-s", str(args.duration_s),
            "--warmup-s", str(args.warmup_s), "--metadata-url", meta_url, "--no-stages", "--quiet",
            "--json", "--out", str(out_dir), "--name", name]  # fmt: skip


def _stop_loads(procs: list["subprocess.Popen[bytes]"]) -> None:
    """SIGTERM to each load process group (its own session), then SIGKILL to what is left."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(LOAD_STOP_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group: spawned load children too
        proc.wait()


def _stop_server(server: ServeProcess) -> str:
    """SIGTERM, wait, SIGKILL after ``SERVE_STOP_S``; '' or what went wrong."""
    try:
        status = server.stop(SERVE_STOP_S)
    except subprocess.TimeoutExpired:
        return f"did not stop within {SERVE_STOP_S:g} s after SIGTERM: killed"
    return "" if status == 0 else f"exited {status}"


def _figures(summary: dict[str, Any]) -> dict[str, Any]:
    lat = summary.get("latency_us") or {}
    counts = summary.get("counts") or {}
    return {
        "throughput_per_s": summary.get("throughput_per_s"),
        "p50_ms": round(lat["p50"] / 1000, 3) if "p50" in lat else None,
        "p99_ms": round(lat["p99"] / 1000, 3) if "p99" in lat else None,
        "ok": counts.get("ok"),
        "errors": counts.get("errors"),
        "errors_by_kind": counts.get("errors_by_kind"),
        "elapsed_s": summary.get("elapsed_s"),
    }


def _read_load(proc: "subprocess.Popen[bytes]", run_dir: Path) -> dict[str, Any]:
    stdout = (run_dir / "stdout.txt").read_text(errors="replace")
    stderr = (run_dir / "stderr.txt").read_text(errors="replace")
    if proc.returncode != 0 or "{" not in stdout:
        return {"error": f"lumenrt bench load exited {proc.returncode}: {(stdout + stderr)[-1500:].strip()}"}
    summary = json.loads(stdout[stdout.find("{") :])
    return {**_figures(summary), "summary_file": summary.get("csv", "").replace(".csv", ".json")}


def measure(placement: str, round_no: int, args: argparse.Namespace, runs_dir: Path) -> dict[str, Any]:
    """One server with ``placement``, both loads at once; the run's figures (or its error)."""
    run: dict[str, Any] = {
        "round": round_no,
        "placement": placement,
        "serve_args": list(PLACEMENTS[placement]),
    }
    server: ServeProcess | None = None
    loads: list[subprocess.Popen[bytes]] = []
    try:
        with INTERRUPTS.held():
            only = ("--models", *args.models) if list(args.models) != list(MODELS) else ()
            server = start_serve(*PLACEMENTS[placement], *only, *shlex.split(args.serve_args))
        run["server_pid"] = server.proc.pid
        run["threads_idle"] = asdict(settled_threads(server.proc.pid))
        meta_url = f"http://{server.http_url}"
        target = f"tcp://127.0.0.1:{server.ports['tcp']}" if args.protocol == "tcp" else meta_url
        concurrency = {SQUEEZENET: args.squeezenet_concurrency, DIGITS: args.digits_concurrency}
        dirs = {}
        for model in args.models:
            name = f"r{round_no}-{placement}-{model}"
            dirs[model] = runs_dir / name
            dirs[model].mkdir(parents=True, exist_ok=True)
            cmd = _load_command(model, concurrency[model], target, meta_url, dirs[model], name, args)
            with open(dirs[model] / "stdout.txt", "wb") as out, open(dirs[model] / "stderr.txt", "wb") as err:
                # a session of its own: the terminal's Ctrl-C reaches this script, which stops it
                loads.append(subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True))
        deadline = time.monotonic() + args.warmup_s + args.duration_s + LOAD_SLACK_S
        for proc in loads:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                run["error"] = f"a load process ran past {args.warmup_s + args.duration_s + LOAD_SLACK_S:g} s"
                break
        if "error" not in run:
            run["models"] = {
                m: {**_read_load(p, dirs[m]), "dir": str(dirs[m].relative_to(runs_dir.parent))}
                for m, p in zip(args.models, loads, strict=True)
            }
            run["threads_after_load"] = asdict(count_threads(server.proc.pid))
    except RuntimeError as exc:  # the server did not start
        run["error"] = str(exc)[-3000:]
    finally:
        with INTERRUPTS.held():
            _stop_loads(loads)
            if server is not None:
                problem = _stop_server(server)
                if problem:
                    run["server_stop"] = problem
                lines = list(server.lines)
                run["plan_lines"] = [ln for ln in lines if PLAN_MARK in ln]
                run["settings_line"] = next((ln for ln in lines if "loading models" in ln), None)
                run["server_notes"] = [ln for ln in lines if _notable(ln)]
                run["server_output"] = lines[-200:]
    return run


def _notable(line: str) -> bool:
    low = line.lower()
    return PLAN_MARK in line or any(w in low for w in ("warn", "error", "traceback", "exception"))


# ---- medians, ratios, the table -----------------------------------------------------------------


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarize(runs: list[dict[str, Any]], models: list[str]) -> dict[str, Any]:
    """Medians over rounds per placement and model, thread counts, and planned's ratios."""
    ok = [r for r in runs if "models" in r]
    medians: dict[str, Any] = {}
    for placement in PLACEMENTS:
        mine = [r for r in ok if r["placement"] == placement]
        row: dict[str, Any] = {
            "rounds": len(mine),
            "threads_idle": _median([r["threads_idle"]["total"] for r in mine]),
            "server_threads_idle": _median([r["threads_idle"]["server"] for r in mine]),
            "threads_after_load": _median([r["threads_after_load"]["total"] for r in mine]),
            "processes": _median([r["threads_idle"]["processes"] for r in mine]),
        }
        for model in models:
            figs = [r["models"][model] for r in mine if "error" not in r["models"][model]]
            row[model] = {k: _median([f[k] for f in figs]) for k in ("throughput_per_s", "p50_ms", "p99_ms")}
            row[model]["errors"] = sum(int(f.get("errors") or 0) for f in figs)
        medians[placement] = row
    ratios: dict[str, Any] = {}
    for model in models:
        for base in BASELINES:
            for key, label in (("throughput_per_s", "throughput"), ("p99_ms", "p99")):
                name = f"{model} {label} planned/{base}"
                per_round = []
                for rnd in sorted({r["round"] for r in ok}):
                    mine = {r["placement"]: r["models"][model] for r in ok if r["round"] == rnd}
                    if "planned" in mine and base in mine:
                        per_round.append(_ratio(mine["planned"].get(key), mine[base].get(key)))
                ratios[name] = {
                    "of_medians": _ratio(medians["planned"][model][key], medians[base][model][key]),
                    "per_round": per_round,
                }
    return {"medians": medians, "ratios": ratios}


def _cell(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def format_table(doc: dict[str, Any]) -> str:
    med, ratios = doc["summary"]["medians"], doc["summary"]["ratios"]
    cfg = doc["config"]
    models = cfg["models"]
    clients = {SQUEEZENET: cfg["squeezenet_concurrency"], DIGITS: cfg["digits_concurrency"]}
    out = [
        f"Load over {cfg['protocol']}: "
        + " + ".join(f"{m} c{clients[m]}" for m in models)
        + f", {cfg['duration_s']:g} s runs, medians of {cfg['repeats']} round(s)",
        "",
        "| placement | model | req/s | p50 ms | p99 ms | errors | threads idle (server) | after load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for placement, row in med.items():
        for model in models:
            f = row[model]
            out.append(
                f"| {placement} | {model} | {_cell(f['throughput_per_s'])} | {_cell(f['p50_ms'], '.2f')} "
                f"| {_cell(f['p99_ms'], '.2f')} | {f['errors']} | {_cell(row['threads_idle'], 'g')} "
                f"({_cell(row['server_threads_idle'], 'g')}) | {_cell(row['threads_after_load'], 'g')} |"
            )
    out += ["", "| ratio | of medians | per round |", "|---|---|---|"]
    for name, r in ratios.items():
        rounds = ", ".join(_cell(x, ".3f") for x in r["per_round"])
        out.append(f"| {name} | {_cell(r['of_medians'], '.3f')} | {rounds} |")
    plans: dict[str, list[str]] = {}
    for r in doc["runs"]:
        if "plan_lines" in r:
            plans.setdefault(r["placement"], r["plan_lines"])
    out += ["", "placement lines printed by the server (first run of each):"]
    for placement, lines in plans.items():
        out.append(
            f"  {placement}: "
            + ("; ".join(ln.split(PLAN_MARK, 1)[1].strip() for ln in lines) if lines else "(none)")
        )
    failed = [r for r in doc["runs"] if "error" in r]
    for r in failed:
        out.append(f"FAILED round {r['round']} {r['placement']}: {r['error'].splitlines()[0]}")
    return "\n".join(out)


# ---- the run ------------------------------------------------------------------------------------


def _topology() -> dict[str, Any]:
    from lumenrt.placement.topology import TopologyError, read_topology

    try:
        return read_topology().to_json()
    except (TopologyError, OSError) as exc:
        return {"error": str(exc)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="rounds of every placement (default 3)")
    p.add_argument(
        "--duration-s", type=float, default=10.0, help="measured seconds per load run (default 10)"
    )
    p.add_argument("--warmup-s", type=float, default=2.0, help="warm-up seconds per load run (default 2)")
    p.add_argument("--squeezenet-concurrency", type=int, default=2, help="squeezenet's clients (default 2)")
    p.add_argument("--digits-concurrency", type=int, default=4, help="digits_mlp's clients (default 4)")
    p.add_argument("--protocol", choices=("tcp", "http"), default="tcp", help="load protocol (default tcp)")
    p.add_argument("--serve-args", default="", help="more `lumenrt serve` flags for every placement")
    p.add_argument(
        "--models",
        nargs="+",
        choices=MODELS,
        default=list(MODELS),
        help="the models served and loaded (default: both; the server loads only these)",
    )
    p.add_argument("--out", type=Path, default=Path("results"), help="results folder (default results/)")
    p.add_argument("--quick", action="store_true", help="one round of 3 s runs (1 s warm-up): a smoke check")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.duration_s, args.warmup_s = 1, 3.0, 1.0
    if args.repeats < 1 or args.duration_s <= 0 or args.warmup_s < 0:
        p.error("--repeats must be at least 1, --duration-s above 0, --warmup-s at least 0")
    INTERRUPTS.install()
    path = new_result_path(args.out, "placement")
    runs_dir = path.with_suffix("")
    runs_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "kind": "placement",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "commit": git_commit(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "config": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "placements": {k: list(v) for k, v in PLACEMENTS.items()},
            "models": list(args.models),
        },
        "topology": _topology(),
        "runs": [],
    }
    status = 0
    try:
        names = list(PLACEMENTS)
        for round_no in range(1, args.repeats + 1):
            # each round starts one placement later, so that no placement always runs first or
            # after the same one (the first run of a round met a machine the last one left)
            shift = (round_no - 1) % len(names)
            for placement in names[shift:] + names[:shift]:
                _progress(f"round {round_no}/{args.repeats}: {placement} ({' '.join(PLACEMENTS[placement])})")
                run = measure(placement, round_no, args, runs_dir)
                doc["runs"].append(run)
                for line in run.get("server_notes", []):
                    _progress(f"  server: {line}")
                if "error" in run:
                    _progress(f"  failed: {run['error'].splitlines()[0]}")
                for model, f in run.get("models", {}).items():
                    _progress(
                        f"  {model}: "
                        + (
                            f["error"].splitlines()[0]
                            if "error" in f
                            else f"{f['throughput_per_s']}/s p50 {f['p50_ms']} ms p99 {f['p99_ms']} ms "
                            f"errors {f['errors']}"
                        )
                    )
                doc["summary"] = summarize(doc["runs"], args.models)
                write_json(path, doc)  # after every run: an interrupted run keeps what it measured
    except KeyboardInterrupt:
        _progress("interrupted: every server and load process is stopped")
        doc["interrupted"] = True
        status = 130
    doc["summary"] = summarize(doc["runs"], args.models)
    write_json(path, doc)
    failed = any("error" in r or any("error" in f for f in r.get("models", {}).values()) for r in doc["runs"])
    print(format_table(doc))
    print(f"\nwrote {path}")
    return status or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
