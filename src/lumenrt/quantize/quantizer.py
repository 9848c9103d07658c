"""One ONNX model to INT8 with ONNX Runtime's quantization tools.

Source of the choices below: ONNX Runtime's quantization guide,
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html

- Method (``auto``): static quantization in the QDQ format, calibrated on samples, for graphs with
  convolutions; dynamic quantization (activation ranges computed at run time, no calibration) for
  the rest, MLPs and other MatMul/Gemm graphs. The guide: dynamic for RNNs and transformers,
  static for CNNs.
- Types: activations uint8, weights int8 (U8S8). Measured here (SqueezeNet, batch 1, one thread,
  AMD EPYC with AVX2): 166 images/s U8S8, 125 U8U8, 63 S8S8, FP32 97.
- Reduce range (``auto``: on for x86-64 without VNNI): weights in 7 bits. There the U8S8 kernels
  use VPMADDUBSW, whose 16-bit sums can saturate (the guide's "When and why do I need to try
  U8U8?"). Measured on this machine (no VNNI): digits_mlp per-channel, max abs error 0.44 and
  99.1% top-1 agreement without it, 0.080 and 100% with; SqueezeNet 6% agreement without, 31% with.
- Per-channel (on where supported): one weight scale per output channel. QDQ carries it in
  QuantizeLinear's ``axis`` attribute, which needs opset 13.
- Pre-processing (``quant_pre_process``, which the guide asks for): ONNX Runtime's basic graph
  optimizations and ONNX shape inference, so the quantizer sees fused nodes and known shapes. Its
  symbolic shape inference runs only when asked (``symbolic_shapes``: for dimensions that ONNX
  shape inference cannot follow); it imports sympy, 2.8 s measured here. Should pre-processing
  fail, the model is quantized as it is and the outcome says so.
"""

import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumenrt.quantize.calibration import SampleReader, Samples
from lumenrt.quantize.errors import UsageError
from lumenrt.quantize.model_source import ModelSource

METHODS = ("auto", "dynamic", "static")
CONV_OPS = frozenset({"Conv", "ConvTranspose"})
PER_CHANNEL_MIN_OPSET = 13
_X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
_VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # /proc/cpuinfo names
# Calibration runs one sample a feed. Measured (64 SqueezeNet images): 1.5-2.0 s at batch 1 or 8
# alike, but a peak of 208 MB at batch 1 against 601 MB at batch 8. The calibrator keeps only each
# run's reduced ranges, so more samples cost time, not memory.
CALIBRATION_BATCH = 1


@dataclass(frozen=True, slots=True)
class Settings:
    method: str  # "dynamic" | "static" (QDQ)
    per_channel: bool
    reduce_range: bool
    symbolic_shapes: bool = False

    @property
    def label(self) -> str:
        words = ["static QDQ" if self.method == "static" else "dynamic", "U8S8"]
        words += ["per-channel" if self.per_channel else "per-tensor"]
        words += ["reduce-range"] if self.reduce_range else []
        return ", ".join(words)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "format": "QDQ" if self.method == "static" else "dynamic",
            "activation_type": "uint8",
            "weight_type": "int8",
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
            "symbolic_shapes": self.symbolic_shapes,
        }


def resolve_settings(
    source: ModelSource,
    method: str = "auto",
    per_channel: bool | None = None,
    reduce_range: str = "auto",
    symbolic_shapes: bool = False,
) -> Settings:
    """The settings for ``source``: ``auto`` and ``None`` decided as the top of this file says."""
    if method not in METHODS:
        raise UsageError(f"--method {method}: must be one of {', '.join(METHODS)}")
    if method == "auto":
        method = "static" if source.op_types & CONV_OPS else "dynamic"
    supported = source.opset >= PER_CHANNEL_MIN_OPSET
    if per_channel and not supported:
        raise UsageError(
            f"--per-channel: the model's opset is {source.opset}; per-channel scales need opset "
            f">= {PER_CHANNEL_MIN_OPSET} (give --no-per-channel)"
        )
    if reduce_range not in ("auto", "on", "off"):
        raise UsageError(f"--reduce-range {reduce_range}: must be auto, on or off")
    return Settings(
        method=method,
        per_channel=supported if per_channel is None else per_channel,
        reduce_range=needs_reduce_range() if reduce_range == "auto" else reduce_range == "on",
        symbolic_shapes=symbolic_shapes,
    )


def needs_reduce_range(machine: str | None = None, flags: frozenset[str] | None = None) -> bool:
    """x86 without VNNI (this machine's, unless given)."""
    machine = (machine or platform.machine()).lower()
    if machine not in _X86:
        return False
    return not ((cpu_flags() if flags is None else flags) & _VNNI_FLAGS)


def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def quantize_model(
    source: Path, out: Path, settings: Settings, calibration: Samples | None, fixed_batch: int | None
) -> str:
    """Write the INT8 model to ``out`` (complete or not at all: written beside it, then renamed).
    ``calibration`` is needed for the static method. Returns what pre-processing did."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    if settings.method == "static" and calibration is None:
        raise UsageError("--calibration: static quantization needs calibration samples")
    with tempfile.TemporaryDirectory(prefix="lumenrt-quantize-") as tmp:
        model_input, preprocess = _preprocess(source, Path(tmp) / "preprocessed.onnx", settings)
        fd, partial = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
        try:
            if settings.method == "dynamic":
                quantize_dynamic(
                    model_input,
                    partial,
                    per_channel=settings.per_channel,
                    reduce_range=settings.reduce_range,
                    weight_type=QuantType.QInt8,
                )
            else:
                assert calibration is not None
                quantize_static(
                    model_input,
                    partial,
                    SampleReader(calibration, fixed_batch or CALIBRATION_BATCH),
                    quant_format=QuantFormat.QDQ,
                    per_channel=settings.per_channel,
                    reduce_range=settings.reduce_range,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                )
            os.chmod(partial, 0o644)  # mkstemp makes it 0600; a model file is readable like the source
            os.replace(partial, out)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
    return preprocess


def _preprocess(source: Path, dest: Path, settings: Settings) -> tuple[str, str]:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(str(source), str(dest), skip_symbolic_shape=not settings.symbolic_shapes)
    except Exception as exc:  # whatever its optimizer or shape inference raise: quantize the model as it is
        return str(source), f"failed, quantized without it ({type(exc).__name__}: {exc})"
    done = "graph optimizations, ONNX shape inference"
    return str(dest), done + (", symbolic shape inference" if settings.symbolic_shapes else "")
