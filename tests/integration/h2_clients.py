"""Hand-made HTTP/2 for the gRPC front end's tests: h2's client (an independent implementation)
over a blocking socket, and what a stream ended with."""

import socket
import time
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

from lumenrt.protocols import grpc_wire as wire

INFER = b"/inference.GRPCInferenceService/ModelInfer"


class RawH2:
    """h2's client over a blocking socket: what it sends is up to the test."""

    def __init__(self, port: int, **settings: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings({h2.settings.SettingCodes[k.upper()]: v for k, v in settings.items()})
        self.flush()
        self.closed = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def request(self, stream_id: int, path: bytes = INFER, content_type: bytes = b"application/grpc") -> None:
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path),
            (b":authority", b"127.0.0.1"),
            (b"content-type", content_type),
            (b"te", b"trailers"),
        ]
        self.conn.send_headers(stream_id, headers)
        self.flush()

    def events(self, done: Callable[[list[Any]], bool], timeout_s: float = 5.0) -> list[Any]:
        got: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while not done(got):
            if time.monotonic() > deadline:
                raise AssertionError(f"not done after {timeout_s}s: {got}")
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                self.closed = True
                break
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                got.append(event)
            self.flush()
        return got

    def close(self) -> None:
        self.sock.close()


def ended(stream_id: int) -> Callable[[list[Any]], bool]:
    return lambda events: any(
        isinstance(e, h2.events.StreamEnded | h2.events.StreamReset) and e.stream_id == stream_id
        for e in events
    )


def status_of(events: list[Any], stream_id: int) -> tuple[int, str]:
    """The grpc-status and grpc-message a stream ended with."""
    for e in events:
        if (
            isinstance(e, h2.events.ResponseReceived | h2.events.TrailersReceived)
            and e.stream_id == stream_id
        ):
            fields = dict(e.headers)
            if b"grpc-status" in fields:
                return int(fields[b"grpc-status"]), wire.decode_message_text(fields.get(b"grpc-message", b""))
    raise AssertionError(f"stream {stream_id} has no grpc-status in {events}")
