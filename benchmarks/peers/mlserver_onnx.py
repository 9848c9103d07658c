"""MLServer custom runtime: an ONNX model run by ONNX Runtime, for the MLServer peer of ``run.py``.

Runs under ``.venv-mlserver`` (mlserver, onnxruntime, numpy; never lumenrt). ``run.py`` writes, in a
temporary folder, ``settings.json`` (``parallel_workers: 2``, loopback ports) and one
``<model>/model-settings.json`` with ``"implementation": "mlserver_onnx.OnnxRuntimeModel"`` and
``parameters.uri`` = the ``model.onnx`` path, and starts ``mlserver start <folder>`` with this folder
on ``PYTHONPATH``.

Each MLServer inference worker (a process) loads its own session (``intra_op_num_threads`` from
``parameters.extra.intra_op_threads``, default 1; sequential execution). ``predict`` decodes every
input with the NumPy codec, runs the session on the worker's event loop (one inference at a time per
worker) and encodes every output back with the NumPy codec.
"""

from typing import Any

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64}


def _session(uri: str, intra_op_threads: int) -> Any:
    so = ort.SessionOptions()
    so.intra_op_num_threads = intra_op_threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(uri, sess_options=so, providers=["CPUExecutionProvider"])


class OnnxRuntimeModel(MLModel):  # type: ignore[misc]
    """One ONNX Runtime session per MLServer worker; KServe V2 tensors in and out."""

    async def load(self) -> bool:
        params = self.settings.parameters
        extra = (params.extra if params is not None else None) or {}
        uri = params.uri if params is not None else None
        if not uri:
            raise ValueError(f"model {self.name}: parameters.uri (the model.onnx path) is required")
        self._session = _session(str(uri), int(extra.get("intra_op_threads", 1)))
        self._input_dtypes = {n.name: _ORT_DTYPES[n.type] for n in self._session.get_inputs()}
        self._output_names = [n.name for n in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {
            i.name: np.asarray(NumpyCodec.decode_input(i), dtype=self._input_dtypes[i.name])
            for i in payload.inputs
        }
        results = self._session.run(self._output_names, feed)
        outputs = [NumpyCodec.encode_output(n, r) for n, r in zip(self._output_names, results, strict=True)]
        return InferenceResponse(model_name=self.name, model_version=self.version, outputs=outputs)
