"""The real ``tritonclient.http`` sending compressed requests (``request_compression_algorithm``) and
asking for compressed answers: lumenrt decodes gzip and deflate bodies, JSON and binary alike, and
answers identity-coded, which tritonclient reads as it is."""

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from lumenrt.models.builtin import builtin_examples
from tests.e2e.conftest import ServeProcess


@pytest.fixture(scope="module")
def client(served: ServeProcess) -> Iterator[Any]:
    c = httpclient.InferenceServerClient(served.http_url)
    yield c
    c.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_requests_infer_like_plain_ones(client: Any, coding: str, binary: bool) -> None:
    x = builtin_examples("digits_mlp", 3)["input"]
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("probabilities", binary_data=binary)]
    plain = client.infer("digits_mlp", [inp], outputs=outputs)
    packed = client.infer(
        "digits_mlp",
        [inp],
        outputs=outputs,
        request_compression_algorithm=coding,
        response_compression_algorithm=coding,  # a preference: the answer comes identity-coded
    )
    np.testing.assert_array_equal(packed.as_numpy("probabilities"), plain.as_numpy("probabilities"))
    assert packed.as_numpy("probabilities").shape == (3, 10)
