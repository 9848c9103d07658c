"""KServe's Python SDK against a running lumenrt serve: run by tests/e2e/test_kserve_sdk.py with the
interpreter of .venv-kserve (the SDK pins protobuf<7, which lumenrt's gRPC gencode cannot use), so
this file imports nothing from lumenrt.

    .venv-kserve/bin/python tests/e2e/kserve_client.py HTTP_URL GRPC_HOST:PORT MODEL

Prints one JSON object: what each call returned. The test asserts on it.
"""

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest
from kserve.inference_client import RESTConfig

# KServe's own e2e tests send the iris model FP32 [2, 4] as nested lists
DATA = [[6.8, 2.8, 4.8, 1.4], [6.0, 3.4, 4.5, 1.6]]


async def rest(url: str, model: str) -> dict[str, object]:
    out: dict[str, object] = {}
    async with InferenceRESTClient(RESTConfig(protocol="v2", retries=1, timeout=30)) as client:
        out["live"] = await client.is_server_live(url)
        out["ready"] = await client.is_server_ready(url)
        out["model_ready"] = await client.is_model_ready(url, model)
        nested = {"inputs": [{"name": "input-0", "shape": [2, 4], "datatype": "FP32", "data": DATA}]}
        res = await client.infer(url, nested, model_name=model)
        out["json"] = {o.name: [o.shape, o.datatype, o.data] for o in res.outputs}
        binary = InferInput("input-0", [2, 4], "FP32")
        binary.set_data_from_numpy(np.array(DATA, dtype=np.float32), binary_data=True)
        res = await client.infer(url, InferRequest(model, [binary]), model_name=model)
        out["binary"] = {o.name: [o.shape, o.datatype, o.as_numpy().tolist()] for o in res.outputs}
        try:
            await client.infer(
                url,
                {"inputs": [{"name": "nope", "shape": [1], "datatype": "FP32", "data": [1]}]},
                model_name=model,
            )
            out["bad_input"] = "accepted"
        except Exception as exc:  # the SDK raises httpx.HTTPStatusError with the server's text
            out["bad_input"] = f"{type(exc).__name__}: {exc}"
    return out


async def grpc(url: str, model: str) -> dict[str, object]:
    out: dict[str, object] = {}
    client = InferenceGRPCClient(url, timeout=30, retries=2)
    try:
        out["live"] = await client.is_server_live()
        out["ready"] = await client.is_server_ready()
        out["model_ready"] = await client.is_model_ready(model)
        tensor = InferInput("input-0", [2, 4], "FP32")
        tensor.set_data_from_numpy(np.array(DATA, dtype=np.float32))
        res = await client.infer(InferRequest(model, [tensor]))
        out["infer"] = {o.name: [o.shape, o.datatype, o.as_numpy().tolist()] for o in res.outputs}
    finally:
        await client.close()
    return out


async def main(http_url: str, grpc_url: str, model: str) -> None:
    print(json.dumps({"rest": await rest(http_url, model), "grpc": await grpc(grpc_url, model)}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
