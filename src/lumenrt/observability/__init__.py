"""What an operator watches: Prometheus metrics (metrics.py), built at scrape time from the counters
the engine and the service keep; the server's log (logging.py); the per-request access log
(access_log.py) and the OpenTelemetry spans made from it (tracing.py), written off the hot path."""
