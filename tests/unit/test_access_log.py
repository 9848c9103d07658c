"""The access log's writer: one JSON line per record with the stage times in µs, ids made for
requests without one, drops counted when the deque is full and reported when it flows again,
everything flushed at close with no thread left."""

import io
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from lumenrt.engine.request import StageTimes
from lumenrt.extras import MissingExtra
from lumenrt.observability.access_log import AccessLog, AccessRecord

START_NS = 1_000_000_000
KEYS = [
    "ts", "id", "model", "version", "protocol", "status",
    "queue_us", "compute_us", "engine_us", "total_us", "batch_size",
]  # fmt: skip
# a writer that never wakes by itself within a test: only close() drains
NEVER_S = 3600.0


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def times() -> StageTimes:
    return StageTimes(
        received_ns=START_NS,
        enqueued_ns=START_NS + 10_000,
        dequeued_ns=START_NS + 50_000,
        compute_start_ns=START_NS + 60_000,
        compute_end_ns=START_NS + 160_000,
        completed_ns=START_NS + 170_000,
        batch_size=4,
    )


def test_one_json_line_per_record_with_stage_times_in_us() -> None:
    out = io.StringIO()
    log = AccessLog(out, flush_interval_s=NEVER_S)
    log.record("digits_mlp", 1, "http", 200, "req-7", START_NS, START_NS + 200_000, times())
    log.close()
    (line,) = lines(out.getvalue())
    assert list(line) == KEYS
    assert line["id"] == "req-7"
    assert (line["model"], line["version"], line["protocol"], line["status"]) == (
        "digits_mlp",
        1,
        "http",
        200,
    )
    assert (line["queue_us"], line["compute_us"], line["engine_us"], line["total_us"]) == (40, 100, 160, 200)
    assert line["batch_size"] == 4
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", line["ts"])


def test_a_request_without_id_gets_a_process_prefixed_counter() -> None:
    out = io.StringIO()
    log = AccessLog(out, flush_interval_s=NEVER_S)
    for rid in (None, "", 42, None):
        log.record("m", 1, "tcp", 200, rid, START_NS, START_NS + 1000)
    log.close()
    ids = [line["id"] for line in lines(out.getvalue())]
    prefix = log.ids.prefix
    assert ids == [f"{prefix}-1", f"{prefix}-2", "42", f"{prefix}-3"]


def test_stages_not_reached_are_zero() -> None:
    out = io.StringIO()
    log = AccessLog(out, flush_interval_s=NEVER_S)
    log.record("m", 1, "grpc", 504, "late", START_NS, START_NS + 3_000_000)  # never reached a worker
    log.close()
    (line,) = lines(out.getvalue())
    assert (line["status"], line["queue_us"], line["compute_us"], line["total_us"]) == (504, 0, 0, 3000)


def test_a_full_deque_drops_and_the_count_is_logged_when_it_flows_again() -> None:
    out = io.StringIO()
    log = AccessLog(out, capacity=3, flush_interval_s=NEVER_S)
    for i in range(5):
        log.record("m", 1, "http", 200, f"r{i}", START_NS, START_NS + 1000)
    assert log.dropped == 2
    log.close()
    got = lines(out.getvalue())
    assert [g["id"] for g in got[:3]] == ["r0", "r1", "r2"]
    assert got[3]["event"] == "access_log_dropped" and got[3]["dropped"] == 2
    assert len(got) == 4


def test_the_writer_thread_drains_without_close() -> None:
    written = threading.Event()

    class Out(io.StringIO):
        def flush(self) -> None:
            if self.getvalue():
                written.set()

    out = Out()
    log = AccessLog(out, flush_interval_s=0.01)
    try:
        log.record("m", 1, "http", 200, "x", START_NS, START_NS + 1000)
        assert written.wait(10), "the writer never wrote the record"
        assert lines(out.getvalue())[0]["id"] == "x"
    finally:
        log.close()


def test_close_flushes_closes_the_file_and_leaves_no_thread(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog.open(str(path))
    for i in range(100):
        log.record("m", 1, "http", 200, f"r{i}", START_NS, START_NS + 1000)
    log.close()
    log.close()  # idempotent
    assert [line["id"] for line in lines(path.read_text())] == [f"r{i}" for i in range(100)]
    assert not any(t.name == "lumenrt-access-log" for t in threading.enumerate())


def test_records_copy_the_stage_times() -> None:
    """The inline lane reuses one StageTimes: a record keeps the values it had when recorded."""
    spans: list[AccessRecord] = []

    class Sink:
        def add(self, record: AccessRecord, request_id: str, wall_offset_ns: int) -> None:
            spans.append(record)

        def close(self) -> None:
            pass

    log = AccessLog(None, spans=Sink(), flush_interval_s=NEVER_S)
    shared = times()
    log.record("m", 1, "http", 200, "a", START_NS, START_NS + 1000, shared)
    shared.compute_end_ns += 1_000_000
    log.close()
    assert spans[0].compute_end_ns == START_NS + 160_000


def test_trace_without_the_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import lumenrt.extras
    from lumenrt.ingress.serve import _open_access_log

    monkeypatch.setattr(lumenrt.extras, "is_installed", lambda module: False)
    with pytest.raises(MissingExtra) as caught:
        _open_access_log(None, "http://127.0.0.1:4318/v1/traces")
    assert str(caught.value) == "needs the 'trace' extra: pip install 'lumenrt[trace]'"


def test_nothing_of_opentelemetry_is_imported_when_tracing_is_off() -> None:
    code = (
        "import sys\n"
        "from lumenrt.ingress.serve import _open_access_log\n"
        "import lumenrt.ingress.app\n"
        "log = _open_access_log('-', None)\n"
        "log.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(
    ("request_id", "model"),
    [(None, "digits_mlp"), ("abc", "digits_mlp"), ('q"uo\\te\n', "m-1.x"), ("ünï", "squeezenet"), (42, "m")],
)
def test_a_formatted_line_is_exactly_the_json_of_its_fields(request_id: Any, model: str) -> None:
    """The writer formats lines itself (its cost competes with the event loop); they must be the
    same text json.dumps makes of the fields, escaping included."""
    log = AccessLog(io.StringIO())
    try:
        r = AccessRecord(model, 3, "tcp", 504, request_id, 1_000_000, 9_500_000, 2_000_000, 3_000_000,
                         4_000_000, 7_000_000, 8_000_000, 2)  # fmt: skip
        generated = request_id is None
        rid = log.ids.new() if generated else str(request_id)
        got = log._format(r, rid, generated)
        assert got == json.dumps(log._line(r, rid), separators=(", ", ": "))
        assert json.loads(got)["id"] == rid
    finally:
        log.close()
