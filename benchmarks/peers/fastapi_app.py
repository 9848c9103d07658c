"""A plain FastAPI endpoint around ONNX Runtime: the "no serving framework" peer of ``run.py``.

Runs under ``.venv-fastapi`` (fastapi, uvicorn[standard], onnxruntime, numpy; never lumenrt)::

    PEERS_FASTAPI_MODELS=squeezenet=/path/model.onnx[,digits_mlp=/path/model.onnx] \\
        .venv-fastapi/bin/python -m uvicorn fastapi_app:app --app-dir benchmarks/peers \\
        --host 127.0.0.1 --port 8000 --workers 2 --no-access-log

``POST /predict/{model}``: the body is the model's single input for batch 1 as raw little-endian bytes
(application/octet-stream); the answer is its first output's raw little-endian bytes. A body of the wrong
size is a 400, an unknown model a 404. ``GET /ready`` is 200 once this worker has loaded its models.

Each uvicorn worker is a process with one ONNX Runtime session per model (``intra_op_num_threads=1``,
sequential execution) and runs one inference at a time: the handler is ``async`` and calls the session
on the event loop, so two workers use the two cores as lumenrt's two workers do. No batching.
"""

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, HTTPException, Request, Response

MODELS_ENV = "PEERS_FASTAPI_MODELS"  # name=path[,name=path...]
THREADS_ENV = "PEERS_INTRA_OP_THREADS"  # default 1

_ORT_DTYPES = {
    "tensor(float)": "<f4",
    "tensor(double)": "<f8",
    "tensor(int64)": "<i8",
    "tensor(int32)": "<i4",
}


@dataclass(frozen=True)
class Served:
    session: Any
    input_name: str
    input_dtype: np.dtype[Any]
    input_shape: tuple[int, ...]  # batch 1 included
    input_bytes: int
    output_name: str


def _session(path: str, intra_op_threads: int) -> Any:
    so = ort.SessionOptions()
    so.intra_op_num_threads = intra_op_threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])


def _served(path: str, intra_op_threads: int) -> Served:
    session = _session(path, intra_op_threads)
    (node,) = session.get_inputs()  # the endpoint takes exactly one input
    dtype = np.dtype(_ORT_DTYPES[node.type])
    shape = (1, *(int(d) if isinstance(d, int) and d > 0 else 1 for d in list(node.shape)[1:]))
    size_bytes = int(np.prod(shape)) * dtype.itemsize
    output = session.get_outputs()[0].name
    session.run([output], {node.name: np.zeros(shape, dtype=dtype)})  # warm up
    return Served(session, node.name, dtype, shape, size_bytes, output)


def _load_models() -> dict[str, Served]:
    spec = os.environ.get(MODELS_ENV, "")
    threads = int(os.environ.get(THREADS_ENV, "1"))
    models: dict[str, Served] = {}
    for item in filter(None, spec.split(",")):
        name, _, path = item.partition("=")
        models[name] = _served(path, threads)
    return models


MODELS = _load_models()
app = FastAPI(title="peers fastapi", docs_url=None, redoc_url=None, openapi_url=None)


@app.get("/ready")
async def ready() -> Response:
    return Response(status_code=200 if MODELS else 503)


@app.post("/predict/{model}")
async def predict(model: str, request: Request) -> Response:
    served = MODELS.get(model)
    if served is None:
        raise HTTPException(status_code=404, detail=f"unknown model {model!r}")
    body = await request.body()
    if len(body) != served.input_bytes:
        raise HTTPException(
            status_code=400, detail=f"body must be {served.input_bytes} bytes, got {len(body)}"
        )
    x = np.frombuffer(body, dtype=served.input_dtype).reshape(served.input_shape)
    (out,) = served.session.run([served.output_name], {served.input_name: x})
    data = np.ascontiguousarray(out, dtype=out.dtype.newbyteorder("<")).tobytes()
    return Response(content=data, media_type="application/octet-stream")
