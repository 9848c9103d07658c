"""The one logging setup of ``lumenrt serve``: every log line in one format (``--log-format``:
text on stderr, or JSON lines on stdout), at ``--log-level``.

The lifecycle lines that users and tests read (``lumenrt serve: listening ...``, ``... ready``,
``... stopped``) stay plain lines on stdout; everything else the server has to say goes through
``logging`` (``logging.getLogger(__name__)`` in each module). The root logger gets the handler, so
libraries' warnings share the format; the level applies to lumenrt's own loggers, while other
libraries stay at WARNING (their DEBUG output is not ours to turn on).

Secrets: nothing here logs a configuration; code that does passes it through ``redacted`` first.
"""

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# text: LOG_FORMAT on stderr, lifecycle lines plain on stdout; json: one JSON object per line on
# stdout for both (what a container platform's log collector parses), {"time", "level", "logger",
# "message"} and "exception" when there is one
LOG_FORMATS = ("text", "json")
# A flag or config key whose name contains one of these holds a secret: its value is never logged.
SECRET_WORDS = ("token", "secret", "password", "passwd", "api_key", "apikey", "credential", "private_key")
REDACTED = "<redacted>"

_HANDLER_MARK = "_lumenrt_handler"  # set on the handler this module installed (replaced on a re-setup)


_format = "text"  # what setup_logging chose; ``say`` follows it


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601 with ms), level, logger, message, exception."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def say(line: str, *, error: bool = False) -> None:
    """A lifecycle line of ``lumenrt serve`` (``lumenrt serve: ready, ...``): plain on stdout (stderr
    for an error) in the text format, a JSON object on stdout in the json format."""
    if _format == "json":
        doc = {"time": _utc(time.time()), "level": "error" if error else "info", "logger": "lumenrt.serve"}
        print(json.dumps({**doc, "message": line}), flush=True)
    else:
        print(line, file=sys.stderr if error else sys.stdout, flush=True)


def setup_logging(
    level: str = DEFAULT_LOG_LEVEL, stream: TextIO | None = None, log_format: str = "text"
) -> logging.Handler:
    """Send log records to ``stream`` (default: stderr for text, stdout for json) in ``log_format``;
    lumenrt's loggers log at ``level`` (one of ``LOG_LEVELS``). Calling it again replaces the
    handler it installed."""
    global _format
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    _format = log_format
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    default = sys.stdout if log_format == "json" else sys.stderr
    handler = logging.StreamHandler(stream if stream is not None else default)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(LOG_FORMAT))
    setattr(handler, _HANDLER_MARK, True)
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
    logging.getLogger("lumenrt").setLevel(level.upper())
    return handler


def is_secret(name: str) -> bool:
    """Whether a flag or key name (``auth_token``, ``--api-key``) names a secret."""
    flat = name.lower().replace("-", "_")
    return any(word in flat for word in SECRET_WORDS)


def redacted(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every secret's value replaced by ``REDACTED`` (for logging them)."""
    return {k: (REDACTED if is_secret(k) and v is not None else v) for k, v in settings.items()}
