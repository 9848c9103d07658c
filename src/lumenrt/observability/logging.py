"""The one logging setup of ``lumenrt serve``: every log line on stderr, in one format, at
``--log-level``.

The lifecycle lines that users and tests read (``lumenrt serve: listening ...``, ``... ready``,
``... stopped``) stay plain lines on stdout; everything else the server has to say goes through
``logging`` (``logging.getLogger(__name__)`` in each module). The root logger gets the handler, so
libraries' warnings share the format; the level applies to lumenrt's own loggers, while other
libraries stay at WARNING (their DEBUG output is not ours to turn on).

Secrets: nothing here logs a configuration; code that does passes it through ``redacted`` first.
"""

import logging
import sys
from collections.abc import Mapping
from typing import Any, TextIO

LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A flag or config key whose name contains one of these holds a secret: its value is never logged.
SECRET_WORDS = ("token", "secret", "password", "passwd", "api_key", "apikey", "credential", "private_key")
REDACTED = "<redacted>"

_HANDLER_MARK = "_lumenrt_handler"  # set on the handler this module installed (replaced on a re-setup)


def setup_logging(level: str = DEFAULT_LOG_LEVEL, stream: TextIO | None = None) -> logging.Handler:
    """Send log records to ``stream`` (default stderr) in ``LOG_FORMAT``; lumenrt's loggers log at
    ``level`` (one of ``LOG_LEVELS``). Calling it again replaces the handler it installed."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
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
