"""Triton Inference Server (via PyTriton) serving one ONNX model with ONNX Runtime: a benchmark peer.

Standalone script: it imports only the standard library, numpy, onnxruntime and pytriton (never lumenrt),
because it runs under the separate ``.venv-triton`` interpreter::

    .venv-triton/bin/python benchmarks/triton_peer.py --model-path PATH/model.onnx \\
        --http-port 8000 --grpc-port 8001 [--model-name squeezenet] [--sessions 2] [--max-batch 8] \\
        [--preferred-batch-sizes [N ...]] [--max-queue-delay-us 2000]

It serves the model under ``--model-name`` (default ``squeezenet``) with dynamic batching and one ONNX
Runtime session per model instance (``intra_op_num_threads=1`` each). Inputs and outputs (names,
datatypes, dims) are read from the ONNX file, whose first dimension must be the batch: for the built-in
SqueezeNet that is input ``data`` FP32 [3,224,224] and output ``prob`` FP32 [1000]; for ``digits_mlp``
input ``input`` FP32 [64] and outputs ``probabilities`` FP32 [10] and ``label`` INT64 (a per-item scalar,
served with dims [1] because a Triton tensor needs at least one dimension). Preferred batch sizes are 4
and 8 (those up to ``--max-batch``) unless ``--preferred-batch-sizes`` lists others (none: no preference). HTTP and gRPC bind to 127.0.0.1; Triton's metrics endpoint is off
unless ``--metrics-port`` is given. Token-protected endpoints (statistics and others) are opened with
``TritonSecurityConfig(restricted_endpoints=[])`` so perf_analyzer can read server statistics.

Prints ``READY http=<port> grpc=<port>`` (flushed) once it serves; tritonserver's own log also goes to
stdout unless ``--triton-log-file`` is given, so scan for the line. Stops cleanly on SIGTERM/SIGINT
(about 5 s: PyTriton stops the server and its Python-backend stubs, removes its workspace and shared memory).

PyTriton's Python backend stub links against libpython; unless this interpreter's own library folder
(``sysconfig.get_config_var("LIBDIR")``) comes first on ``LD_LIBRARY_PATH`` the stub may load a different
system libpython and fail, so the script re-executes itself with that folder prepended.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import signal
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np

MODEL_NAME = "squeezenet"
INPUT_NAME = "data"
OUTPUT_NAME = "prob"
_REEXEC_MARKER = "LUMENRT_TRITON_PEER_REEXEC"

# ONNX Runtime's type strings -> numpy dtypes (the ones the benchmark models use, and their kin)
_ORT_DTYPES: dict[str, type[np.generic]] = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as Triton serves it: dims without the batch dimension."""

    name: str
    dtype: type[np.generic]
    dims: tuple[int, ...]


def _spec_from_node(node: Any) -> TensorSpec:
    """A TensorSpec from an ONNX Runtime NodeArg (``name``, ``type``, ``shape`` with the batch first)."""
    dtype = _ORT_DTYPES.get(str(node.type))
    if dtype is None:
        raise SystemExit(f"triton_peer: tensor {node.name!r} has unsupported type {node.type}")
    dims = tuple(int(d) if isinstance(d, int) and d > 0 else -1 for d in list(node.shape)[1:])
    return TensorSpec(str(node.name), dtype, dims or (1,))


def model_io(session: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs and outputs of an ONNX Runtime session, as Triton tensors."""
    return [_spec_from_node(n) for n in session.get_inputs()], [
        _spec_from_node(n) for n in session.get_outputs()
    ]


def preferred_batch_sizes(max_batch: int, chosen: Sequence[int] | None) -> list[int]:
    """``chosen`` (those up to ``max_batch``), else 4 and 8 where they fit, else ``max_batch``."""
    if chosen is not None:
        return [b for b in chosen if 0 < b <= max_batch]
    return [b for b in (4, 8) if b <= max_batch] or [max_batch]


def _ensure_libdir_first() -> None:
    """Re-exec this script with the interpreter's LIBDIR first on LD_LIBRARY_PATH (once)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if not isinstance(libdir, str) or not libdir:
        return
    parts = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if parts and parts[0] == libdir:
        return
    if os.environ.get(_REEXEC_MARKER) == "1":  # already re-executed once; do not loop
        return
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([libdir, *(p for p in parts if p != libdir)])
    env[_REEXEC_MARKER] = "1"
    script = os.path.abspath(__file__)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, script, *sys.argv[1:]], env)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model-path", required=True, help="path to the model.onnx (default: SqueezeNet's)")
    p.add_argument("--model-name", default=MODEL_NAME, help=f"served model name (default {MODEL_NAME})")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=0, help="enable Triton metrics on this port (0: off)")
    p.add_argument("--sessions", type=int, default=2, help="model instances, one ORT session each")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument(
        "--preferred-batch-sizes",
        type=int,
        nargs="*",
        default=None,
        metavar="N",
        help="dynamic batcher's preferred sizes (default: 4 and 8 up to --max-batch; none given: none)",
    )
    p.add_argument("--max-queue-delay-us", type=int, default=2000)
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--triton-log-file", default=None, help="write tritonserver's log here (default: stdout)")
    p.add_argument("--verbose", action="store_true", help="PyTriton debug logging")
    return p.parse_args(argv)


def _make_session(model_path: str, intra_op_threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = intra_op_threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])


def _make_infer_fn(
    session: Any, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> Callable[..., dict[str, np.ndarray]]:
    """Triton's batched infer function over ``session``; outputs reshaped to [batch, *dims]."""
    warm = {t.name: np.zeros((1, *(max(d, 1) for d in t.dims)), dtype=t.dtype) for t in inputs}
    session.run(None, warm)  # warm up
    names = [t.name for t in outputs]

    def infer(**feed: np.ndarray) -> dict[str, np.ndarray]:
        x = {t.name: np.ascontiguousarray(feed[t.name], dtype=t.dtype) for t in inputs}
        results = session.run(names, x)
        return {
            t.name: np.asarray(r, dtype=t.dtype).reshape(len(r), *t.dims)
            for t, r in zip(outputs, results, strict=True)
        }

    return infer


def main(argv: list[str] | None = None) -> int:
    _ensure_libdir_first()
    args = _parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
    )

    from pytriton.decorators import batch  # type: ignore[import-not-found]
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # type: ignore[import-not-found]
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig  # type: ignore[import-not-found]

    preferred = preferred_batch_sizes(args.max_batch, args.preferred_batch_sizes)
    sessions = [_make_session(args.model_path, args.intra_op_threads) for _ in range(max(1, args.sessions))]
    inputs, outputs = model_io(sessions[0])
    infer_fns: list[Any] = [batch(_make_infer_fn(s, inputs, outputs)) for s in sessions]
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        allow_metrics=args.metrics_port > 0,
        allow_gpu_metrics=False,
        metrics_address="127.0.0.1",
        metrics_port=args.metrics_port if args.metrics_port > 0 else None,
        exit_timeout_secs=5,
        log_file=pathlib.Path(args.triton_log_file) if args.triton_log_file else None,
    )
    model_config = ModelConfig(
        batching=True,
        max_batch_size=args.max_batch,
        batcher=DynamicBatcher(
            max_queue_delay_microseconds=args.max_queue_delay_us,
            preferred_batch_size=preferred or None,
        ),
    )

    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    triton = Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[]))
    try:
        triton.bind(
            model_name=args.model_name,
            infer_func=infer_fns,
            inputs=[Tensor(name=t.name, dtype=t.dtype, shape=t.dims) for t in inputs],
            outputs=[Tensor(name=t.name, dtype=t.dtype, shape=t.dims) for t in outputs],
            config=model_config,
            strict=True,
        )
        triton.run()
        print(f"READY http={args.http_port} grpc={args.grpc_port} model={args.model_name}", flush=True)
        while not stop.wait(timeout=1.0):
            if not triton.is_alive():
                print("triton_peer: Triton server or model proxy died", file=sys.stderr, flush=True)
                return 1
        return 0
    finally:
        triton.stop()


if __name__ == "__main__":
    sys.exit(main())
