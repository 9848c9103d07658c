"""Large ModelInfer messages received straight into the model's arena slot by lumenrt's gRPC server
(ingress/grpc_body.py): the answer is the engine's, the inputs are adopted where they were received,
and the lent slot comes back on every path (answered, refused, rebuilt, client gone mid-message).
One server per worker mode, real loopback sockets, SqueezeNet's 600 KB input, through lumenrt's
client, tritonclient's and hand-made HTTP/2."""

import asyncio
from collections.abc import Iterator
from typing import Any

import h2.events
import numpy as np
import pytest
import tritonclient.grpc as tgrpc

from lumenrt.client.grpc import AsyncGrpcClient, GrpcClient, GrpcError, decode_infer
from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.ingress.app import ServeOptions, ServerThread
from lumenrt.models.builtin import builtin_examples
from lumenrt.protocols import grpc_wire as wire
from lumenrt.protocols.proto import grpc_service_pb2 as pb
from tests.integration.h2_clients import RawH2, ended, status_of
from tests.integration.slot_checks import slots_back, wait_for

MODEL = "squeezenet"


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    settings = EngineConfig(worker_mode=request.param, thread_count=1, pin=False)
    with (
        Engine(models=[MODEL], settings=settings) as engine,
        ServerThread(engine, ServeOptions(http_port=None, grpc_port=0, tcp_port=None)) as st,
    ):
        yield st


def _engine(server: ServerThread) -> Engine:
    return server.app.engine


def _image(seed: int = 0) -> np.ndarray:
    x = builtin_examples(MODEL, 1)["data"]
    return (x + np.float32(seed)).astype(np.float32)


def _message(x: np.ndarray, request_id: str = "") -> bytes:
    request = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "data", "FP32"
    tensor.shape.extend(x.shape)
    request.raw_input_contents.append(x.tobytes())
    return bytes(request.SerializeToString())


def _slots_back(server: ServerThread) -> bool:
    return slots_back(_engine(server).runtime(MODEL))


def test_messages_of_a_known_signature_are_received_in_their_slot_and_not_copied_again(
    server: ServerThread,
) -> None:
    engine = _engine(server)
    rt = engine.runtime(MODEL)
    with GrpcClient("127.0.0.1", server.ports["grpc"]) as client:
        client.infer(MODEL, {"data": _image()})  # the first of its signature: decoded whole, planned
        before = rt.inputs_in_place
        for seed in range(1, 4):
            x = _image(seed)
            expected = engine.infer(MODEL, {"data": x}).outputs["prob"]
            got = client.infer(MODEL, {"data": x}).outputs["prob"]
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert rt.inputs_in_place == before + 3  # each adopted where it was received (one frame from this client)
    wait_for(lambda: _slots_back(server))


def test_the_async_clients_concurrent_calls_are_received_in_their_slots(server: ServerThread) -> None:
    """Four calls at once on one connection, their frames interleaved, each sent unjoined
    (``writelines``) and received into a slot of its own."""
    engine = _engine(server)
    rt = engine.runtime(MODEL)
    images = [_image(seed) for seed in range(10, 14)]

    async def run() -> list[np.ndarray]:
        async with AsyncGrpcClient("127.0.0.1", server.ports["grpc"]) as client:
            await client.infer(MODEL, {"data": images[0]})  # the signature, planned
            answers = await asyncio.gather(*(client.infer(MODEL, {"data": x}) for x in images))
            return [a.outputs["prob"] for a in answers]

    before = rt.inputs_in_place
    got = asyncio.run(run())
    for x, prob in zip(images, got, strict=True):
        np.testing.assert_allclose(
            prob, engine.infer(MODEL, {"data": x}).outputs["prob"], rtol=1e-5, atol=1e-6
        )
    # each qualifies unless a read ends inside its first ~200 octets (its fields): rare, not never
    assert rt.inputs_in_place >= before + 3
    wait_for(lambda: _slots_back(server))


def test_tritonclient_messages_are_received_in_their_slot(server: ServerThread) -> None:
    engine = _engine(server)
    rt = engine.runtime(MODEL)
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    try:
        before = rt.inputs_in_place
        for seed in range(4):
            x = _image(seed)
            tensor = tgrpc.InferInput("data", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            got = client.infer(MODEL, [tensor]).as_numpy("prob")
            np.testing.assert_allclose(
                got, engine.infer(MODEL, {"data": x}).outputs["prob"], rtol=1e-5, atol=1e-6
            )
    finally:
        client.close()
    assert rt.inputs_in_place > before  # grpc's frames vary in size: most, not all, qualify
    wait_for(lambda: _slots_back(server))


def test_a_request_id_is_kept_apart_from_the_signature_and_echoed(server: ServerThread) -> None:
    rt = _engine(server).runtime(MODEL)
    x = _image(5)
    with GrpcClient("127.0.0.1", server.ports["grpc"]) as client:
        client.call("ModelInfer", _message(x), 30.0)  # the signature, planned
        before = rt.inputs_in_place
        for n in range(3):
            answer = pb.ModelInferResponse.FromString(
                client.call("ModelInfer", _message(x, f"req-{n}"), 30.0)
            )
            assert answer.id == f"req-{n}"
    assert rt.inputs_in_place == before + 3
    wait_for(lambda: _slots_back(server))


def test_octets_not_where_the_signature_puts_them_take_the_ordinary_path(server: ServerThread) -> None:
    """The raw contents' tag changed to field 8's (a field ModelInferRequest does not have): the
    message is rebuilt as sent, and protobuf's own reading of it is what is answered."""
    engine = _engine(server)
    rt = engine.runtime(MODEL)
    x = _image(6)
    good = _message(x)
    at = good.rindex(b"\x3a\x80\xe0\x24")  # raw_input_contents: tag 7, 602112 in three octets
    bad = good[:at] + b"\x42" + good[at + 1 :]
    with GrpcClient("127.0.0.1", server.ports["grpc"]) as client:
        client.call("ModelInfer", good, 30.0)
        before = rt.inputs_in_place
        with pytest.raises(GrpcError) as refused:
            client.call("ModelInfer", bad, 30.0)
        assert refused.value.code == wire.INVALID_ARGUMENT
        assert "raw_input_contents" in str(refused.value) or "data" in str(refused.value)
        answer = decode_infer(client.call("ModelInfer", good, 30.0))  # the connection goes on
        np.testing.assert_allclose(
            answer.outputs["prob"], engine.infer(MODEL, {"data": x}).outputs["prob"], rtol=1e-5, atol=1e-6
        )
    assert rt.inputs_in_place == before + 1  # the good one only
    wait_for(lambda: _slots_back(server))


def test_a_client_gone_mid_message_gives_its_slot_back(server: ServerThread) -> None:
    rt = _engine(server).runtime(MODEL)
    message = _message(_image(7))
    with GrpcClient("127.0.0.1", server.ports["grpc"]) as client:
        client.call("ModelInfer", message, 30.0)  # the signature, planned
    framed = wire.frame_prefix(len(message)) + message
    raw = RawH2(server.ports["grpc"])
    try:
        raw.request(1)
        for at in range(0, 3 * 16384, 16384):  # three frames of h2's default size, then gone
            raw.conn.send_data(1, framed[at : at + 16384])
        raw.flush()
        wait_for(lambda: rt.receiving == 1)  # lent while the message arrives
    finally:
        raw.close()
    wait_for(lambda: _slots_back(server))


def _arriving(server: ServerThread, rt: Any, framed: bytes) -> RawH2:
    """A call on a hand-made connection whose message's first 100,000 octets are sent (one frame:
    the server's SETTINGS allow it), once it was lent a slot of ``rt``."""
    raw = RawH2(server.ports["grpc"])
    raw.events(lambda got: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in got))
    raw.request(1)
    raw.conn.send_data(1, framed[:100_000])
    raw.flush()
    wait_for(lambda: rt.receiving == 1)
    return raw


def test_a_model_unloaded_while_its_message_arrives_answers_unavailable_and_serves_again() -> None:
    """The slot is revoked at close (the region unmaps), the call is answered UNAVAILABLE, and the
    model serves again once loaded. Process mode, where the region is unmapped at close; a server
    of its own: the reload starts workers."""
    settings = EngineConfig(worker_mode="process", thread_count=1, pin=False)
    with (
        Engine(models=[MODEL], settings=settings) as engine,
        ServerThread(engine, ServeOptions(http_port=None, grpc_port=0, tcp_port=None)) as server,
    ):
        service = server.app.service
        message = _message(_image(8))
        with GrpcClient("127.0.0.1", server.ports["grpc"]) as client:
            client.call("ModelInfer", message, 30.0)  # the signature, planned
        framed = wire.frame_prefix(len(message)) + message
        raw = _arriving(server, engine.runtime(MODEL), framed)
        try:
            service.unload(MODEL)  # closes the runtime: raises if the region could not unmap
            raw.conn.send_data(1, framed[100_000:], end_stream=True)
            raw.flush()
            code, text = status_of(raw.events(ended(1)), 1)
        finally:
            raw.close()
        assert code == wire.UNAVAILABLE and "unloaded" in text
        service.load(MODEL)
        rt = engine.runtime(MODEL)
        before = rt.inputs_in_place
        with GrpcClient("127.0.0.1", server.ports["grpc"]) as client:
            for _ in range(2):
                answer = decode_infer(client.call("ModelInfer", message, 30.0))
                assert answer.outputs["prob"].shape == (1, 1000)
        assert rt.inputs_in_place == before + 2  # the signature is still known: straight into the slot
        wait_for(lambda: _slots_back(server))


def test_a_server_shut_down_while_a_message_arrives_gives_its_slot_back() -> None:
    settings = EngineConfig(thread_count=1, pin=False)
    with Engine(models=[MODEL], settings=settings) as engine:
        rt = engine.runtime(MODEL)
        message = _message(_image(9))
        framed = wire.frame_prefix(len(message)) + message
        with ServerThread(engine, ServeOptions(http_port=None, grpc_port=0, tcp_port=None)) as server:
            with GrpcClient("127.0.0.1", server.ports["grpc"]) as client:
                client.call("ModelInfer", message, 30.0)  # the signature, planned
            raw = _arriving(server, rt, framed)
        raw.close()  # (h2's client takes GOAWAY as the connection's end: the answer is not read here)
        assert slots_back(rt)
