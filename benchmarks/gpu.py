"""GPU benchmark (issue 17): SqueezeNet 1.1 and a small MLP on one CUDA device.

    python benchmarks/gpu.py [--quick] [--out results] [--models squeezenet,mlp] [--skip-serve]
        [--batches 1,4,16,64] [--concurrency 1,8,64] [--duration-s S] [--warmup-s S]

Rows, each with throughput (inferences = rows per second), p50 and p99 latency, and for engine
rows the mean batch and the device's mean copy-in, compute and copy-out time per batch:

* ``raw``: a plain PyTorch loop on the device, one thread: the batch copied from pinned memory
  on one stream, the model, the answer copied back, the stream synchronized; FP32 and FP16
  (autocast). The ceiling the engine rows are compared against (same model, batch, precision).
* ``engine``: the engine in process, one GPU instance, a closed loop of C concurrent
  ``infer_async`` requests of B rows from one thread (``clients: async``), or of C threads calling
  ``infer`` (``clients: threads``: admission's copies of big requests then run side by side). Variants, one switch at a time from ``base`` (FP32, pinned
  staging, copy streams, no graphs): ``fp16`` (autocast), ``pageable`` (staging not page-locked),
  ``one-stream`` (copies and compute on one stream), ``graphs`` (CUDA graphs for 1, 4, 16, 64),
  ``direct`` (each request copied to the device from its arena slot, no gather on the host),
  ``graphs-direct`` (both), and those two with ``busy_wait_events`` (``graphs-busy``,
  ``graphs-direct-busy``: the worker spins on its batch's event rather than sleeping).
* ``serve-http`` / ``serve-tcp``: ``lumenrt serve`` over the ``--serve-variants`` models (default
  ``graphs`` and ``graphs-direct``), driven by lumenrt's load generator (closed loop) over HTTP (binary
  tensors) and the TCP protocol.

``--quick`` (what benchmarks/gpu_check.sh runs): batches 1 and 64 (the raw loop's best on the
H100), concurrency 1 and 16, variants at batch 64 and concurrency 16 only (the direct ones also
with threads), serve rows of one image
at concurrency 8, 16 and 32 and of 64 at 16, phases of 1 s after 0.3 s of warm-up (batches 1 and
16 with the base serve rows alone took 78 s on an H100 machine). The run ends with issue 17's
three targets read off the rows (``targets``). The full run: batches
1, 4, 16, 64 x concurrency 1, 8, 64 for base and serve rows, variants at every batch with
concurrency 64, phases of 5 s after 1 s (not timed; batches 1, 16, 64 x concurrency 1, 16, 64
with 1.5 s phases and base serve rows took 217 s there).

The models are built in code with random weights (no download): SqueezeNet 1.1 after Iandola et
al. (2016), as in the ONNX built-in (lumenrt/models/squeezenet.py); the MLP is 64-512-512-10.
Without a CUDA device it exits with status 2 and says so. Writes ``<out>/gpu-<stamp>.json``
(machine, commit, torch, device, configuration, every row, engine/raw ratios); a failed row is an
error row and makes the exit status 1; the benchmark reports and never judges.
"""

import argparse
import copy
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lumenrt.bench.engine_load import Phase, closed_loop_async, closed_loop_threads, percentiles_us
from lumenrt.bench.load_run import LoadPlan, run_load
from lumenrt.bench.load_stats import summarize
from lumenrt.bench.results import git_commit, machine_info, write_result
from lumenrt.bench.serve_process import start_serve

MAX_BATCH = 64
QUICK_SERVE_CONCURRENCY = [8, 16, 32]
GRAPH_SIZES = [1, 4, 16, 64]
VARIANTS: dict[str, dict[str, Any]] = {  # engine variants: the model config's optimization block
    "base": {},
    "fp16": {"cuda": {"autocast": "FP16"}},
    "pageable": {"input_pinned_memory": {"enable": False}, "output_pinned_memory": {"enable": False}},
    "one-stream": {"cuda": {"copy_streams": False}},
    "graphs": {"cuda": {"graphs": True}},
    "direct": {"cuda": {"direct_copies": True}},
    "graphs-direct": {"cuda": {"graphs": True, "direct_copies": True}},
    "graphs-busy": {"cuda": {"graphs": True, "busy_wait_events": True}},
    "graphs-direct-busy": {"cuda": {"graphs": True, "direct_copies": True, "busy_wait_events": True}},
}


@dataclass
class Row:
    scenario: str  # raw | engine | serve-http | serve-tcp
    model: str
    variant: str  # raw: fp32 / fp16; engine and serve: a VARIANTS key
    batch: int
    concurrency: int
    throughput_per_s: float | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    mean_batch_rows: float | None = None
    clients: str = "async"  # engine rows: async (one thread) or threads (one per request in flight)
    device_us: dict[str, float] = field(default_factory=dict)  # mean per batch: copy_in, compute, copy_out
    error: str | None = None


# ---- the models -------------------------------------------------------------------------------


def build_models(torch: Any) -> dict[str, tuple[Any, tuple[int, ...], int]]:
    """name -> (module, input shape without the batch dim, output size)."""
    nn = torch.nn

    class Fire(nn.Module):  # type: ignore[misc]
        def __init__(self, cin: int, squeeze: int, expand: int) -> None:
            super().__init__()
            self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
            self.e1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
            self.e3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

        def forward(self, x: Any) -> Any:
            s = self.squeeze(x)
            return torch.cat([self.e1(s), self.e3(s)], 1)

    def pool() -> Any:
        return nn.MaxPool2d(3, 2, ceil_mode=True)

    squeezenet = nn.Sequential(  # SqueezeNet 1.1
        nn.Conv2d(3, 64, 3, stride=2), nn.ReLU(), pool(),
        Fire(64, 16, 64), Fire(128, 16, 64), pool(),
        Fire(128, 32, 128), Fire(256, 32, 128), pool(),
        Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
        nn.Conv2d(512, 1000, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Softmax(-1),
    )  # fmt: skip
    mlp = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return {"squeezenet": (squeezenet.eval(), (3, 224, 224), 1000), "mlp": (mlp.eval(), (64,), 10)}


def write_repository(torch: Any, root: Path, models: dict[str, Any], variants: list[str]) -> None:
    """``<model>_<variant>`` per model and variant: one torch.export file, one GPU instance."""
    root.mkdir(parents=True, exist_ok=True)
    for name, (module, shape, outputs) in models.items():
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        program = torch.export.export(module, (torch.zeros(2, *shape),), dynamic_shapes={"input": {0: batch}})
        exported = root / f"_{name}.pt2"
        torch.export.save(program, str(exported))
        for variant in variants:
            folder = root / f"{name}_{variant}"
            (folder / "1").mkdir(parents=True)
            shutil.copy(exported, folder / "1" / "model.pt2")
            config: dict[str, Any] = {
                "backend": "pytorch",
                "max_batch_size": MAX_BATCH,
                "dynamic_batching": {"max_queue_delay_us": 0, "preferred_batch_size": GRAPH_SIZES},
                "input": [{"name": "input", "datatype": "FP32", "dims": list(shape)}],
                "output": [{"name": "output", "datatype": "FP32", "dims": [outputs]}],
                "instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}],
                "warmup": 2,
            }
            if VARIANTS[variant]:
                config["optimization"] = VARIANTS[variant]
            (folder / "config.yaml").write_text(yaml.safe_dump(config))
        exported.unlink()


# ---- the rows ---------------------------------------------------------------------------------


def raw_row(
    torch: Any, name: str, module: Any, shape: tuple[int, ...], batch: int, fp16: bool, phase: Phase
) -> Row:
    device = torch.device("cuda:0")
    model = copy.deepcopy(module).to(device)
    stream = torch.cuda.Stream(device)
    x = torch.randn(batch, *shape).pin_memory()
    x_dev = torch.empty_like(x, device=device)
    out = torch.empty(batch, model(x_dev).shape[-1], pin_memory=True)

    def call() -> None:
        with torch.cuda.stream(stream):
            x_dev.copy_(x, non_blocking=True)
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16, enabled=fp16):
                y = model(x_dev)
            out.copy_(y, non_blocking=True)
        stream.synchronize()

    samples = closed_loop_threads([call], batch, phase)
    p = percentiles_us(samples.latencies_ns)
    return Row(
        "raw",
        name,
        "fp16" if fp16 else "fp32",
        batch,
        1,
        round(samples.throughput_per_s, 1),
        p.p50_us,
        p.p99_us,
    )


def engine_row(
    engine: Any, name: str, variant: str, shape: tuple[int, ...], batch: int, c: int, phase: Phase,
    clients: str = "async",
) -> Row:  # fmt: skip
    model = f"{name}_{variant}"
    x = np.random.default_rng(0).standard_normal((batch, *shape), dtype=np.float32)
    before = engine.statistics(model)[0]
    if clients == "threads":
        samples = closed_loop_threads([lambda: engine.infer(model, {"input": x})] * c, batch, phase)
        after = engine.statistics(model)[0]
        mean_batch = (
            (after["requests"] - before["requests"]) * batch / max(after["batches"] - before["batches"], 1)
        )
    else:
        samples, counters = closed_loop_async(
            engine, model, {"input": x}, rows_per_request=batch, concurrency=c, phase=phase
        )
        after = engine.statistics(model)[0]
        mean_batch = counters.mean_batch_rows
    p = percentiles_us(samples.latencies_ns)
    batches = max(after["gpu"]["batches"] - before["gpu"]["batches"], 1)
    device = {
        stage: round((after["gpu"][f"{stage}_ns"] - before["gpu"][f"{stage}_ns"]) / batches / 1000, 1)
        for stage in ("copy_in", "compute", "copy_out")
    }
    return Row(
        "engine", name, variant, batch, c, round(samples.throughput_per_s, 1), p.p50_us, p.p99_us,
        round(mean_batch, 1), clients, device,
    )  # fmt: skip


def serve_row(
    url: str, protocol: str, name: str, variant: str, shape: tuple[int, ...], batch: int, c: int, phase: Phase
) -> Row:
    x = np.random.default_rng(0).standard_normal((batch, *shape), dtype=np.float32)
    plan = LoadPlan(
        target=f"{protocol}://{url}", model=f"{name}_{variant}", inputs={"input": x}, concurrency=c,
        warmup_s=phase.warmup_s, duration_s=phase.duration_s,
    )  # fmt: skip
    records, window = run_load(plan, multiprocessing.RawArray("q", 1))
    figures = summarize(records.arrays(), window)
    latency = figures["latency_us"] or {}
    errors = figures["counts"].get("errors") or None
    return Row(
        f"serve-{protocol}", name, variant, batch, c, round(figures["throughput_per_s"] * batch, 1),
        latency.get("p50"), latency.get("p99"), error=f"{errors} failed requests" if errors else None,
    )  # fmt: skip


def guarded(make: Callable[[], Row], fallback: Row) -> Row:
    try:
        row = make()
    except Exception as exc:  # the row fails, the run goes on
        fallback.error = f"{type(exc).__name__}: {exc}"
        row = fallback
    scenario = "engine-thr" if row.clients == "threads" else row.scenario
    print(
        f"{scenario:10} {row.model:10} {row.variant:13} b{row.batch:<3} c{row.concurrency:<3} "
        + (
            f"ERROR {row.error}"
            if row.error
            else f"{row.throughput_per_s}/s p50 {row.p50_us} us p99 {row.p99_us} us"
        )
        + (f" device {row.device_us}" if row.device_us else ""),
        flush=True,
    )
    return row


def plan_rows(args: argparse.Namespace) -> Iterator[tuple[str, str, int, int]]:
    """(scenario, variant, batch, concurrency) for every engine and serve row (scenario
    ``engine-threads``: an engine row whose clients are threads)."""
    top_c = max(args.concurrency)
    for batch in args.batches:
        for c in args.concurrency:
            yield "engine", "base", batch, c
        for variant in VARIANTS:
            if variant != "base" and (not args.quick or batch == max(args.batches)):
                yield "engine", variant, batch, top_c
                if "direct" in variant and batch > 1:  # big requests: admission's copy in threads
                    yield "engine-threads", variant, batch, top_c
    if not args.skip_serve:
        for variant in args.serve_variants:
            for protocol in ("http", "tcp"):
                for batch in args.batches:
                    # --quick: one-image requests at the concurrencies where the HTTP target is read
                    quick_c = QUICK_SERVE_CONCURRENCY if batch == 1 else [top_c]
                    for c in args.concurrency if not args.quick else quick_c:
                        yield f"serve-{protocol}", variant, batch, c


def ratios(rows: list[Row]) -> list[dict[str, Any]]:
    """Each engine and serve row's throughput over the raw loop's (same model, batch, precision)."""
    raw = {
        (r.model, r.batch, r.variant): r.throughput_per_s for r in rows if r.scenario == "raw" and not r.error
    }
    out = []
    for r in rows:
        base = raw.get((r.model, r.batch, "fp16" if r.variant == "fp16" else "fp32"))
        if r.scenario != "raw" and not r.error and base and r.throughput_per_s:
            out.append({**{k: getattr(r, k) for k in ("scenario", "model", "variant", "batch", "concurrency")},
                        "of_raw": round(r.throughput_per_s / base, 3)})  # fmt: skip
    return out


def targets(rows: list[Row]) -> dict[str, Any]:
    """Issue 17's three targets, read off the rows (the benchmark reports; it does not judge):

    * ``engine_of_raw``: per model, the raw loop's best FP32 throughput and its batch size, and the
      engine's best FP32 row at that batch size (any concurrency or variant but fp16), as a ratio
      (the issue asks >= 0.9);
    * ``http_squeezenet``: the serve-http squeezenet rows of one-image requests with >= 1,000
      requests/s and p50 < 10 ms (the issue asks for one), else the best of them;
    * ``overlap``: per engine row, the device's mean copy-in + compute + copy-out per batch over
      the wall time per batch; above 1, stages of consecutive batches ran at once.
    """
    ok = [r for r in rows if not r.error and r.throughput_per_s]
    out: dict[str, Any] = {"engine_of_raw": {}, "overlap": []}
    for model in sorted({r.model for r in ok}):
        raw = [r for r in ok if r.scenario == "raw" and r.model == model and r.variant == "fp32"]
        if not raw:
            continue
        best_raw = max(raw, key=lambda r: r.throughput_per_s or 0.0)
        engine = [
            r for r in ok if r.scenario == "engine" and r.model == model and r.variant != "fp16"
            and r.batch == best_raw.batch
        ]  # fmt: skip
        best = max(engine, key=lambda r: r.throughput_per_s or 0.0, default=None)
        out["engine_of_raw"][model] = {
            "raw_batch": best_raw.batch,
            "raw_per_s": best_raw.throughput_per_s,
            "engine": None if best is None else {k: getattr(best, k) for k in ("variant", "clients", "concurrency", "throughput_per_s")},
            "ratio": None if best is None else round((best.throughput_per_s or 0.0) / (best_raw.throughput_per_s or 1.0), 3),
        }  # fmt: skip
    http = [r for r in ok if r.scenario == "serve-http" and r.model == "squeezenet" and r.batch == 1]
    met = [
        r for r in http if (r.throughput_per_s or 0) >= 1000 and r.p50_us is not None and r.p50_us < 10_000
    ]
    shown = met or sorted(http, key=lambda r: r.throughput_per_s or 0.0)[-1:]
    out["http_squeezenet"] = {
        "met": bool(met),
        "rows": [{k: getattr(r, k) for k in ("variant", "concurrency", "throughput_per_s", "p50_us")} for r in shown],
    }  # fmt: skip
    for r in ok:
        if r.scenario == "engine" and r.device_us and r.mean_batch_rows:
            wall_us = r.mean_batch_rows / (r.throughput_per_s or 1.0) * 1e6
            out["overlap"].append({
                **{k: getattr(r, k) for k in ("model", "variant", "batch", "concurrency")},
                "device_over_wall": round(sum(r.device_us.values()) / wall_us, 2),
            })  # fmt: skip
    return out


def print_targets(t: dict[str, Any]) -> None:
    for model, e in t["engine_of_raw"].items():
        engine = e["engine"] or {}
        print(
            f"target engine/raw {model}: raw {e['raw_per_s']}/s at batch {e['raw_batch']}; engine "
            f"{engine.get('throughput_per_s')}/s ({engine.get('variant')}, {engine.get('clients')}, c{engine.get('concurrency')}): {e['ratio']}"
        )
    h = t["http_squeezenet"]
    print(f"target squeezenet HTTP >= 1000/s, p50 < 10 ms: {'met' if h['met'] else 'not met'}: {h['rows']}")
    if t["overlap"]:
        top = max(t["overlap"], key=lambda o: o["device_over_wall"])
        print(f"overlap: highest device time / wall time per batch {top['device_over_wall']} ({top})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the short run of benchmarks/gpu_check.sh")
    parser.add_argument("--out", default="results")
    parser.add_argument("--models", default="squeezenet,mlp")
    parser.add_argument("--batches", default=None, help="default 1,4,16,64 (--quick: 1,64)")
    parser.add_argument("--concurrency", default=None, help="default 1,8,64 (--quick: 1,16)")
    parser.add_argument("--duration-s", type=float, default=None)
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument(
        "--serve-variants",
        default="graphs,graphs-direct",
        help="the engine variants `lumenrt serve` serves for the serve rows (default graphs,graphs-direct)",
    )
    args = parser.parse_args(argv)
    args.serve_variants = args.serve_variants.split(",")
    unknown = [v for v in args.serve_variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--serve-variants: unknown {unknown}; choose from {list(VARIANTS)}")
    try:
        import torch
    except ImportError:
        print(
            "benchmarks/gpu.py: needs PyTorch with CUDA (pip install 'lumenrt[torch]', a CUDA build)",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print(
            f"benchmarks/gpu.py: no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False); "
            "run it on a GPU machine (benchmarks/gpu_check.sh)",
            file=sys.stderr,
        )
        return 2
    args.batches = [int(b) for b in (args.batches or ("1,64" if args.quick else "1,4,16,64")).split(",")]
    args.concurrency = [int(c) for c in (args.concurrency or ("1,16" if args.quick else "1,8,64")).split(",")]
    phase = Phase(
        args.warmup_s if args.warmup_s is not None else (0.3 if args.quick else 1.0),
        args.duration_s if args.duration_s is not None else (1.0 if args.quick else 5.0),
    )
    names = args.models.split(",")
    models = {k: v for k, v in build_models(torch).items() if k in names}
    rows: list[Row] = []
    started = time.monotonic()
    from lumenrt.engine.engine import Engine, EngineConfig

    with tempfile.TemporaryDirectory(prefix="lumenrt-gpu-bench-") as tmp:
        repo = Path(tmp) / "repo"
        write_repository(torch, repo, models, list(VARIANTS))  # exported from the CPU modules
        for name, (module, shape, _) in models.items():
            for batch in args.batches:
                for fp16 in (False, True):
                    rows.append(guarded(
                        lambda: raw_row(torch, name, module, shape, batch, fp16, phase),  # noqa: B023
                        Row("raw", name, "fp16" if fp16 else "fp32", batch, 1),
                    ))  # fmt: skip
        serve_repo = Path(tmp) / "serve"
        serve_repo.mkdir()
        for name in models:
            for variant in args.serve_variants:
                shutil.copytree(repo / f"{name}_{variant}", serve_repo / f"{name}_{variant}")
        planned = list(plan_rows(args))
        with Engine(repo, EngineConfig(queue_type="mpmc")) as engine:
            for scenario, variant, batch, c in planned:
                if scenario.startswith("engine"):
                    clients = "threads" if scenario == "engine-threads" else "async"
                    for name, (_, shape, _) in models.items():
                        rows.append(guarded(
                            lambda: engine_row(engine, name, variant, shape, batch, c, phase, clients),  # noqa: B023
                            Row("engine", name, variant, batch, c, clients=clients),
                        ))  # fmt: skip
        serving = [p for p in planned if p[0].startswith("serve-")]
        if serving:
            with start_serve("--repository", str(serve_repo)) as server:
                urls = {"http": server.http_url, "tcp": f"127.0.0.1:{server.ports['tcp']}"}
                for scenario, variant, batch, c in serving:
                    protocol = scenario.removeprefix("serve-")
                    for name, (_, shape, _) in models.items():
                        rows.append(guarded(
                            lambda: serve_row(urls[protocol], protocol, name, variant, shape, batch, c, phase),  # noqa: B023
                            Row(scenario, name, variant, batch, c),
                        ))  # fmt: skip
    payload = {
        "benchmark": "gpu",
        "machine": machine_info(),
        "commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "config": {**vars(args), "phase": asdict(phase), "variants": VARIANTS, "max_batch_size": MAX_BATCH},
        "elapsed_s": round(time.monotonic() - started, 1),
        "rows": [asdict(r) for r in rows],
        "ratios": ratios(rows),
        "targets": targets(rows),
    }
    print_targets(payload["targets"])
    path = write_result(args.out, "gpu", payload)
    print(f"wrote {path}")
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
