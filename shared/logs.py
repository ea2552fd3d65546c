"""Structured (JSON) logs that carry the trace id of the work in hand."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import string
import sys
from datetime import datetime, timezone
from typing import TextIO

trace_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_id", default=None)

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
# `://user:password@`: anchored on the `://`, so each try ends at the next `/` (linear time)
_USERINFO = re.compile(r"://[^/@\s]+@")
_LETTERS = frozenset(string.ascii_letters)
_SCHEME_CHARS = _LETTERS | frozenset(string.digits + "+.-")
# A log line's text is cut to this many characters before any pattern reads it: an untrusted
# string (a request path, a property) can neither slow the formatter nor flood the log.
MAX_LOGGED_CHARS = 4096


def trace_id_from_traceparent(header: str | None) -> str | None:
    """The trace id of a W3C `traceparent` header, or None if absent or malformed."""
    match = _TRACEPARENT.match((header or "").strip().lower())
    if not match or match.group(1) == "0" * 32:
        return None
    return match.group(1)


def clip(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """`text` cut to `limit` characters, saying how many were left off."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} more chars]"


def redact_url(text: str) -> str:
    """Hide `user:password@` in URLs (RTSP credentials never reach a log), in linear time.

    A scheme is letters, digits and `+.-` starting with a letter, right before `://`; the
    backward scan stops at the `:` of any earlier `://`, so no character is read twice.
    """
    out: list[str] = []
    done = 0
    for match in _USERINFO.finditer(text):
        start = match.start()
        first = start
        while first > done and text[first - 1] in _SCHEME_CHARS:
            first -= 1
        while first < start and text[first] not in _LETTERS:
            first += 1
        if first == start:
            continue  # no scheme before `://`: not a URL
        out.append(text[done:start])
        out.append("://***@")
        done = match.end()
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


class JsonFormatter(logging.Formatter):
    _SKIP = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat()
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact_url(clip(record.getMessage())),
        }
        trace_id = getattr(record, "trace_id", None) or trace_id_var.get()
        if trace_id:
            entry["trace_id"] = trace_id
        entry.update(
            {
                k: redact_url(clip(v)) if isinstance(v, str) else v
                for k, v in vars(record).items()
                if k not in self._SKIP and k != "trace_id"
            }
        )
        if record.exc_info:
            # exception messages quote URLs too (OpenCV, httpx): redact them like the message
            trace = clip(self.formatException(record.exc_info), 4 * MAX_LOGGED_CHARS)
            entry["exc"] = redact_url(trace)
        return json.dumps(entry, default=str)


class PlainFormatter(logging.Formatter):
    """Human-readable lines, with the same credential redaction as the JSON lines."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return redact_url(clip(super().format(record), 4 * MAX_LOGGED_CHARS))


class StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes, as logging's last resort
    does: a CLI run under a test runner, or with its stderr swapped, never leaves the root
    logger writing to a stream closed since."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:  # StreamHandler.setStream: stderr's the one
        pass


def configure_logging(level: str = "INFO", *, json_format: bool = True) -> None:
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if json_format else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
