"""A ModelInfer message received into a lent slot (ingress/grpc_body.py), fed in pieces of every
size: tensor bytes land at their aligned offsets, the other octets are kept and checked, the message
rebuilds exactly as sent (also when its octets are not where the signature puts them), and bytes
past its end are refused."""

import random
from typing import Any

import numpy as np
import pytest

from lumenrt.ingress.grpc_body import ALIGN, SlotMessage
from lumenrt.ingress.grpc_service import _Plan
from lumenrt.protocols import grpc_infer
from lumenrt.protocols import grpc_wire as wire
from lumenrt.protocols.proto import grpc_service_pb2 as pb


class Runtime:
    """What SlotMessage asks of a model's runtime: a slot's memory, and its return."""

    def __init__(self) -> None:
        self.memory = bytearray(1 << 20)
        self.returned: list[int] = []

    def receive_slot(self, payload_bytes: int) -> tuple[int, memoryview] | None:
        return 3, memoryview(self.memory)[:payload_bytes]

    def return_slot(self, slot: int) -> None:
        self.returned.append(slot)


def _message(arrays: list[np.ndarray], request_id: str = "") -> bytes:
    request = pb.ModelInferRequest(model_name="m", id=request_id)
    for i, a in enumerate(arrays):
        request.inputs.add(name=f"x{i}", datatype="FP32", shape=a.shape)
        request.raw_input_contents.append(a.tobytes())
    request.outputs.add(name="y")
    return bytes(request.SerializeToString())


def _plan(arrays: list[np.ndarray]) -> Any:
    inputs = tuple((f"x{i}", "FP32", np.dtype("<f4"), a.shape, a.nbytes) for i, a in enumerate(arrays))
    return _Plan("m", "", inputs, ["y"], None, False, 0)


def _lend(runtime: Runtime, message: bytes, arrays: list[np.ndarray]) -> SlotMessage:
    split = grpc_infer.split_head(message[:4096])
    assert split is not None
    _, request_id, at = split
    layout, length = grpc_infer.raw_layout(at, [a.nbytes for a in arrays])
    assert length == len(message)
    slot = SlotMessage.lend(runtime, _plan(arrays), request_id, message[:at], layout, length)
    assert slot is not None
    return slot


def _feed_in_pieces(slot: SlotMessage, message: bytes, seed: int) -> None:
    rng = random.Random(seed)
    at = 0
    while at < len(message):
        n = rng.choice([1, 2, 7, 100, 4096, 50_000])
        slot.feed(memoryview(message)[at : at + n])
        at += n


@pytest.mark.parametrize("seed", range(5))
def test_tensor_bytes_land_at_aligned_offsets_and_the_message_rebuilds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrays = [rng.random(n, dtype=np.float32) for n in (3, 1000, 20_000)]
    message = _message(arrays, "id-7")
    runtime = Runtime()
    slot = _lend(runtime, message, arrays)
    assert slot.request_id == "id-7"
    _feed_in_pieces(slot, message, seed)
    assert slot.complete and slot.as_expected
    for a, offset in zip(arrays, slot.offsets, strict=True):
        assert offset % ALIGN == 0
        got = np.frombuffer(slot.payload[offset : offset + a.nbytes], np.float32)
        np.testing.assert_array_equal(got, a)
    assert slot.rebuild() == message
    slot.release()
    slot.release()  # once only
    assert runtime.returned == [3]


def test_octets_the_signature_does_not_expect_are_noticed_and_kept_as_sent() -> None:
    arrays = [np.arange(5000, dtype=np.float32)]
    message = _message(arrays)
    runtime = Runtime()
    slot = _lend(runtime, message, arrays)
    at = message.rindex(b"\x3a\xa0\x9c\x01")  # tag 7 and 20000 as a varint
    odd = message[:at] + b"\x42" + message[at + 1 :]  # field 8's tag instead
    _feed_in_pieces(slot, odd, 1)
    assert slot.complete and not slot.as_expected
    assert slot.rebuild() == odd


def test_octets_past_the_message_are_a_second_message() -> None:
    arrays = [np.ones(100, dtype=np.float32)]
    message = _message(arrays)
    slot = _lend(Runtime(), message, arrays)
    with pytest.raises(wire.GrpcWireError) as refused:
        slot.feed(memoryview(message + b"\0"))
    assert refused.value.code == wire.UNIMPLEMENTED


def test_a_message_cut_short_is_not_complete() -> None:
    arrays = [np.ones(100, dtype=np.float32)]
    message = _message(arrays)
    slot = _lend(Runtime(), message, arrays)
    slot.feed(memoryview(message)[:-1])
    assert not slot.complete
