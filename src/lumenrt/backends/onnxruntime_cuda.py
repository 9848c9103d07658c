"""An ONNX model as a GPU instance's program, on ONNX Runtime's CUDAExecutionProvider.

Needs ``onnxruntime-gpu`` in place of ``onnxruntime`` (``OnnxRuntimeBackend.check_gpu`` says so
before any device is opened). The session runs on the instance's own compute stream
(``user_compute_stream``), its nodes that CUDA lacks on the CPU provider. Inputs and outputs are
bound (IO binding) to the instance's device staging buffers, so ONNX Runtime copies nothing: the
pipeline's own copies move the batch between the pinned host buffers and those (pipeline.py).
A binding is made per staging set and row count on first use and kept (at most 2 x
max_batch_size of them). ``disable_synchronize_execution_providers`` keeps ``run`` from waiting
for the stream: it returns once the work is enqueued.

Imported only when a GPU instance of an ONNX model loads (``OnnxRuntimeBackend.load_gpu``).
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnxruntime as ort

from lumenrt.engine.config import ConfigError, ModelConfig
from lumenrt.protocols import dtypes

CUDA_PROVIDER = "CUDAExecutionProvider"


def check_cuda_provider(config: ModelConfig) -> None:
    """ConfigError naming onnxruntime-gpu when this onnxruntime has no CUDA provider."""
    available = ort.get_available_providers()
    if CUDA_PROVIDER in available:
        return
    field = (
        "optimization.execution_accelerators.gpu_execution_accelerator[0].name"
        if config.gpu.accelerator
        else "instance_group"
    )
    raise ConfigError(
        config.source or config.name,
        field,
        f"KIND_GPU instances of an ONNX model run on ONNX Runtime's {CUDA_PROVIDER}, which this "
        f"onnxruntime {ort.__version__} lacks (it has {', '.join(available)}): install onnxruntime-gpu "
        "in its place (pip uninstall onnxruntime; pip install onnxruntime-gpu)",
    )


class OrtCudaProgram:
    """One GPU instance's session. Owns ``session``."""

    def __init__(
        self, model_path: Path, config: ModelConfig, so: Any, device_index: int, stream_handle: int
    ) -> None:
        """``so``: the backend's SessionOptions for the model (onnxruntime_backend.session_options)."""
        source = config.source or str(model_path)
        cuda = {"device_id": str(device_index), "user_compute_stream": str(stream_handle)}
        self.session: Any = ort.InferenceSession(
            str(model_path), sess_options=so, providers=[(CUDA_PROVIDER, cuda), "CPUExecutionProvider"]
        )
        if CUDA_PROVIDER not in self.session.get_providers():
            raise ConfigError(
                source, "instance_group", f"ONNX Runtime did not enable {CUDA_PROVIDER} for this model"
            )
        self.device_index = device_index
        self.dtypes = {s.name: dtypes.to_numpy(s.datatype) for s in (*config.inputs, *config.outputs)}
        self.options = ort.RunOptions()
        self.options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        self._bindings: dict[tuple[int, tuple[int, ...]], Any] = {}
        self.weight_bytes = 0  # ORT's CUDA allocator holds them: counted in the device's figures

    def run(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        session = self.session
        if session is None:
            raise RuntimeError("onnxruntime GPU program used after close()")
        first = next(iter(inputs.values()))
        key = (int(first.data_ptr()), tuple(first.shape))
        binding = self._bindings.get(key)
        if binding is None:
            binding = self._bindings[key] = self._bind(session, inputs, outputs)
        session.run_with_iobinding(binding, self.options)

    def _bind(self, session: Any, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> Any:
        binding = session.io_binding()
        for name, view in inputs.items():
            binding.bind_input(
                name, "cuda", self.device_index, self.dtypes[name], list(view.shape), int(view.data_ptr())
            )
        for name, view in outputs.items():
            binding.bind_output(
                name, "cuda", self.device_index, self.dtypes[name], list(view.shape), int(view.data_ptr())
            )
        return binding

    def close(self) -> None:
        self._bindings.clear()
        self.session = None


def stream_handle(stream: Any) -> int:
    """The CUDA stream's handle (a torch.cuda.Stream's ``cuda_stream``)."""
    handle = getattr(stream, "cuda_stream", None)
    if not isinstance(handle, int):
        raise TypeError(f"an ONNX model's GPU instance needs a CUDA stream, got {type(stream).__name__}")
    return handle
