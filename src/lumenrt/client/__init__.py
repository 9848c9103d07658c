"""Python clients of a lumenrt server: the binary TCP protocol (lowest latency) and KServe V2
HTTP (binary tensor extension, JSON fallback). They need only the standard library and numpy.

    from lumenrt.client import TcpClient
    with TcpClient("127.0.0.1", 8003) as client:
        client.infer("digits_mlp", {"input": x}).outputs["label"]
"""

from lumenrt.client.errors import InferenceError
from lumenrt.client.http import AsyncHttpClient, HttpClient
from lumenrt.client.result import InferResult
from lumenrt.client.tcp import AsyncTcpClient, TcpClient

__all__ = ["AsyncHttpClient", "AsyncTcpClient", "HttpClient", "InferResult", "InferenceError", "TcpClient"]
