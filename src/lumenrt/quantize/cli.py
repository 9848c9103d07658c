"""``lumenrt quantize MODEL --out FILE``: the arguments and the run (see the package's top for
the steps). Every argument is checked, input files from their headers, before anything is
quantized; a bad one is one line on stderr naming it, and exit status 2."""

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported for the run only: --help imports nothing of the command's own
    from lumenrt.quantize.calibration import Samples
    from lumenrt.quantize.model_source import ModelSource
    from lumenrt.quantize.quantizer import Settings

PROG = "lumenrt quantize"
DEFAULT_SECONDS = 2.0  # per model and batch size: 8 s of measuring in all, 4 turns of 0.5 s each
DEFAULT_THREADS = 1  # one intra-op thread: what a server worker gets on a core of its own


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (
        "examples:\n"
        "  lumenrt quantize builtin:digits_mlp --out digits_int8.onnx      dynamic; held out: the test digits\n"
        "  lumenrt quantize builtin:squeezenet --out squeezenet_int8.onnx --report sq.json\n"
        "  lumenrt quantize model.onnx --out model_int8.onnx --calibration calib/ --held-out test/\n"
        "\n"
        "Sample folders (--calibration, --held-out) hold one <input name>.npy per model input, samples\n"
        "stacked on axis 0, the same number in each; name, dtype and shape are checked against the model\n"
        "from the .npy headers before anything is read. builtin:NAME (squeezenet, digits_mlp) is a\n"
        "built-in model's own data: calibration from its training rows or from images of another seed,\n"
        "held out from its test rows (with labels: accuracy is reported) or its example images.\n"
        "Without --held-out, a --calibration folder is split: its last quarter is held out (dynamic\n"
        "quantization calibrates nothing, so there all of it is held out).\n"
        "\n"
        "The report: model sizes; p50/p99 latency and samples/s at batch 1 and at the preferred batch\n"
        "(--batch, else the model config's largest preferred_batch_size or its max_batch_size, else 8),\n"
        "both models in ONNX Runtime sessions set up as a server worker's, with the same threads, in\n"
        "alternating turns; on the held-out samples, top-1 agreement and max/mean absolute error of the\n"
        "scores output, and accuracy where there are labels. Exit status: 0 done, 2 a bad argument,\n"
        "1 quantizing or running failed.\n"
        "\n"
        "To serve the result: put it in a repository as <model>/1/model.onnx with the FP32 model's\n"
        "config.yaml, or `lumenrt serve --model-dir` a folder holding it as model.onnx. The built-in\n"
        "INT8 variants: `lumenrt serve --models digits_mlp_int8 squeezenet_int8 ...` (built on first use)."
    )
    p.add_argument(
        "model", metavar="MODEL", help="an ONNX model file, or builtin:NAME (squeezenet, digits_mlp)"
    )
    p.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="where to write the INT8 model (.onnx)"
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="FILE.json",
        help="also write the report as JSON (with machine and commit)",
    )
    how = p.add_argument_group("how to quantize (ONNX Runtime's quantize_dynamic / quantize_static)")
    how.add_argument(
        "--method",
        choices=("auto", "dynamic", "static"),
        default="auto",
        help="dynamic: weights INT8, activation ranges computed at run time, no calibration (MLPs, "
        "MatMul/Gemm graphs); static: QDQ format, activation ranges from --calibration (CNNs); "
        "auto (default): static when the graph has Conv or ConvTranspose, else dynamic",
    )
    how.add_argument(
        "--per-channel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one weight scale per output channel (default: on when the model's opset is >= 13, "
        "which QDQ's per-channel axis needs)",
    )
    how.add_argument(
        "--reduce-range",
        choices=("auto", "on", "off"),
        default="auto",
        help="7-bit weights, against the saturation of ONNX Runtime's uint8 x int8 kernels on x86 "
        "CPUs without VNNI; auto (default): on for those CPUs only",
    )
    how.add_argument(
        "--symbolic-shapes",
        action="store_true",
        help="pre-processing also runs ONNX Runtime's symbolic shape inference (for dimensions ONNX "
        "shape inference cannot follow; slower: it imports sympy)",
    )
    data = p.add_argument_group("samples (a folder of <input>.npy, or builtin:NAME)")
    data.add_argument(
        "--calibration",
        metavar="SOURCE",
        help="calibration samples for static quantization (default for builtin:NAME: its own); "
        "dynamic quantization calibrates nothing, and holds all of them out when --held-out is not given",
    )
    data.add_argument(
        "--calibration-samples",
        type=int,
        default=None,
        metavar="N",
        help="use at most N calibration samples (default 64)",
    )
    data.add_argument(
        "--held-out",
        metavar="SOURCE",
        help="samples to compare FP32 and INT8 on, never calibrated on (default for builtin:NAME: its "
        "own held-out set; else part of --calibration, see below)",
    )
    data.add_argument(
        "--held-out-samples",
        type=int,
        default=None,
        metavar="N",
        help="use at most N held-out samples (default: all; builtin:squeezenet makes 64 images)",
    )
    data.add_argument(
        "--output",
        metavar="NAME",
        help="the output to compare (default: the first floating-point output with a class axis)",
    )
    measure = p.add_argument_group("measuring")
    measure.add_argument(
        "--batch", type=int, metavar="N", help="the preferred batch to measure besides 1 (default: see below)"
    )
    measure.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        metavar="N",
        help=f"intra-op threads of both sessions (default {DEFAULT_THREADS})",
    )
    measure.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        metavar="S",
        help=f"measuring time per model and batch size (default {DEFAULT_SECONDS:g})",
    )


def run_from_args(args: argparse.Namespace) -> int:
    from lumenrt.quantize.errors import UsageError

    try:
        plan = _plan(args)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        report = _run(args, plan)
    except UsageError as exc:  # found only once the model runs (no output to compare)
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # ONNX Runtime's quantizer or session refusing the model: one line, not a trace
        print(f"{PROG}: failed: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    from lumenrt.quantize.report import format_table, write_report

    print(format_table(report))
    if args.report is not None:
        write_report(args.report, report)
    return 0


@dataclass(frozen=True, slots=True)
class Plan:
    source: "ModelSource"
    settings: "Settings"
    batch: int  # the preferred batch
    calibration: "Samples | None"  # None: dynamic (nothing calibrated)
    held_out: "Samples"


def _plan(args: argparse.Namespace) -> Plan:
    """Every argument checked and every sample set read (memory-mapped) before any work."""
    from lumenrt.quantize.calibration import CALIBRATION_SAMPLES, read_samples, split, whole_batches
    from lumenrt.quantize.errors import UsageError
    from lumenrt.quantize.model_source import BUILTIN_PREFIX, open_model, preferred_batch
    from lumenrt.quantize.quantizer import resolve_settings

    for flag in ("threads", "calibration_samples", "held_out_samples"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {value}: must be >= 1")
    if not args.seconds > 0:  # NaN too
        raise UsageError(f"--seconds {args.seconds:g}: must be > 0")
    source = open_model(args.model)
    out: Path = args.out
    if out.is_dir():
        raise UsageError(f"--out {out}: is a folder (give the INT8 model's file name)")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: the folder {out.parent} does not exist")
    if out.resolve() == source.path.resolve():
        raise UsageError(f"--out {out}: is MODEL itself (the FP32 model is needed for the report)")
    if args.report is not None and not args.report.parent.is_dir():
        raise UsageError(f"--report {args.report}: the folder {args.report.parent} does not exist")
    if args.output is not None and args.output not in source.outputs:
        raise UsageError(
            f"--output {args.output}: the model has no such output (it has {', '.join(source.outputs)})"
        )
    settings = resolve_settings(
        source, args.method, args.per_channel, args.reduce_range, args.symbolic_shapes
    )
    batch = preferred_batch(source, args.batch)
    own = BUILTIN_PREFIX + source.builtin if source.builtin else None
    calibration_source: str | None = args.calibration or own
    held_out_source: str | None = args.held_out or own
    static = settings.method == "static"
    if static and calibration_source is None:
        raise UsageError(
            f"--calibration: static quantization of {source.label} needs calibration samples "
            "(a folder of <input>.npy files, or builtin:NAME)"
        )
    if calibration_source is None and held_out_source is None:
        raise UsageError(
            "--held-out: needed to compare FP32 and INT8 (a folder of <input>.npy, or builtin:NAME)"
        )
    if (
        static
        and calibration_source is not None
        and held_out_source is not None
        and not calibration_source.startswith(BUILTIN_PREFIX)
        and Path(calibration_source).resolve() == Path(held_out_source).resolve()
    ):
        raise UsageError(
            f"--held-out {held_out_source}: the --calibration folder itself: agreement must be measured on "
            "other samples (leave --held-out out to hold out the folder's last quarter)"
        )
    cal_limit = args.calibration_samples or CALIBRATION_SAMPLES
    calibration = None
    if held_out_source is not None:
        held_out = read_samples(
            held_out_source, source.inputs, "--held-out", args.held_out_samples, held_out=True
        )
        if static:
            assert calibration_source is not None
            calibration = read_samples(
                calibration_source, source.inputs, "--calibration", cal_limit, held_out=False
            )
    else:  # a calibration folder only: part of it held out (all of it when nothing is calibrated)
        assert calibration_source is not None
        samples = read_samples(calibration_source, source.inputs, "--calibration", None, held_out=False)
        held_out = samples
        if static:
            calibration, held_out = split(samples, source.fixed_batch)
            calibration = calibration.take(0, cal_limit)
        if args.held_out_samples is not None:
            held_out = held_out.take(0, args.held_out_samples)
    fixed = source.fixed_batch
    if calibration is not None:
        calibration = whole_batches(calibration, fixed, "--calibration")
    return Plan(source, settings, batch, calibration, whole_batches(held_out, fixed, "--held-out"))


def _run(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    import numpy as np

    from lumenrt.quantize.agreement import compare, score_output
    from lumenrt.quantize.quantizer import quantize_model
    from lumenrt.quantize.report import build_report
    from lumenrt.quantize.timing import make_session, measure

    source, settings, batch = plan.source, plan.settings, plan.batch
    calibration, held_out = plan.calibration, plan.held_out
    _say(f"quantizing {source.label} ({settings.label})")
    start = time.perf_counter()
    preprocess = quantize_model(source.path, args.out, settings, calibration, source.fixed_batch)
    quantize_s = time.perf_counter() - start
    sessions = {
        name: make_session(path, args.threads, source.session_options, source.label)
        for name, path in (("fp32", source.path), ("int8", args.out))
    }
    output = score_output(sessions["fp32"].get_outputs(), args.output)
    _say(f"comparing on {held_out.count} held-out samples ({held_out.source})")
    agreement = compare(sessions["fp32"], sessions["int8"], held_out, output, batch)
    timings = {}
    for size in sorted({source.fixed_batch or 1, batch}):
        _say(f"measuring batch {size} ({args.seconds:g} s per model)")
        rows = np.arange(size) % held_out.count  # the held-out samples, repeated if fewer than the batch
        feed = {name: np.ascontiguousarray(array[rows]) for name, array in held_out.arrays.items()}
        timings[size] = measure(sessions, feed, args.seconds)
    return build_report(
        model=source.label,
        paths={"fp32": source.path, "int8": args.out},
        settings=settings,
        preprocess=preprocess,
        calibration=None if calibration is None else (calibration.source, calibration.count),
        agreement=agreement,
        timings=timings,
        threads=args.threads,
        seconds=args.seconds,
        quantize_s=quantize_s,
    )


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
