"""The HTTP/2 session (protocols/http2.py) with no sockets: against the ``h2`` package's client (an
independent implementation), against itself in both roles, and fed hand-made frames for every
rule it enforces."""

import struct
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from lumenrt.protocols import http2
from lumenrt.protocols.hpack import encode_block
from lumenrt.protocols.http2 import (
    CONNECTION_WINDOW,
    DATA,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    H2Session,
    H2Stream,
    LocalSettings,
    frame_header,
    settings_frame,
)

REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/pkg.Svc/Call"),
    (b":authority", b"localhost"),
    (b"content-type", b"application/grpc"),
]
BLOCK = encode_block(REQUEST)


class Recorder(H2Session):
    """A session that keeps what its hooks are told."""

    def __init__(self, client: bool = False, local: LocalSettings | None = None) -> None:
        self.out: list[bytes] = []
        super().__init__(client, self.out.append, local)
        self.events: list[tuple[Any, ...]] = []

    def on_headers(self, stream: H2Stream, fields: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        stream.call = stream.call or "call"
        self.events.append(("headers", stream.id, list(fields), end_stream))

    def on_data(self, stream: H2Stream, data: memoryview, end_stream: bool) -> None:
        self.events.append(("data", stream.id, bytes(data), end_stream))

    def on_reset(self, stream: H2Stream, code: int) -> None:
        self.events.append(("reset", stream.id, code))

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.events.append(("goaway", last_stream_id, code))

    def on_error(self, code: int, message: str) -> None:
        self.events.append(("error", code, message))

    def take(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in ``data``."""
    out, at = [], 0
    while at < len(data):
        hi, lo, kind, flags, stream = struct.unpack_from(">BHBBL", data, at)
        length = (hi << 16) | lo
        out.append((kind, flags, stream & 0x7FFFFFFF, data[at + 9 : at + 9 + length]))
        at += 9 + length
    return out


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return frame_header(len(payload), kind, flags, stream) + payload


def started_server(local: LocalSettings | None = None) -> Recorder:
    """A server session past the handshake, its output taken."""
    server = Recorder(local=local)
    server.initiate()
    server.receive(PREFACE + settings_frame([]))
    server.take()
    return server


def goaway_code(data: bytes) -> int:
    (kind, _, _, payload), *_ = [f for f in frames(data) if f[0] == GOAWAY]
    assert kind == GOAWAY
    return int(struct.unpack(">LL", payload[:8])[1])


# ---- against h2's client ---------------------------------------------------------------------------


def h2_client(**settings: int) -> h2.connection.H2Connection:
    """h2's client, its SETTINGS named as keywords (``initial_window_size=100``)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    if settings:
        conn.update_settings({h2.settings.SettingCodes[k.upper()]: v for k, v in settings.items()})
    return conn


def exchange(server: Recorder, client: h2.connection.H2Connection) -> list[Any]:
    """Move bytes both ways until neither has more; the client's events."""
    events: list[Any] = []
    for _ in range(20):
        to_server = client.data_to_send()
        if to_server:
            server.receive(to_server)
        to_client = server.take()
        if to_client:
            events += client.receive_data(to_client)
        if not to_server and not to_client:
            return events
    raise AssertionError("the exchange did not settle")


def test_a_call_from_h2s_client_and_the_answer_back() -> None:
    server, client = Recorder(), h2_client()
    server.initiate()
    exchange(server, client)
    client.send_headers(1, REQUEST)
    client.send_data(1, b"hello", end_stream=True)
    exchange(server, client)
    assert server.events == [("headers", 1, REQUEST, False), ("data", 1, b"hello", True)]
    stream = server.streams[1]
    head = encode_block([(b":status", b"200")])
    server.send(stream, head, b"world", encode_block([(b"grpc-status", b"0")]))
    events = exchange(server, client)
    kinds = [type(e) for e in events]
    assert kinds == [
        h2.events.ResponseReceived,
        h2.events.DataReceived,
        h2.events.TrailersReceived,
        h2.events.StreamEnded,
    ]
    assert events[1].data == b"world"
    assert events[2].headers == [(b"grpc-status", b"0")]
    assert 1 not in server.streams  # both sides ended it


def test_bytes_fed_one_at_a_time_give_the_same_events() -> None:
    client = h2_client()
    client.send_headers(1, REQUEST)
    client.send_data(1, b"x" * 100, end_stream=True)
    data = client.data_to_send()
    whole, pieces = Recorder(), Recorder()
    whole.receive(data)
    for i in range(len(data)):
        pieces.receive(data[i : i + 1])
    assert pieces.events == whole.events
    assert pieces.events[-1] == ("data", 1, b"x" * 100, True)


def test_answers_wait_for_the_peers_window_and_trailers_wait_behind_them() -> None:
    server, client = Recorder(), h2_client(initial_window_size=100)
    server.initiate()
    exchange(server, client)
    client.send_headers(1, REQUEST, end_stream=True)
    exchange(server, client)
    server.send(
        server.streams[1], encode_block([(b":status", b"200")]), b"a" * 1000, encode_block([(b"x", b"y")])
    )
    events = exchange(server, client)
    got = sum(len(e.data) for e in events if isinstance(e, h2.events.DataReceived))
    assert got == 100
    assert not any(isinstance(e, h2.events.TrailersReceived) for e in events)
    for _ in range(20):  # the client reads and opens the window, 100 octets at a time
        for e in events:
            if isinstance(e, h2.events.DataReceived):
                client.acknowledge_received_data(e.flow_controlled_length, 1)
        events = exchange(server, client)
        got += sum(len(e.data) for e in events if isinstance(e, h2.events.DataReceived))
        if any(isinstance(e, h2.events.TrailersReceived) for e in events):
            break
    assert got == 1000
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)


def test_data_is_split_at_the_peers_frame_size() -> None:
    server, client = Recorder(), h2_client()
    server.initiate()
    exchange(server, client)
    client.send_headers(1, REQUEST, end_stream=True)
    exchange(server, client)
    server.conn_send_window = server.streams[1].send_window = 100_000  # as if the peer had opened them
    server.send(server.streams[1], None, b"d" * 40_000, None)
    sizes = [len(p) for kind, _, _, p in frames(server.take()) if kind == DATA]
    assert sizes == [16384, 16384, 40_000 - 2 * 16384]


def test_a_lowered_header_table_size_is_acknowledged_in_the_next_block() -> None:
    server, client = Recorder(), h2_client(header_table_size=0)
    server.initiate()
    exchange(server, client)
    client.send_headers(1, REQUEST, end_stream=True)
    exchange(server, client)
    server.send(server.streams[1], encode_block([(b":status", b"200"), (b"grpc-status", b"0")]))
    events = exchange(server, client)  # h2 insists on the size update first
    assert isinstance(events[0], h2.events.ResponseReceived)
    assert events[0].headers == [(b":status", b"200"), (b"grpc-status", b"0")]


def test_h2_client_gets_refused_stream_past_the_limit() -> None:
    server = Recorder(local=LocalSettings(max_concurrent_streams=2))
    client = h2_client()
    server.initiate()
    exchange(server, client)
    client.local_settings.max_concurrent_streams = 100
    client.remote_settings.acknowledge()
    for stream_id in (1, 3):
        client.send_headers(stream_id, REQUEST)
    exchange(server, client)
    raw = frame(HEADERS, http2.END_HEADERS, 5, BLOCK)  # h2 itself keeps to the limit: by hand
    server.receive(raw)
    (kind, _, stream, payload), *_ = frames(server.take())
    assert (kind, stream, struct.unpack(">L", payload)[0]) == (RST_STREAM, 5, http2.REFUSED_STREAM)
    server.receive(frame(HEADERS, http2.END_HEADERS, 7, encode_block([(b":path", b"/again")])))
    assert server.events[-1][2] != [(b":path", b"/again")]  # refused too (still two open) ...
    server.receive(frame(RST_STREAM, 0, 1, struct.pack(">L", 8)))
    server.receive(frame(HEADERS, http2.END_HEADERS, 9, BLOCK))
    assert server.events[-1] == ("headers", 9, REQUEST, False)  # ... and HPACK stayed in step


# ---- our client session against our server session (both roles) --------------------------------


def test_our_client_and_server_sessions_complete_calls_and_goaway() -> None:
    server, client = Recorder(), Recorder(client=True)
    server.initiate()
    client.initiate()

    def pump() -> None:
        for _ in range(10):
            a, b = client.take(), server.take()
            if a:
                server.receive(a)
            if b:
                client.receive(b)
            if not a and not b:
                return

    pump()
    first, second = client.open_stream(), client.open_stream()
    assert (first.id, second.id) == (1, 3)
    client.send(first, BLOCK, b"one")
    pump()
    server.goaway()  # takes no stream after 1
    client.send(second, BLOCK, b"two")
    pump()
    assert ("goaway", 1, 0) in client.events
    assert [e[1] for e in server.events if e[0] == "headers"] == [1]  # stream 3 was ignored
    server.send(server.streams[1], encode_block([(b":status", b"200")]), b"ok", encode_block([(b"a", b"b")]))
    pump()
    assert ("data", 1, b"ok", False) in client.events
    assert client.events[-1] == ("headers", 1, [(b"a", b"b")], True)


# ---- frame by frame ---------------------------------------------------------------------------------


def test_a_bad_preface_ends_the_connection() -> None:
    server = Recorder()
    server.receive(b"GET / HTTP/1.1\r\n\r\n")
    assert server.closed
    assert goaway_code(server.take()) == http2.PROTOCOL_ERROR
    server.receive(PREFACE)  # nothing more is read
    assert server.take() == b""


def test_the_first_frame_must_be_settings() -> None:
    server = Recorder()
    server.receive(PREFACE + frame(PING, 0, 0, b"12345678"))
    assert goaway_code(server.take()) == http2.PROTOCOL_ERROR


def test_a_frame_over_our_limit_ends_the_connection_before_its_payload_arrives() -> None:
    server = started_server()
    server.receive(frame_header(LocalSettings().max_frame_size + 1, DATA, 0, 1))  # the header alone
    assert goaway_code(server.take()) == http2.FRAME_SIZE_ERROR


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (frame(DATA, 0, 0, b"x"), http2.PROTOCOL_ERROR),
        (frame(HEADERS, http2.END_HEADERS, 2, BLOCK), http2.PROTOCOL_ERROR),  # a server's stream id
        (frame(DATA, 0, 9, b"x"), http2.PROTOCOL_ERROR),  # never opened
        (frame(http2.CONTINUATION, http2.END_HEADERS, 1, BLOCK), http2.PROTOCOL_ERROR),
        (frame(HEADERS, 0, 1, BLOCK[:3]) + frame(PING, 0, 0, b"12345678"), http2.PROTOCOL_ERROR),
        (frame(http2.PUSH_PROMISE, http2.END_HEADERS, 1, b"\0\0\0\2" + BLOCK), http2.PROTOCOL_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), http2.PROTOCOL_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"), http2.FLOW_CONTROL_ERROR),
        (settings_frame([(http2.ENABLE_PUSH, 2)]), http2.PROTOCOL_ERROR),
        (settings_frame([(http2.MAX_FRAME_SIZE, 100)]), http2.PROTOCOL_ERROR),
        (settings_frame([(http2.INITIAL_WINDOW_SIZE, 1 << 31)]), http2.FLOW_CONTROL_ERROR),
        (frame(SETTINGS, 0, 0, b"\0\0\0"), http2.FRAME_SIZE_ERROR),
        (frame(SETTINGS, http2.ACK, 0, b"\0\0\0\0\0\0"), http2.FRAME_SIZE_ERROR),
        (frame(PING, 0, 0, b"1234"), http2.FRAME_SIZE_ERROR),
        (frame(GOAWAY, 0, 1, b"\0" * 8), http2.PROTOCOL_ERROR),
        (frame(HEADERS, http2.END_HEADERS, 1, b"\xff\xff\xff\xff\x7f"), http2.COMPRESSION_ERROR),
        (frame(HEADERS, http2.END_HEADERS | http2.PADDED, 1, b"\xff" + BLOCK[:10]), http2.PROTOCOL_ERROR),
    ],
)
def test_connection_errors_send_goaway_with_their_code(raw: bytes, code: int) -> None:
    server = started_server()
    server.receive(raw)
    assert server.closed
    assert goaway_code(server.take()) == code
    assert server.events[-1][:2] == ("error", code)


def test_headers_on_a_lower_stream_id_open_nothing() -> None:
    """Stream 3 is closed once 5 was opened (RFC 9113 5.1.1); HEADERS there may be trailers of a
    stream we reset, so they are decoded and dropped, and the connection goes on."""
    server = started_server()
    server.receive(frame(HEADERS, http2.END_HEADERS, 5, BLOCK))
    server.receive(frame(RST_STREAM, 0, 5, b"\0\0\0\x08"))
    server.receive(frame(HEADERS, http2.END_HEADERS, 3, BLOCK))
    assert [e[:2] for e in server.events] == [("headers", 5), ("reset", 5)]
    assert not server.closed and 3 not in server.streams


def test_a_header_block_in_continuations_and_its_size_limit() -> None:
    server = started_server()
    server.receive(
        frame(HEADERS, 0, 1, BLOCK[:10])
        + frame(http2.CONTINUATION, 0, 1, BLOCK[10:20])
        + frame(http2.CONTINUATION, http2.END_HEADERS, 1, BLOCK[20:])
    )
    assert server.events == [("headers", 1, REQUEST, False)]
    small = started_server(LocalSettings(max_header_list_bytes=30))
    small.receive(frame(HEADERS, 0, 1, BLOCK[:20]) + frame(http2.CONTINUATION, 0, 1, BLOCK[20:]))
    assert goaway_code(small.take()) == http2.ENHANCE_YOUR_CALM


def test_padding_and_priority_fields_are_taken_off() -> None:
    server = started_server()
    server.receive(frame(HEADERS, http2.END_HEADERS | http2.PADDED | http2.PRIORITY_FLAG, 1,
                         b"\x03" + b"\0\0\0\0\x10" + BLOCK + b"\0\0\0"))  # fmt: skip
    server.receive(frame(DATA, http2.PADDED | http2.END_STREAM, 1, b"\x02ab\0\0"))
    assert server.events == [("headers", 1, REQUEST, False), ("data", 1, b"ab", True)]


def test_data_past_a_streams_window_resets_it_and_the_connection_goes_on() -> None:
    server = started_server(LocalSettings(initial_window=10))
    server.receive(frame(HEADERS, http2.END_HEADERS, 1, BLOCK) + frame(DATA, 0, 1, b"x" * 11))
    (kind, _, stream, payload), *_ = frames(server.take())
    assert (kind, stream, struct.unpack(">L", payload)[0]) == (RST_STREAM, 1, http2.FLOW_CONTROL_ERROR)
    assert server.events[-1] == ("reset", 1, http2.FLOW_CONTROL_ERROR)
    assert not server.closed
    server.receive(frame(DATA, 0, 1, b"late"))  # a reset stream's frames are ignored
    assert not server.closed


def test_data_past_the_connection_window_ends_the_connection() -> None:
    server = Recorder(local=LocalSettings(initial_window=1 << 20))
    server.receive(PREFACE + settings_frame([]))  # no initiate(): the connection window stays 65535
    server.receive(frame(HEADERS, http2.END_HEADERS, 1, BLOCK))
    server.receive(b"".join(frame(DATA, 0, 1, b"x" * 16384) for _ in range(4)) + frame(DATA, 0, 1, b"x"))
    assert goaway_code(server.take()) == http2.FLOW_CONTROL_ERROR


def test_windows_are_granted_back_as_data_arrives() -> None:
    server = started_server(LocalSettings(initial_window=1000))
    server.receive(frame(HEADERS, http2.END_HEADERS, 1, BLOCK) + frame(DATA, 0, 1, b"x" * 400))
    assert server.take() == b""  # under half the window: nothing yet
    server.receive(frame(DATA, 0, 1, b"x" * 200))
    (kind, _, stream, payload), *_ = frames(server.take())
    assert (kind, stream, struct.unpack(">L", payload)[0]) == (WINDOW_UPDATE, 1, 600)
    chunk = frame(DATA, 0, 1, b"y" * 16384)
    server.streams[1].recv_window = 1 << 30  # the stream's own updates aside
    total = 0
    while total < CONNECTION_WINDOW // 2:
        server.receive(chunk)
        total += 16384
    updates = [f for f in frames(server.take()) if f[0] == WINDOW_UPDATE and f[2] == 0]
    assert len(updates) == 1


def test_ping_is_answered_and_settings_are_acknowledged() -> None:
    server = started_server()
    server.receive(frame(PING, 0, 0, b"abcdefgh") + settings_frame([(http2.MAX_FRAME_SIZE, 20000)]))
    out = frames(server.take())
    assert out[0] == (PING, http2.ACK, 0, b"abcdefgh")
    assert out[1] == (SETTINGS, http2.ACK, 0, b"")
    assert server.peer_max_frame == 20000


def test_a_new_initial_window_moves_open_streams_windows() -> None:
    server = started_server()
    server.receive(frame(HEADERS, http2.END_HEADERS, 1, BLOCK))
    assert server.streams[1].send_window == 65535
    server.receive(settings_frame([(http2.INITIAL_WINDOW_SIZE, 100)]))
    assert server.streams[1].send_window == 100


def test_a_peer_reset_tells_the_subclass_and_drops_waiting_data() -> None:
    server = started_server()
    server.receive(frame(HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, BLOCK))
    stream = server.streams[1]
    stream.send_window = 0
    server.send(stream, None, b"waiting", None)
    assert stream.pending is not None
    server.receive(frame(RST_STREAM, 0, 1, b"\0\0\0\x08"))
    assert server.events[-1] == ("reset", 1, http2.CANCEL)
    assert 1 not in server.streams
    server.receive(frame(WINDOW_UPDATE, 0, 0, b"\0\0\x10\0"))
    assert not [f for f in frames(server.take()) if f[0] == DATA]


def test_after_our_goaway_new_streams_are_ignored() -> None:
    server = started_server()
    server.receive(frame(HEADERS, http2.END_HEADERS, 1, BLOCK))
    server.goaway()
    (kind, _, _, payload), *_ = frames(server.take())
    assert kind == GOAWAY and struct.unpack(">LL", payload[:8]) == (1, http2.NO_ERROR)
    server.receive(frame(HEADERS, http2.END_HEADERS, 3, BLOCK))
    assert [e[1] for e in server.events] == [1]
    assert not server.closed


def test_settings_defaults_are_sent_at_the_start() -> None:
    server = Recorder()
    server.initiate()
    out = frames(server.take())
    assert out[0][0] == SETTINGS
    values = dict(struct.iter_unpack(">HL", out[0][3]))
    assert values[http2.MAX_CONCURRENT_STREAMS] == LocalSettings().max_concurrent_streams
    assert out[1] == (WINDOW_UPDATE, 0, 0, struct.pack(">L", CONNECTION_WINDOW - 65535))
    assert h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS == http2.MAX_CONCURRENT_STREAMS


def test_empty_continuations_cannot_flood() -> None:
    server = started_server()
    server.receive(frame(HEADERS, 0, 1, BLOCK[:5]))
    server.receive(b"".join(frame(http2.CONTINUATION, 0, 1) for _ in range(http2.MAX_CONTINUATIONS)))
    assert goaway_code(server.take()) == http2.ENHANCE_YOUR_CALM


def test_a_settings_frame_moves_the_streams_windows_once() -> None:
    server = started_server()
    server.receive(frame(HEADERS, http2.END_HEADERS, 1, BLOCK))
    many = [(http2.INITIAL_WINDOW_SIZE, 1000 + i) for i in range(50)]
    server.receive(settings_frame(many))
    assert server.streams[1].send_window == 1049  # the last value, applied once
    assert server.peer_initial_window == 1049


def test_streams_held_after_their_reset_count_against_the_limit() -> None:
    server = started_server(LocalSettings(max_concurrent_streams=2))
    server.extra_streams = 2  # two reset calls whose work is still running
    server.receive(frame(HEADERS, http2.END_HEADERS, 1, BLOCK))
    (kind, _, stream, payload), *_ = frames(server.take())
    assert (kind, stream, struct.unpack(">L", payload)[0]) == (RST_STREAM, 1, http2.REFUSED_STREAM)
    server.extra_streams = 0
    server.receive(frame(HEADERS, http2.END_HEADERS, 3, BLOCK))
    assert server.events[-1] == ("headers", 3, REQUEST, False)


def test_data_that_waits_keeps_its_order_and_its_end() -> None:
    server = started_server()
    server.receive(frame(HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, BLOCK))
    stream = server.streams[1]
    stream.send_window = 3
    server.send(stream, None, b"abcdef", None, end_stream=False)
    server.send(stream, None, b"gh", encode_block([(b"t", b"1")]))  # queued behind what waits
    sent = frames(server.take())
    assert [(k, f, p) for k, f, _, p in sent] == [(DATA, 0, b"abc")]
    server.receive(frame(WINDOW_UPDATE, 0, 1, struct.pack(">L", 100)))
    sent = frames(server.take())
    assert [(k, p) for k, _, _, p in sent if k == DATA] == [(DATA, b"def"), (DATA, b"gh")]
    assert sent[-1][0] == HEADERS and sent[-1][1] & http2.END_STREAM
    assert 1 not in server.streams


def test_a_bad_priority_frame_on_an_idle_stream_is_a_connection_error() -> None:
    server = started_server()
    server.receive(frame(http2.PRIORITY, 0, 7, b"\0\0\0"))
    assert goaway_code(server.take()) == http2.FRAME_SIZE_ERROR


# ---- a large DATA frame handed over in pieces ------------------------------------------------------


def _data_events(server: Recorder) -> list[tuple[int, bytes, bool]]:
    return [(e[1], e[2], e[3]) for e in server.events if e[0] == "data"]


def test_a_large_data_frame_over_many_reads_arrives_in_pieces_ending_once() -> None:
    server = started_server()
    payload = bytes(range(256)) * 400  # 102,400 octets: over PIECES_ABOVE
    raw = frame(HEADERS, http2.END_HEADERS, 1, BLOCK) + frame(DATA, http2.END_STREAM, 1, payload)
    raw += frame(PING, 0, 0, b"abcdefgh")  # a frame after it, in the same reads
    for at in range(0, len(raw), 7000):
        server.receive(raw[at : at + 7000])
    pieces = _data_events(server)
    assert len(pieces) > 10  # handed over as the reads came, not kept whole
    assert b"".join(p[1] for p in pieces) == payload
    assert [p[2] for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert server.streams[1].remote_closed
    assert frames(server.take())[-1] == (PING, http2.ACK, 0, b"abcdefgh")  # parsing went on after it


def test_pieces_count_against_the_windows_as_the_whole_frame_does() -> None:
    whole, pieces = started_server(), started_server()
    raw = frame(HEADERS, http2.END_HEADERS, 1, BLOCK) + frame(DATA, 0, 1, b"z" * 600_000)
    whole.receive(raw)
    for at in range(0, len(raw), 65536):
        pieces.receive(raw[at : at + 65536])
    assert pieces.take() == whole.take()  # the same WINDOW_UPDATEs
    assert pieces.streams[1].recv_window == whole.streams[1].recv_window
    assert pieces.conn_recv_window == whole.conn_recv_window
    assert b"".join(p[1] for p in _data_events(pieces)) == b"z" * 600_000


def test_a_stream_reset_while_its_frame_arrives_drops_the_rest_of_the_frame() -> None:
    server = started_server()
    raw = frame(HEADERS, http2.END_HEADERS, 1, BLOCK) + frame(DATA, http2.END_STREAM, 1, b"q" * 100_000)
    server.receive(raw[:30_000])
    got = len(b"".join(p[1] for p in _data_events(server)))
    server.reset(server.streams[1], http2.NO_ERROR)  # answered early, as a hook may
    server.receive(raw[30_000:] + frame(PING, 0, 0, b"12345678"))
    assert len(b"".join(p[1] for p in _data_events(server))) == got  # nothing more for it
    assert frames(server.take())[-1] == (PING, http2.ACK, 0, b"12345678")
    assert not server.closed


def test_a_large_frame_for_an_unknown_stream_in_pieces_is_dropped_and_parsing_goes_on() -> None:
    server = started_server()
    server.receive(frame(HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, BLOCK))
    server.reset(server.streams[1], http2.NO_ERROR)
    raw = frame(DATA, 0, 1, b"w" * 50_000) + frame(PING, 0, 0, b"abcdefgh")
    for at in range(0, len(raw), 4096):
        server.receive(raw[at : at + 4096])
    assert not _data_events(server)
    assert not server.closed
    assert frames(server.take())[-1] == (PING, http2.ACK, 0, b"abcdefgh")


def test_a_large_send_goes_to_writelines_unjoined_and_a_small_one_is_joined() -> None:
    lines: list[list[Any]] = []
    writes: list[bytes] = []
    session = H2Session(True, writes.append, writelines=lambda parts: lines.append(list(parts)))
    session.receive(settings_frame([(http2.MAX_FRAME_SIZE, 16384), (http2.INITIAL_WINDOW_SIZE, 1 << 20)]))
    session.receive(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", 1 << 20)))
    writes.clear()
    big = bytes(200_000)
    session.send(session.open_stream(), BLOCK, big)
    (parts,) = lines
    assert sum(len(p) for p in parts) > len(big)  # the frames' headers and the data as it was
    assert any(isinstance(p, memoryview) and p.obj is big for p in parts)  # views, not copies
    session.send(session.open_stream(), BLOCK, b"small")
    assert len(lines) == 1 and len(writes) == 1
