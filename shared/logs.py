"""Structured (JSON) logs that carry the trace id of the work in hand."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
from datetime import datetime, timezone

trace_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_id", default=None)

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


def trace_id_from_traceparent(header: str | None) -> str | None:
    """The trace id of a W3C `traceparent` header, or None if absent or malformed."""
    match = _TRACEPARENT.match((header or "").strip().lower())
    if not match or match.group(1) == "0" * 32:
        return None
    return match.group(1)


def redact_url(text: str) -> str:
    """Hide `user:password@` in URLs (RTSP credentials never reach a log)."""
    return _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)


class JsonFormatter(logging.Formatter):
    _SKIP = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat()
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact_url(record.getMessage()),
        }
        trace_id = getattr(record, "trace_id", None) or trace_id_var.get()
        if trace_id:
            entry["trace_id"] = trace_id
        entry.update(
            {
                k: redact_url(v) if isinstance(v, str) else v
                for k, v in vars(record).items()
                if k not in self._SKIP and k != "trace_id"
            }
        )
        if record.exc_info:
            # exception messages quote URLs too (OpenCV, httpx): redact them like the message
            entry["exc"] = redact_url(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class PlainFormatter(logging.Formatter):
    """Human-readable lines, with the same credential redaction as the JSON lines."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact_url(super().format(record))


def configure_logging(level: str = "INFO", *, json_format: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_format else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
