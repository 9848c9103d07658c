"""OpenTelemetry traces (``lumenrt serve --trace OTLP_HTTP_ENDPOINT``), made off the hot path.

Nothing here runs on the request path: the access log's writer thread (``access_log.py``) hands
each answered request's record to ``SpanExporter.add``, which makes the spans after the fact with
explicit start and end times (the record's CLOCK_MONOTONIC stamps moved to wall time by one offset
taken when the log started). Per request, one parent span ``infer <model>`` (received -> answered)
with children for the stages it went through::

    queue    enqueued -> taken by a worker
    batch    taken -> compute started (waiting for the batch to form)
    compute  the model's run
    return   compute finished -> answer back on the event loop

The OTLP/HTTP exporter sends them in batches from the SDK's own thread (``BatchSpanProcessor``).
The OpenTelemetry packages are the ``trace`` extra: this module imports them only inside
``SpanExporter.__init__``, and ``lumenrt serve`` imports this module only with ``--trace``.
"""

from typing import Any

from lumenrt.extras import require
from lumenrt.observability.access_log import AccessRecord

SERVICE_NAME = "lumenrt"
# (name, start field, end field) of each child span, in the order a request goes through them
STAGES = (
    ("queue", "enqueued_ns", "dequeued_ns"),
    ("batch", "dequeued_ns", "compute_start_ns"),
    ("compute", "compute_start_ns", "compute_end_ns"),
    ("return", "compute_end_ns", "completed_ns"),
)


class SpanExporter:
    """Turns access records into spans and exports them over OTLP/HTTP to ``endpoint``
    (e.g. ``http://127.0.0.1:4318/v1/traces``). Used by the access log's writer thread only."""

    def __init__(self, endpoint: str) -> None:
        require("trace")
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self._trace = trace
        self._provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self._tracer: Any = self._provider.get_tracer("lumenrt.serve")
        self._error = trace.Status(trace.StatusCode.ERROR)

    def add(self, record: AccessRecord, request_id: str, wall_offset_ns: int) -> None:
        start = record.start_ns + wall_offset_ns
        end = max(record.end_ns, record.start_ns) + wall_offset_ns
        attributes = {
            "lumenrt.model": record.model,
            "lumenrt.model_version": record.version,
            "lumenrt.request_id": request_id,
            "lumenrt.protocol": record.protocol,
            "http.response.status_code": record.status,
        }
        if record.batch_size:
            attributes["lumenrt.batch_size"] = record.batch_size
        parent = self._tracer.start_span(f"infer {record.model}", start_time=start, attributes=attributes)
        if record.status >= 400:
            parent.set_status(self._error)
        context = self._trace.set_span_in_context(parent)
        for name, first, last in STAGES:
            a, b = getattr(record, first), getattr(record, last)
            if a and b >= a:
                child = self._tracer.start_span(name, context=context, start_time=a + wall_offset_ns)
                child.end(end_time=b + wall_offset_ns)
        parent.end(end_time=end)

    def close(self) -> None:
        """Export what is still buffered, then stop the SDK's thread."""
        self._provider.shutdown()
